"""Kafka's own Java client (kafka-clients 4.1) and the CLI tools shipped with Kafka.

The Java client is the reference client: what it accepts is what Kafka users
depend on. The CLI tools are what an operator types first, so they must work
unchanged against the broker.
"""

import json
import re

import roundtrip
from support import java

TOOLS = "org.apache.kafka.tools"


def test_java_client_round_trip(broker, tmp_path):
    """Admin creates the topic; idempotent KafkaProducer with every codec; KafkaConsumer.assign
    reads everything back exactly; offsetsForTimes finds the right offsets."""
    spec = roundtrip.make_spec("java-roundtrip")
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec))

    java("dev.ferrolog.tests.RoundTrip", broker.bootstrap, spec_path, result_path)

    result = json.loads(result_path.read_text())
    roundtrip.check(spec, result)
    # The producer set CreateTime explicitly; the broker must keep it (log.message.timestamp.type).
    assert {r["timestamp_type"] for r in result["records"]} == {"CreateTime"}


def _describe(bootstrap, pattern):
    out = java(f"{TOOLS}.TopicCommand", "--bootstrap-server", bootstrap, "--describe", "--topic", pattern).stdout
    topics, partitions = {}, {}
    for line in out.splitlines():
        m = re.match(r"Topic: (\S+)\s+TopicId: (\S+)\s+PartitionCount: (\d+)\s+ReplicationFactor: (\d+)", line)
        if m:
            topics[m[1]] = {"id": m[2], "partitions": int(m[3]), "replication_factor": int(m[4])}
            continue
        m = re.match(r"\s+Topic: (\S+)\s+Partition: (\d+)\s+Leader: (\S+)\s+Replicas: (\S+)\s+Isr: (\S*)", line.rstrip() + " ")
        if m:
            partitions[(m[1], int(m[2]))] = {"leader": m[3], "replicas": m[4], "isr": m[5]}
    return out, topics, partitions


def test_kafka_cli_tools(broker):
    """TopicCommand --create/--describe, ConsoleProducer -> ConsoleConsumer with keys and
    headers, VerifiableProducer acks everything, GetOffsetShell agrees on the end offsets."""
    b = broker.bootstrap

    for topic, count in (("cli-console", 1), ("cli-verifiable", 3)):
        out = java(f"{TOOLS}.TopicCommand", "--bootstrap-server", b, "--create", "--topic", topic,
                   "--partitions", count, "--replication-factor", 1).stdout  # fmt: skip
        assert f"Created topic {topic}." in out

    out, topics, partitions = _describe(b, "cli-.*")
    assert {t: d["partitions"] for t, d in topics.items()} == {"cli-console": 1, "cli-verifiable": 3}, out
    assert all(d["replication_factor"] == 1 and d["id"] != "AAAAAAAAAAAAAAAAAAAAAA" for d in topics.values()), out
    assert sorted(partitions) == [("cli-console", 0), ("cli-verifiable", 0), ("cli-verifiable", 1), ("cli-verifiable", 2)], out
    for tp, d in partitions.items():
        assert d["leader"].isdigit(), f"{tp} has no leader: {out}"
        assert d["replicas"] == d["leader"] and d["isr"] == d["leader"], f"{tp}: single node must be the only replica and in ISR: {out}"

    # ConsoleProducer's default line format with parse.headers and parse.key:
    # "h1:v1,h2:v2<TAB>key<TAB>value".
    lines = [f"seq:{i},codec:zstd\tkey-{i % 3}\tconsole value {i}" for i in range(50)]
    java(f"{TOOLS}.ConsoleProducer", "--bootstrap-server", b, "--topic", "cli-console",
         "--property", "parse.key=true", "--property", "parse.headers=true",
         "--compression-codec", "zstd", "--request-required-acks", "all",
         input_text="\n".join(lines) + "\n")  # fmt: skip

    # No consumer group: --partition with --offset makes the console consumer assign().
    consumed = java(f"{TOOLS}.consumer.ConsoleConsumer", "--bootstrap-server", b, "--topic", "cli-console",
                    "--partition", 0, "--offset", "earliest", "--max-messages", len(lines), "--timeout-ms", 30000,
                    "--property", "print.offset=true", "--property", "print.headers=true",
                    "--property", "print.key=true").stdout.splitlines()  # fmt: skip
    want = [f"Offset:{i}\tseq:{i},codec:zstd\tkey-{i % 3}\tconsole value {i}" for i in range(50)]
    assert consumed == want

    out = java(f"{TOOLS}.VerifiableProducer", "--bootstrap-server", b, "--topic", "cli-verifiable",
               "--max-messages", 1000, "--acks", -1, "--repeating-keys", 10).stdout  # fmt: skip
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    errors = [e for e in events if e["name"] == "producer_send_error"]
    assert not errors, errors[:5]
    summary = [e for e in events if e["name"] == "tool_data"]
    assert summary and summary[-1]["sent"] == 1000 and summary[-1]["acked"] == 1000, summary
    acked = [e for e in events if e["name"] == "producer_send_success"]
    assert sorted(int(e["value"]) for e in acked) == list(range(1000))
    offsets = {}
    for e in acked:
        offsets.setdefault(e["partition"], []).append(e["offset"])
    for p, got in offsets.items():
        assert sorted(got) == list(range(len(got))), f"partition {p}: acked offsets not 0..n-1 exactly once"
    assert len(offsets) > 1, "10 repeating keys should hash to more than one of 3 partitions"

    out = java(f"{TOOLS}.GetOffsetShell", "--bootstrap-server", b, "--topic", "cli-verifiable", "--time", -1).stdout
    ends = {int(p): int(o) for _, p, o in (line.rsplit(":", 2) for line in out.split())}
    assert ends == {p: len(offsets.get(p, [])) for p in range(3)}, out
