"""Transactions (KIP-98, transaction protocol v1) with real clients: the Java client's
transactional producer and librdkafka's (confluent-kafka), read back by read_committed and
read_uncommitted consumers. Each test also runs against Apache Kafka
(FERROLOG_TARGET=apache).
"""

import json
import time

import pytest
from cluster import Cluster, create, metadata
from conftest import TARGET
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from support import java, read_all, wait_until


def _create(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _values(result, prefix):
    return sorted(v for v in result if v.startswith(prefix + "-"))


def test_java_transactions_commit_abort_fence_and_time_out(broker, tmp_path):
    """Committed transactions are read by read_committed consumers, aborted and timed-out
    ones only by read_uncommitted ones; a second producer with the same transactional id
    fences the first; an open transaction holds read_committed's end offsets back; a
    transaction past its timeout is aborted by the coordinator."""
    topic, partitions = "txn-java", 3
    _create(broker.bootstrap, topic, partitions)
    result_path = tmp_path / "result.json"

    java("dev.ferrolog.tests.TxnRoundTrip", broker.bootstrap, topic, partitions, result_path, timeout_s=240)

    r = json.loads(result_path.read_text())
    committed, uncommitted = r["read_committed"], r["read_uncommitted"]
    expect = {p: sorted(f"{p}-{i}" for i in range(n)) for p, n in
              (("commit-1", 30), ("commit-3", 10), ("commit-4", 5), ("open-5", 4))}  # fmt: skip
    for prefix, values in expect.items():
        assert _values(committed, prefix) == values, prefix
        assert _values(uncommitted, prefix) == values, prefix
    for prefix in ("abort-2", "timeout-6", "zombie"):
        assert _values(committed, prefix) == [], f"{prefix} read by read_committed"
    assert _values(uncommitted, "abort-2") == sorted(f"abort-2-{i}" for i in range(20))
    assert _values(uncommitted, "timeout-6") == sorted(f"timeout-6-{i}" for i in range(3))
    assert len(committed) == len(set(committed)), "a record read twice"
    # The fenced producer's commit and the timed-out producer's commit both fail.
    assert r["fenced"] in ("ProducerFencedException", "InvalidProducerEpochException"), r["fenced"]
    assert r["timed_out"] is not None
    # With open-5 open, read_committed's end offsets stop below its records.
    open_ends = r["end_offsets_open"]
    assert open_ends["read_committed"] < open_ends["read_uncommitted"], open_ends
    # At the end no transaction is open: both agree.
    assert r["end_offsets"]["read_committed"] == r["end_offsets"]["read_uncommitted"], r["end_offsets"]


def _read(bootstrap, topic, partitions, isolation):
    return [v.decode() for _, v in read_all(bootstrap, topic, partitions, isolation)]


def test_librdkafka_transactions_survive_a_broker_restart(broker):
    """librdkafka's transactional API: commit and abort; after a kill -9 and restart, the
    aborted records stay hidden from read_committed (the aborted-transaction index and the
    coordinator's state come back from disk), and the same transactional id goes on."""
    topic, partitions = "txn-rdkafka", 2
    _create(broker.bootstrap, topic, partitions)

    def transaction(prefix, n, commit):
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-rdkafka"})
        p.init_transactions(60)
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, value=f"{prefix}-{i}".encode(), partition=i % partitions)
        p.flush(60)  # sent, so an abort leaves records behind
        if commit:
            p.commit_transaction(60)
        else:
            p.abort_transaction(60)

    transaction("c1", 20, True)
    transaction("a2", 10, False)
    transaction("c3", 6, True)

    def check():
        committed = _read(broker.bootstrap, topic, partitions, "read_committed")
        assert sorted(committed) == sorted([f"c1-{i}" for i in range(20)] + [f"c3-{i}" for i in range(6)])
        uncommitted = _read(broker.bootstrap, topic, partitions, "read_uncommitted")
        assert sorted(v for v in uncommitted if v.startswith("a2-")) == sorted(f"a2-{i}" for i in range(10))

    check()
    broker.kill9()
    broker.start()
    check()
    transaction("c4", 4, True)
    transaction("a5", 4, False)
    committed = _read(broker.bootstrap, topic, partitions, "read_committed")
    assert sorted(v for v in committed if v[:2] in ("c4", "a5")) == sorted(f"c4-{i}" for i in range(4))


