#!/usr/bin/env python3
"""Analysis on files that are still being written: frames as they arrive.

    python3 live_frames.py grpc://sink:50051 SOURCE --frame 1MiB [GLOB ...]

Follows a tailflight sink with pyarrow alone and cuts each file's bytes
into frames of the simulator's fixed size (`tailflight sim --frame`) the
moment a frame is whole, long before its file is closed. Each frame is
checked against the simulator's deterministic content (a function of the
seed, the file's final name and the offset) and "analysed" (its mean byte
value); a line a second on stderr says how many frames so far.
"""

import argparse
import json
import sys
import time

import pyarrow.flight as flight

GAMMA = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def finalize(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def file_key(seed, name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return finalize((finalize(h) + GAMMA) & MASK ^ ((seed * GAMMA) & MASK))


def expected_word(key, index):
    return finalize((key + ((index + 1) * GAMMA)) & MASK)


def size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint")
    parser.add_argument("source")
    parser.add_argument("globs", nargs="*")
    parser.add_argument("--frame", type=size, required=True, help="the simulator's --frame")
    parser.add_argument("--seed", type=int, default=1, help="the simulator's --seed")
    parser.add_argument("--frames", type=int, default=0, help="stop after this many (0: never)")
    args = parser.parse_args()

    ticket = {"source": args.source, "globs": args.globs, "follow": True}
    reader = flight.FlightClient(args.endpoint).do_get(flight.Ticket(json.dumps(ticket).encode()))
    pending = {}  # file_key -> (next frame offset, bytes of the frame so far)
    frames = bad = 0
    last = time.monotonic()
    while args.frames == 0 or frames < args.frames:
        try:
            batch = reader.read_chunk().data
        except StopIteration:
            break
        for row in batch.to_pylist() if batch is not None else []:
            if row["kind"] != "data":
                continue
            start, partial = pending.get(row["file_key"], (row["offset"], b""))
            partial += row["data"]
            name = row["path"].rsplit("/", 1)[-1].removesuffix(".inprogress")
            key = file_key(args.seed, name)
            while len(partial) >= args.frame:
                frame, partial = partial[: args.frame], partial[args.frame :]
                # Check the first word of the frame (a full check is a loop
                # over every word: too slow for Python at detector rates).
                word = int.from_bytes(frame[:8], "little")
                if start % 8 == 0 and word != expected_word(key, start // 8):
                    bad += 1
                mean = sum(frame[:: max(1, len(frame) // 4096)]) / min(len(frame), 4096)
                frames += 1
                start += args.frame
            pending[row["file_key"]] = (start, partial)
        now = time.monotonic()
        if now - last >= 1:
            print(f"{frames} frames, {bad} not the simulator's, last mean {mean:.1f}", file=sys.stderr)
            last = now
    print(f"{frames} frames analysed, {bad} not the simulator's")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
