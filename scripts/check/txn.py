"""The transactional workload: producers with a `transactional.id` (librdkafka's transactional
API) write transactions of a few records over the partitions of their own topic, committing
most and aborting one in five, while a read_committed consumer polls the topic. Each
transaction's outcome is what the client was told: committed (commit_transaction returned),
aborted (abort_transaction returned), or unknown (the producer failed in between; Kafka
makes no promise the client saw kept). After the run the topic is read to its end with
read_committed, once every transaction is closed there (the last stable offset reached the
high watermark).

Checks, each an anomaly kind:
- txn-lost-commit: a record of a committed transaction not in the final read_committed log.
- txn-aborted-read: a record of an aborted transaction read by a read_committed consumer or
  in the final read_committed log.
- txn-partial: a transaction some of whose records the final read_committed log holds and
  some not (of any outcome: a transaction is all or nothing).
- txn-duplicated: a record at two offsets of the final read_committed log.
- txn-dirty-read: a record a read_committed consumer polled that is not in the final
  read_committed log (it read what was never committed).
- txn-order: one transaction's records to a partition at offsets out of their send order.
- txn-stuck: a partition whose last stable offset does not reach its high watermark after
  the run (a transaction left open there, holding read_committed consumers back).
"""

import random
import time
from collections import defaultdict

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from check.workload import CLIENT_TIMEOUTS, Worker, read_everything

TOPIC = "ferrolog-check-txn"
# Short, so that a transaction left open by a killed or fenced producer is aborted by its
# coordinator within the run's settling time.
TXN_TIMEOUT_MS = 10000
ABORT_EVERY = 5
# How long the coordinator may take to close what the run left open: its timeout, Kafka's
# default check interval (10 s), and slack for a coordinator that moved.
SETTLE_S = TXN_TIMEOUT_MS / 1000 + 10 + 40


class TxnProducerWorker(Worker):
    """One transactional id; a fatal error (fenced, or a transaction it cannot finish) makes
    a new producer of the same id, which fences the old one and aborts what it left open."""

    def __init__(self, name, bootstrap, partitions, rate, history, stop, seed):
        super().__init__(name)
        self.bootstrap, self.partitions, self.history, self.stop = bootstrap, partitions, history, stop
        self.interval = 1.0 / rate
        self.rng = random.Random(seed)
        self.session = 0
        self.unflushed = 0  # a transaction is flushed by its commit or abort

    def client(self):
        """A new producer of the id, once InitProducerId succeeds (retried while faults last)."""
        while not self.stop.is_set():
            self.session += 1
            conf = {
                "bootstrap.servers": self.bootstrap, "transactional.id": f"check-{self.name}",
                "transaction.timeout.ms": TXN_TIMEOUT_MS, "message.timeout.ms": TXN_TIMEOUT_MS - 1000,
                "request.timeout.ms": 5000, "linger.ms": 5, **CLIENT_TIMEOUTS,
                "error_cb": lambda err: self.history.error(self.name, err),
            }  # fmt: skip
            p = Producer(conf)
            try:
                p.init_transactions(20)
                return p
            except KafkaException as err:
                self.history.error(self.name, f"init_transactions: {err}")
                time.sleep(1)
        return None

    def work(self):
        producer, n = self.client(), 0
        while producer is not None and not self.stop.is_set():
            n += 1
            pname = f"{self.name}.{self.session}"
            count = self.rng.randint(1, 8)
            records = [(f"{pname}-t{n}-{i}", self.rng.randrange(self.partitions)) for i in range(count)]
            commit = n % ABORT_EVERY != 0
            txn = {"id": f"{pname}-t{n}", "records": records, "commit": commit, "outcome": None,
                   "t0": self.history.now(), "t1": None}  # fmt: skip
            with self.history.lock:
                self.history.txns.append(txn)
            txn["outcome"], healthy = self.one(producer, records, commit)
            txn["t1"] = self.history.now()
            if not healthy:
                producer = self.client()
            time.sleep(self.interval * count)

    def one(self, producer, records, commit):
        """Runs one transaction: (outcome, whether the producer can go on)."""
        try:
            producer.begin_transaction()
            for value, partition in records:
                producer.produce(TOPIC, value=value.encode(), partition=partition)
            if not commit:
                producer.abort_transaction(20)
                return "aborted", True
            for attempt in range(5):
                try:
                    producer.commit_transaction(20)
                    return "committed", True
                except KafkaException as err:
                    if not err.args[0].retriable() or attempt == 4:
                        raise
                    self.history.error(self.name, f"commit_transaction, retried: {err}")
        except KafkaException as err:
            self.history.error(self.name, f"transaction: {err}")
            if err.args[0].txn_requires_abort():
                try:
                    producer.abort_transaction(20)
                    return "aborted", True
                except KafkaException as err2:
                    self.history.error(self.name, f"abort_transaction: {err2}")
            return "unknown", False
        except BufferError as err:  # the client's queue is full: abort what went in
            self.history.error(self.name, f"produce: {err}")
            try:
                producer.abort_transaction(20)
                return "aborted", True
            except KafkaException:
                return "unknown", False