def test_transactional_errors(broker):
    """Kafka's answers to misuse: a transaction timeout above transaction.max.timeout.ms is
    INVALID_TRANSACTION_TIMEOUT."""
    p = Producer({
        "bootstrap.servers": broker.bootstrap,
        "transactional.id": "txn-too-long",
        "transaction.timeout.ms": 900_001,
    })  # fmt: skip
    try:
        p.init_transactions(30)
        raise AssertionError("init_transactions accepted a timeout above the maximum")
    except KafkaException as e:
        assert e.args[0].name() == "INVALID_TRANSACTION_TIMEOUT", e


def _java_hash_partition(key, partitions):
    """Kafka's partition of a transactional id: abs(String.hashCode) % partitions."""
    h = 0
    units = key.encode("utf-16-be")
    for u in (int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)):
        h = (31 * h + u) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@pytest.mark.skipif(TARGET != "ferrolog", reason="starts three ferrolog nodes")
def test_transactions_in_a_cluster_across_a_coordinator_kill(tmp_path):
    """Three nodes, a replicated topic whose partitions other nodes lead (markers go there
    over the node-to-node transport) and a replicated __transaction_state. A transaction is
    left open when the node coordinating its id is killed with -9: the next producer of the
    id, at the new coordinator, fences and aborts it, and read_committed never shows it."""
    cluster = Cluster(tmp_path).start()
    try:
        txn_id, topic, partitions = "txn-cluster", "txn-cluster", 6
        bootstrap = cluster.bootstrap()
        wait_until(lambda: create(cluster, 1, topic, partitions, rf=3) in (0, 36), "topic created")
        def led():
            t = metadata(1, cluster, topic).topics.get(topic)
            return t is not None and all(t.partitions[p].leader > 0 for p in range(partitions))

        wait_until(led, "every partition has a leader")

        def producer():
            p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
            p.init_transactions(120)
            return p

        def send(p, prefix, n):
            p.begin_transaction()
            for i in range(n):
                p.produce(topic, value=f"{prefix}-{i}".encode(), partition=i % partitions)
            p.flush(60)

        p = producer()
        send(p, "c1", 30)
        p.commit_transaction(60)
        send(p, "a2", 12)
        p.abort_transaction(60)
        send(p, "open3", 12)  # left open: its coordinator dies next
        state = metadata(1, cluster, "__transaction_state").topics["__transaction_state"]
        coordinator = state.partitions[_java_hash_partition(txn_id, len(state.partitions))].leader
        assert coordinator in cluster.nodes, state
        cluster.nodes[coordinator].kill9()
        bootstrap = cluster.bootstrap()

        p = producer()  # at the new coordinator: fences and aborts open3 first
        send(p, "c4", 12)
        p.commit_transaction(60)
        committed = _read(bootstrap, topic, partitions, "read_committed")
        expected = [f"c1-{i}" for i in range(30)] + [f"c4-{i}" for i in range(12)]
        assert sorted(committed) == sorted(expected)
        uncommitted = _read(bootstrap, topic, partitions, "read_uncommitted")
        for prefix, n in (("a2", 12), ("open3", 12)):
            assert sorted(v for v in uncommitted if v.startswith(prefix + "-")) == sorted(
                f"{prefix}-{i}" for i in range(n)
            )
    finally:
        cluster.kill()


