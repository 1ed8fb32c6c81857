"""The offsets topic stays bounded, and rewriting it loses nothing.

`__consumer_offsets` is compact-only. Apache Kafka's log cleaner compacts it; ferrolog has
no log compaction yet, so its group coordinator rewrites a partition's live state once the
partition holds more than twice that (plus 10,000 records, checked every 30 s) and moves
the log start past the older records. Here one group commits 12,000 times; the rewrite must
happen (ferrolog only: it is ferrolog's mechanism), and after `kill -9` every group's last
commit must be what it was, on both brokers.
"""

from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import TARGET
from support import wait_until, when_coordinator_ready

TOPIC = "positions"
COMMITS = 12_000


def consumer(bootstrap, group):
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})


def committed(bootstrap, group):
    c = consumer(bootstrap, group)
    try:
        return when_coordinator_ready(
            lambda: [(tp.offset, tp.metadata) for tp in c.committed([TopicPartition(TOPIC, 0)], timeout=10)],
            f"committed offsets of {group}",
        )
    finally:
        c.close()


def commit_until_accepted(c, offsets):
    when_coordinator_ready(lambda: c.commit(offsets=offsets, asynchronous=False), "commit accepted")


def log_start(partition_dir):
    f = Path(partition_dir) / "log-start-offset"
    return int(f.read_text()) if f.exists() else 0


def test_offsets_survive_the_rewrite_of_the_offsets_topic(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, 1, 1)], operation_timeout=30).values():
        f.result(30)
    # A quiet group committed once, before the busy one fills the partition they share
    # ("quiet-46" and "busy" both hash to partition 41 of 50, as in Kafka).
    quiet = consumer(broker.bootstrap, "quiet-46")
    commit_until_accepted(quiet, [TopicPartition(TOPIC, 0, 7, metadata="quiet")])
    quiet.close()

    busy = consumer(broker.bootstrap, "busy")
    commit_until_accepted(busy, [TopicPartition(TOPIC, 0, 0)])
    for i in range(1, COMMITS + 1):
        busy.commit(offsets=[TopicPartition(TOPIC, 0, i, metadata=f"m{i}")], asynchronous=i % 200 != 0)
    busy.close()
    assert committed(broker.bootstrap, "busy") == [(COMMITS, f"m{COMMITS}")]

    if TARGET == "ferrolog":
        shared = Path(broker.data_dir) / "__consumer_offsets-41"
        wait_until(lambda: log_start(shared) >= COMMITS, "the busy group's partition was rewritten", timeout_s=90, interval_s=1)

    broker.kill9()
    broker.start()
    assert committed(broker.bootstrap, "busy") == [(COMMITS, f"m{COMMITS}")]
    assert committed(broker.bootstrap, "quiet-46") == [(7, "quiet")]
