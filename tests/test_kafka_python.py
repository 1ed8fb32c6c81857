"""kafka-python, the pure-Python client: older protocol code paths than the others.

Smaller than the other client tests: the uncompressed and gzip codecs only
(the others need optional native packages), same exact read-back and
offsets_for_times checks.
"""

import time

import roundtrip
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

TIMEOUT_S = 60


def _bytes(s):
    return None if s is None else s.encode()


def _text(b):
    return None if b is None else b.decode()


def test_kafka_python_round_trip(broker):
    """KafkaAdminClient creates the topic; idempotent KafkaProducer (none, gzip); assign()
    reads everything back exactly; offsets_for_times finds the right offsets."""
    # kafka-python cannot send a header whose value is null.
    spec = roundtrip.make_spec(
        "kafka-python-roundtrip", codecs=("none", "gzip"), records_per_codec=200, null_header_values=False
    )
    topic, partitions = spec["topic"], spec["partitions"]

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()

    result = {"acks": [], "start_offsets": {}, "end_offsets": {}, "records": [], "time_queries": []}
    for group in spec["groups"]:
        codec = group["compression"]
        producer = KafkaProducer(
            bootstrap_servers=broker.bootstrap,
            acks="all",
            enable_idempotence=True,
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
        )
        try:
            futures = [
                producer.send(
                    topic,
                    key=_bytes(r["key"]),
                    value=_bytes(r["value"]),
                    partition=r["partition"],
                    timestamp_ms=r["timestamp"],
                    headers=[(k, _bytes(v)) for k, v in r["headers"]],
                )
                for r in group["records"]
            ]
            producer.flush(timeout=TIMEOUT_S)
            for f in futures:
                md = f.get(timeout=TIMEOUT_S)
                result["acks"].append({"partition": md.partition, "offset": md.offset})
        finally:
            producer.close(timeout=TIMEOUT_S)

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        consumer.assign(tps)
        start, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
        result["start_offsets"] = {str(tp.partition): o for tp, o in start.items()}
        result["end_offsets"] = {str(tp.partition): o for tp, o in end.items()}

        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + TIMEOUT_S
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"did not reach end offsets {end}"
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    result["records"].append(
                        {
                            "partition": m.partition,
                            "offset": m.offset,
                            "timestamp": m.timestamp,
                            "key": _text(m.key),
                            "value": _text(m.value),
                            "headers": [[k, _text(v)] for k, v in m.headers],
                        }
                    )

        for q in spec["time_queries"]:
            tp = TopicPartition(topic, q["partition"])
            hit = consumer.offsets_for_times({tp: q["timestamp"]})[tp]
            result["time_queries"].append(dict(q, offset=None if hit is None else hit.offset))
    finally:
        consumer.close()

    roundtrip.check(spec, result)