def test_a_partition_not_in_the_transaction_is_refused(broker):
    """KIP-890 part 1, on the wire: a transactional batch to a partition the transaction did
    not add is INVALID_TXN_STATE, and so is one that arrives after its transaction was
    aborted (a late retry), so no transaction nobody will close is opened there and the
    read_committed end offset does not stall."""
    import kafka_wire as w

    topic, txn_id = "txn-verify", "txn-verify-id"
    _create(broker.bootstrap, topic, 1)
    with w.Connection(broker.bootstrap) as conn:

        def call(api_key, version, body):
            return w.Reader(conn.request(api_key, version, body))

        # FindCoordinator v1, key type 1, until __transaction_state exists and is led.
        deadline = time.monotonic() + 30
        while True:
            r = call(w.FIND_COORDINATOR, 1, w.string(txn_id) + w.i8(1))
            r.i32()
            if r.i16() == w.NONE or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        while True:  # InitProducerId v1 with the transactional id
            r = call(w.INIT_PRODUCER_ID, 1, w.init_producer_id_v0(txn_id))
            r.i32()
            error, pid, epoch = r.i16(), r.i64(), r.i16()
            if error == w.NONE or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert error == w.NONE, error

        def produce(seq):
            batch = w.record_batch([b"v"], producer_id=pid, producer_epoch=epoch, base_sequence=seq, attributes=0x10)
            body = w.produce_v7({topic: {0: batch}}, transactional_id=txn_id)
            return w.parse_produce(conn.request(w.PRODUCE, 7, body), 7)[(topic, 0)]["error_code"]

        assert produce(0) == 48, "INVALID_TXN_STATE before AddPartitionsToTxn"
        topics = w.array([w.string(topic) + w.array([w.i32(0)])])
        add = call(24, 1, w.string(txn_id) + w.i64(pid) + w.i16(epoch) + topics)  # AddPartitionsToTxn v1
        add.i32()
        results = add.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i16()))))
        assert results == [(topic, [(0, w.NONE)])], results
        assert produce(0) == w.NONE
        end = call(26, 1, w.string(txn_id) + w.i64(pid) + w.i16(epoch) + w.boolean(False))  # EndTxn v1, abort
        end.i32()
        assert end.i16() == w.NONE
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "txn-verify", "isolation.level": "read_committed"})
        try:

            def committed_end():
                return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]

            wait_until(lambda: committed_end() == 2, "read_committed's end passes the aborted batch and its marker")
            late = produce(1)
            assert late == 48, f"a late batch after the abort opens nothing: {late}"
            assert committed_end() == 2
        finally:
            c.close()


def test_kafka_transactional_message_copier_copies_exactly_once(broker):
    """Kafka's own TransactionalMessageCopier (kafka-tools): consume, produce and commit the
    consumed offsets in one transaction (AddOffsetsToTxn and TxnOffsetCommit, KIP-447), with
    random aborts, which rewind it to the committed offsets. read_committed sees every
    input record exactly once in the output, and the group's committed offset is the input's
    end; a second run from those offsets copies nothing more."""
    src, dst, n = "txn-copy-in", "txn-copy-out", 1000
    _create(broker.bootstrap, src, 1)
    _create(broker.bootstrap, dst, 3)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(n):
        p.produce(src, value=f"in-{i}".encode(), partition=0)
    assert p.flush(60) == 0
    for _ in range(2):
        java("org.apache.kafka.tools.TransactionalMessageCopier", "--broker-list", broker.bootstrap,
             "--input-topic", src, "--input-partition", 0, "--output-topic", dst,
             "--consumer-group", "txn-copier", "--transactional-id", "txn-copier",
             "--transaction-size", 50, "--enable-random-aborts", "--max-messages", -1,
             timeout_s=240)  # fmt: skip
    copied = _read(broker.bootstrap, dst, 3, "read_committed")
    assert sorted(copied) == sorted(f"in-{i}" for i in range(n))
    out = java("dev.ferrolog.tests.Committed", broker.bootstrap, "txn-copier", src, 1).stdout
    assert json.loads(out)["0"]["offset"] == n, out


