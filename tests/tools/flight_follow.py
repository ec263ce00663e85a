#!/usr/bin/env python3
"""A Flight consumer of a tailflight fleet that knows one member's address.

    flight_follow.py grpc+tcp://member:port SOURCE --out DIR --done MARKER --report JSON

Lists the source's files through the member (ListFlights), and follows each
one where its FlightEndpoint's location says, with the ticket the listing
gave (a DoGet live tail). When a stream breaks (its identity was taken
over), it lists again through the same member and resumes the file from
its cursor at the new location. It rebuilds the files under DIR and fails
if any byte arrives twice or out of order. It ends once MARKER exists
(holding the number of files to expect) and every file is sealed, and
writes a report: files, bytes, streams opened, resumptions, locations seen.
"""

import argparse
import json
import os
import sys
import threading
import time

import pyarrow.flight as flight


def confined(out, path):
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SystemExit(f"refusing a path outside {out}: {path!r}")
    return os.path.join(out, *parts)


class File:
    """One followed file: where it is rebuilt, its cursor, what it saw."""

    def __init__(self, key):
        self.key = key
        self.path = None
        self.offset = 0  # every byte below was received, once
        self.position = None  # the cursor's position for this file
        self.sealed = False
        self.streams = 0
        self.locations = set()
        self.running = False


class Follower:
    def __init__(self, args):
        self.args = args
        self.member = flight.FlightClient(args.member)
        self.files = {}
        self.lock = threading.Lock()
        self.failure = None
        self.listings = 0
        self.failed_listings = 0

    def list(self):
        self.listings += 1
        infos = []
        for info in self.member.list_flights(f"{self.args.source}/**".encode()):
            meta = json.loads(info.app_metadata)
            endpoint = info.endpoints[0]
            infos.append((meta, endpoint))
        return infos

    def follow(self, file, meta, endpoint):
        """Reads one file's stream until it is sealed or the stream breaks."""
        location = endpoint.locations[0]
        ticket = json.loads(endpoint.ticket.ticket)
        ticket["follow"] = True
        if file.position is not None:
            ticket["start"] = "cursor"
            ticket["cursor"] = [file.position]
        try:
            client = flight.FlightClient(location)
            reader = client.do_get(flight.Ticket(json.dumps(ticket).encode()))
            while not file.sealed:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                self.take(file, chunk)
            client.close()
        except flight.FlightError as e:
            print(f"{file.key}: stream at {location} broke: {e}", file=sys.stderr)
        except Exception as e:  # a byte twice, a gap: the test fails
            self.failure = f"{file.key}: {e}"
        finally:
            with self.lock:
                file.running = False

    def take(self, file, chunk):
        batch = chunk.data
        for row in batch.to_pylist() if batch is not None else []:
            if row["file_key"] != file.key:
                raise RuntimeError(f"a row of another file: {row['file_key']}")
            kind, path = row["kind"], row["path"]
            target = confined(self.args.out, path) if path else None
            if kind == "opened":
                if file.path is None:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    open(target, "wb").close()
                    file.path = path
            elif kind == "data":
                if row["offset"] != file.offset:
                    raise RuntimeError(
                        f"bytes at {row['offset']} when {file.offset} was next: "
                        + ("a byte arrived twice" if row["offset"] < file.offset else "a hole")
                    )
                with open(confined(self.args.out, file.path), "r+b") as f:
                    f.seek(row["offset"])
                    f.write(row["data"])
                file.offset += len(row["data"])
            elif kind == "renamed":
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(confined(self.args.out, file.path), target)
                file.path = path
            elif kind == "superseded":
                raise RuntimeError("superseded: not expected in this run")
            elif kind == "sealed":
                if row["size"] != file.offset:
                    raise RuntimeError(f"sealed at {row['size']} bytes, {file.offset} received")
                file.sealed = True
        if chunk.app_metadata is not None:
            for position in json.loads(chunk.app_metadata.to_pybytes())["cursor"]:
                if position[0] == file.key:
                    file.position = position

    def expected(self):
        try:
            with open(self.args.done) as f:
                return int(f.read().strip() or "0")
        except (FileNotFoundError, ValueError):
            return None

    def run(self):
        deadline = time.monotonic() + self.args.timeout
        threads = []
        while time.monotonic() < deadline and self.failure is None:
            expected = self.expected()
            with self.lock:
                sealed = sum(1 for f in self.files.values() if f.sealed)
            if expected is not None and sealed >= expected:
                break
            try:
                infos = self.list()
            except flight.FlightError as e:
                self.failed_listings += 1
                print(f"listing failed: {e}", file=sys.stderr)
                time.sleep(0.5)
                continue
            for meta, endpoint in infos:
                key = meta["file_key"]
                with self.lock:
                    file = self.files.setdefault(key, File(key))
                    if file.sealed or file.running:
                        continue
                    file.running = True
                    file.streams += 1
                    file.locations.add(endpoint.locations[0].uri.decode())
                thread = threading.Thread(target=self.follow, args=(file, meta, endpoint), daemon=True)
                thread.start()
                threads.append(thread)
            time.sleep(0.5)
        report = {
            "failure": self.failure,
            "files": len(self.files),
            "sealed": sum(1 for f in self.files.values() if f.sealed),
            "bytes": sum(f.offset for f in self.files.values()),
            "streams": sum(f.streams for f in self.files.values()),
            "resumptions": sum(f.streams - 1 for f in self.files.values()),
            "listings": self.listings,
            "failed_listings": self.failed_listings,
            "locations": sorted({l for f in self.files.values() for l in f.locations}),
            "files_over_several_locations": sum(1 for f in self.files.values() if len(f.locations) > 1),
            "timed_out": time.monotonic() >= deadline,
        }
        with open(self.args.report, "w") as f:
            json.dump(report, f)
        return 0 if self.failure is None and not report["timed_out"] else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("member")
    parser.add_argument("source")
    parser.add_argument("--out", required=True)
    parser.add_argument("--done", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sys.exit(Follower(args).run())


if __name__ == "__main__":
    main()
