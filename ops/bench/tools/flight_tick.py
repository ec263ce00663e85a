#!/usr/bin/env python3
"""P9's floor: how long a row takes from a pyarrow Flight server to this
pyarrow client on this machine, with nothing behind the server. `serve`
answers a DoGet with one small row every `--every-ms`, stamped with the
time it was handed to Flight; `read` prints, per row, its stamp and its
delay (arrival minus stamp, ms)."""

import argparse
import time

import pyarrow as pa
import pyarrow.flight as flight

SCHEMA = pa.schema([("sent_ns", pa.int64()), ("data", pa.binary())])


class TickServer(flight.FlightServerBase):
    def __init__(self, location, count, every_s):
        super().__init__(location)
        self.count, self.every_s = count, every_s

    def do_get(self, context, ticket):
        def ticks():
            payload = b"\0" * 4096
            next_at = time.monotonic()
            for _ in range(self.count):
                next_at += self.every_s
                time.sleep(max(0.0, next_at - time.monotonic()))
                yield pa.record_batch([pa.array([time.time_ns()], pa.int64()),
                                       pa.array([payload], pa.binary())], schema=SCHEMA)
        return flight.GeneratorStream(SCHEMA, ticks())


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--every-ms", type=float, default=10.0)
    r = sub.add_parser("read")
    r.add_argument("endpoint")
    args = ap.parse_args()
    if args.mode == "serve":
        server = TickServer(f"grpc://127.0.0.1:{args.port}", args.count, args.every_ms / 1000)
        print("serving", flush=True)
        server.serve()
        return
    reader = flight.FlightClient(args.endpoint).do_get(flight.Ticket(b"ticks"))
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        now = time.time_ns()
        if chunk.data is not None and chunk.data.num_rows:
            sent = chunk.data.column("sent_ns")[0].as_py()
            print(sent, (now - sent) / 1e6, flush=True)


if __name__ == "__main__":
    main()
