#!/usr/bin/env bash
# fetch-apache-kafka.sh — put Apache Kafka's broker on this machine, from Maven Central.
#
# Usage: scripts/fetch-apache-kafka.sh
#
# Result: <repo>/.cache/apache-kafka/lib/*.jar, one flat classpath holding the
# broker (kafka_2.13: main class kafka.Kafka, kafka.tools.StorageTool), the
# command-line tools (kafka-tools) and a log4j2 backend for slf4j. The version is
# pinned in scripts/apache-kafka/pom.xml (kafka.version). No release tarball is
# reachable from here, so the jars come from Maven Central through `mvn`.
#
# Idempotent: when the lib directory already holds the pinned broker jar, it
# does nothing. Downloads land in Maven's usual local repository (~/.m2), so a
# fresh clone of the repo on the same machine copies instead of downloading.
#
# Needs: java 17+ and mvn on PATH (scripts/install-test-deps.sh installs them).
# Used by: scripts/start-apache-kafka.sh, tests/conftest.py (FERROLOG_TARGET=apache),
# and the benchmark harness.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pom="$repo_root/scripts/apache-kafka/pom.xml"
lib_dir="$repo_root/.cache/apache-kafka/lib"

kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")"
if [[ -z "$kafka_version" ]]; then
    echo "fetch-apache-kafka: cannot read kafka.version from $pom" >&2
    exit 1
fi

marker="$lib_dir/kafka_2.13-$kafka_version.jar"
if [[ -f "$marker" ]]; then
    echo "fetch-apache-kafka: Apache Kafka $kafka_version already in $lib_dir"
    exit 0
fi

# A half-filled or older directory would mix versions on the classpath: start clean.
rm -rf "$lib_dir"
mkdir -p "$lib_dir"
echo "fetch-apache-kafka: resolving Apache Kafka $kafka_version into $lib_dir"
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$lib_dir"

if [[ ! -f "$marker" ]]; then
    echo "fetch-apache-kafka: $marker missing after mvn; see the output above" >&2
    exit 1
fi
echo "fetch-apache-kafka: $(ls "$lib_dir" | wc -l) jars in $lib_dir"
