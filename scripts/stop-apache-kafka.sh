#!/usr/bin/env bash
# stop-apache-kafka.sh — stop a broker started in background mode by
# scripts/start-apache-kafka.sh, using the pid in DATA_DIR/kafka.pid.
#
# Usage: scripts/stop-apache-kafka.sh DATA_DIR [--kill]
#
# Sends SIGTERM (a clean shutdown, which Kafka takes a few seconds for) and waits
# up to STOP_TIMEOUT_S (default 60) before SIGKILL. --kill sends SIGKILL at once,
# as a crash would. Exits 0 when no broker from DATA_DIR is running afterwards.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 DATA_DIR [--kill]" >&2
    exit 2
fi
pid_file="$1/kafka.pid"
if [[ ! -f "$pid_file" ]]; then
    echo "stop-apache-kafka: no $pid_file; nothing to stop"
    exit 0
fi
pid="$(cat "$pid_file")"
signal=TERM
[[ "${2:-}" == --kill ]] && signal=KILL
if kill -0 "$pid" 2>/dev/null; then
    kill -s "$signal" "$pid"
    deadline=$((SECONDS + ${STOP_TIMEOUT_S:-60}))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            echo "stop-apache-kafka: pid $pid still alive after ${STOP_TIMEOUT_S:-60} s; SIGKILL" >&2
            kill -s KILL "$pid" 2>/dev/null || true
        fi
        sleep 0.2
    done
fi
rm -f "$pid_file"