class TxnConsumerWorker(Worker):
    """read_committed, every partition from offset 0; records (partition, offset, value, t)."""

    def __init__(self, name, bootstrap, partitions, history, stop):
        super().__init__(name)
        self.bootstrap, self.partitions, self.history, self.stop = bootstrap, partitions, history, stop
        self.positions = {}

    def work(self):
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"check-{self.name}", "enable.auto.commit": False,
                      "isolation.level": "read_committed", "auto.offset.reset": "error", **CLIENT_TIMEOUTS,
                      "error_cb": lambda err: self.history.error(self.name, err)})  # fmt: skip
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(self.partitions)])
        try:
            while not self.stop.is_set():
                for m in c.consume(num_messages=500, timeout=0.2):
                    if m.error():
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            self.history.error(self.name, m.error())
                        continue
                    row = (m.partition(), m.offset(), m.value().decode(errors="replace"), self.history.now())
                    with self.history.lock:
                        self.history.txn_polls.append(row)
                # By position: the markers that end transactions are never delivered.
                for tp in c.position(c.assignment()):
                    if tp.offset >= 0:
                        self.positions[tp.partition] = tp.offset
        finally:
            c.close()


def stable_offsets(bootstrap, partitions, timeout_s):
    """Waits until every partition's last stable offset reaches its high watermark; returns
    the partitions where it did not within `timeout_s`, with both offsets."""
    committed = Consumer({"bootstrap.servers": bootstrap, "group.id": "check-txn-lso", "isolation.level": "read_committed",
                          **CLIENT_TIMEOUTS})  # fmt: skip
    uncommitted = Consumer({"bootstrap.servers": bootstrap, "group.id": "check-txn-hw",
                            "isolation.level": "read_uncommitted", **CLIENT_TIMEOUTS})  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            stuck = {}
            for p in range(partitions):
                tp = TopicPartition(TOPIC, p)
                try:
                    lso = committed.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                    hw = uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                except KafkaException as err:
                    stuck[p] = str(err)
                    continue
                if lso != hw:
                    stuck[p] = f"last stable offset {lso}, high watermark {hw}"
            if not stuck or time.monotonic() > deadline:
                return stuck
            time.sleep(1)
    finally:
        committed.close()
        uncommitted.close()


def read_committed_log(bootstrap, partitions):
    """The whole topic as read_committed shows it: read_everything's answer."""
    return read_everything(bootstrap, TOPIC, partitions, isolation="read_committed")


def check(history, final, stuck, a):
    """Adds the transactional anomalies of `history` (its `txns` and `txn_polls`) to `a`;
    `final`: {partition: {offset: value}} read with read_committed; `stuck`: {partition: why}.
    Returns the notes (counts that are not anomalies)."""
    where = defaultdict(list)
    for p, log in final.items():
        for o, v in log.items():
            where[v].append((p, o))
    for v, places in where.items():
        if len(places) > 1:
            a.add("txn-duplicated", 0.0, f"{v} at {sorted(places)}")
    outcome = {}
    for txn in history.txns:
        values = [v for v, _ in txn["records"]]
        for v in values:
            outcome[v] = txn["outcome"]
        t = txn["t1"] if txn["t1"] is not None else txn["t0"]
        present = [v for v in values if v in where]
        if present and len(present) < len(values):
            missing = sorted(set(values) - set(present))
            a.add("txn-partial", t, f"{txn['id']} ({txn['outcome']}): {len(present)} of {len(values)} records "
                                    f"read_committed, missing {missing[:3]}")  # fmt: skip
        if txn["outcome"] == "committed" and len(present) < len(values):
            a.add("txn-lost-commit", t, f"{txn['id']} committed, {len(values) - len(present)} of {len(values)} "
                                        f"records not in the final read_committed log")  # fmt: skip
        if txn["outcome"] == "aborted" and present:
            a.add("txn-aborted-read", t, f"{txn['id']} aborted, in the final read_committed log: {present[:3]}")
        by_partition = defaultdict(list)
        for v, p in txn["records"]:
            if v in where:
                by_partition[p].append(where[v][0][1])
        for p, offsets in by_partition.items():
            if offsets != sorted(offsets):
                a.add("txn-order", t, f"{txn['id']} on partition {p}: offsets {offsets} out of send order")
    for p, o, v, t in history.txn_polls:
        if outcome.get(v) == "aborted":
            a.add("txn-aborted-read", t, f"read_committed consumer polled {v} at {p}/{o}, of an aborted transaction")
        elif v not in where:
            a.add("txn-dirty-read", t, f"read_committed consumer polled {v} at {p}/{o}, not in the final log")
    for p, why in sorted(stuck.items()):
        a.add("txn-stuck", history.now(), f"partition {p}: {why}")
    counts = defaultdict(int)
    for txn in history.txns:
        counts[txn["outcome"]] += 1
    return {
        "transactions-committed": counts["committed"], "transactions-aborted": counts["aborted"],
        "transactions-unknown": counts["unknown"],
        "transactions-unknown-found": sum(1 for t in history.txns if t["outcome"] == "unknown"
                                          and any(v in where for v, _ in t["records"])),
    }  # fmt: skip
