"""Segments roll on segment.bytes and retention.bytes deletes whole old segments.

What a user sees: on disk, a partition directory of segments named by 20-digit base offset
(.log, .index, .timeindex, Kafka's layout); the earliest offset moves forward once the log is
over retention.bytes, and everything from the new earliest offset on is still readable in order.
"""

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from support import wait_until

SEGMENT_BYTES = 1024 * 1024  # Kafka 4's minimum segment.bytes
RETENTION_BYTES = 2 * SEGMENT_BYTES
RECORD_BYTES = 10_000
RECORDS = 700  # about 7 MB: several segments past the retention limit


def offsets(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        c.close()


@pytest.mark.broker_config({"log.retention.check.interval.ms": "500"})
def test_segments_roll_and_retention_bytes_deletes_oldest(broker):
    topic = f"retention-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    configs = {"segment.bytes": str(SEGMENT_BYTES), "retention.bytes": str(RETENTION_BYTES)}
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(timeout=30)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, value=f"{i:08d}".encode() + b"x" * (RECORD_BYTES - 8), partition=0)
    assert producer.flush(60) == 0

    # ferrolog keeps partitions directly in log.dirs; the Apache start script uses data/log.
    dirs = [d for d in broker.data_dir.rglob(f"{topic}-0") if d.is_dir()]
    assert len(dirs) == 1, dirs
    part_dir = dirs[0]
    logs = sorted(p.name for p in part_dir.glob("*.log"))
    assert len(logs) >= 3, f"7 MB in 1 MiB segments should have rolled: {logs}"
    assert all(len(n) == len("00000000000000000000.log") and n[:20].isdigit() for n in logs), logs
    # Retention runs every log.retention.check.interval.ms and may take more than one pass.
    def retained():
        low, high = offsets(broker.bootstrap, topic)
        return (high - low) * RECORD_BYTES <= RETENTION_BYTES + 2 * SEGMENT_BYTES

    wait_until(retained, "retention to delete old segments", timeout_s=60)

    low, high = offsets(broker.bootstrap, topic)
    assert high == RECORDS
    kept_bytes = (high - low) * RECORD_BYTES
    assert kept_bytes >= RETENTION_BYTES - SEGMENT_BYTES, f"deleted too much: kept {high - low} records"
    assert kept_bytes <= RETENTION_BYTES + 2 * SEGMENT_BYTES, f"kept too much: {high - low} records"
    # The log start moves (and is persisted) before the segments below it are unlinked, as in
    # Kafka, where deletion is asynchronous: wait for the files rather than race the unlink.
    def first_segment_is_log_start():
        return int(sorted(part_dir.glob("*.log"))[0].name[:20]) == low

    wait_until(first_segment_is_log_start, "segments below the log start to be unlinked", timeout_s=30)
    remaining = sorted(part_dir.glob("*.log"))
    for seg in remaining[:-1]:  # closed segments carry both indexes
        assert seg.with_suffix(".index").exists() and seg.with_suffix(".timeindex").exists()

    # No group coordination here: without auto-commit, close() has nothing to send.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, low)])
    seen, deadline = [], time.monotonic() + 60
    while len(seen) < high - low and time.monotonic() < deadline:
        m = consumer.poll(1.0)
        if m is not None and m.error() is None:
            seen.append((m.offset(), int(m.value()[:8])))
    consumer.close()
    assert seen == [(o, o) for o in range(low, high)]
