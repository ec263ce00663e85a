#!/usr/bin/env bash
# Runs a real one-node Apache Kafka 4.3.1 broker (KRaft: broker and controller
# in one JVM) for humans and the benchmark; the Rust tests use
# tests/common/kafka.rs instead, which owns its child process.
#
#   broker.sh start DIR [PORT CONTROLLER_PORT]   # prints 127.0.0.1:PORT when ready
#   broker.sh stop DIR
#
# Data, config, pid and log live in DIR; a restart on the same DIR reuses the
# data. Env: KAFKA_PARTITIONS (num.partitions, default 4), KAFKA_AUTO_CREATE
# (default true).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage() { echo "usage: $0 start|stop DIR [PORT CONTROLLER_PORT]" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd="$1"
dir="$(mkdir -p "$2" && cd "$2" && pwd)"
pidfile="$dir/broker.pid"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stop() {
    running || { rm -f "$pidfile"; return 0; }
    local pid; pid="$(cat "$pidfile")"
    kill -TERM "$pid"
    for _ in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
        sleep 0.1
    done
    echo "broker $pid did not stop within 30 s: killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

start() {
    if running; then echo "broker already running in $dir (pid $(cat "$pidfile"))" >&2; exit 1; fi
    local port="${1:-}" cport="${2:-}"
    # Without explicit ports, a restart reuses the ones of the existing config.
    if [ -z "$port" ] && [ -f "$dir/server.properties" ]; then
        port="$(sed -n 's|^listeners=PLAINTEXT://127.0.0.1:\([0-9]*\),.*|\1|p' "$dir/server.properties")"
        cport="$(sed -n 's|^listeners=.*CONTROLLER://127.0.0.1:\([0-9]*\)$|\1|p' "$dir/server.properties")"
    fi
    [ -n "$port" ] || port="$(free_port)"
    [ -n "$cport" ] || cport="$(free_port)"
    local libs; libs="$("$here/fetch.sh" | tail -n 1)"
    local auto_create=true
    [ "${KAFKA_AUTO_CREATE:-true}" = false ] && auto_create=false

    cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=${KAFKA_PARTITIONS:-4}
auto.create.topics.enable=$auto_create
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS

    if [ ! -f "$dir/data/meta.properties" ]; then
        local id; id="$(java -cp "$libs/*" kafka.tools.StorageTool random-uuid)"
        java -cp "$libs/*" kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" >> "$dir/format.log" 2>&1 \
            || { cat "$dir/format.log" >&2; exit 1; }
    fi

    local log="$dir/broker.log"
    # A mark so that readiness is judged on this run's lines only.
    echo "=== broker.sh start $(date -Is)" >> "$log"
    local from; from="$(wc -l < "$log")"
    nohup java -Xms256m -Xmx512m -Dlog4j2.configurationFile="$here/log4j2.properties" \
        -cp "$libs/*" kafka.Kafka "$dir/server.properties" >> "$log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    for _ in $(seq 900); do
        if tail -n +"$from" "$log" | grep -q "Kafka Server started"; then
            echo "127.0.0.1:$port"
            return 0
        fi
        running || { echo "broker exited during start; log tail:" >&2; tail -n 30 "$log" >&2; rm -f "$pidfile"; exit 1; }
        sleep 0.1
    done
    echo "broker not ready within 90 s; log tail:" >&2
    tail -n 30 "$log" >&2
    stop
    exit 1
}

case "$cmd" in
    start) shift 2; start "$@" ;;
    stop) stop ;;
    *) usage ;;
esac
