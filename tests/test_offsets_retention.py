"""offsets.retention.minutes: committed offsets of a group without members expire.

Kafka keeps the offsets of an empty group for `offsets.retention.minutes` after the
group emptied (for a consumer that only commits, after each commit), then deletes
them, and the group with them. The smallest retention Kafka accepts is one minute,
so this test waits a little over a minute; `offsets.retention.check.interval.ms`
makes the check run every second.
"""

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until, when_coordinator_ready

TOPIC = "kept"
GROUP = "short-lived"


def committed(bootstrap, group):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=30)]
    finally:
        consumer.close()


def listed_groups(admin):
    return {g.group_id for g in admin.list_consumer_groups().result(30).valid}


@pytest.mark.broker_config({"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000"})
def test_offsets_of_an_empty_group_expire_after_retention(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, 2, 1)], operation_timeout=30).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(TOPIC, value=b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0

    # A consumer that assigns partitions itself and commits: Kafka's "simple" group.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    offsets = [TopicPartition(TOPIC, 0, 3), TopicPartition(TOPIC, 1, 4)]
    when_coordinator_ready(lambda: consumer.commit(offsets=offsets, asynchronous=False), "offsets committed")
    committed_at = time.monotonic()
    consumer.close()
    assert committed(broker.bootstrap, GROUP) == [3, 4]
    assert GROUP in listed_groups(admin)

    # Still there, every time we look, for the first 40 s of the minute.
    def kept_for_40_s():
        assert committed(broker.bootstrap, GROUP) == [3, 4], "offsets expired before offsets.retention.minutes"
        return time.monotonic() - committed_at >= 40

    wait_until(kept_for_40_s, "offsets kept for 40 s", timeout_s=60, interval_s=2)

    # Gone after it (the check runs every second), and the group with them.
    wait_until(lambda: committed(broker.bootstrap, GROUP) == [-1001, -1001], "offsets expired", timeout_s=60, interval_s=1)
    assert time.monotonic() - committed_at >= 59
    wait_until(lambda: GROUP not in listed_groups(admin), "the group without offsets is deleted", timeout_s=30, interval_s=1)
