"""Reading a backlog from the disk, as a consumer that fell behind or started late does.

The broker restarts after the writes, so nothing of the backlog is in memory and every
Fetch reads the disk: several partitions at once, each on its share of the fetch's
`fetch.max.bytes` (src/kafka/handlers/fetch.rs), and each partition's next share read
ahead while the response travels (src/read_ahead.rs). Two librdkafka consumers read the
same partitions at once at different speeds, one with `fetch.max.bytes` below its
partitions' limits together and batches larger than its per-partition limit allows
(KIP-74); each must get every record exactly once, in order, with its contents.
"""

import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_for_partition_leaders

TOPIC = "backlog"
PARTITIONS = 4
RECORDS = 40_000
VALUE_BYTES = 1000
TIMEOUT_S = 180


def _value(i):
    return (f"{i:010d}" * (VALUE_BYTES // 10)).encode()


def _produce(bootstrap):
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            # Batches up to 200 KB: larger than consumer A's 64 KiB per-partition limit.
            "batch.size": 200_000,
        }
    )
    errors = []

    def delivered(err, _msg):
        if err is not None:
            errors.append(err)

    for i in range(RECORDS):
        while True:
            try:
                producer.produce(TOPIC, key=str(i).encode(), value=_value(i), partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "records still unacknowledged"
    assert not errors, errors[:5]


def _read_all(bootstrap, name, extra, found):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": name, "enable.auto.commit": False, **extra})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    found[name] = got


def test_two_consumers_read_a_backlog_from_disk(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], operation_timeout=30).values():
        future.result(60)
    _produce(broker.bootstrap)
    broker.restart()
    wait_for_partition_leaders(broker.bootstrap, TOPIC, PARTITIONS, timeout_s=60)

    consumers = {
        # Defaults: 1 MiB per partition, 50 MiB per fetch.
        "defaults": {},
        # 4 partitions x 64 KiB do not fit in 100 KB, and a batch does not fit in 64 KiB.
        "small-fetches": {
            "fetch.max.bytes": 100_000,
            "max.partition.fetch.bytes": 65_536,
            "message.max.bytes": 100_000,
            "receive.message.max.bytes": 1_000_000,
        },
    }
    found = {}
    threads = [threading.Thread(target=_read_all, args=(broker.bootstrap, n, c, found)) for n, c in consumers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S + 30)
    assert sorted(found) == sorted(consumers), f"a consumer did not finish: {sorted(found)}"
    for name, got in found.items():
        for p, records in got.items():
            expected = list(range(p, RECORDS, PARTITIONS))
            assert len(records) == len(expected), f"{name}: partition {p} gave {len(records)} of {len(expected)} records"
            for k, (offset, key, value) in enumerate(records):
                i = expected[k]
                assert offset == k, f"{name}: partition {p}: record #{k} at offset {offset}"
                assert key == str(i).encode() and value == _value(i), f"{name}: partition {p} offset {offset}: wrong record"
