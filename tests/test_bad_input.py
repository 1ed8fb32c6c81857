"""Bad input from clients, pinned to Apache Kafka 4.1: what the broker answers, or that it hangs up.

Two kinds of bad input:

  * well-framed requests with content the broker must refuse per partition
    (corrupt CRC, oversized batch, acks=5, two batches, control or transactional
    batches from a plain producer, keyless records on a compacted topic, far-future
    timestamps, idempotent sequence gaps): the client gets an error code and
    nothing is appended;
  * requests the broker cannot or must not parse (frame bigger than
    socket.request.max.bytes, unknown API key, a version it does not serve,
    array counts larger than the frame): it closes that connection, and keeps
    serving everyone else.

Most requests here are built by hand (kafka_wire), since client libraries will not
send them; where a client library can produce the situation, the test also goes
through confluent-kafka's Producer and checks the delivery error a user sees.
"""

import struct
import time

import kafka_wire as wire
import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_for_partition_leaders, wait_until

TIMEOUT_S = 30
TOPIC = "input"


# ---- helpers --------------------------------------------------------------------------
def create_topic(broker, name=TOPIC, partitions=1, config=None):
    """Create a topic and wait until every partition has a leader that serves it."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    future = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})], operation_timeout=TIMEOUT_S)
    future[name].result(timeout=TIMEOUT_S)

    def ready():
        with wire.Connection(broker.bootstrap) as conn:
            md = wire.parse_metadata_v8(conn.request(wire.METADATA, 8, wire.metadata_v8([name], False)))
        parts = md["topics"][name]["partitions"] or []
        return len(parts) == partitions and all(p["leader"] >= 0 for p in parts)

    wait_until(ready, f"{name} has leaders", TIMEOUT_S)
    wait_for_partition_leaders(broker.bootstrap, name, partitions, TIMEOUT_S)


def produce_one(broker, records, topic=TOPIC, partition=0, version=9, acks=-1):
    """One Produce request on a fresh connection; returns that partition's response."""
    with wire.Connection(broker.bootstrap) as conn:
        resp = wire.produce(conn, {topic: {partition: records}}, version=version, acks=acks)
    return resp[(topic, partition)]


def next_offset(broker, topic=TOPIC, partition=0):
    """Append one good record and return its offset: how many records the partition had before."""
    resp = produce_one(broker, wire.record_batch([b"probe"], keys=[b"probe"]), topic, partition)
    assert resp["error_code"] == wire.NONE, resp
    return resp["base_offset"]


def assert_still_serving(broker, *open_conns):
    """Connections opened earlier, and a new one, still get ApiVersions answers."""
    with wire.Connection(broker.bootstrap) as fresh:
        for conn in (*open_conns, fresh):
            resp = wire.parse_api_versions(conn.request(wire.API_VERSIONS, 0, wire.api_versions_v0()), 0)
            assert resp["error_code"] == wire.NONE
            assert wire.PRODUCE in resp["api_keys"]


def batch_with_raw_fields(after_crc):
    """A v2 batch around hand-made bytes from `attributes` onwards, with a correct CRC."""
    crc = wire.crc32c(after_crc)
    return wire.i64(0) + wire.i32(9 + len(after_crc)) + wire.i32(-1) + wire.i8(2) + struct.pack(">I", crc) + after_crc


def batch_fields(records, count, attributes=0, producer_id=-1, producer_epoch=-1, base_sequence=-1):
    """The bytes of a v2 batch from `attributes` onwards, with the record count given separately."""
    now = int(time.time() * 1000)
    return (
        wire.i16(attributes)
        + wire.i32(count - 1)  # lastOffsetDelta
        + wire.i64(now)
        + wire.i64(now)
        + wire.i64(producer_id)
        + wire.i16(producer_epoch)
        + wire.i32(base_sequence)
        + wire.i32(count)
        + records
    )


def deliver(broker, topic, value, key=None, timestamp=None, **config):
    """Produce one record with confluent-kafka; returns the delivery error (None = delivered)."""
    # Refusals are not retriable, so librdkafka reports them at once; the timeout
    # bounds the wait should a broker answer something retriable instead.
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "acks": "all", "message.timeout.ms": TIMEOUT_S * 1000 // 2, **config}
    )
    reports = []
    kwargs = {} if timestamp is None else {"timestamp": timestamp}
    producer.produce(topic, value=value, key=key, on_delivery=lambda err, msg: reports.append(err), **kwargs)
    assert producer.flush(TIMEOUT_S) == 0, "record neither delivered nor failed"
    assert len(reports) == 1
    return reports[0]


