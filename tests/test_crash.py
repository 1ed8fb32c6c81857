"""kill -9 the broker while an idempotent acks=all producer is writing, restart, repeat.

What a user relies on: a record whose write was acknowledged is there after a
crash, at the offset the acknowledgement named, exactly once, with the bytes
that were sent; and the broker never returns a record nobody wrote.

The producer (confluent-kafka, enable.idempotence, acks=all) runs in its own
thread and sends numbered records without pause, so every kill lands with
batches in flight. Its delivery callbacks record (partition, offset) for every
acknowledged record. After KILL_CYCLES kill/restart cycles and some more acks,
everything is read back with assign() and checked:

  * every acknowledged record is at its acknowledged (partition, offset), unchanged;
  * offsets in each partition run 0..end-1 without a hole (no transactions here,
    so there are no control records to skip);
  * no record appears twice (the idempotent producer retries across the crash;
    the broker must deduplicate against its recovered producer state);
  * every record read is one the producer sent, in the partition it was sent to,
    and each partition holds them in send order.

Records sent but never acknowledged may or may not be there: both are correct.
"""

import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TOPIC = "crash"
PARTITIONS = 3
KILL_CYCLES = 3
ACKS_PER_CYCLE = 4000  # new acknowledgements before each kill, and after the last restart
MAX_OUTSTANDING = 20_000  # sent but not yet acknowledged or failed: bounds the producer's memory
MAX_RECORDS = 2_000_000  # the producer stops here whatever happens
WAIT_S = 120  # for acks to arrive, for the producer to drain, for the read-back


def value_of(n):
    # The number, then filler derived from it, so corruption anywhere in the value shows.
    return f"{n:09d}|".encode() + bytes((n + i) % 251 for i in range(100))


def number_of(value):
    n = int(value[:9])
    assert value == value_of(n), f"record {value[:9]!r} has bytes the producer never sent"
    return n


class LoopingProducer(threading.Thread):
    """Sends value_of(0), value_of(1), ... to partition n % PARTITIONS until stopped."""

    def __init__(self, bootstrap):
        super().__init__(name="crash-producer", daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                # Survive a broker restart: keep retrying for two minutes.
                "message.timeout.ms": WAIT_S * 1000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.lock = threading.Lock()
        self.acked = {}  # n -> (partition, offset)
        self.failed = {}  # n -> error
        self.sent = 0
        self.fatal = None
        self.stop = threading.Event()

    def _delivered(self, err, msg):
        n = number_of(msg.value())
        with self.lock:
            if err is None:
                self.acked[n] = (msg.partition(), msg.offset())
            else:
                self.failed[n] = err
                if err.fatal() and self.fatal is None:
                    self.fatal = err

    def acked_count(self):
        with self.lock:
            return len(self.acked)

    def run(self):
        p = self.producer
        while not self.stop.is_set() and self.sent < MAX_RECORDS and self.fatal is None:
            with self.lock:
                outstanding = self.sent - len(self.acked) - len(self.failed)
            if outstanding >= MAX_OUTSTANDING:
                p.poll(0.05)
                continue
            try:
                p.produce(TOPIC, value=value_of(self.sent), partition=self.sent % PARTITIONS, on_delivery=self._delivered)
            except BufferError:
                p.poll(0.05)
                continue
            self.sent += 1
            p.poll(0)
        p.flush(WAIT_S)


def wait_for_acks(producer, count, what):
    deadline = time.monotonic() + WAIT_S
    while producer.acked_count() < count:
        assert producer.fatal is None, f"producer failed fatally {what}: {producer.fatal}"
        assert producer.is_alive(), f"producer stopped {what} after {producer.sent} records"
        assert time.monotonic() < deadline, (
            f"only {producer.acked_count()} of {count} records acknowledged {what} after {WAIT_S} s"
        )
        time.sleep(0.05)


def read_all(bootstrap):
    """Every record of the topic, as {partition: [(offset, value), ...]}."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ferrolog-crash-check", "enable.auto.commit": False}
    )
    try:
        end = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=WAIT_S)[1] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        log = {p: [] for p in range(PARTITIONS)}
        next_offset = {p: 0 for p in range(PARTITIONS)}
        deadline = time.monotonic() + WAIT_S
        while any(next_offset[p] < end[p] for p in end):
            assert time.monotonic() < deadline, f"read up to {next_offset}, end offsets are {end}"
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    raise KafkaException(msg.error())
                log[msg.partition()].append((msg.offset(), msg.value()))
                next_offset[msg.partition()] = msg.offset() + 1
        return log, end
    finally:
        consumer.close()


def test_acked_records_survive_kill9(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], operation_timeout=30).values():
        f.result(WAIT_S)

    del admin  # confluent-kafka's AdminClient has no close(); it would reconnect through every kill

    producer = LoopingProducer(broker.bootstrap)
    producer.start()
    in_flight_at_kill = []
    try:
        for cycle in range(1, KILL_CYCLES + 1):
            wait_for_acks(producer, producer.acked_count() + ACKS_PER_CYCLE, f"before kill {cycle}")
            broker.kill9()
            in_flight_at_kill.append(producer.sent - producer.acked_count())
            broker.restart()
        wait_for_acks(producer, producer.acked_count() + ACKS_PER_CYCLE, "after the last restart")
    finally:
        producer.stop.set()
        producer.join(WAIT_S + 30)
    assert not producer.is_alive(), "producer did not drain within its deadline"
    assert producer.fatal is None, f"producer failed fatally: {producer.fatal}"

    log, end = read_all(broker.bootstrap)

    where = {}  # n -> (partition, offset) as read back
    for p, records in log.items():
        offsets = [o for o, _ in records]
        assert offsets == list(range(end[p])), f"partition {p}: offsets are not 0..{end[p] - 1} without holes"
        previous = -1
        for o, value in records:
            n = number_of(value)
            assert n < producer.sent, f"partition {p} offset {o}: record {n} was never sent"
            assert n % PARTITIONS == p, f"partition {p} offset {o}: record {n} was sent to partition {n % PARTITIONS}"
            assert n not in where, f"record {n} is both at {where[n]} and at {(p, o)}: duplicated"
            assert n > previous, f"partition {p} offset {o}: record {n} after record {previous}: reordered"
            previous = n
            where[n] = (p, o)

    lost = {n: at for n, at in producer.acked.items() if where.get(n) != at}
    if lost:
        examples = sorted(lost.items())[:10]
        pytest.fail(
            f"{len(lost)} of {len(producer.acked)} acknowledged records are not where their ack said "
            f"(record: acked at -> found at): {[(n, at, where.get(n)) for n, at in examples]}"
        )
    # The producer kept going through every crash: acks after each restart prove it.
    assert len(producer.acked) >= (KILL_CYCLES + 1) * ACKS_PER_CYCLE
    print(
        f"sent {producer.sent}, acknowledged {len(producer.acked)}, failed {len(producer.failed)}, "
        f"in the log {len(where)} (end offsets {end}); unacknowledged when killed: {in_flight_at_kill}"
    )
