#!/usr/bin/env bash
# start-apache-kafka.sh — run one Apache Kafka node (KRaft, broker+controller
# combined) on loopback, the reference that ferrolog is tested and benchmarked against.
#
# Usage: scripts/start-apache-kafka.sh PORT DATA_DIR [KEY=VALUE ...]
#
#   PORT       client listener, PLAINTEXT://$KAFKA_HOST:PORT (also advertised).
#   DATA_DIR   created if missing. Holds server.properties (written on every
#              start), log/ (log.dirs and the KRaft metadata log), tmp/ (the
#              JVM's java.io.tmpdir), format.out, kafka.out (broker output,
#              background mode) and kafka.pid.
#   KEY=VALUE  extra broker configs appended to server.properties, overriding the
#              defaults below, e.g. log.flush.interval.messages=1 num.partitions=3.
#
# Environment:
#   CONTROLLER_PORT  controller listener port. Default: the one recorded in
#                    DATA_DIR/server.properties by an earlier start (the KRaft voter
#                    set remembers it), else a free port picked now.
#   KAFKA_HOST       the address both listeners bind and advertise (default 127.0.0.1),
#                    e.g. a network namespace's own address.
#   KAFKA_HEAP_OPTS  default "-Xms1g -Xmx1g" (as kafka-server-start.sh does).
#   FOREGROUND=1     exec the JVM in the foreground after formatting: the caller
#                    owns the process (its pid is this script's pid), captures
#                    its output and waits for readiness itself. tests/conftest.py
#                    uses this so that kill -9 hits the broker itself.
#   READY_TIMEOUT_S  background mode: how long to wait for readiness (default 120).
#   KAFKA_VOTERS     a multi-node cluster: the static voter set, e.g.
#                    1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293, with
#                    KAFKA_NODE_ID (this node, one of them), KAFKA_CLUSTER_ID (the same
#                    22-character id on every node) and CONTROLLER_PORT (this node's
#                    port in the voter set). Internal topics then keep Kafka's
#                    replication defaults (3). Unset: a single node (node.id 1).
#   KAFKA_LOG4J_CONFIG  log4j2 config file instead of scripts/apache-kafka/log4j2.properties
#                    (e.g. one that sets kafka.request.logger to DEBUG to see every
#                    request's API key and version).
#
# First start on an empty DATA_DIR formats storage with
# `kafka.tools.StorageTool format --standalone` (a single-voter dynamic quorum,
# KIP-853, which needs controller.quorum.bootstrap.servers instead of
# controller.quorum.voters). Later starts on the same DATA_DIR skip formatting and
# recover the existing log, so the same command restarts a killed broker.
#
# Background mode (default) returns once the broker answers an ApiVersions
# request on PORT, printing its pid; stop it with scripts/stop-apache-kafka.sh DATA_DIR.
#
# Needs: scripts/fetch-apache-kafka.sh run once (jars in .cache/apache-kafka/lib).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
fi
port="$1"
data_dir="$2"
shift 2

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lib_dir="$repo_root/.cache/apache-kafka/lib"
log4j_config="${KAFKA_LOG4J_CONFIG:-$repo_root/scripts/apache-kafka/log4j2.properties}"
if ! compgen -G "$lib_dir/kafka_2.13-*.jar" >/dev/null; then
    echo "start-apache-kafka: no broker jars in $lib_dir; run scripts/fetch-apache-kafka.sh" >&2
    exit 1
fi

mkdir -p "$data_dir"
data_dir="$(cd "$data_dir" && pwd)"
props="$data_dir/server.properties"
log_dir="$data_dir/log"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

host="${KAFKA_HOST:-127.0.0.1}"
controller_port="${CONTROLLER_PORT:-}"
if [[ -z "$controller_port" && -f "$props" ]]; then
    controller_port="$(sed -n 's/^controller\.quorum\.bootstrap\.servers=127\.0\.0\.1:\([0-9]*\)$/\1/p' "$props")"
fi
if [[ -z "$controller_port" ]]; then
    controller_port="$(free_port)"
fi

