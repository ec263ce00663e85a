#!/usr/bin/env python3
"""P12's Kafka clients (confluent-kafka, run with the project's venv).

`floor`: the broker's own floor. One small message every `--every-ms` for
`--seconds`, from an idempotent producer (linger.ms=0; `--transactional`:
one transaction per message; with `--spread`, every other transaction
writes one message to each of the topic's partitions instead, the shape of
a relay's transaction) to a read_committed consumer of a fresh group in the
same process. The consumer is assigned, at each partition's end,
before the first message; the first `--warmup-s` of messages (connections,
metadata) are not measured. Logs each measured message: its send time (ns),
its arrival (ns), its record timestamp (ms) and how many messages its
transaction held.

`relay`: a plain transactional relay, the peer of the sink's. Events are
made at `--rate` a second (each stamped with the time it was made) and
published in back-to-back transactions of every event waiting (at most
`--max-batch`), keyed over `--keys` keys, by a transactional producer
(linger.ms=1, as the sink's relay) to a read_committed consumer in the same
process. It keeps no position and checks nothing: what any relay that
publishes in transactions pays. Measured and logged as `floor`.

`events`: a read_committed consumer of a fresh group on the sink's topic,
from each partition's end at assignment, until SIGTERM or `--timeout`. Logs
each record: its arrival (ns), its record timestamp (ms: the sink's commit
time) and its CloudEvent `type`.

Both create their topic if it is missing, print "assigned" once the consumer
is assigned and positioned, and print a JSON summary as their last line;
every latency there is arrival minus record timestamp, as P12 measures it.
"""

import argparse
import collections
import json
import math
import re
import signal
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

TYPE = re.compile(rb'"type"\s*:\s*"([^"]*)"')


def percentile(sorted_values, p):
    """Nearest rank, as the suite's analysis.percentile."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def summary(values):
    s = sorted(values)
    return {"n": len(s), "p50_ms": percentile(s, 50), "p99_ms": percentile(s, 99),
            "max_ms": s[-1] if s else None}


def ensure_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                      operation_timeout=30).values():
        try:
            future.result(60)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


# A topic just created has partitions without a leader for a moment.
LEADER_PENDING = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                  KafkaError.UNKNOWN_TOPIC_OR_PART)


def end_offset(consumer, tp, deadline):
    """The partition's high watermark as the broker answers now; waits, until `deadline`, for a
    partition of a new topic to have a leader."""
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
        except KafkaException as e:
            if e.args[0].code() not in LEADER_PENDING or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def assigned_consumer(bootstrap, topic, role, timeout=60.0):
    """A read_committed consumer of a fresh group, subscribed to `topic` and assigned, each partition
    positioned at its end as the broker answers now (not later, at its first fetch: a message sent
    in between would be skipped)."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"tfbench-p12-{role}-{uuid.uuid4()}",
        "isolation.level": "read_committed",
        "auto.offset.reset": "latest",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "topic.metadata.refresh.interval.ms": 1000,
    })
    done = threading.Event()

    def on_assign(c, partitions):
        for tp in partitions:
            tp.offset = end_offset(c, tp, time.monotonic() + timeout)
        c.assign(partitions)
        done.set()

    consumer.subscribe([topic], on_assign=on_assign)
    deadline = time.monotonic() + timeout
    while not done.is_set():
        if time.monotonic() > deadline:
            raise SystemExit(f"the consumer of {topic} was not assigned within {timeout:.0f} s")
        for msg in consumer.consume(100, 0.1):
            check(msg)
    print("assigned", flush=True)
    return consumer


def receive(consumer, timeout):
    """The next message (waiting at most `timeout` s) and those already queued behind it, with the
    time the first was handed over. Not consume(n, timeout) alone: it waits for n messages or the
    whole timeout, and that wait would count as latency."""
    msg = consumer.poll(timeout)
    recv_ns = time.time_ns()
    if msg is None:
        return recv_ns, []
    return recv_ns, [msg, *consumer.consume(1000, 0)]


def check(msg):
    err = msg.error()
    if err is None:
        return True
    if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART) or (
            not err.fatal() and err.retriable()):
        return False
    raise KafkaException(err)


