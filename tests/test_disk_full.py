"""A full disk: writes fail with KAFKA_STORAGE_ERROR, acknowledged data stays readable, and
the broker log says what happened.

The data directory is a small ext4 file system on a loop device made by the test (root only).
ferrolog only: Apache Kafka takes a failed log directory offline and, with a single log
directory, shuts the broker down, so there is nothing to compare against.
"""

import subprocess
import uuid

import pytest
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import TARGET, Broker

pytestmark = pytest.mark.skipif(TARGET != "ferrolog", reason="Apache Kafka halts when its only log dir fails")

DISK_MB = 48
VALUE_BYTES = 256 * 1024


def consume_all(bootstrap, topic, count, timeout_s=60):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "fetch.max.bytes": 4 * VALUE_BYTES, "max.partition.fetch.bytes": 2 * VALUE_BYTES})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out, deadline = [], time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return out


@pytest.fixture
def small_disk(tmp_path):
    image = tmp_path / "disk.img"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", f"{DISK_MB}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_gives_storage_error_and_reads_go_on(tmp_path, small_disk):
    topic = f"full-{uuid.uuid4().hex[:8]}"
    broker = Broker(tmp_path, overrides={"log.dirs": small_disk / "data", "log.segment.bytes": 8 * 1024 * 1024})
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        producer = Producer({
            "bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
            "message.max.bytes": 2 * VALUE_BYTES, "retries": 0, "enable.idempotence": False,
            "message.timeout.ms": 20000,
        })  # fmt: skip
        acked, errors = [], []

        def on_delivery(err, msg):
            if err is None:
                acked.append((msg.offset(), msg.value()))
            else:
                errors.append(err)

        # The disk holds fewer than DISK_MB / value records; write until the broker refuses.
        for i in range(2 * DISK_MB * 1024 * 1024 // VALUE_BYTES):
            value = bytes([i % 251]) * VALUE_BYTES
            producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
            producer.flush(30)
            if errors:
                break
        assert errors, "the broker accepted more data than the disk holds"
        assert errors[0].code() == KafkaError.KAFKA_STORAGE_ERROR, errors[0]
        assert len(acked) > 10, "the disk should hold some records before it fills"
        # Reads go on: every acknowledged record is there, in order, unchanged.
        assert consume_all(broker.bootstrap, topic, len(acked)) == acked
        log = broker.log_tail(200)
        assert "No space left on device" in log, log
        assert "storage error" in log, log
    finally:
        broker.stop()


def test_start_up_on_a_full_disk_stops_with_the_reason(tmp_path, small_disk):
    """A broker whose first writes fail (here: the controller's metadata log on a full disk)
    exits non-zero with one line naming the file and the reason, instead of running on
    without a listener."""
    data = small_disk / "data"
    (data / "__cluster_metadata-0").mkdir(parents=True)
    # Fill every block; files can still be created (inodes are left), not written.
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk}/filler", "bs=1M"], capture_output=True, check=False)
    broker = Broker(tmp_path, overrides={"log.dirs": data})
    broker.launch()
    try:
        code = broker.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the broker kept running after its metadata log failed:\n{broker.log_tail(40)}")
    finally:
        broker.proc.kill()
        broker.proc.wait()
        broker.proc = None
    assert code != 0
    last = broker.log_tail(1)
    assert "ferrolog stops" in last and "No space left on device" in last, broker.log_tail(40)
    assert str(data / "__cluster_metadata-0") in last, last
