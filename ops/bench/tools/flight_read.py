#!/usr/bin/env python3
"""P8's consumer: one pyarrow DoGet, every batch read and its `data` column
touched, until the stream ends or `--until` data bytes came. Prints JSON:
data bytes, seconds from the call to the last batch, and to the first, and
the CPU seconds this process used."""

import argparse
import json
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("ticket", help="the DoGet ticket (JSON for a tailflight sink)")
    ap.add_argument("--until", type=int, default=0, help="stop after this many data bytes")
    ap.add_argument("--arrivals", help="log each data row here: file_key offset length arrival_unix_ns")
    args = ap.parse_args()
    # Loaded before the clock starts: the first call of a compute kernel loads its registry.
    pc.binary_length(pa.array([b""], pa.binary()))
    t0 = time.monotonic()
    reader = flight.FlightClient(args.endpoint).do_get(flight.Ticket(args.ticket.encode()))
    got, first, last = 0, None, t0
    arrivals = open(args.arrivals, "w") if args.arrivals else None
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
        if arrivals:
            now_ns = time.time_ns()
            kinds, keys, offsets = (batch.column(n).to_pylist() for n in ("kind", "file_key", "offset"))
            lengths = pc.binary_length(data).to_pylist()
            for kind, key, offset, length in zip(kinds, keys, offsets, lengths):
                if kind == "data":
                    arrivals.write(f"{key} {offset} {length} {now_ns}\n")
            # A consumer stopped by a signal must not lose the tail of its log.
            arrivals.flush()
    if arrivals:
        arrivals.close()
    print(json.dumps({"bytes": got, "seconds": last - t0,
                      "first_s": (first - t0) if first else None,
                      "cpu_s": time.process_time()}))


if __name__ == "__main__":
    main()