@pytest.mark.skipif(
    TARGET != "ferrolog",
    reason="Apache Kafka looks for the group's coordinator first, and answers COORDINATOR_NOT_AVAILABLE "
    "while __consumer_offsets is being created",
)
def test_txn_offset_commit_refuses_oversized_metadata(broker):
    """TxnOffsetCommit v3 (flexible) with metadata longer than offset.metadata.max.bytes
    (4096) is OFFSET_METADATA_TOO_LARGE for that partition, as OffsetCommit answers, and the
    broker goes on serving. (Past 32767 bytes, more than a record's int16-length string
    holds, ferrolog answers the same; Apache Kafka closes the connection.)"""
    import kafka_wire as w

    topic = "txn-metadata"
    _create(broker.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-metadata"})
    p.init_transactions(60)  # creates __transaction_state
    with w.Connection(broker.bootstrap) as conn:
        partition = w.i32(0) + w.i64(5) + w.i32(-1) + w.compact_string("m" * 5_000) + w.NO_TAGS
        topics = w.compact_array([w.compact_string(topic) + w.compact_array([partition]) + w.NO_TAGS])
        body = (
            w.compact_string("txn-metadata") + w.compact_string("txn-metadata-group") + w.i64(-1) + w.i16(-1)
            + w.i32(-1) + w.compact_string("") + w.compact_string(None) + topics + w.NO_TAGS
        )  # fmt: skip
        r = w.Reader(conn.request(28, 3, body, flexible=True))  # TxnOffsetCommit v3
        r.i32()
        results = r.compact_array(
            lambda r: (r.compact_string(), r.compact_array(lambda r: (r.i32(), r.i16(), r.tags())), r.tags())
        )
        assert [(t, [(i, e) for i, e, _ in ps]) for t, ps, _ in results] == [(topic, [(0, 12)])], results
    # Still serving.
    p.begin_transaction()
    p.produce(topic, value=b"after", partition=0)
    p.commit_transaction(60)


def test_first_init_producer_ids_racing_for_one_id_get_one_producer(broker):
    """Several InitProducerId requests for a transactional id the coordinator does not know
    yet, sent at once on separate connections: at most one creates it. Every success names
    the same producer id with a distinct epoch; the others are CONCURRENT_TRANSACTIONS."""
    import kafka_wire as w

    warm = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-race-warm"})
    warm.init_transactions(60)  # __transaction_state exists and is loaded
    conns = [w.Connection(broker.bootstrap) for _ in range(4)]
    try:
        for round_ in range(5):
            txn_id = f"txn-race-{round_}"
            sent = [(c, c.send(w.INIT_PRODUCER_ID, 1, w.init_producer_id_v0(txn_id))) for c in conns]
            answers = [w.parse_init_producer_id_v0(c.receive(cid)) for c, cid in sent]
            ok = [(a["producer_id"], a["producer_epoch"]) for a in answers if a["error_code"] == w.NONE]
            assert ok, answers
            assert all(a["error_code"] in (w.NONE, 51) for a in answers), answers
            assert len({pid for pid, _ in ok}) == 1, f"one id, several producers: {answers}"
            assert len({epoch for _, epoch in ok}) == len(ok), answers
    finally:
        for c in conns:
            c.close()


def _transactions_tool(bootstrap, *args, check=True):
    """Kafka's `kafka-transactions.sh` (TransactionsCommand from kafka-tools)."""
    return java("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", bootstrap, *args,
                timeout_s=120, check=check)  # fmt: skip


def _table(stdout):
    """The tool's table (cells padded and ended by a tab) as one dict per row."""
    lines = [line for line in stdout.splitlines() if "\t" in line]
    header = [cell.strip() for cell in lines[0].split("\t")[:-1]]
    return [dict(zip(header, (cell.strip() for cell in line.split("\t")[:-1]))) for line in lines[1:]]


def test_kafka_transactions_tool_lists_describes_finds_hanging_and_aborts(broker):
    """Kafka's own `kafka-transactions` tool against an open transaction of librdkafka's
    (ListTransactions, DescribeTransactions, DescribeProducers, WriteTxnMarkers): `list` and
    `describe` show it Ongoing with its partition, `describe-producers` shows where it
    starts, `find-hanging` finds nothing to report (its coordinator knows the partition),
    and `abort` writes an abort marker there, after which read_committed reads past it and
    the producer's own later commit does not bring its records back."""
    topic, txn_id = "txn-tool", "txn-tool-id"
    _create(broker.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=f"kept-{i}".encode(), partition=0)
    p.commit_transaction(60)  # offsets 0-2, its marker at 3
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=f"cut-{i}".encode(), partition=0)
    assert p.flush(30) == 0  # offsets 4-5, open

    listed = _table(_transactions_tool(broker.bootstrap, "list").stdout)
    mine = [r for r in listed if r["TransactionalId"] == txn_id]
    assert len(mine) == 1 and mine[0]["TransactionState"] == "Ongoing", listed
    producer_id = mine[0]["ProducerId"]
    filtered = _table(_transactions_tool(broker.bootstrap, "list", "--transactional-id-pattern", "txn-tool-.*").stdout)
    assert [r["TransactionalId"] for r in filtered] == [txn_id], filtered

    [described] = _table(_transactions_tool(broker.bootstrap, "describe", "--transactional-id", txn_id).stdout)
    assert described["ProducerId"] == producer_id, described
    assert described["TransactionState"] == "Ongoing", described
    assert described["TopicPartitions"] == f"{topic}-0", described
    assert described["TransactionTimeoutMs"] == "60000", described  # librdkafka's default
    assert described["CurrentTransactionStartTimeMs"] != "None", described
    missing = _transactions_tool(broker.bootstrap, "describe", "--transactional-id", "txn-tool-nobody", check=False)
    assert missing.returncode == 1 and "the ID could not be found" in missing.stderr, missing

    [producer] = _table(_transactions_tool(broker.bootstrap, "describe-producers", "--topic", topic, "--partition", 0).stdout)
    assert producer["ProducerId"] == producer_id, producer
    assert producer["CurrentTransactionStartOffset"] == "4", producer
    assert producer["LastSequence"] == "4", producer
    assert int(producer["LatestCoordinatorEpoch"]) >= 0, producer  # the commit's marker

    hanging = _transactions_tool(broker.bootstrap, "find-hanging", "--topic", topic, "--max-transaction-timeout", 0)
    assert _table(hanging.stdout) == [], hanging.stdout

    nothing = _transactions_tool(broker.bootstrap, "abort", "--topic", topic, "--partition", 0, "--start-offset", 2,
                                 check=False)  # fmt: skip
    assert nothing.returncode == 1, nothing
    assert "Could not find any open transactions starting at offset 2" in nothing.stdout + nothing.stderr
    _transactions_tool(broker.bootstrap, "abort", "--topic", topic, "--partition", 0, "--start-offset", 4)
    [producer] = _table(_transactions_tool(broker.bootstrap, "describe-producers", "--topic", topic, "--partition", 0).stdout)
    assert producer["CurrentTransactionStartOffset"] == "None", producer

    # The abort marker (offset 6) closed it there: read_committed reads to the end.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "txn-tool-check",
                  "isolation.level": "read_committed"})  # fmt: skip
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert high == 7, (low, high)
    finally:
        c.close()
    p.commit_transaction(60)
    assert sorted(_read(broker.bootstrap, topic, 1, "read_committed")) == [f"kept-{i}" for i in range(3)]


