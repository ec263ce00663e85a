"""A minimal OTLP/gRPC metrics receiver for the operators' test, built on the
official OpenTelemetry protobufs (opentelemetry-proto) and grpcio: it
answers every export and appends it to a file as one JSON line.

    python otlp_receiver.py PORT OUT.jsonl
"""

import sys
from concurrent import futures

import grpc
from google.protobuf.json_format import MessageToJson
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)


class Receiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, out_path):
        self.out_path = out_path

    def Export(self, request, context):
        line = MessageToJson(request, indent=None)
        with open(self.out_path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main():
    port, out_path = int(sys.argv[1]), sys.argv[2]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Receiver(out_path), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("listening", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