def code(err):
    return None if err is None else err.code()


# ---- per-partition errors --------------------------------------------------------------
@pytest.mark.parametrize("version", [7, 9])
def test_corrupt_crc_is_corrupt_message(broker, version):
    create_topic(broker)
    resp = produce_one(broker, wire.record_batch([b"a", b"b"], corrupt_crc=True), version=version)
    assert resp["error_code"] == wire.CORRUPT_MESSAGE
    assert resp["base_offset"] == -1
    assert next_offset(broker) == 0, "the corrupt batch was appended"


def test_batch_larger_than_max_message_bytes_is_message_too_large(broker):
    create_topic(broker, config={"max.message.bytes": "10000"})

    resp = produce_one(broker, wire.record_batch([b"x" * 20_000]))
    assert resp["error_code"] == wire.MESSAGE_TOO_LARGE

    # What a producer sees (its own limit is well above the topic's).
    assert code(deliver(broker, TOPIC, b"y" * 20_000, **{"message.max.bytes": 1_000_000})) == (
        KafkaError.MSG_SIZE_TOO_LARGE
    )
    # Just under the limit, batch overhead included, is fine.
    assert deliver(broker, TOPIC, b"z" * 9_000) is None
    assert next_offset(broker) == 1


def test_acks_5_is_invalid_required_acks(broker):
    create_topic(broker)
    for version in (7, 9):
        resp = produce_one(broker, wire.record_batch([b"a"]), version=version, acks=5)
        assert resp["error_code"] == wire.INVALID_REQUIRED_ACKS, f"Produce v{version}"
    assert next_offset(broker) == 0


def test_two_batches_for_one_partition_is_invalid_record(broker):
    create_topic(broker)
    two = wire.record_batch([b"a"]) + wire.record_batch([b"b"])
    for version in (7, 9):
        assert produce_one(broker, two, version=version)["error_code"] == wire.INVALID_RECORD, f"Produce v{version}"
    assert next_offset(broker) == 0


def test_malformed_record_sets_are_invalid_record(broker):
    create_topic(broker)
    good = wire.record_batch([b"a", b"b"])
    cases = {
        "no batch at all": b"",
        "batch cut short": good[:-3],
        # Produce v3+ carries only magic 2 batches.
        "magic 1 message set": wire.legacy_message_set(b"x"),
        "record count larger than the records": batch_with_raw_fields(batch_fields(wire.record(0, b"x"), 3)),
        # Control batches (transaction markers) are written by the broker only.
        "control batch from a client": batch_with_raw_fields(batch_fields(wire.record(0, b"x"), 1, attributes=0x20)),
    }
    got = {name: produce_one(broker, records)["error_code"] for name, records in cases.items()}
    assert got == {name: wire.INVALID_RECORD for name in cases}
    assert next_offset(broker) == 0


def test_transactional_batch_without_transactional_id_is_refused(broker):
    create_topic(broker)
    transactional = batch_with_raw_fields(batch_fields(wire.record(0, b"x"), 1, attributes=0x10))
    # Apache Kafka authorizes the request's (null) transactional id for any
    # transactional batch, so the answer is an authorization failure.
    assert produce_one(broker, transactional)["error_code"] == wire.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert next_offset(broker) == 0


def test_record_without_key_on_compacted_topic_is_invalid_record(broker):
    create_topic(broker, config={"cleanup.policy": "compact"})
    resp = produce_one(broker, wire.record_batch([b"no key"]))
    assert resp["error_code"] == wire.INVALID_RECORD
    # KIP-467: the response says which record in the batch was refused, and why.
    assert [index for index, _ in resp["record_errors"]] == [0]
    assert resp["error_message"]

    assert code(deliver(broker, TOPIC, b"no key either")) == KafkaError.INVALID_RECORD
    assert deliver(broker, TOPIC, b"keyed", key=b"k") is None
    assert next_offset(broker) == 1


