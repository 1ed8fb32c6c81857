#!/usr/bin/env bash
# install-test-deps.sh — everything the end-to-end tests in tests/ need, except
# the brokers themselves (ferrolog is built with cargo; Apache Kafka comes from
# scripts/fetch-apache-kafka.sh).
#
# Usage: scripts/install-test-deps.sh      (as root, on Debian; idempotent)
#
# Installs or builds:
#   Debian    kcat, perf (linux-perf); and, only where missing, a JDK (17+), Maven and pip.
#   PyPI      confluent-kafka, kafka-python and pytest at the pinned versions below,
#             into whatever `python3` is first on PATH (the one that runs the tests).
#   Maven     tests/java: kafka-clients + kafka-tools 4.1 + slf4j-simple and our
#             driver program, all jars in .cache/java/lib.
#   Kafka CLI kafka-topics.sh & co. in .cache/kafka/bin (scripts/install-kafka-cli.sh,
#             on Apache Kafka's jars from Maven Central), for the README's examples.
#   Go        tests/go (franz-go) built to .cache/go/franzcheck. franz-go 1.22 needs
#             Go >= 1.26, which the project's machines have preinstalled; Debian 12's
#             golang-go is 1.19, so this step stops with a message where Go is older.
#
# Every step checks first and skips work already done, so a second run takes a
# second or two. Build outputs live under <repo>/.cache (git-ignored); downloads
# stay in the tools' usual per-user caches (~/.m2, Go's module cache), so a fresh
# clone on the same machine does not download again.
set -euo pipefail

CONFLUENT_KAFKA_VERSION=2.16.1
KAFKA_PYTHON_VERSION=3.0.12
PYTEST_VERSION=9.2.0

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$repo_root/.cache"
say() { echo "install-test-deps: $*"; }

# ---- Debian packages -----------------------------------------------------------
apt_packages=()
command -v kcat >/dev/null || apt_packages+=(kcat)
command -v javac >/dev/null || apt_packages+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || apt_packages+=(maven)
command -v python3 >/dev/null || apt_packages+=(python3)
# `ip netns` for the network-partition test.
command -v ip >/dev/null || apt_packages+=(iproute2)
# iptables inside a test's own namespace, for the one-way partition test.
command -v iptables >/dev/null || apt_packages+=(iptables)
# perf for the benchmark's flame graphs (bench/harness.py).
command -v perf >/dev/null || apt_packages+=(linux-perf)
# mkfs.ext4 and e2fsck for ferrolog-check's disks (and the disk-full test).
command -v mkfs.ext4 >/dev/null && command -v e2fsck >/dev/null || apt_packages+=(e2fsprogs)
if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_packages+=(python3-pip)
fi
if ((${#apt_packages[@]})); then
    say "apt-get install ${apt_packages[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${apt_packages[@]}"
else
    say "Debian packages present"
fi

# ---- Python clients and pytest -------------------------------------------------
pins=("confluent-kafka==$CONFLUENT_KAFKA_VERSION" "kafka-python==$KAFKA_PYTHON_VERSION" "pytest==$PYTEST_VERSION")
if python3 - "${pins[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
then
    say "Python packages at pinned versions"
else
    say "pip install ${pins[*]}"
    # Debian's own python3 is "externally managed" (PEP 668); these are test tools
    # for a throw-away machine, so install next to the system packages anyway.
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --root-user-action=ignore "${pins[@]}"
fi

# ---- Java: kafka-clients, kafka-tools, our driver --------------------------------
java_dir="$repo_root/tests/java"
java_jar="$cache/java/lib/ferrolog-client-tests.jar"
if [[ -f "$java_jar" && -z "$(find "$java_dir/pom.xml" "$java_dir/src" -newer "$java_jar" -print -quit)" ]]; then
    say "Java test classpath up to date in $cache/java/lib"
else
    say "building tests/java into $cache/java/lib"
    # Jars of an older pin would stay on the wildcard classpath: start clean.
    rm -rf "$cache/java/lib"
    mvn -q -B -Dstyle.color=never -f "$java_dir/pom.xml" package
fi

# ---- Go: franz-go driver --------------------------------------------------------
go_dir="$repo_root/tests/go"
go_bin="$cache/go/franzcheck"
if [[ -x "$go_bin" && -z "$(find "$go_dir" -name '*.go' -newer "$go_bin" -print -quit)" \
    && ! "$go_dir/go.mod" -nt "$go_bin" && ! "$go_dir/go.sum" -nt "$go_bin" ]]; then
    say "franz-go driver up to date at $go_bin"
else
    say "building tests/go into $go_bin"
    go_need="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$go_dir/go.mod")"
    if ! command -v go >/dev/null; then
        say "no Go on PATH; tests/go needs Go >= $go_need" >&2
        exit 1
    fi
    mkdir -p "$cache/go"
    # GOTOOLCHAIN=local: use the installed Go, never download another toolchain.
    (cd "$go_dir" && GOTOOLCHAIN=local GOFLAGS=-buildvcs=false go build -o "$go_bin" .)
fi

# ---- Kafka's command-line tools, as the README's examples run them ------------------
"$repo_root/scripts/install-kafka-cli.sh"

say "done"
