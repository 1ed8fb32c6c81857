"""Admin APIs as a user sees them through confluent-kafka's AdminClient, pinned to Apache Kafka 4.1.

Topic lifecycle (CreateTopics, DeleteTopics, CreatePartitions), topic configs
(DescribeConfigs, IncrementalAlterConfigs, legacy AlterConfigs), DescribeCluster,
DeleteRecords, ListOffsets and topic auto-creation through Metadata. Each test
asserts the error code (or the visible result) a client gets; a few checks go
through raw Metadata requests (kafka_wire), where librdkafka would hide the answer
or auto-create the topic it is asked about.

Apache Kafka's brokers learn of a topic creation or deletion from the metadata log
a moment after CreateTopics/DeleteTopics return, so checks of what Metadata says
afterwards poll (support.wait_until); none of them measures time.
"""

import time

import kafka_wire as wire
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from support import kafka_error_code, wait_for_partition_leaders, wait_until

TIMEOUT_S = 30

# Every topic config Apache Kafka 4.1 describes for a topic created without
# overrides, on a broker with no log.* settings of its own, and its value.
# (message.downconversion.enable is gone since 4.0, KIP-724.)
TOPIC_CONFIG_DEFAULTS = {
    "cleanup.policy": "delete",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.type": "producer",
    "compression.zstd.level": "3",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000",
    "flush.messages": "9223372036854775807",
    "flush.ms": "9223372036854775807",
    "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "4096",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": "9223372036854775807",
    "max.message.bytes": "1048588",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": "1073741824",
    "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0",
    "segment.ms": "604800000",
    "unclean.leader.election.enable": "false",
}

# KRaft writes a cluster-wide min.insync.replicas record when the metadata log is
# formatted, so Apache Kafka reports this one as DYNAMIC_DEFAULT_BROKER_CONFIG rather
# than DEFAULT_CONFIG. Either tells a user "not set on this topic"; the value is pinned.
NOT_SET_ON_TOPIC = {ConfigSource.DEFAULT_CONFIG, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG}
SOURCE_MAY_BE_CLUSTER_DEFAULT = {"min.insync.replicas"}

DEFAULT = ConfigSource.DEFAULT_CONFIG.value
DYNAMIC_TOPIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value


# ---- helpers ------------------------------------------------------------------------
def admin_client(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(broker, admin, name, partitions=1, config=None):
    """Create a topic and wait until every partition has a leader that serves it."""
    topic = NewTopic(name, partitions, 1, config=config or {})
    admin.create_topics([topic], operation_timeout=TIMEOUT_S)[name].result(timeout=TIMEOUT_S)
    wait_for_partitions(broker, name, partitions)
    wait_for_partition_leaders(broker.bootstrap, name, partitions, TIMEOUT_S)


def create_error(admin, topic: NewTopic, validate_only=False):
    """Error code CreateTopics gives for one topic (0 = created)."""
    futures = admin.create_topics([topic], validate_only=validate_only, operation_timeout=TIMEOUT_S)
    return kafka_error_code(futures[topic.topic])


def raw_metadata(broker, topics, allow_auto_topic_creation=False):
    """Metadata v8 straight from the broker (librdkafka's list_topics may auto-create)."""
    with wire.Connection(broker.bootstrap) as conn:
        body = conn.request(wire.METADATA, 8, wire.metadata_v8(topics, allow_auto_topic_creation))
    return wire.parse_metadata_v8(body)


def topic_error(broker, topic, allow_auto_topic_creation=False):
    return raw_metadata(broker, [topic], allow_auto_topic_creation)["topics"][topic]["error_code"]


def wait_for_partitions(broker, topic, count):
    """Wait until Metadata shows `topic` with `count` partitions, each with a leader."""

    def ready():
        t = raw_metadata(broker, [topic])["topics"][topic]
        parts = t["partitions"] or []
        return t["error_code"] == 0 and len(parts) == count and all(p["leader"] >= 0 for p in parts)

    wait_until(ready, f"Metadata shows {topic} with {count} partitions and leaders", TIMEOUT_S)


def wait_for_unknown(broker, topic):
    wait_until(
        lambda: topic_error(broker, topic) == wire.UNKNOWN_TOPIC_OR_PARTITION,
        f"Metadata says {topic} is unknown",
        TIMEOUT_S,
    )


def describe_topic_configs(admin, topic):
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource], request_timeout=TIMEOUT_S)[resource].result(timeout=TIMEOUT_S)


