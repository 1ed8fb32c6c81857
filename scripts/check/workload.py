"""Jepsen's Kafka queue workload, with real librdkafka clients (confluent-kafka).

Producers send unique values (`<producer>.<session>-<seq>`) with acks=all, some with
idempotence and some without, and record each send's outcome: the acknowledged partition
and offset, or the error (then the write is indeterminate: it may or may not be in the log).
Consumers poll continuously, one with `assign` (every partition from the start) and one
with `subscribe` in a group that commits its position every second and reads the committed
offsets back. Every operation goes to a `History`, which the checker reads afterwards.
"""

import threading
import time

import traceback

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

# Every client gives up on a request in seconds, not Kafka's 30 s / 2 min defaults, so that a
# fault shows as errors in the history instead of a stall.
CLIENT_TIMEOUTS = {"socket.timeout.ms": 10000, "metadata.max.age.ms": 5000}


class History:
    """Operations of every client, with times in seconds since the run started."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.sends = []  # [producer, idempotent, seq, value, partition, t_sent, t_done, offset|None, error|None]
        self.polls = []  # (consumer, epoch, partition, offset, value, t)
        self.commits = []  # (t_start, t_done, {partition: offset})
        self.committed_reads = []  # (t_start, t_done, {partition: offset, -1: none committed})
        self.resumes = []  # (consumer, epoch, t, {partition: offset, -1: none}, from the group's commits?)
        self.resets = []  # (consumer, t, error): an offset the broker could not serve
        self.client_errors = []  # (t, client, error)
        self.txns = []  # transactions, as `txn.TxnProducerWorker` records them
        self.txn_polls = []  # (partition, offset, value, t) of the read_committed consumer

    def now(self):
        return time.monotonic() - self.t0

    def error(self, client, err):
        with self.lock:
            self.client_errors.append((self.now(), client, str(err)))


class Worker(threading.Thread):
    """A client thread; an exception it did not expect ends the run (see `failure`)."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.failure = None

    def run(self):
        try:
            self.work()
        except Exception:
            self.failure = traceback.format_exc()


class ProducerWorker(Worker):
    def __init__(self, name, bootstrap, topic, partitions, idempotent, rate, history, stop):
        super().__init__(name)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.idempotent, self.rate, self.history, self.stop = idempotent, rate, history, stop
        self.session = 0
        self.fatal = False
        self.unflushed = 0

    def client(self):
        self.session += 1
        self.fatal = False
        conf = {
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": self.idempotent,
            "linger.ms": 5, "message.timeout.ms": 20000, "request.timeout.ms": 5000, **CLIENT_TIMEOUTS,
            "error_cb": lambda err: self.on_error(err),
        }  # fmt: skip
        return Producer(conf)

    def on_error(self, err):
        self.history.error(self.name, err)
        if err.fatal():
            self.fatal = True

    def work(self):
        producer, seq = self.client(), 0
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            if self.fatal:  # an idempotent producer can be fenced for good: start a new one
                producer.flush(30)
                producer = self.client()
            pname = f"{self.name}.{self.session}"
            partition = seq % self.partitions
            value = f"{pname}-{seq}"
            entry = [pname, self.idempotent, seq, value, partition, self.history.now(), None, None, None]
            with self.history.lock:
                self.history.sends.append(entry)
            try:
                producer.produce(self.topic, value=value.encode(), partition=partition,
                                 on_delivery=lambda err, msg, e=entry: self.delivered(e, err, msg))  # fmt: skip
            except BufferError as err:  # the client's queue is full: never sent
                entry[6], entry[8] = self.history.now(), f"not sent: {err}"
            except KafkaException as err:  # fatal (fenced): the next turn starts a new producer
                entry[6], entry[8] = self.history.now(), f"not sent: {err}"
                self.fatal = True
            seq += 1
            next_at = max(next_at + interval, time.monotonic() - 1.0)  # no burst after a stall
            while True:
                producer.poll(max(0.0, min(0.05, next_at - time.monotonic())))
                if time.monotonic() >= next_at or self.stop.is_set():
                    break
        self.unflushed = producer.flush(60)

    def delivered(self, entry, err, msg):
        entry[6] = self.history.now()
        if err is None:
            entry[7] = msg.offset()
        else:
            entry[8] = err.name()


