"""franz-go (kgo client, kadm admin), the most widely used pure-Go Kafka client.

franz-go negotiates the newest request versions it knows and is strict about
the protocol, so it catches broker answers that the Java client tolerates.

Exactly-once: members of a kgo.GroupTransactSession pipeline (`franzcheck eos`) copy a
topic while some of them die mid-transaction, and read_committed sees each record once.
"""

import json
import signal
import subprocess
import time
from collections import Counter

import pytest
import roundtrip
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support import CACHE, need, read_all, run, wait_for_partition_leaders


def test_franz_go_round_trip(broker, tmp_path):
    """kadm creates the topic; idempotent kgo producers with every codec; direct partition
    consumption reads everything back exactly; kadm.ListOffsetsAfterMilli finds the offsets."""
    binary = need(CACHE / "go" / "franzcheck")
    spec = roundtrip.make_spec("franz-go-roundtrip")
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec))

    run([binary, broker.bootstrap, spec_path, result_path], timeout_s=180)

    roundtrip.check(spec, json.loads(result_path.read_text()))


# ---- exactly-once pipeline: kgo.GroupTransactSession ------------------------------------------
EOS_PARTITIONS = 3
EOS_PER_PARTITION = 1000
EOS_BATCH = 200  # records per poll, so per transaction
EOS_DELAY_MS = 3  # per record: 2000 records take one member 6 s, so work is left when one dies
EOS_TIMEOUT_S = 60


