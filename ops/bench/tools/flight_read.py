#!/usr/bin/env python3
"""P8's consumer: one pyarrow DoGet, every batch read and its `data` column
touched, until the stream ends or `--until` data bytes came. Prints JSON:
data bytes, seconds from the call to the last batch, and to the first."""

import argparse
import json
import time

import pyarrow.flight as flight


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("ticket", help="the DoGet ticket (JSON for a tailflight sink)")
    ap.add_argument("--until", type=int, default=0, help="stop after this many data bytes")
    args = ap.parse_args()
    t0 = time.monotonic()
    reader = flight.FlightClient(args.endpoint).do_get(flight.Ticket(args.ticket.encode()))
    got, first, last = 0, None, t0
    while args.until == 0 or got < args.until:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        batch = chunk.data
        if batch is None or batch.num_rows == 0:
            continue
        # The bytes as a consumer would take them: one buffer, not copied.
        data = batch.column("data")
        got += data.buffers()[2].size if data.buffers()[2] is not None else 0
        last = time.monotonic()
        if first is None:
            first = last
    print(json.dumps({"bytes": got, "seconds": last - t0,
                      "first_s": (first - t0) if first else None}))


if __name__ == "__main__":
    main()