def measure(consumer, producing, sent, bound, log_path):
    """Reads the messages a producer thread (`producing`) sends, until it has ended and every measured one
    (`sent[0]`) arrived (or 10 s more passed), or until `bound` (monotonic). Each value starts with its
    warm-up flag and its send time (ns). Returns the latencies (ms) from the record timestamp and from the
    send time to the arrival, and closes the consumer."""
    log = open(log_path, "w") if log_path else None
    by_ts, exact = [], []
    drain_deadline = None
    while time.monotonic() < bound:
        if not producing.is_alive():
            drain_deadline = drain_deadline or time.monotonic() + 10
            if len(by_ts) >= sent[0] or time.monotonic() > drain_deadline:
                break
        recv_ns, msgs = receive(consumer, 0.05)
        for msg in msgs:
            if not check(msg):
                continue
            warm, sent_ns, width = msg.value().split(b" ", 3)[:3]
            if warm == b"1":
                continue
            sent_ns = int(sent_ns)
            ts_ms = msg.timestamp()[1]
            by_ts.append((recv_ns - ts_ms * 1_000_000) / 1e6)
            exact.append((recv_ns - sent_ns) / 1e6)
            if log:
                log.write(f"{sent_ns}\t{recv_ns}\t{ts_ms}\t{int(width)}\n")
    if log:
        log.close()
    consumer.close()
    return by_ts, exact


class Schedule:
    """A run's clock: a warm-up of `warmup_s`, then `seconds` measured; says "measuring" on stdout
    when the measured part starts."""

    def __init__(self, warmup_s, seconds):
        self.start = time.monotonic()
        self.warm_until = self.start + warmup_s
        self.end = self.warm_until + seconds
        self.measuring = False

    def now(self):
        """The monotonic time, or None once the run is over."""
        now = time.monotonic()
        if now >= self.end:
            return None
        if not self.measuring and now >= self.warm_until:
            self.measuring = True
            print("measuring", flush=True)
        return now


def floor(args):
    ensure_topic(args.bootstrap, args.topic, args.partitions)
    consumer = assigned_consumer(args.bootstrap, args.topic, "floor")
    config = {"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
    if args.transactional:
        config["transactional.id"] = f"tfbench-p12-floor-{uuid.uuid4()}"
    producer = Producer(config)
    if args.transactional:
        producer.init_transactions(30)
    every = args.every_ms / 1000
    pad = b"x" * max(0, args.size - 48)
    sent = [0]
    errors = []
    partitions = len(producer.list_topics(args.topic, 30).topics[args.topic].partitions)

    def delivered(err, _msg):
        if err is not None:
            errors.append(str(err))

    def produce():
        # Warm-up messages first (flag 1), then the measured ones (flag 0), at a fixed pace;
        # a late tick is not made up for with a burst.
        clock = Schedule(args.warmup_s, args.seconds)
        next_at = clock.start
        spread = False
        while clock.now() is not None:
            measuring = clock.measuring
            sent_ns = time.time_ns()
            targets = list(range(partitions)) if spread else [None]
            value = b"%d %d %d " % (int(not measuring), sent_ns, len(targets)) + pad
            if args.transactional:
                producer.begin_transaction()
            for partition in targets:
                extra = {} if partition is None else {"partition": partition}
                producer.produce(args.topic, value, timestamp=sent_ns // 1_000_000, on_delivery=delivered, **extra)
            if args.transactional:
                producer.commit_transaction(30)
            else:
                producer.poll(0)
            if measuring:
                sent[0] += len(targets)
            spread = args.spread and not spread
            next_at = max(next_at + every, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))
        producer.flush(30)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    by_ts, exact = measure(consumer, thread, sent, time.monotonic() + args.warmup_s + args.seconds + 60,
                           args.log)
    out = {"mode": "floor", "transactional": args.transactional, "every_ms": args.every_ms,
           "sent": sent[0], "received": len(by_ts), "delivery_errors": errors[:5],
           **summary(by_ts), "exact": summary(exact)}
    print(json.dumps(out), flush=True)


def relay(args):
    ensure_topic(args.bootstrap, args.topic, args.partitions)
    consumer = assigned_consumer(args.bootstrap, args.topic, "relay")
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 1, "transactional.id": f"tfbench-p12-relay-{uuid.uuid4()}"})
    producer.init_transactions(30)
    pad = b"x" * max(0, args.size - 48)
    waiting = collections.deque()
    made = [0]
    sent = [0]
    transactions = [0]
    errors = []
    clock = Schedule(args.warmup_s, args.seconds)
    stop = threading.Event()

    def make():
        # Events fall due at a steady rate; each 1 ms tick makes the ones due by then.
        while not stop.is_set():
            now = clock.now()
            if now is None:
                break
            measuring = clock.measuring
            due = int((now - clock.start) * args.rate) - made[0]
            made_ns = time.time_ns()
            for _ in range(max(0, due)):
                waiting.append((made[0], made_ns, not measuring))
                made[0] += 1
            time.sleep(0.001)
        stop.set()

    def delivered(err, _msg):
        if err is not None:
            errors.append(str(err))

    def publish():
        while not (stop.is_set() and not waiting):
            if not waiting:
                time.sleep(0.0005)
                continue
            batch = [waiting.popleft() for _ in range(min(len(waiting), args.max_batch))]
            producer.begin_transaction()
            for n, made_ns, warm in batch:
                producer.produce(args.topic, b"%d %d 1 " % (int(warm), made_ns) + pad,
                                 key=b"file-%d" % (n % args.keys), timestamp=made_ns // 1_000_000,
                                 on_delivery=delivered)
            producer.commit_transaction(30)
            transactions[0] += 1
            sent[0] += sum(1 for _, _, warm in batch if not warm)

    threads = [threading.Thread(target=make, daemon=True), threading.Thread(target=publish, daemon=True)]
    for thread in threads:
        thread.start()
    by_ts, exact = measure(consumer, threads[1], sent, clock.end + 60, args.log)
    stop.set()
    out = {"mode": "relay", "transactional": True, "rate": args.rate, "sent": sent[0], "received": len(by_ts),
           "transactions": transactions[0], "delivery_errors": errors[:5], **summary(by_ts),
           "exact": summary(exact)}
    print(json.dumps(out), flush=True)


