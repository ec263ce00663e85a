#!/usr/bin/env bash
# Runs the whole test suite: unit tests of every crate and the end-to-end,
# crash, lost-state, source-event, bad-input and authentication tests, which
# start sinks, watchers and simulators as separate processes on loopback;
# then the unit tests of the benchmark suite's calculations, and the suite
# itself in --quick mode, so that it cannot rot (it must complete and write
# its results; its figures are not asserted).
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/env.sh
tailflight_install_build_deps
cargo build --workspace --all-targets
# A consumer test runs ops/examples/live_tail.py with pyarrow from PyPI, in
# a venv outside the clone (reused across runs).
pyvenv="${TAILFLIGHT_PY_VENV:-$HOME/.cache/tailflight/py-venv}"
if ! "$pyvenv/bin/python" -c 'import pyarrow.flight, grpc, opentelemetry.proto, confluent_kafka' >/dev/null 2>&1; then
    if ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    fi
    rm -rf "$pyvenv"
    /usr/bin/python3 -m venv "$pyvenv"
    # pyarrow for the consumer's test; grpcio and the official OpenTelemetry
    # protobufs for the OTLP receiver of the operators' test; confluent-kafka
    # (a wheel with librdkafka inside) to read the sink's events back.
    "$pyvenv/bin/pip" install --quiet pyarrow grpcio opentelemetry-proto confluent-kafka
fi
export TAILFLIGHT_PYTHON="$pyvenv/bin/python"
# The Kafka events' tests run a real broker (Apache Kafka 4.3.1 in KRaft
# mode) from Maven Central jars, fetched once into ~/.cache/tailflight.
ops/kafka/fetch.sh >/dev/null
# The operators' test scrapes a watcher and a sink with a real Prometheus
# server (Debian 12 packages 2.42, with promtool).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package starts a system-wide server where systemd runs; the test
    # starts its own.
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
export TAILFLIGHT_PROMETHEUS="$(command -v prometheus)"
# The terminal view's test runs it inside tmux; the status page's test
# renders it in Debian's headless Chromium.
if ! command -v tmux >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends tmux chromium >/dev/null
fi
export TAILFLIGHT_CHROMIUM="$(command -v chromium)"
# The fleet's tests start a real 3-member etcd cluster on loopback (Debian
# 12's etcd-server and etcd-client, 3.4).
if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null
    # The package starts a system-wide member where systemd runs; the tests
    # start their own.
    $sudo systemctl disable --now etcd >/dev/null 2>&1 || true
fi
export TAILFLIGHT_ETCD="$(command -v etcd)"
# The tests need ~2 GiB of scratch at peak (each removes its folder when it
# passes); say what there is, so a full disk is recognised as such.
df -h "${TMPDIR:-/tmp}" . | sed 's/^/disk: /'
# Tests that need root (network namespaces, tmpfs mounts) say SKIPPED on
# stderr where they cannot run; as root (CI) every one of them must run.
if [ "$(id -u)" -eq 0 ]; then
    export TAILFLIGHT_NO_SKIPS=1
fi
# No new module cycle in any crate (the ones left to undo are listed).
python3 ops/module_cycles.py --allow ops/module-cycles.allow
# A sink that takes its locks out of order panics in every process the
# tests start, instead of logging it (sink/src/lock_order.rs).
export TAILFLIGHT_LOCK_ORDER=panic
# Two test threads: the machines this runs on have two cores, and the
# end-to-end tests each run several processes.
cargo test --workspace -- --test-threads=2
python3 -m unittest discover -s ops/bench/tests -t ops/bench
ops/bench/run.sh --quick
test -s ops/bench/results/latest-quick.md