def test_transaction_admin_apis_answer_bad_requests_as_kafka(broker):
    """On the wire: WriteTxnMarkers v1 refuses a marker of an older producer epoch
    (INVALID_PRODUCER_EPOCH) or coordinator epoch (TRANSACTION_COORDINATOR_FENCED) and one
    for a partition that does not exist (UNKNOWN_TOPIC_OR_PARTITION), and the transaction
    is untouched; ListTransactions filters by state (echoing unknown state names), producer
    id and duration, and refuses a pattern that does not compile (INVALID_REGULAR_EXPRESSION);
    DescribeProducers of an unknown topic is UNKNOWN_TOPIC_OR_PARTITION."""
    import kafka_wire as w

    topic, txn_id = "txn-admin-wire", "txn-admin-wire-id"
    _create(broker.bootstrap, topic, 1)
    first = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
    first.init_transactions(60)
    del first
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
    p.init_transactions(60)  # epoch 1, so there is an older one to refuse
    p.begin_transaction()
    p.produce(topic, value=b"one", partition=0)
    p.commit_transaction(60)
    p.begin_transaction()
    p.produce(topic, value=b"two", partition=0)
    assert p.flush(30) == 0

    def describe_producers(conn, name):
        body = w.compact_array([w.compact_string(name) + w.compact_array([w.i32(0)]) + w.NO_TAGS]) + w.NO_TAGS
        r = w.Reader(conn.request(61, 0, body, flexible=True))
        r.i32()
        producer = lambda r: (r.i64(), r.i32(), r.i32(), r.i64(), r.i32(), r.i64(), r.tags())  # noqa: E731
        partition = lambda r: (r.i32(), r.i16(), r.compact_string(), r.compact_array(producer), r.tags())  # noqa: E731
        [(_, [(_, code, message, producers, _)], _)] = r.compact_array(lambda r: (r.compact_string(), r.compact_array(partition), r.tags()))
        return code, message, producers

    def markers(conn, producer_id, epoch, coordinator_epoch, partitions):
        topics = w.compact_array([w.compact_string(t) + w.compact_array([w.i32(i) for i in ps]) + w.NO_TAGS
                                  for t, ps in partitions])  # fmt: skip
        body = w.compact_array([w.i64(producer_id) + w.i16(epoch) + w.boolean(False) + topics
                                + w.i32(coordinator_epoch) + w.NO_TAGS]) + w.NO_TAGS  # fmt: skip
        r = w.Reader(conn.request(27, 1, body, flexible=True))
        partition = lambda r: (r.i32(), r.i16(), r.tags())  # noqa: E731
        topic_result = lambda r: (r.compact_string(), [c for _, c, _ in r.compact_array(partition)], r.tags())  # noqa: E731
        [(_, results, _)] = r.compact_array(lambda r: (r.i64(), r.compact_array(topic_result), r.tags()))
        return {t: codes for t, codes, _ in results}

    def list_txns(conn, version, states=(), producer_ids=(), duration=-1, pattern=None):
        body = w.compact_array([w.compact_string(s) for s in states]) + w.compact_array([w.i64(i) for i in producer_ids])
        body += (w.i64(duration) if version >= 1 else b"") + (w.compact_string(pattern) if version >= 2 else b"")
        body += w.NO_TAGS
        r = w.Reader(conn.request(66, version, body, flexible=True))
        r.i32()
        code = r.i16()
        unknown = r.compact_array(lambda r: r.compact_string())
        states = r.compact_array(lambda r: (r.compact_string(), r.i64(), r.compact_string(), r.tags()))
        return code, unknown, [(i, pid, s) for i, pid, s, _ in states if i.startswith("txn-admin-wire")]

    with w.Connection(broker.bootstrap) as conn:
        code, _, [(pid, epoch, last_seq, _, coordinator_epoch, start, _)] = describe_producers(conn, topic)
        assert (code, epoch, start) == (w.NONE, 1, 2) and coordinator_epoch >= 0, (code, epoch, start, coordinator_epoch)
        assert markers(conn, pid, epoch - 1, coordinator_epoch, [(topic, [0])]) == {topic: [w.INVALID_PRODUCER_EPOCH]}
        assert markers(conn, pid, epoch, coordinator_epoch - 1, [(topic, [0])]) == {topic: [52]}
        assert markers(conn, pid, epoch, coordinator_epoch, [(topic, [3]), ("txn-admin-nowhere", [0])]) == {
            topic: [w.UNKNOWN_TOPIC_OR_PARTITION], "txn-admin-nowhere": [w.UNKNOWN_TOPIC_OR_PARTITION]}  # fmt: skip
        assert describe_producers(conn, topic)[2][0][5] == 2, "a refused marker closed the transaction"

        ongoing = [(txn_id, pid, "Ongoing")]
        assert list_txns(conn, 0, states=["Ongoing", "Bogus"]) == (w.NONE, ["Bogus"], ongoing)
        assert list_txns(conn, 0, states=["CompleteCommit"]) == (w.NONE, [], [])
        assert list_txns(conn, 0, producer_ids=[pid]) == (w.NONE, [], ongoing)
        assert list_txns(conn, 0, producer_ids=[pid + 1]) == (w.NONE, [], [])
        assert list_txns(conn, 1, duration=3_600_000) == (w.NONE, [], [])
        assert list_txns(conn, 1, duration=0) == (w.NONE, [], ongoing)
        assert list_txns(conn, 2, pattern="txn-admin-wire-.*") == (w.NONE, [], ongoing)
        assert list_txns(conn, 2, pattern="(")[0] == 128

        code, message, producers = describe_producers(conn, "txn-admin-no-such-topic")
        assert (code, producers) == (w.UNKNOWN_TOPIC_OR_PARTITION, []) and message, (code, message)
    p.commit_transaction(60)
    assert sorted(_read(broker.bootstrap, topic, 1, "read_committed")) == ["one", "two"]