def events(args):
    ensure_topic(args.bootstrap, args.topic, args.partitions)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    consumer = assigned_consumer(args.bootstrap, args.topic, "events")
    by_type = {}
    bound = time.monotonic() + args.timeout
    with open(args.log, "w") as log:
        while not stop.is_set() and time.monotonic() < bound:
            recv_ns, msgs = receive(consumer, 0.1)
            for msg in msgs:
                if not check(msg):
                    continue
                ts_ms = msg.timestamp()[1]
                m = TYPE.search(msg.value() or b"")
                kind = m.group(1).decode() if m else "?"
                by_type.setdefault(kind, []).append((recv_ns - ts_ms * 1_000_000) / 1e6)
                log.write(f"{recv_ns}\t{ts_ms}\t{kind}\n")
            if msgs:
                log.flush()
    consumer.close()
    print(json.dumps({"mode": "events", "records": sum(len(v) for v in by_type.values()),
                      "by_type": {k: summary(v) for k, v in by_type.items()}}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("floor", "relay", "events"):
        p = sub.add_parser(name)
        p.add_argument("--bootstrap", required=True)
        p.add_argument("--topic", required=True)
        p.add_argument("--partitions", type=int, default=4, help="if the topic must be created")
        p.add_argument("--log", help="one line per record")
    f = sub.choices["floor"]
    f.add_argument("--seconds", type=float, required=True, help="how long measured messages are sent")
    f.add_argument("--every-ms", type=float, default=10.0)
    f.add_argument("--warmup-s", type=float, default=1.0)
    f.add_argument("--size", type=int, default=400, help="bytes per message (a commit event's order)")
    f.add_argument("--transactional", action="store_true")
    f.add_argument("--spread", action="store_true",
                   help="every other transaction: one message to each partition (needs --transactional)")
    r = sub.choices["relay"]
    r.add_argument("--seconds", type=float, required=True, help="how long measured events are made")
    r.add_argument("--rate", type=float, required=True, help="events a second")
    r.add_argument("--warmup-s", type=float, default=1.0)
    r.add_argument("--size", type=int, default=400)
    r.add_argument("--keys", type=int, default=100)
    r.add_argument("--max-batch", type=int, default=2000, help="events per transaction at most (as the sink's)")
    e = sub.choices["events"]
    e.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    if args.mode == "events" and not args.log:
        ap.error("events needs --log")
    if args.mode == "floor" and args.spread and not args.transactional:
        ap.error("--spread needs --transactional")
    {"floor": floor, "relay": relay, "events": events}[args.mode](args)


if __name__ == "__main__":
    main()
