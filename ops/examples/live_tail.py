#!/usr/bin/env python3
"""Follow a tailflight sink's files with pyarrow alone (no tailflight code).

    python3 live_tail.py grpc://sink:50051 hutch1 'hutch1/xtc/*' --out DIR

Subscribes with a DoGet ticket (JSON), rebuilds each file under DIR as its
durable bytes arrive (renames applied, a new generation replacing the old),
keeps the merged cursor in DIR/.cursor.json so that a restart resumes where
it stopped, and prints its throughput every two seconds. (It does not check
seal digests: `tailflight tail` does.)
"""

import argparse
import json
import os
import sys
import time

import pyarrow.flight as flight


def confined(out, path):
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SystemExit(f"refusing a path outside {out}: {path!r}")
    return os.path.join(out, *parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint", help="grpc://host:port (grpc+tls:// with TLS)")
    parser.add_argument("source")
    parser.add_argument("globs", nargs="*", help="globs over <source>/<path>")
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-follow", action="store_true", help="stop once caught up")
    parser.add_argument("--cursor", help="where to keep the cursor (default: OUT/.cursor.json)")
    parser.add_argument("--token-file", help="a file holding the sink's subscriber token")
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    cursor_file = args.cursor or os.path.join(args.out, ".cursor.json")
    cursor = {}  # file_key -> [key, generation, offset, path(, sealed)]
    if os.path.exists(cursor_file):
        with open(cursor_file) as f:
            cursor = {p[0]: p for p in json.load(f)}
    ticket = {"source": args.source, "globs": args.globs, "follow": not args.no_follow}
    if cursor:
        ticket.update(start="cursor", cursor=list(cursor.values()))

    client = flight.FlightClient(args.endpoint)
    options = flight.FlightCallOptions()
    if args.token_file:
        with open(args.token_file) as f:
            token = f.readline().strip()
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
    reader = client.do_get(flight.Ticket(json.dumps(ticket).encode()), options)
    started = last = time.monotonic()
    received = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        batch = chunk.data
        for row in batch.to_pylist() if batch is not None else []:
            kind = row["kind"]
            if not row["path"]:
                continue  # a generation the cursor knew that is gone entirely
            target = confined(args.out, row["path"])
            if kind == "opened":
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "wb").close()
            elif kind == "data":
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "r+b" if os.path.exists(target) else "wb") as f:
                    f.seek(row["offset"])
                    f.write(row["data"])
                received += len(row["data"])
            elif kind == "renamed":
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = confined(args.out, row["from_path"])
                if os.path.exists(source) or not os.path.exists(target):
                    os.replace(source, target)
            elif kind == "superseded" and row["path"] and os.path.exists(target):
                os.remove(target)
            elif kind == "sealed":
                print(f"sealed {row['path']}: {row['size']} bytes, {row['digest']}")
        if chunk.app_metadata is not None:
            for position in json.loads(chunk.app_metadata.to_pybytes())["cursor"]:
                known = cursor.get(position[0])
                if known is None or known[1] <= position[1]:
                    cursor[position[0]] = position
            with open(cursor_file + ".partial", "w") as f:
                json.dump(list(cursor.values()), f)
            os.replace(cursor_file + ".partial", cursor_file)
        now = time.monotonic()
        if now - last >= 2:
            print(f"{received / 2**20:.1f} MiB, {received / 2**20 / (now - started):.1f} MiB/s",
                  file=sys.stderr)
            last = now
    print(f"received {received} bytes in {time.monotonic() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