def test_timestamp_too_far_in_the_future_is_invalid_timestamp(broker):
    # message.timestamp.after.max.ms defaults to one hour (KIP-937, Kafka 4.0).
    create_topic(broker)
    two_hours_ahead = int(time.time() * 1000) + 2 * 3600 * 1000
    resp = produce_one(broker, wire.record_batch([b"from the future"], base_timestamp=two_hours_ahead))
    assert resp["error_code"] == wire.INVALID_TIMESTAMP
    assert [index for index, _ in resp["record_errors"]] == [0]
    assert resp["error_message"]

    assert code(deliver(broker, TOPIC, b"late", timestamp=two_hours_ahead)) == KafkaError.INVALID_TIMESTAMP
    # The past is fine: message.timestamp.before.max.ms is unlimited.
    assert produce_one(broker, wire.record_batch([b"old"], base_timestamp=1000))["error_code"] == wire.NONE
    assert next_offset(broker) == 1


def test_unknown_topic_or_partition_in_produce(broker):
    create_topic(broker, partitions=2)
    assert produce_one(broker, wire.record_batch([b"a"]), topic="absent")["error_code"] == (
        wire.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert produce_one(broker, wire.record_batch([b"a"]), partition=2)["error_code"] == wire.UNKNOWN_TOPIC_OR_PARTITION


# ---- idempotent producer sequences -----------------------------------------------------------
def test_idempotent_sequence_gap_and_duplicate(broker):
    create_topic(broker)
    with wire.Connection(broker.bootstrap) as conn:
        pid, epoch = wire.init_producer_id(conn)
        assert pid >= 0 and epoch >= 0

        def batch(seq, *values):
            return wire.record_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)

        def send(records):
            return wire.produce(conn, {TOPIC: {0: records}})[(TOPIC, 0)]

        first = batch(0, b"s0", b"s1")
        resp = send(first)
        assert (resp["error_code"], resp["base_offset"]) == (wire.NONE, 0)

        # Sequences 2..4 never arrived: 5 is out of order and is not appended.
        assert send(batch(5, b"s5"))["error_code"] == wire.OUT_OF_ORDER_SEQUENCE_NUMBER

        # A retry of an acknowledged batch is acknowledged again, at its original
        # offset, and not appended a second time.
        resp = send(first)
        assert (resp["error_code"], resp["base_offset"]) == (wire.NONE, 0)

        resp = send(batch(2, b"s2"))
        assert (resp["error_code"], resp["base_offset"]) == (wire.NONE, 2)
        # Still recognised as a duplicate with another batch after it.
        resp = send(first)
        assert (resp["error_code"], resp["base_offset"]) == (wire.NONE, 0)

    assert next_offset(broker) == 3


# ---- requests the broker hangs up on -------------------------------------------------------------
@pytest.mark.parametrize("size", [200_000_000, 100 * 1024 * 1024 + 1, -5, 0])
def test_frame_size_outside_limits_closes_the_connection(broker, size):
    """socket.request.max.bytes (100 MiB): checked on the 4-byte size, before reading the frame."""
    with wire.Connection(broker.bootstrap) as bystander:
        with wire.Connection(broker.bootstrap) as conn:
            conn.send_raw(struct.pack(">i", size))
            assert conn.closed_by_peer(timeout_s=10), f"connection still open after a frame size of {size}"
        assert_still_serving(broker, bystander)


def test_api_versions_at_unsupported_version_answers_in_v0_format(broker):
    with wire.Connection(broker.bootstrap) as conn:
        # ApiVersions v3+ requests use the flexible header (v2); a client from the future would send it.
        body = conn.request(wire.API_VERSIONS, 127, wire.api_versions_v3(), flexible=True)
        # v0 layout: error code, then the ApiVersions entry only, so the client can retry
        # at a version both sides know. No throttle time, no tagged fields.
        only_api_versions = wire.i32(1) + wire.i16(wire.API_VERSIONS) + wire.i16(0) + wire.i16(4)
        assert body == wire.i16(wire.UNSUPPORTED_VERSION) + only_api_versions

        # The connection stays usable: the client retries at a supported version.
        resp = wire.parse_api_versions(conn.request(wire.API_VERSIONS, 3, wire.api_versions_v3(), flexible=True), 3)
        assert resp["error_code"] == wire.NONE
        assert resp["api_keys"][wire.API_VERSIONS] == (0, 4)
        assert resp["trailing_bytes"] == 0


def test_produce_v2_closes_the_connection(broker):
    """Kafka 4.0 removed Produce v0-v2 (KIP-896)."""
    create_topic(broker)
    # Produce v0-v2 have no transactional id; records are a legacy message set.
    partition = wire.i32(0) + wire.nullable_bytes(wire.legacy_message_set(b"x"))
    body = wire.i16(-1) + wire.i32(10_000) + wire.array([wire.string(TOPIC) + wire.array([partition])])
    with wire.Connection(broker.bootstrap) as bystander:
        with wire.Connection(broker.bootstrap) as conn:
            conn.send(wire.PRODUCE, 2, body)
            assert conn.closed_by_peer(), "Produce v2 was answered"
        assert_still_serving(broker, bystander)
    assert next_offset(broker) == 0


