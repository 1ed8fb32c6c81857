#!/usr/bin/env python3
"""request-versions.py — which Kafka requests (API key, version) clients sent, and
which error codes Apache Kafka answered, read from Apache Kafka's request log.

Usage:
    sed 's/^logger.request.level = WARN/logger.request.level = DEBUG/' \\
        scripts/apache-kafka/log4j2.properties > /tmp/requests.properties
    KAFKA_LOG4J_CONFIG=/tmp/requests.properties FERROLOG_TARGET=apache \\
        python3 -m pytest tests/ --basetemp=/tmp/e2e
    python3 scripts/request-versions.py /tmp/e2e/*/broker.log

Prints one Markdown table: a row per API, a column per log file (per test), the
request versions seen. Then, per log, the non-zero error codes in responses. Only
the client listener (PLAINTEXT) counts: the broker's own controller traffic is left
out, and so is the test fixture's readiness probe (ApiVersions v0, correlation id 0x5E7A).
"""

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

MARK = "Completed request:"


def error_codes(node):
    """Every non-zero errorCode anywhere in a response."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "errorCode" and isinstance(v, int) and v != 0:
                yield v
            else:
                yield from error_codes(v)
    elif isinstance(node, list):
        for v in node:
            yield from error_codes(v)


def parse(path):
    versions = defaultdict(set)  # (api key, name) -> versions
    errors = Counter()  # (name, error code) -> count
    with open(path, errors="replace") as f:
        for line in f:
            i = line.find(MARK)
            if i < 0:
                continue
            body = line[i + len(MARK) :].rstrip()
            body = body.rsplit(" (kafka.request.logger)", 1)[0]
            try:
                entry = json.loads(body)
            except json.JSONDecodeError:
                continue
            if entry.get("listener") != "PLAINTEXT":
                continue
            header = entry["requestHeader"]
            name, key, version = header["requestApiKeyName"], header["requestApiKey"], header["requestApiVersion"]
            if key == 18 and version == 0 and header.get("correlationId") == 0x5E7A:
                continue  # conftest.answers_api_versions
            versions[(key, name)].add(version)
            for code in error_codes(entry.get("response", {})):
                errors[(name, code)] += 1
    return versions, errors


def main(paths):
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    columns = []
    for p in paths:
        label = Path(p).parent.name.rstrip("0123456789") if Path(p).name == "broker.log" else Path(p).name
        if label.endswith("current"):
            continue  # pytest's "*current" symlink to the latest run of the same test
        columns.append((label, *parse(p)))
    apis = sorted({api for _, versions, _ in columns for api in versions})
    print("| API (key) | " + " | ".join(label for label, _, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for key, name in apis:
        cells = [",".join(map(str, sorted(v[(key, name)]))) if (key, name) in v else "" for _, v, _ in columns]
        print(f"| {name} ({key}) | " + " | ".join(cells) + " |")
    print()
    for label, _, errors in columns:
        if errors:
            listed = ", ".join(f"{name} error {code} x{n}" for (name, code), n in sorted(errors.items()))
            print(f"- {label}: {listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