class ConsumerWorker(Worker):
    """Polls `topic`; `mode` is "assign" (every partition from offset 0) or "subscribe" (a
    group member that commits every second and reads its committed offsets back). Offsets are
    never reset silently (`auto.offset.reset=error`): a new assignment starts where the group
    committed, read explicitly, or at the beginning when nothing is committed."""

    def __init__(self, name, bootstrap, topic, partitions, mode, history, stop):
        super().__init__(name)
        self.bootstrap, self.topic, self.partitions, self.mode = bootstrap, topic, partitions, mode
        self.history, self.stop = history, stop
        self.epoch = 0
        self.positions = {}  # partition -> next offset to read, for the end of the run

    def on_assign(self, consumer, partitions):
        self.epoch += 1  # a new assignment may legitimately re-read from the committed offset
        t = self.history.now()
        for _ in range(6):  # the coordinator may be moving: a few tries, then librdkafka's own fetch
            try:
                committed = consumer.committed(partitions, timeout=5)
                break
            except KafkaException as err:
                self.history.error(self.name, f"committed in on_assign: {err}")
        else:  # start over: a new assignment may re-read, and nothing is claimed about commits
            for tp in partitions:
                tp.offset = OFFSET_BEGINNING
            with self.history.lock:
                self.history.resumes.append((self.name, self.epoch, t, {tp.partition: 0 for tp in partitions}, False))
            consumer.assign(partitions)
            return
        read = {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in committed if tp.error is None}
        for tp in committed:
            if tp.error is None and tp.offset < 0:  # nothing committed (an error: librdkafka fetches)
                tp.offset = OFFSET_BEGINNING
        with self.history.lock:
            self.history.resumes.append((self.name, self.epoch, t, read, True))
        consumer.assign(committed)

    def on_revoke(self, consumer, partitions):
        self.epoch += 1

    def work(self):
        conf = {
            "bootstrap.servers": self.bootstrap, "group.id": f"check-{self.name}", "enable.auto.commit": False,
            "auto.offset.reset": "error", "session.timeout.ms": 10000, **CLIENT_TIMEOUTS,
            "error_cb": lambda err: self.history.error(self.name, err),
        }  # fmt: skip
        c = Consumer(conf)
        if self.mode == "assign":
            self.epoch = 1
            with self.history.lock:
                self.history.resumes.append((self.name, 1, self.history.now(), {p: 0 for p in range(self.partitions)}, False))
            c.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        else:
            c.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_revoke)
        last_commit = time.monotonic()
        try:
            while not self.stop.is_set():
                for m in c.consume(num_messages=500, timeout=0.2):
                    if m.error():
                        if m.error().code() == KafkaError._AUTO_OFFSET_RESET:
                            with self.history.lock:
                                self.history.resets.append((self.name, self.history.now(), str(m.error())))
                        elif m.error().code() != KafkaError._PARTITION_EOF:
                            self.history.error(self.name, m.error())
                        continue
                    value = m.value().decode(errors="replace") if m.value() is not None else "<null>"
                    row = (self.name, self.epoch, m.partition(), m.offset(), value, self.history.now())
                    with self.history.lock:
                        self.history.polls.append(row)
                    self.positions[m.partition()] = m.offset() + 1
                if self.mode == "subscribe" and time.monotonic() - last_commit >= 1.0:
                    last_commit = time.monotonic()
                    self.commit_and_read_back(c)
        finally:
            c.close()

    def commit_and_read_back(self, c):
        t = self.history.now()
        try:
            done = c.commit(asynchronous=False)
        except Exception as err:  # KafkaException: nothing to commit, or a refused commit
            self.history.error(self.name, f"commit: {err}")
            done = None
        if done:
            offsets = {tp.partition: tp.offset for tp in done if tp.error is None and tp.offset >= 0}
            if offsets:
                with self.history.lock:
                    self.history.commits.append((t, self.history.now(), offsets))
        t = self.history.now()
        try:
            read = c.committed([TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=5)
        except Exception as err:
            self.history.error(self.name, f"committed: {err}")
            return
        offsets = {tp.partition: (tp.offset if tp.offset >= 0 else -1) for tp in read if tp.error is None}
        with self.history.lock:
            self.history.committed_reads.append((t, self.history.now(), offsets))


def _high_watermark(consumer, topic, partition, give_up_at):
    """`partition`'s high watermark, asked again after any error until `give_up_at`."""
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)[1]
        except KafkaException:
            if time.monotonic() >= give_up_at:
                raise
            time.sleep(1)


def read_everything(bootstrap, topic, partitions, timeout_s=120, isolation="read_uncommitted"):
    """The whole log after the run: ({partition: {offset: value}}, {partition: high watermark},
    what could not be read). The watermarks are read again at the end: a change means the
    cluster was not settled, which is reported, not taken as loss. With read_committed, the
    "high watermark" is the last stable offset."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-final-{topic}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": isolation, **CLIENT_TIMEOUTS})  # fmt: skip
    try:
        # Asked again while the cluster settles: a node restarted by the healing may still be
        # starting, and librdkafka then fails a query at once (seen: "Unknown partition").
        settled_by = time.monotonic() + 60
        highs = {p: _high_watermark(c, topic, p, settled_by) for p in range(partitions)}
        log = {p: {} for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions) if highs[p] > 0])
        deadline = time.monotonic() + timeout_s
        done = {p for p in range(partitions) if highs[p] == 0}
        while len(done) < partitions and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    continue
                log[m.partition()][m.offset()] = m.value().decode(errors="replace") if m.value() is not None else "<null>"
            # By position, not by the last record: a transaction marker, never delivered, may
            # end the log.
            for tp in c.position([TopicPartition(topic, p) for p in range(partitions) if p not in done]):
                if tp.offset >= highs[tp.partition]:
                    done.add(tp.partition)
        problems = [f"partition {p}: read to {max(log[p], default=-1) + 1} of high watermark {highs[p]} in {timeout_s} s"
                    for p in range(partitions) if p not in done]  # fmt: skip
        for p in range(partitions):
            again = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
            if again != highs[p]:
                problems.append(f"partition {p}: high watermark {highs[p]} before the read, {again} after")
        return log, highs, problems
    finally:
        c.close()