@pytest.mark.parametrize(
    "api_key, version",
    [(999, 0), (-1, 0), (wire.METADATA, 99)],
    ids=["unknown-key-999", "negative-key", "metadata-v99"],
)
def test_unknown_api_key_or_version_closes_the_connection(broker, api_key, version):
    with wire.Connection(broker.bootstrap) as bystander:
        with wire.Connection(broker.bootstrap) as conn:
            conn.send(api_key, version, b"\x00" * 16)
            assert conn.closed_by_peer(), f"api key {api_key} v{version} was answered"
        assert_still_serving(broker, bystander)


def _metadata_huge_array():
    return wire.METADATA, 8, wire.i32(0x7FFFFFFF), False


def _metadata_negative_array():
    return wire.METADATA, 8, wire.i32(-5), False


def _produce_huge_partition_array():
    body = wire.string(None) + wire.i16(-1) + wire.i32(1000) + wire.i32(1) + wire.string(TOPIC) + wire.i32(0x7FFFFFFF)
    return wire.PRODUCE, 7, body, False


def _produce_flexible_huge_compact_array():
    body = wire.compact_string(None) + wire.i16(-1) + wire.i32(1000) + wire.uvarint(0xFFFFFFFF)
    return wire.PRODUCE, 9, body, True


def _produce_huge_records_length():
    body = (
        wire.string(None) + wire.i16(-1) + wire.i32(1000)
        + wire.array([wire.string(TOPIC) + wire.array([wire.i32(0) + wire.i32(0x7FFFFFF0)])])
    )  # fmt: skip
    return wire.PRODUCE, 7, body, False


def _api_versions_v3_huge_string():
    return wire.API_VERSIONS, 3, wire.uvarint(0x7FFFFFFF) + b"abc", True


@pytest.mark.parametrize(
    "make",
    [
        _metadata_huge_array,
        _metadata_negative_array,
        _produce_huge_partition_array,
        _produce_flexible_huge_compact_array,
        _produce_huge_records_length,
        _api_versions_v3_huge_string,
    ],
    ids=lambda f: f.__name__.lstrip("_"),
)
def test_lengths_beyond_the_frame_close_the_connection(broker, make):
    """A count or length larger than the bytes that follow: the broker must not trust it."""
    create_topic(broker)
    api_key, version, body, flexible = make()
    with wire.Connection(broker.bootstrap) as bystander:
        with wire.Connection(broker.bootstrap) as conn:
            conn.send(api_key, version, body, flexible=flexible)
            assert conn.closed_by_peer(), "the malformed request was answered"
        assert_still_serving(broker, bystander)
    assert next_offset(broker) == 0


def test_request_header_cut_short_closes_the_connection(broker):
    with wire.Connection(broker.bootstrap) as bystander:
        for payload in (
            wire.i16(wire.API_VERSIONS),  # only the api key
            # client id length pointing past the end of the frame
            wire.i16(wire.API_VERSIONS) + wire.i16(0) + wire.i32(7) + wire.i16(100) + b"abc",
        ):
            with wire.Connection(broker.bootstrap) as conn:
                conn.send_raw(wire.i32(len(payload)) + payload)
                assert conn.closed_by_peer(), f"header {payload.hex()} was answered"
        assert_still_serving(broker, bystander)


def test_failed_acks_0_produce_closes_the_connection(broker):
    """With acks=0 there is no response to carry an error, so Kafka closes the connection."""
    create_topic(broker)
    with wire.Connection(broker.bootstrap) as conn:
        good = wire.record_batch([b"fine"])
        conn.send(wire.PRODUCE, 9, wire.produce_v9({TOPIC: {0: good}}, acks=0), flexible=True)
        assert_still_serving(broker, conn)
        bad = bytearray(wire.record_batch([b"bad crc"]))
        bad[-1] ^= 0xFF
        conn.send(wire.PRODUCE, 9, wire.produce_v9({TOPIC: {0: bytes(bad)}}, acks=0), flexible=True)
        assert conn.closed_by_peer(timeout_s=10), "connection still open after a failed acks=0 produce"
    assert next_offset(broker) == 1
