"""Idempotent-producer state survives a crash even after the log has rolled past the
producer's last batch (Kafka keeps producer snapshots; so must we).

A producer writes one batch, other traffic rolls the segment several times, the broker is
killed with SIGKILL and restarted, and the producer retries its batch: the broker must
recognise it as a duplicate (NONE, original offset) and must not append it again.
"""

import kafka_wire as wire
from support import wait_for_partition_leaders
from test_bad_input import create_topic, produce_one

TOPIC = "pstate"
SEGMENT_BYTES = 1024 * 1024


def test_duplicate_recognised_after_roll_and_kill9(broker):
    create_topic(broker, TOPIC, config={"segment.bytes": str(SEGMENT_BYTES)})
    with wire.Connection(broker.bootstrap) as conn:
        pid, epoch = wire.init_producer_id(conn)
    batch = wire.record_batch([b"once", b"only"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    first = produce_one(broker, batch, TOPIC)
    assert (first["error_code"], first["base_offset"]) == (wire.NONE, 0)

    # About 3 MiB of plain records: the segment with the idempotent batch is long closed.
    filler = wire.record_batch([b"f" * 100_000] * 10)
    for _ in range(3):
        assert produce_one(broker, filler, TOPIC)["error_code"] == wire.NONE
    end_before = produce_one(broker, wire.record_batch([b"mark"]), TOPIC)["base_offset"] + 1

    broker.kill9()
    broker.start()
    wait_for_partition_leaders(broker.bootstrap, TOPIC, 1, 60)

    retry = produce_one(broker, batch, TOPIC)
    assert (retry["error_code"], retry["base_offset"]) == (wire.NONE, 0), "a retry is a duplicate"
    after = produce_one(broker, wire.record_batch([b"after"]), TOPIC)
    assert after["base_offset"] == end_before, "the duplicate was not appended again"
