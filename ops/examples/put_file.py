#!/usr/bin/env python3
"""Send one file to a tailflight sink with pyarrow alone (no tailflight code).

    python3 put_file.py grpc://sink:50051 SOURCE FILE KEY [--chunk BYTES] [--window N]

Opens a DoPut stream with the tailflight hello, sends FILE's bytes as data
rows of the range schema (at most --chunk bytes each, several rows to a
batch), waits until the sink has acknowledged them, then seals the file with
its size and CRC-64/NVME digest: the sink places the file at
<root>/SOURCE/KEY. The same stream format any Arrow Flight client can write.
"""

import argparse
import json
import sys

import pyarrow as pa
import pyarrow.flight as flight

SCHEMA = pa.schema(
    [
        pa.field("kind", pa.uint8(), nullable=False),
        pa.field("file_key", pa.utf8(), nullable=False),
        pa.field("generation", pa.uint64(), nullable=False),
        pa.field("offset", pa.uint64(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("crc32c", pa.uint32(), nullable=False),
        pa.field("path", pa.utf8(), nullable=True),
        pa.field("digest", pa.utf8(), nullable=True),
    ]
)
DATA, SEAL = 0, 3


def crc_table(polynomial):
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ polynomial if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC32C = crc_table(0x82F63B78)
CRC64NVME = crc_table(0x9A6C9329AC4BC9B5)


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc64nvme(data):
    crc = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        crc = CRC64NVME[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFFFFFFFFFF


def rows_batch(rows):
    columns = list(zip(*rows))
    return pa.record_batch([pa.array(c, type=f.type) for c, f in zip(columns, SCHEMA)], schema=SCHEMA)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint", help="grpc://host:port")
    parser.add_argument("source", help="the stream's source name")
    parser.add_argument("file")
    parser.add_argument("key", help="where the file lands under the source")
    parser.add_argument("--chunk", type=int, default=1 << 20, help="bytes per data row")
    parser.add_argument("--rows-per-batch", type=int, default=3)
    parser.add_argument("--window", type=int, default=8, help="batches sent and not yet acknowledged, at most")
    args = parser.parse_args()

    with open(args.file, "rb") as f:
        content = f.read()
    rows = [
        (DATA, args.key, 1, at, content[at : at + args.chunk], crc32c(content[at : at + args.chunk]), None, None)
        for at in range(0, len(content), args.chunk)
    ]
    digest = f"crc64nvme:{crc64nvme(content):016x}"
    sent = 0
    rows.append((SEAL, args.key, 1, len(content), b"", 0, None, digest))

    client = flight.FlightClient(args.endpoint)
    hello = json.dumps({"protocol": 1, "source": args.source}).encode()
    writer, acks = client.do_put(flight.FlightDescriptor.for_command(hello), SCHEMA)
    data, seal = rows[:-1], rows[-1:]
    batches = [data[i : i + args.rows_per_batch] for i in range(0, len(data), args.rows_per_batch)]
    # A seal is checked against the bytes placed before it: it goes once
    # every data row is acknowledged.
    acked = set()

    def read_ack():
        ack = json.loads(acks.read().to_pybytes())
        if ack.get("rejected"):
            sys.exit(f"the sink rejected rows: {ack['rejected']}")
        acked.add(ack["seq"])

    for stage in (batches, [seal]):
        for batch in stage:
            while sent - len(acked) >= args.window:
                read_ack()
            writer.write_with_metadata(rows_batch(batch), sent.to_bytes(8, "big"))
            sent += 1
        while len(acked) < sent:
            read_ack()
    writer.done_writing()
    writer.close()
    print(f"sent {len(content)} bytes in {sent} batches, all acknowledged")


if __name__ == "__main__":
    main()
