#!/usr/bin/env python3
"""P8's ceiling: a minimal pyarrow Flight server that answers any DoGet with
`--bytes` of data in batches of `--batch` bytes, built in memory once, in
the consumer schema's shape (what a Flight server can do for this client on
this machine, with no file and no sink behind it)."""

import argparse
import os

import pyarrow as pa
import pyarrow.flight as flight


class MemoryServer(flight.FlightServerBase):
    def __init__(self, location, batches):
        super().__init__(location)
        self.batches = batches

    def do_get(self, context, ticket):
        return flight.RecordBatchStream(pa.Table.from_batches(self.batches))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--batch", type=int, default=4 << 20)
    args = ap.parse_args()
    payload = os.urandom(args.batch)
    schema = pa.schema([("kind", pa.string()), ("path", pa.string()), ("offset", pa.uint64()),
                        ("data", pa.binary())])
    batches = []
    for i in range(max(1, args.bytes // args.batch)):
        batches.append(pa.record_batch([pa.array(["data"]), pa.array([f"f{i % 16}"]),
                                        pa.array([i * args.batch], pa.uint64()),
                                        pa.array([payload], pa.binary())], schema=schema))
    server = MemoryServer(f"grpc://127.0.0.1:{args.port}", batches)
    print("serving", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