class _Pipeline:
    """`franzcheck eos` member processes, each writing its events to NAME.jsonl (stderr to NAME.err)."""

    def __init__(self, binary, bootstrap, tmp_path, group, in_topic, out_topic):
        self.argv = [str(binary), "eos", bootstrap, group, in_topic, out_topic]
        self.tmp_path = tmp_path
        self.procs, self.files = {}, []

    def start(self, name, txn_id, init="lazy", crash="none"):
        out, err = open(self.tmp_path / f"{name}.jsonl", "w"), open(self.tmp_path / f"{name}.err", "w")
        self.files += [out, err]
        argv = self.argv + [txn_id, str(EOS_BATCH), str(EOS_DELAY_MS), init, crash]
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def events(self, name):
        lines = (self.tmp_path / f"{name}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def logs(self, lines=12):
        out = []
        for name in self.procs:
            for suffix in ("jsonl", "err"):
                text = (self.tmp_path / f"{name}.{suffix}").read_text().splitlines()
                out.append(f"--- {name}.{suffix} (exit {self.procs[name].poll()}):\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def wait_exit(self, name, code):
        try:
            got = self.procs[name].wait(timeout=EOS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after {EOS_TIMEOUT_S} s\n{self.logs()}")
        assert got == code, f"{name} exited {got}, expected {code}\n{self.logs()}"

    def wait_for(self, predicate, what):
        deadline = time.monotonic() + EOS_TIMEOUT_S
        while not predicate():
            for name, p in self.procs.items():
                if p.poll() not in (None, 3, -signal.SIGKILL):
                    pytest.fail(f"{name} exited {p.poll()} while waiting for {what}\n{self.logs()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {EOS_TIMEOUT_S} s\n{self.logs()}")
            time.sleep(0.1)

    def committed_txns(self, name):
        return [e for e in self.events(name) if e["ev"] == "txn" and e["committed"]]

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in self.files:
            f.close()


# A dead member's transaction that nobody fences is aborted within a second of its timeout;
# the group's first members do not wait for more to join (start-apache-kafka.sh sets the same).
EOS_BROKER_CONFIG = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.mark.broker_config(EOS_BROKER_CONFIG)
def test_franz_go_group_transact_session_copies_exactly_once(broker, tmp_path):
    """franz-go's consume-transform-produce pipeline (kgo.GroupTransactSession: KIP-98
    transactions with the group's offsets in them, KIP-447) copies an input topic to an
    output topic while its members die mid-transaction, by os.Exit (after the transaction's
    records are written, or after its offsets are pending too) or by SIGKILL from here. The
    group goes on from the committed offsets: a dead member's open transaction is aborted
    when a member with the same transactional id fences it, or when it times out, and until
    then its pending offsets hold the next owner of its partitions back (require_stable).
    read_committed sees every input record exactly once in the output, the aborted copies
    only read_uncommitted does, and the group's committed offsets are the input's end."""
    binary = need(CACHE / "go" / "franzcheck")
    src, dst, group = "eos-in", "eos-out", "eos-copier"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for topic in (src, dst):
        admin.create_topics([NewTopic(topic, EOS_PARTITIONS, 1)])[topic].result(30)
        wait_for_partition_leaders(broker.bootstrap, topic, EOS_PARTITIONS)
    inputs = [f"in-{i}" for i in range(EOS_PARTITIONS * EOS_PER_PARTITION)]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, value in enumerate(inputs):
        producer.produce(src, value=value.encode(), partition=i % EOS_PARTITIONS)
        producer.poll(0)
    assert producer.flush(60) == 0

    members = _Pipeline(binary, broker.bootstrap, tmp_path, group, src, dst)
    crashes = []

    def crashed(name):
        members.wait_exit(name, 3)
        crashes.append(members.events(name)[-1])
        assert crashes[-1]["ev"] == "crash", members.logs()

    try:
        # Two members die in the transaction after their 2nd and 3rd commits: a1 with its
        # offsets pending, b1 with its records written.
        members.start("a1", "eos-a", crash="offsets:2")
        members.start("b1", "eos-b", crash="produce:3")
        crashed("a1")
        crashed("b1")
        # a2 initializes its producer only after fetching its offsets, which a1's pending
        # ones hold back until a1's transaction times out. b2 fences b1 as it begins its
        # first transaction, and dies with the offsets of its second pending.
        members.start("a2", "eos-a")
        members.start("b2", "eos-b", crash="offsets:1")
        crashed("b2")
        # b3 fences b2 before it joins, aborting b2's pending offsets; killed once it has
        # committed, most likely mid-transaction; b4 takes over.
        members.start("b3", "eos-b", init="eager")
        members.wait_for(lambda: members.committed_txns("b3"), "b3 commits a transaction")
        time.sleep(0.2)
        members.procs["b3"].kill()
        members.procs["b3"].wait()
        members.start("b4", "eos-b")

        def done():
            committed = {}
            for name in members.procs:
                for e in members.committed_txns(name):
                    for p, o in e["next"].items():
                        committed[int(p)] = max(committed.get(int(p), 0), o)
            return committed == {p: EOS_PER_PARTITION for p in range(EOS_PARTITIONS)}

        members.wait_for(done, "every input partition committed to its end")
        for name in ("a2", "b4"):
            members.procs[name].terminate()
            members.wait_exit(name, 0)
        # Committed transactions tile each input partition: none skipped, none copied twice.
        ranges = sorted(
            (int(p), e["first"][p], e["next"][p]) for n in members.procs for e in members.committed_txns(n) for p in e["first"]
        )  # fmt: skip
        for p in range(EOS_PARTITIONS):
            mine = [(first, end) for q, first, end in ranges if q == p]
            assert [first for first, _ in mine] == [0] + [end for _, end in mine[:-1]], (p, mine, members.logs())
    finally:
        members.close()

    copied = [v.decode() for _, v in read_all(broker.bootstrap, dst, EOS_PARTITIONS, "read_committed", EOS_TIMEOUT_S)]
    duplicated = sorted(v for v, n in Counter(copied).items() if n > 1)
    lost = sorted(set(inputs) - set(copied))
    assert not duplicated and not lost, f"{len(duplicated)} duplicated, e.g. {duplicated[:5]}; {len(lost)} lost, e.g. {lost[:5]}"
    assert sorted(copied) == sorted(inputs)
    # The dead members' open transactions were written, and aborted: read_uncommitted shows them.
    uncommitted = [v.decode() for _, v in read_all(broker.bootstrap, dst, EOS_PARTITIONS, "read_uncommitted", EOS_TIMEOUT_S)]
    assert len(uncommitted) >= len(inputs) + sum(c["n"] for c in crashes), (len(uncommitted), crashes)

    report = json.loads(run([binary, "offsets", broker.bootstrap, group, src], timeout_s=60).stdout)
    assert {p: o["offset"] for p, o in report["offsets"].items()} == {
        str(p): EOS_PER_PARTITION for p in range(EOS_PARTITIONS)
    }, report
    assert report["state"] == "Empty", report
