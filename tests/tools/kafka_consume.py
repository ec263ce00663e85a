"""Reads a Kafka topic with confluent-kafka and prints each record as one JSON
line, for the tests and the benchmark to check what the sink published.

    python kafka_consume.py --bootstrap 127.0.0.1:PORT --topic T \
        [--min-events N] [--idle-seconds S] [--timeout S]

Reads committed records only (read_committed), from the beginning, with a
fresh group id and no offset commits. Stops once at least --min-events were
read and nothing new arrived for --idle-seconds, or at --timeout overall.
Each line: {"partition", "offset", "key", "headers", "value", "timestamp_ms"};
"value" is the record value parsed as JSON.
"""

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException


def text(b):
    return None if b is None else b.decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--min-events", type=int, default=0)
    ap.add_argument("--idle-seconds", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--from-beginning", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": f"kafka-consume-{uuid.uuid4()}",
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # The topic may not exist yet when the tool starts.
        "topic.metadata.refresh.interval.ms": 1000,
    })
    consumer.subscribe([args.topic])

    start = time.monotonic()
    last = start
    count = 0
    try:
        while True:
            now = time.monotonic()
            if now - start >= args.timeout:
                break
            if count >= args.min_events and now - last >= args.idle_seconds:
                break
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    continue
                if not err.fatal() and err.retriable():
                    continue
                raise KafkaException(err)
            headers = {k: text(v) for k, v in (msg.headers() or [])}
            _, ts = msg.timestamp()
            record = {
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": text(msg.key()),
                "headers": headers,
                "value": json.loads(msg.value()) if msg.value() is not None else None,
                "timestamp_ms": ts,
            }
            sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
            sys.stdout.flush()
            count += 1
            last = time.monotonic()
    finally:
        consumer.close()
    print(f"kafka_consume: {count} records from {args.topic}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