def _describe_txn(bootstrap, txn_id):
    """DescribeTransactions v0 of one id on a single broker: (error code, state, producer id)."""
    import kafka_wire as w

    with w.Connection(bootstrap) as conn:
        r = w.Reader(conn.request(65, 0, w.compact_array([w.compact_string(txn_id)]) + w.NO_TAGS, flexible=True))
        r.i32()
        topic = lambda r: (r.compact_string(), r.compact_array(lambda r: r.i32()), r.tags())  # noqa: E731
        state = lambda r: (r.i16(), r.compact_string(), r.compact_string(), r.i32(), r.i64(), r.i64(), r.i16(),  # noqa: E731
                           r.compact_array(topic), r.tags())  # fmt: skip
        [(code, _, name, _, _, producer_id, _, _, _)] = r.compact_array(state)
        return code, name, producer_id


@pytest.mark.broker_config({"transactional.id.expiration.ms": 3000,
                            "transaction.remove.expired.transaction.cleanup.interval.ms": 500})  # fmt: skip
def test_idle_transactional_ids_expire(broker):
    """transactional.id.expiration.ms: an id with no transaction open and no change for that
    long is forgotten (TRANSACTIONAL_ID_NOT_FOUND, and its next producer gets a new producer
    id), also after a restart; one with a transaction open is kept."""
    topic = "txn-expiry"
    _create(broker.bootstrap, topic, 1)
    idle = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-expiry-idle"})
    idle.init_transactions(60)
    idle.begin_transaction()
    idle.produce(topic, value=b"committed", partition=0)
    idle.commit_transaction(60)
    # CompleteCommit once its markers are written, a moment after the commit returned.
    wait_until(lambda: _describe_txn(broker.bootstrap, "txn-expiry-idle")[:2] == (0, "CompleteCommit"), "completed")
    first_pid = _describe_txn(broker.bootstrap, "txn-expiry-idle")[2]
    busy = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-expiry-open",
                     "transaction.timeout.ms": 120_000})  # fmt: skip
    busy.init_transactions(60)
    busy.begin_transaction()
    busy.produce(topic, value=b"open", partition=0)
    assert busy.flush(30) == 0

    wait_until(lambda: _describe_txn(broker.bootstrap, "txn-expiry-idle")[0] == 105, "the idle id expired", timeout_s=60)
    assert _describe_txn(broker.bootstrap, "txn-expiry-open")[:2] == (0, "Ongoing")
    broker.restart()
    # Once the coordinator serves again (Apache Kafka answers NOT_COORDINATOR meanwhile).
    code = wait_until(lambda: _describe_txn(broker.bootstrap, "txn-expiry-idle")[0] not in (14, 15, 16) and
                      _describe_txn(broker.bootstrap, "txn-expiry-idle")[0], "the coordinator serves")  # fmt: skip
    assert code == 105, f"the expired id is back after a restart ({code})"
    again = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-expiry-idle"})
    again.init_transactions(60)
    code, _, pid = _describe_txn(broker.bootstrap, "txn-expiry-idle")
    assert code == 0 and pid != first_pid, (code, pid, first_pid)
