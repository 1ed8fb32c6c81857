"""Incremental fetch sessions (KIP-227), pinned to Apache Kafka 4.1, over hand-built Fetch v11.

The Java consumer fetches through sessions; what it relies on:
  * epoch 0 opens a session and the response names its id; the response is full;
  * each later request carries the next epoch and only the partitions that changed; the
    response carries only partitions with news (records, a new HW or log start);
  * a wrong epoch gets INVALID_FETCH_SESSION_EPOCH and an unknown id
    FETCH_SESSION_ID_NOT_FOUND (top-level errors), so the client falls back to a full fetch;
  * epoch -1 closes the session.

Also KIP-320's check of the leader epoch a fetcher says it knows.
"""

import kafka_wire as wire
from kafka_wire import Reader, array, i8, i32, i64, string
from test_bad_input import create_topic, produce_one

TOPIC = "sessions"
FETCH = 1
VERSION = 11
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
UNKNOWN_LEADER_EPOCH = 75


def fetch_v11(session_id, epoch, partitions, forgotten=(), max_wait_ms=100, topic=TOPIC, current_leader_epoch=-1):
    """partitions: {partition: fetch_offset} of `topic`."""
    parts = [i32(p) + i32(current_leader_epoch) + i64(off) + i64(-1) + i32(1 << 20) for p, off in partitions.items()]
    topics = [string(topic) + array(parts)] if partitions else []
    forgot = [string(topic) + array([i32(p) for p in forgotten])] if forgotten else []
    return (
        i32(-1) + i32(max_wait_ms) + i32(1) + i32(50 << 20) + i8(0) + i32(session_id) + i32(epoch)
        + array(topics) + array(forgot) + string("")
    )  # fmt: skip


def parse_fetch_v11(body):
    r = Reader(body)
    r.i32()  # throttle
    out = {"error_code": r.i16(), "session_id": r.i32(), "partitions": {}}
    for _ in range(r.i32()):
        topic = r.string()
        for _ in range(r.i32()):
            p = r.i32()
            error, hw, _lso, _start = r.i16(), r.i64(), r.i64(), r.i64()
            n_aborted = r.i32()
            for _ in range(max(n_aborted, 0)):
                r.i64(), r.i64()
            r.i32()  # preferred read replica
            size = r.i32()
            records = r.raw(size) if size > 0 else b""
            out["partitions"][(topic, p)] = {"error_code": error, "high_watermark": hw, "records": records}
    return out


def fetch(conn, *args, **kwargs):
    return parse_fetch_v11(conn.request(FETCH, VERSION, fetch_v11(*args, **kwargs)))


def test_fetch_session_lifecycle(broker):
    create_topic(broker, TOPIC, partitions=2)
    assert produce_one(broker, wire.record_batch([b"a", b"b"]), TOPIC, 0)["error_code"] == wire.NONE
    with wire.Connection(broker.bootstrap) as conn:
        full = fetch(conn, 0, 0, {0: 0, 1: 0})
        assert full["error_code"] == wire.NONE
        session = full["session_id"]
        assert session != 0, "epoch 0 must open a session"
        assert set(full["partitions"]) == {(TOPIC, 0), (TOPIC, 1)}, "the first response is full"
        assert full["partitions"][(TOPIC, 0)]["high_watermark"] == 2
        assert full["partitions"][(TOPIC, 0)]["records"]

        # The client moved partition 0 past what it read; nothing new anywhere.
        quiet = fetch(conn, session, 1, {0: 2})
        assert (quiet["error_code"], quiet["session_id"]) == (wire.NONE, session)
        assert quiet["partitions"] == {}, "an incremental response carries only news"

        # New data on partition 1, which the request does not mention: it is still fetched.
        assert produce_one(broker, wire.record_batch([b"c"]), TOPIC, 1)["error_code"] == wire.NONE
        news = fetch(conn, session, 2, {})
        assert set(news["partitions"]) == {(TOPIC, 1)}
        assert news["partitions"][(TOPIC, 1)]["high_watermark"] == 1
        assert news["partitions"][(TOPIC, 1)]["records"]

        # Forgetting partition 1 drops it from the session, even when it has news.
        assert produce_one(broker, wire.record_batch([b"d"]), TOPIC, 1)["error_code"] == wire.NONE
        forgot = fetch(conn, session, 3, {}, forgotten=[1])
        assert forgot["partitions"] == {}

        assert fetch(conn, session, 7, {})["error_code"] == INVALID_FETCH_SESSION_EPOCH
        assert fetch(conn, 0x7FFF0000, 1, {})["error_code"] == FETCH_SESSION_ID_NOT_FOUND

        # Epoch -1 closes the session (a full, sessionless fetch); the id is gone afterwards.
        closing = fetch(conn, session, -1, {0: 0})
        assert (closing["error_code"], closing["session_id"]) == (wire.NONE, 0)
        assert set(closing["partitions"]) == {(TOPIC, 0)}
        assert fetch(conn, session, 4, {})["error_code"] == FETCH_SESSION_ID_NOT_FOUND


def test_fetch_checks_the_current_leader_epoch(broker):
    """A fetch naming a leader epoch newer than the partition's is UNKNOWN_LEADER_EPOCH; the
    current one, or none (-1), reads. (A single replica's epoch is 0 on both brokers.)"""
    topic = "epoch-fetch"
    create_topic(broker, topic, partitions=1)
    assert produce_one(broker, wire.record_batch([b"a"]), topic, 0)["error_code"] == wire.NONE
    with wire.Connection(broker.bootstrap) as conn:
        for epoch, error in ((5, UNKNOWN_LEADER_EPOCH), (0, wire.NONE), (-1, wire.NONE)):
            r = fetch(conn, 0, -1, {0: 0}, topic=topic, current_leader_epoch=epoch)
            part = r["partitions"][(topic, 0)]
            assert part["error_code"] == error, (epoch, part)
            assert bool(part["records"]) == (error == wire.NONE), (epoch, part)