def wait_for_configs(admin, topic, expected):
    """Wait until DescribeConfigs shows {name: (value, source)} for `topic`; returns all its entries.

    Apache Kafka's broker answers DescribeConfigs from its metadata cache, which
    applies an accepted (Incremental)AlterConfigs a moment later.
    """
    last = {}

    def matches():
        configs = describe_topic_configs(admin, topic)
        last.update({n: (configs[n].value, configs[n].source) if n in configs else None for n in expected})
        return configs if last == expected else None

    deadline = time.monotonic() + TIMEOUT_S
    while True:
        configs = matches()
        if configs is not None:
            return configs
        assert time.monotonic() < deadline, f"configs of {topic}: expected {expected}, still {last}"
        time.sleep(0.1)


def produce_sync(broker, topic, records, partition=0, **config):
    """Produce (value, timestamp_ms) pairs to one partition; returns their offsets, failing on any error."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", **config})
    reports = []

    def delivered(err, msg):
        reports.append((err, msg.offset()))

    for value, timestamp in records:
        kwargs = {"timestamp": timestamp} if timestamp is not None else {}
        producer.produce(topic, value=value, partition=partition, on_delivery=delivered, **kwargs)
    remaining = producer.flush(TIMEOUT_S)
    assert remaining == 0, f"{remaining} records not delivered within {TIMEOUT_S} s"
    errors = [err for err, _ in reports if err is not None]
    assert not errors, f"produce to {topic}-{partition} failed: {errors}"
    return [offset for _, offset in reports]


def list_offset(admin, topic, partition, spec):
    tp = TopicPartition(topic, partition)
    return admin.list_offsets({tp: spec}, request_timeout=TIMEOUT_S)[tp].result(timeout=TIMEOUT_S)


# ---- CreateTopics -----------------------------------------------------------------------
def test_create_topic_appears_in_metadata_with_one_replica_per_partition(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "orders", partitions=3)

    md = raw_metadata(broker, ["orders"])
    (node,) = md["brokers"]
    assert (node["host"], node["port"]) == ("127.0.0.1", broker.port)
    topic = md["topics"]["orders"]
    assert topic["is_internal"] is False
    assert sorted(p["index"] for p in topic["partitions"]) == [0, 1, 2]
    for p in topic["partitions"]:
        assert p["error_code"] == 0
        assert p["leader"] == node["node_id"]
        assert p["replicas"] == [node["node_id"]]
        assert p["isr"] == [node["node_id"]]

    # The new topic takes records in every partition.
    for partition in range(3):
        assert produce_sync(broker, "orders", [(b"first", None)], partition=partition) == [0]


def test_create_existing_topic_is_topic_already_exists(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "dup", partitions=2)
    assert create_error(admin, NewTopic("dup", 2, 1)) == KafkaError.TOPIC_ALREADY_EXISTS
    # Different settings do not matter: the name is taken.
    assert create_error(admin, NewTopic("dup", 5, 1)) == KafkaError.TOPIC_ALREADY_EXISTS
    assert len(raw_metadata(broker, ["dup"])["topics"]["dup"]["partitions"]) == 2


def test_create_topic_with_invalid_name_is_invalid_topic_exception(broker):
    admin = admin_client(broker)
    bad = ["bad name!", "a" * 250, ".", "..", "slash/name", "ünïcode"]
    topics = [NewTopic(name, 1, 1) for name in bad] + [NewTopic("fine.name-1_x", 1, 1)]
    futures = admin.create_topics(topics, operation_timeout=TIMEOUT_S)
    # One request, one answer per topic: the valid one is created regardless.
    got = {name: kafka_error_code(f) for name, f in futures.items()}
    assert got == {**{name: KafkaError.TOPIC_EXCEPTION for name in bad}, "fine.name-1_x": 0}

    # A name that differs from an existing one only in '.' versus '_' collides
    # (their metric names would be the same).
    assert create_error(admin, NewTopic("fine_name-1_x", 1, 1)) == KafkaError.TOPIC_EXCEPTION
    wait_for_partitions(broker, "fine.name-1_x", 1)
    assert topic_error(broker, "fine_name-1_x") == wire.UNKNOWN_TOPIC_OR_PARTITION


def test_create_topic_with_bad_partition_count_or_replication_factor(broker):
    admin = admin_client(broker)
    assert create_error(admin, NewTopic("zero-partitions", 0, 1)) == KafkaError.INVALID_PARTITIONS
    # One broker cannot hold three replicas.
    assert create_error(admin, NewTopic("three-replicas", 1, 3)) == KafkaError.INVALID_REPLICATION_FACTOR
    assert create_error(admin, NewTopic("zero-replicas", 1, 0)) == KafkaError.INVALID_REPLICATION_FACTOR
    for name in ("zero-partitions", "three-replicas", "zero-replicas"):
        assert topic_error(broker, name) == wire.UNKNOWN_TOPIC_OR_PARTITION, f"{name} was created"

    # -1 for both means the broker's defaults: num.partitions (1 here) and one replica.
    assert create_error(admin, NewTopic("broker-defaults", -1, -1)) == 0
    wait_for_partitions(broker, "broker-defaults", 1)


def test_create_topic_with_bad_config_is_invalid_config(broker):
    admin = admin_client(broker)
    bad = {
        "unknown-key": {"no.such.config": "1"},
        "not-a-number": {"retention.ms": "a week"},
        "not-a-policy": {"cleanup.policy": "sometimes"},
        # Removed in Kafka 4.0 (KIP-724): no longer a topic config.
        "removed-key": {"message.downconversion.enable": "true"},
    }
    for name, config in bad.items():
        assert create_error(admin, NewTopic(name, 1, 1, config=config)) == KafkaError.INVALID_CONFIG, config
    for name in bad:
        assert topic_error(broker, name) == wire.UNKNOWN_TOPIC_OR_PARTITION, f"{name} was created"


def test_create_topic_validate_only_creates_nothing(broker):
    admin = admin_client(broker)
    assert create_error(admin, NewTopic("dry-run", 4, 1), validate_only=True) == 0
    # Validation still reports what a real creation would.
    assert create_error(admin, NewTopic("dry-run-bad", 0, 1), validate_only=True) == KafkaError.INVALID_PARTITIONS
    assert create_error(admin, NewTopic("dry run", 1, 1), validate_only=True) == KafkaError.TOPIC_EXCEPTION

    assert topic_error(broker, "dry-run") == wire.UNKNOWN_TOPIC_OR_PARTITION
    # Had the dry run created it, this would be TOPIC_ALREADY_EXISTS.
    create_topic(broker, admin, "dry-run", partitions=2)


# ---- DeleteTopics -------------------------------------------------------------------------
def test_delete_topic_removes_it_and_its_records(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "doomed", partitions=2)
    assert produce_sync(broker, "doomed", [(b"a", None), (b"b", None)]) == [0, 1]

    admin.delete_topics(["doomed"], operation_timeout=TIMEOUT_S)["doomed"].result(timeout=TIMEOUT_S)
    wait_for_unknown(broker, "doomed")
    assert "doomed" not in admin.list_topics(timeout=TIMEOUT_S).topics

    # The name is free again, and the new topic starts empty.
    def recreated():
        return create_error(admin, NewTopic("doomed", 1, 1)) == 0

    wait_until(recreated, "doomed can be created again", TIMEOUT_S, interval_s=0.5)
    wait_for_partitions(broker, "doomed", 1)
    wait_for_partition_leaders(broker.bootstrap, "doomed", 1, TIMEOUT_S)
    assert list_offset(admin, "doomed", 0, OffsetSpec.latest()).offset == 0


def test_delete_unknown_topic_is_unknown_topic_or_partition(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "keeper")
    futures = admin.delete_topics(["never-created", "keeper"], operation_timeout=TIMEOUT_S)
    assert kafka_error_code(futures["never-created"]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert kafka_error_code(futures["keeper"]) == 0


# ---- CreatePartitions -----------------------------------------------------------------------
def test_create_partitions_grows_a_topic(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "growing", partitions=3)

    # validate_only changes nothing.
    f = admin.create_partitions([NewPartitions("growing", 8)], validate_only=True, operation_timeout=TIMEOUT_S)
    assert kafka_error_code(f["growing"]) == 0
    wait_for_partitions(broker, "growing", 3)

    f = admin.create_partitions([NewPartitions("growing", 5)], operation_timeout=TIMEOUT_S)
    assert kafka_error_code(f["growing"]) == 0
    wait_for_partitions(broker, "growing", 5)
    assert produce_sync(broker, "growing", [(b"new partition", None)], partition=4) == [0]
    assert list_offset(admin, "growing", 4, OffsetSpec.latest()).offset == 1


def test_create_partitions_cannot_shrink_or_stay(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "fixed", partitions=3)
    for count in (2, 3):
        f = admin.create_partitions([NewPartitions("fixed", count)], operation_timeout=TIMEOUT_S)
        assert kafka_error_code(f["fixed"]) == KafkaError.INVALID_PARTITIONS, f"to {count}"
    f = admin.create_partitions([NewPartitions("no-such-topic", 4)], operation_timeout=TIMEOUT_S)
    assert kafka_error_code(f["no-such-topic"]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    wait_for_partitions(broker, "fixed", 3)


# ---- DescribeConfigs / IncrementalAlterConfigs / AlterConfigs ---------------------------------
def test_describe_configs_lists_every_topic_config_with_its_default(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "described", config={"retention.ms": "3600000"})
    configs = describe_topic_configs(admin, "described")

    values = {name: entry.value for name, entry in configs.items()}
    assert values == {**TOPIC_CONFIG_DEFAULTS, "retention.ms": "3600000"}

    override = configs["retention.ms"]
    assert override.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert override.is_default is False
    for name, entry in configs.items():
        assert entry.is_sensitive is False, name
        assert entry.is_read_only is False, name
        if name == "retention.ms":
            continue
        if name in SOURCE_MAY_BE_CLUSTER_DEFAULT:
            assert entry.source in {s.value for s in NOT_SET_ON_TOPIC}, name
        else:
            assert entry.source == ConfigSource.DEFAULT_CONFIG.value, (name, entry.source)
            assert entry.is_default is True, name


def test_describe_configs_of_unknown_topic_is_unknown_topic_or_partition(broker):
    admin = admin_client(broker)
    resource = ConfigResource(ResourceType.TOPIC, "not-there")
    future = admin.describe_configs([resource], request_timeout=TIMEOUT_S)[resource]
    assert kafka_error_code(future) == KafkaError.UNKNOWN_TOPIC_OR_PART


def incremental(admin, topic, *ops):
    """IncrementalAlterConfigs on one topic; ops are (name, value, AlterConfigOpType). Returns the error code."""
    entries = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    return kafka_error_code(admin.incremental_alter_configs([resource])[resource])


def test_incremental_alter_configs_set_then_delete(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "tuned")

    assert incremental(admin, "tuned", ("retention.ms", "3600000", AlterConfigOpType.SET)) == 0
    configs = wait_for_configs(admin, "tuned", {"retention.ms": ("3600000", DYNAMIC_TOPIC)})
    assert configs["retention.ms"].is_default is False

    assert incremental(admin, "tuned", ("retention.ms", None, AlterConfigOpType.DELETE)) == 0
    configs = wait_for_configs(admin, "tuned", {"retention.ms": ("604800000", DEFAULT)})
    assert configs["retention.ms"].is_default is True

    # APPEND to a list config starts from the default value.
    assert incremental(admin, "tuned", ("cleanup.policy", "compact", AlterConfigOpType.APPEND)) == 0
    wait_for_configs(admin, "tuned", {"cleanup.policy": ("delete,compact", DYNAMIC_TOPIC)})


def test_incremental_alter_configs_rejects_bad_changes(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "guarded")
    assert incremental(admin, "guarded", ("retention.ms", "soon", AlterConfigOpType.SET)) == KafkaError.INVALID_CONFIG
    assert incremental(admin, "guarded", ("no.such.config", "1", AlterConfigOpType.SET)) == KafkaError.INVALID_CONFIG
    assert (
        incremental(admin, "nobody", ("retention.ms", "1000", AlterConfigOpType.SET))
        == KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    # Nothing was changed by the rejected requests: a later accepted change is
    # the only one visible once it has been applied.
    assert incremental(admin, "guarded", ("segment.ms", "7200000", AlterConfigOpType.SET)) == 0
    wait_for_configs(
        admin, "guarded", {"segment.ms": ("7200000", DYNAMIC_TOPIC), "retention.ms": ("604800000", DEFAULT)}
    )


def test_legacy_alter_configs_replaces_all_topic_overrides(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "legacy", config={"max.message.bytes": "20000", "retention.ms": "3600000"})

    # AlterConfigs (not incremental) sets the topic's whole override set:
    # what it does not name goes back to the default.
    resource = ConfigResource(ResourceType.TOPIC, "legacy", set_config={"segment.ms": "7200000"})
    assert kafka_error_code(admin.alter_configs([resource])[resource]) == 0

    expected = {
        "segment.ms": ("7200000", DYNAMIC_TOPIC),
        "max.message.bytes": ("1048588", DEFAULT),
        "retention.ms": ("604800000", DEFAULT),
    }
    wait_for_configs(admin, "legacy", expected)

    # A rejected AlterConfigs changes nothing; the next accepted one shows alone.
    bad = ConfigResource(ResourceType.TOPIC, "legacy", set_config={"segment.ms": "never"})
    assert kafka_error_code(admin.alter_configs([bad])[bad]) == KafkaError.INVALID_CONFIG
    good = ConfigResource(ResourceType.TOPIC, "legacy", set_config={"segment.ms": "7200000", "retention.ms": "5000"})
    assert kafka_error_code(admin.alter_configs([good])[good]) == 0
    wait_for_configs(admin, "legacy", {**expected, "retention.ms": ("5000", DYNAMIC_TOPIC)})


# ---- DescribeCluster ---------------------------------------------------------------------------
def test_describe_cluster_shows_the_one_broker(broker):
    admin = admin_client(broker)
    cluster = admin.describe_cluster(request_timeout=TIMEOUT_S).result(timeout=TIMEOUT_S)
    assert isinstance(cluster.cluster_id, str) and cluster.cluster_id
    (node,) = cluster.nodes
    assert (node.host, node.port) == ("127.0.0.1", broker.port)
    assert cluster.controller is not None and cluster.controller.id == node.id
    # The same cluster id and broker id through Metadata.
    md = raw_metadata(broker, [])
    assert md["cluster_id"] == cluster.cluster_id
    assert [b["node_id"] for b in md["brokers"]] == [node.id]


# ---- DeleteRecords -------------------------------------------------------------------------------
def test_delete_records_moves_the_log_start_offset(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "trimmed", partitions=2)
    values = [f"r{i}".encode() for i in range(10)]
    assert produce_sync(broker, "trimmed", [(v, None) for v in values]) == list(range(10))

    tp = TopicPartition("trimmed", 0, 4)
    deleted = admin.delete_records([tp], request_timeout=TIMEOUT_S)[tp].result(timeout=TIMEOUT_S)
    assert deleted.low_watermark == 4
    assert list_offset(admin, "trimmed", 0, OffsetSpec.earliest()).offset == 4
    assert list_offset(admin, "trimmed", 0, OffsetSpec.latest()).offset == 10

    # A consumer starting from the beginning starts at the new log start.
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "trimmed-reader", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition("trimmed", 0, OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 6 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.value()))
        assert got == list(zip(range(4, 10), values[4:]))
    finally:
        consumer.close()

    # Moving the start backwards is a no-op, not an error.
    tp = TopicPartition("trimmed", 0, 2)
    assert admin.delete_records([tp])[tp].result(timeout=TIMEOUT_S).low_watermark == 4
    # Beyond the high watermark is an error; -1 means "up to the high watermark".
    tp = TopicPartition("trimmed", 0, 11)
    assert kafka_error_code(admin.delete_records([tp])[tp]) == KafkaError.OFFSET_OUT_OF_RANGE
    tp = TopicPartition("trimmed", 0, -1)
    assert admin.delete_records([tp])[tp].result(timeout=TIMEOUT_S).low_watermark == 10
    assert list_offset(admin, "trimmed", 0, OffsetSpec.earliest()).offset == 10
    # The other partition is untouched and empty: 0 is its high watermark, 1 is beyond.
    tp = TopicPartition("trimmed", 1, 1)
    assert kafka_error_code(admin.delete_records([tp])[tp]) == KafkaError.OFFSET_OUT_OF_RANGE


# ---- ListOffsets ---------------------------------------------------------------------------------
def test_list_offsets_earliest_latest_max_timestamp_and_by_time(broker):
    admin = admin_client(broker)
    create_topic(broker, admin, "timed", partitions=2)
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
        assert list_offset(admin, "timed", 0, spec).offset == 0
    # No records, no maximum timestamp.
    assert list_offset(admin, "timed", 0, OffsetSpec.max_timestamp()).offset == -1

    # CreateTime timestamps out of order; the maximum is the second record's.
    t0 = (int(time.time()) - 3600) * 1000
    deltas = [1000, 5000, 3000, 2000, 4000]
    records = [(f"t{i}".encode(), t0 + d) for i, d in enumerate(deltas)]
    # Partition 0: all five in one batch. Partition 1: one batch per record.
    assert produce_sync(broker, "timed", records, partition=0, **{"linger.ms": 200}) == [0, 1, 2, 3, 4]
    for i, record in enumerate(records):
        assert produce_sync(broker, "timed", [record], partition=1) == [i]

    for partition in (0, 1):
        assert list_offset(admin, "timed", partition, OffsetSpec.earliest()).offset == 0
        assert list_offset(admin, "timed", partition, OffsetSpec.latest()).offset == 5
        newest = list_offset(admin, "timed", partition, OffsetSpec.max_timestamp())
        assert (newest.offset, newest.timestamp) == (1, t0 + 5000), f"partition {partition}"
        # By time: the first offset whose timestamp is at or after the target.
        at = list_offset(admin, "timed", partition, OffsetSpec.for_timestamp(t0 + 2500))
        assert (at.offset, at.timestamp) == (1, t0 + 5000), f"partition {partition}"
        exact = list_offset(admin, "timed", partition, OffsetSpec.for_timestamp(t0 + 1000))
        assert (exact.offset, exact.timestamp) == (0, t0 + 1000), f"partition {partition}"
        assert list_offset(admin, "timed", partition, OffsetSpec.for_timestamp(t0 + 9999)).offset == -1


# ---- auto-creation through Metadata ----------------------------------------------------------------
@pytest.mark.broker_config({"num.partitions": "3"})
def test_producing_to_a_missing_topic_creates_it_with_num_partitions(broker):
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    reports = []
    producer.produce("made-on-demand", value=b"hello", on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    assert reports == [None]
    wait_for_partitions(broker, "made-on-demand", 3)

    # A Metadata request that allows it creates the topic. Apache Kafka 4.1 creates
    # it asynchronously and answers the first request with UNKNOWN_TOPIC_OR_PARTITION
    # (older brokers said LEADER_NOT_AVAILABLE); clients retry either, and a broker
    # that answers with the created topic at once is just as good.
    first = topic_error(broker, "asked-for", allow_auto_topic_creation=True)
    assert first in (0, wire.UNKNOWN_TOPIC_OR_PARTITION, wire.LEADER_NOT_AVAILABLE)
    wait_for_partitions(broker, "asked-for", 3)
    # One that does not allow it creates nothing.
    assert topic_error(broker, "not-asked", allow_auto_topic_creation=False) == wire.UNKNOWN_TOPIC_OR_PARTITION
    # An illegal name is not created either.
    assert topic_error(broker, "bad name!", allow_auto_topic_creation=True) == wire.INVALID_TOPIC_EXCEPTION
    time.sleep(1)  # give a wrongly started creation time to show
    all_topics = raw_metadata(broker, None)["topics"]
    assert "not-asked" not in all_topics and "bad name!" not in all_topics


@pytest.mark.broker_config({"auto.create.topics.enable": "false"})
def test_no_auto_creation_when_disabled(broker):
    assert topic_error(broker, "wished-for", allow_auto_topic_creation=True) == wire.UNKNOWN_TOPIC_OR_PARTITION

    # A producer cannot deliver to it.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 3000})
    reports = []
    producer.produce("wished-for", value=b"x", on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(TIMEOUT_S) == 0
    assert len(reports) == 1 and reports[0] is not None, reports

    all_topics = raw_metadata(broker, None)["topics"]
    assert "wished-for" not in all_topics
    # Explicit creation still works.
    create_topic(broker, admin_client(broker), "wished-for", partitions=2)
