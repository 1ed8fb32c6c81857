#!/usr/bin/env bash
# bench.sh — ferrolog and Apache Kafka side by side on this machine, against its limits.
#
# Usage: scripts/bench.sh [--quick] [harness options]
#
#   (no option)   the full benchmark: 3 repetitions of every workload on ferrolog, Kafka
#                 (default durability) and Kafka with log.flush.interval.messages=1;
#                 about 35-40 minutes on a 2-core machine.
#   --quick       tiny sizes, one repetition, under 3 minutes: a smoke test of the
#                 harness (tests/test_bench_quick.py runs it). Its numbers mean nothing.
#   --no-build    use the binaries in target/release as they are.
#   Other options go to bench/harness.py (--configs, --workloads, --reps, --out,
#   --ferrolog-cores, --no-cross-check; see `python3 bench/harness.py --help`).
#
# Output: bench/results/<date>-<commit>[-quick]/ with report.md, results.json, plots/
# (SVG) and raw/ (one JSON per run). Broker data and logs live in .cache/bench-work/
# while it runs. Exit status 0 when every workload ran; 1 when any failed (the report
# says which and why); nothing here judges a speed.
#
# Builds: ferrolog-bench always (incremental); the broker only when
# target/release/ferrolog is missing (FERROLOG_BIN overrides the binary). Apache Kafka's
# jars come from scripts/fetch-apache-kafka.sh (Maven Central, cached).
#
# Needs: cargo, python3 (stdlib only), java 17+, mvn and perf (scripts/install-test-deps.sh),
# root for the loop mount of the many-partitions workload (without it that workload
# runs on the data disk under a free-space guard).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

build=1
args=()
for a in "$@"; do
    if [[ "$a" == --no-build ]]; then build=0; else args+=("$a"); fi
done

if ((build)); then
    cargo build --release --quiet -p ferrolog-bench
    if [[ -z "${FERROLOG_BIN:-}" && ! -x target/release/ferrolog ]]; then
        cargo build --release --quiet -p ferrolog
    fi
fi
scripts/fetch-apache-kafka.sh >&2

# ferrolog (glommio) locks memory for its I/O rings; the harness raises the limit too.
ulimit -l unlimited 2>/dev/null || true

exec python3 bench/harness.py "${args[@]}"