# Single node: every internal topic has replication factor 1. Group joins are not
# delayed (group.initial.rebalance.delay.ms) so tests do not wait 3 s.
voters="${KAFKA_VOTERS:-}"
{
    echo "# Written by scripts/start-apache-kafka.sh; rewritten on every start."
    echo "process.roles=broker,controller"
    if [[ -n "$voters" ]]; then
        echo "node.id=${KAFKA_NODE_ID:?KAFKA_VOTERS needs KAFKA_NODE_ID}"
    else
        echo "node.id=1"
    fi
    echo "listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$controller_port"
    echo "advertised.listeners=PLAINTEXT://$host:$port"
    echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    echo "inter.broker.listener.name=PLAINTEXT"
    echo "controller.listener.names=CONTROLLER"
    if [[ -n "$voters" ]]; then
        echo "controller.quorum.voters=$voters"
    else
        echo "controller.quorum.bootstrap.servers=127.0.0.1:$controller_port"
        echo "offsets.topic.replication.factor=1"
        echo "transaction.state.log.replication.factor=1"
        echo "transaction.state.log.min.isr=1"
        echo "share.coordinator.state.topic.replication.factor=1"
        echo "share.coordinator.state.topic.min.isr=1"
    fi
    echo "log.dirs=$log_dir"
    echo "num.partitions=1"
    echo "group.initial.rebalance.delay.ms=0"
    for kv in "$@"; do
        if [[ "$kv" != *=* ]]; then
            echo "start-apache-kafka: extra config '$kv' is not KEY=VALUE" >&2
            exit 2
        fi
        echo "$kv"
    done
} >"$props"

java_opts=(
    ${KAFKA_HEAP_OPTS:--Xms1g -Xmx1g}
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$log4j_config"
    # snappy-java and lz4-java unpack their native libraries into java.io.tmpdir
    # and delete them only on a clean exit; keep a killed broker's in DATA_DIR.
    "-Djava.io.tmpdir=$data_dir/tmp"
    -cp "$lib_dir/*"
)

if [[ ! -f "$log_dir/meta.properties" ]]; then
    # Kafka cluster ids are 16 random bytes in URL-safe base64 without padding.
    # Like Kafka's Uuid.randomUuid, never start with '-': the tool would read it as an option.
    cluster_id="${KAFKA_CLUSTER_ID:--}"
    while [[ "$cluster_id" == -* ]]; do
        cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    done
    # A static voter set is formatted as it is; a single node as a one-voter dynamic quorum.
    quorum_flag=(--standalone)
    [[ -n "$voters" ]] && quorum_flag=()
    # The tool prints the whole KafkaConfig; keep that out of the way unless it fails.
    if ! java -Xmx256m "-Dlog4j2.configurationFile=$log4j_config" -cp "$lib_dir/*" \
        kafka.tools.StorageTool format --config "$props" --cluster-id "$cluster_id" "${quorum_flag[@]}" \
        >"$data_dir/format.out" 2>&1; then
        echo "start-apache-kafka: formatting $log_dir failed:" >&2
        tail -n 40 "$data_dir/format.out" >&2
        exit 1
    fi
fi

mkdir -p "$data_dir/tmp"
if [[ "${FOREGROUND:-0}" == 1 ]]; then
    exec java "${java_opts[@]}" kafka.Kafka "$props"
fi

# Background mode: own session, so the broker outlives this script and its terminal.
nohup setsid java "${java_opts[@]}" kafka.Kafka "$props" >"$data_dir/kafka.out" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$data_dir/kafka.pid"

# Ready = answers ApiVersions v0 (api key 18) with our correlation id; a bound
# port alone is not enough, as Kafka listens before it serves requests.
answers_api_versions() {
    exec 3<>"/dev/tcp/$host/$port" || return 1
    printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff' >&3
    local reply
    reply="$(timeout 2 head -c 8 <&3 | od -An -tx1 | tr -d ' \n')" || true
    exec 3>&-
    [[ "$reply" == ????????00000001 ]]
}

deadline=$((SECONDS + ${READY_TIMEOUT_S:-120}))
until answers_api_versions 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "start-apache-kafka: broker exited during start-up; tail of $data_dir/kafka.out:" >&2
        tail -n 40 "$data_dir/kafka.out" >&2
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        echo "start-apache-kafka: broker not ready on port $port after ${READY_TIMEOUT_S:-120} s" >&2
        tail -n 40 "$data_dir/kafka.out" >&2
        exit 1
    fi
    sleep 0.2
done
echo "$pid"
