#!/usr/bin/env bash
# Fetches the jars of a real Apache Kafka 4.3.1 broker (KRaft, one JVM) from
# Maven Central, for the tests and the benchmark. They are cached outside the
# clone (45 MB) and fetched only once: a marker file records a complete copy.
# Prints the libs directory as its last stdout line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home="${TAILFLIGHT_KAFKA_HOME:-$HOME/.cache/tailflight/kafka-4.3.1}"
libs="$home/libs"
marker="$libs/.complete"

if [ ! -f "$marker" ]; then
    # Test binaries may run in parallel: one fetch at a time.
    mkdir -p "$home"
    exec 9>"$home/.fetch.lock"
    flock 9
fi
if [ ! -f "$marker" ]; then
    if ! command -v mvn >/dev/null || ! command -v java >/dev/null; then
        echo "installing maven and a JDK from Debian" >&2
        sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq maven openjdk-17-jdk-headless >/dev/null
    fi
    echo "fetching Kafka 4.3.1 jars into $libs" >&2
    rm -rf "$libs"
    mkdir -p "$libs"
    mvn -B -q -Dstyle.color=never -f "$here/pom.xml" \
        -Dmaven.repo.local="$HOME/.cache/tailflight/m2" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs" >&2
    compgen -G "$libs/kafka_2.13-*.jar" >/dev/null || { echo "fetch.sh: no kafka jar in $libs" >&2; exit 1; }
    touch "$marker"
fi
echo "$libs"
