"""Consumer groups through real clients: librdkafka (confluent-kafka) and franz-go.

Failover: three member processes share a 12-partition topic of numbered
records, each logging what it was assigned, consumed and committed
(tests/group_consumer.py for librdkafka, `franzcheck group` for franz-go); once
all three own partitions and have committed, one is killed with SIGKILL. The
survivors must take its partitions over within the session timeout plus a
margin and consume everything, and the logs must show the group semantics a
user relies on:

  * every record is consumed at least once, with the value produced at its offset;
  * nothing is consumed again once its offset has been committed: a record at
    offset o of partition p may be consumed a second time only if o is at or
    after the last offset committed for p before that moment (the at-least-once
    window between a member's last commit and its death);
  * members consume only partitions they own at that moment;
  * cooperative protocols (cooperative-sticky, KIP-848) add and remove partitions
    incrementally and never take partitions away from the survivors when a member
    dies; the eager protocol (range) revokes the whole assignment every time;
  * at the end every partition's committed offset is its end offset.

Offsets: committed offsets with metadata survive a broker kill -9 and restart,
and the admin views of librdkafka and kadm (group listing, description, members,
assignments, lag) agree with what was committed.

Broker configs (both targets): the classic members ask for a 6 s session (the
smallest group.min.session.timeout.ms allows); for KIP-848 members the session
timeout and heartbeat interval are the broker's, so group.consumer.* are lowered
to 6 s and 1 s (their minimums with them), or a dead member would hold its
partitions for 45 s.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import kafka_wire as wire
import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from support import CACHE, need, run, wait_for_partition_leaders, wait_until

SESSION_TIMEOUT_S = 6
GROUP_CONFIG = {
    "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_S * 1000),
    "group.consumer.min.session.timeout.ms": str(SESSION_TIMEOUT_S * 1000),
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
}
pytestmark = pytest.mark.broker_config(GROUP_CONFIG)

PARTITIONS = 12
PER_PARTITION = 400
MEMBERS = 3
DELAY_MS = 5  # processing time per record: 1600 records a member take 8 s or more
TAKEOVER_MARGIN_S = 10  # beyond the session timeout: rejoin, sync, offset fetch, first fetch
TIMEOUT_S = 60
RDKAFKA_CONSUMER = Path(__file__).resolve().parent / "group_consumer.py"


# ---- helpers -----------------------------------------------------------------------------
def create_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[topic].result(TIMEOUT_S)
    wait_for_partition_leaders(bootstrap, topic, partitions)


def produce_numbered(bootstrap, topic, counts):
    """counts: {partition: n}; record i of partition p has value "p:i" and must land at offset i."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    misplaced = []

    def delivered(err, msg):
        if err is not None or msg.value().decode() != f"{msg.partition()}:{msg.offset()}":
            misplaced.append((err, msg.partition(), msg.offset(), msg.value()))

    for i in range(max(counts.values())):
        for p, n in counts.items():
            if i < n:
                producer.produce(topic, value=f"{p}:{i}".encode(), partition=p, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "records still undelivered"
    assert not misplaced, f"records not delivered at the offsets their values name: {misplaced[:5]}"


def read_events(path):
    """The JSON lines a member wrote so far (a last line still being written is left out)."""
    events = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return events
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return events


def owned_now(events, incremental):
    """The partitions a member owns after its events."""
    owned = set()
    for e in events:
        if e["ev"] == "assign":
            owned = owned | set(e["partitions"]) if incremental else set(e["partitions"])
        elif e["ev"] in ("revoke", "lost"):
            owned -= set(e["partitions"])
    return owned


def committed_since_last_assign(events):
    last_assign = max((i for i, e in enumerate(events) if e["ev"] == "assign"), default=None)
    return last_assign is not None and any(e["ev"] == "commit" for e in events[last_assign:])


def log_tails(paths, lines=15):
    out = []
    for name, path in paths.items():
        text = Path(path).read_text() if Path(path).exists() else ""
        out.append(f"--- {name}:\n" + "\n".join(text.splitlines()[-lines:]))
        err = Path(str(path) + ".err")
        if err.exists() and err.read_text().strip():
            out.append(f"--- {name} stderr:\n" + "\n".join(err.read_text().splitlines()[-lines:]))
    return "\n".join(out)


class Members:
    """Member processes, each writing its events to NAME.jsonl (stderr to NAME.jsonl.err)."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.procs = {}
        self.paths = {}
        self.files = []

    def start(self, name, cmd):
        path = self.tmp_path / f"{name}.jsonl"
        out, err = open(path, "w"), open(str(path) + ".err", "w")
        self.files += [out, err]
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.paths[name] = path

    def events(self, name):
        return read_events(self.paths[name])

    def kill9(self, name):
        self.procs[name].kill()
        self.procs[name].wait(timeout=30)

    def stop(self, name, timeout_s=30):
        """SIGTERM: the member leaves the group and exits 0."""
        p = self.procs[name]
        p.terminate()
        try:
            code = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"{name} did not exit within {timeout_s} s of SIGTERM\n{log_tails(self.paths)}")
        assert code == 0, f"{name} exited {code}\n{log_tails({name: self.paths[name]})}"

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in self.files:
            f.close()


# ---- the checker ---------------------------------------------------------------------------
def check_failover(logs, victim, kill_time, stop_time, incremental, partitions, per_partition):
    """logs: {member: events}. Returns a list of violations (empty when all is well)."""
    problems = []
    commits = []  # (t, p, offset), from every member
    for events in logs.values():
        for e in events:
            if e["ev"] == "commit":
                commits += [(e["t"], int(p), o) for p, o in e["offsets"].items()]
    commits.sort()

    def committed_before(p, t):
        best = None
        for ct, cp, co in commits:
            if ct >= t:
                break
            if cp == p and (best is None or co > best):
                best = co
        return best

    for name, events in logs.items():
        owned = set()
        for e in events:
            ev = e["ev"]
            if ev == "assign":
                added = set(e["partitions"])
                if incremental:
                    if added & owned:
                        problems.append(f"{name}: assigned {sorted(added & owned)} it already owned (t={e['t']:.3f})")
                    owned |= added
                else:
                    if owned:
                        problems.append(f"{name}: eager assign while still owning {sorted(owned)} (t={e['t']:.3f})")
                    owned = added
            elif ev in ("revoke", "lost") and e["partitions"]:
                # (franz-go's cooperative balancer also calls its revoke callback with nothing in it)
                taken = set(e["partitions"])
                if not taken <= owned:
                    problems.append(f"{name}: {ev} of {sorted(taken - owned)} it did not own (t={e['t']:.3f})")
                if not incremental and ev == "revoke" and taken != owned:
                    problems.append(f"{name}: eager revoke of {sorted(taken)} while owning {sorted(owned)}")
                if incremental and name != victim and kill_time < e["t"] < stop_time:
                    problems.append(f"{name}: {ev} of {sorted(taken)} after the kill; survivors should only gain")
                owned -= taken
            elif ev == "msg":
                p, o = e["p"], e["o"]
                if e["v"] != f"{p}:{o}":
                    problems.append(f"{name}: partition {p} offset {o} has value {e['v']!r}")
                if p not in owned:
                    problems.append(f"{name}: consumed {p}@{o} without owning partition {p} (owns {sorted(owned)})")

    # Consumption in time order, all members together: nothing below an offset that
    # someone had already committed (a second consumption is allowed from the last
    # committed offset on; a first one below it would mean the commit skipped records).
    consumed = set()
    msgs = sorted((e["t"], name, e["p"], e["o"]) for name, events in logs.items() for e in events if e["ev"] == "msg")
    for t, name, p, o in msgs:
        c = committed_before(p, t)
        if c is not None and o < c:
            again = "again " if (p, o) in consumed else ""
            problems.append(f"{name}: consumed {p}@{o} {again}after offset {c} had been committed (t={t:.3f})")
        consumed.add((p, o))

    missing = [(p, o) for p in range(partitions) for o in range(per_partition) if (p, o) not in consumed]
    if missing:
        problems.append(f"{len(missing)} records never consumed, e.g. {missing[:10]}")
    final = {p: max((co for _, cp, co in commits if cp == p), default=None) for p in range(partitions)}
    if any(final[p] != per_partition for p in range(partitions)):
        problems.append(f"last committed offsets {final}, expected {per_partition} everywhere")
    return problems


# ---- failover --------------------------------------------------------------------------------
def run_failover(broker, tmp_path, group, command_for, incremental):
    """Start MEMBERS members (command_for(i) -> argv), kill one once the group is settled,
    wait until everything is committed, stop the survivors, check the logs."""
    topic = f"{group}-topic"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    produce_numbered(broker.bootstrap, topic, {p: PER_PARTITION for p in range(PARTITIONS)})

    members = Members(tmp_path)
    names = [f"member{i}" for i in range(MEMBERS)]
    try:
        for i, name in enumerate(names):
            members.start(name, command_for(i, topic))

        def settled():
            # Every member owns its share (every assignor here balances 12 partitions
            # 4/4/4; fewer means a cooperative rebalance is still moving partitions) and
            # has committed since its last assignment; together they own every partition.
            logs = {n: members.events(n) for n in names}
            owned = {n: owned_now(ev, incremental) for n, ev in logs.items()}
            if any(len(ps) != PARTITIONS // MEMBERS for ps in owned.values()):
                return False
            if not all(committed_since_last_assign(ev) for ev in logs.values()):
                return False
            flat = [p for ps in owned.values() for p in ps]
            return sorted(flat) == list(range(PARTITIONS)) and owned

        deadline = time.monotonic() + TIMEOUT_S
        while not (owned_at_kill := settled()):
            for n in names:
                if members.procs[n].poll() is not None:
                    pytest.fail(f"{n} exited early\n{log_tails(members.paths)}")
            if time.monotonic() > deadline:
                pytest.fail(f"the group did not settle within {TIMEOUT_S} s\n{log_tails(members.paths)}")
            time.sleep(0.1)

        victim = names[1]
        survivors = [n for n in names if n != victim]
        kill_time = time.time()
        members.kill9(victim)
        orphaned = owned_at_kill[victim]

        def all_committed():
            done = {}
            for n in names:
                for e in members.events(n):
                    if e["ev"] == "commit":
                        for p, o in e["offsets"].items():
                            done[int(p)] = max(done.get(int(p), 0), o)
            return all(done.get(p) == PER_PARTITION for p in range(PARTITIONS))

        wait_until(all_committed, "every partition committed up to its end offset", TIMEOUT_S, interval_s=0.2)
        stop_time = time.time()
        for n in survivors:
            members.stop(n)
        logs = {n: members.events(n) for n in names}

        # Takeover: every orphaned partition is assigned to a survivor, soon enough.
        taken_over = {}
        for n in survivors:
            for e in logs[n]:
                if e["ev"] == "assign" and e["t"] > kill_time:
                    for p in e["partitions"]:
                        if p in orphaned and p not in taken_over:
                            taken_over[p] = e["t"] - kill_time
        assert set(taken_over) == orphaned, (
            f"orphaned partitions {sorted(orphaned)}, taken over {taken_over}\n{log_tails(members.paths)}"
        )
        slowest = max(taken_over.values())
        assert slowest <= SESSION_TIMEOUT_S + TAKEOVER_MARGIN_S, f"takeover took {slowest:.1f} s: {taken_over}"
        # The victim died with work left: its partitions were consumed by the survivors.
        taken_msgs = [
            e for n in survivors for e in logs[n] if e["ev"] == "msg" and e["p"] in orphaned and e["t"] > kill_time
        ]
        assert taken_msgs, "the survivors consumed nothing from the victim's partitions; the test lost its point"

        problems = check_failover(logs, victim, kill_time, stop_time, incremental, PARTITIONS, PER_PARTITION)
        assert not problems, "\n".join(problems[:30]) + "\n" + log_tails(members.paths)
    finally:
        members.close()

    # The broker agrees: every partition's committed offset is the end offset.
    with wire.Connection(broker.bootstrap) as conn:
        fetched = wire.parse_offset_fetch(
            wire.group_call(conn, wire.OFFSET_FETCH, 9, wire.offset_fetch(group, {topic: list(range(PARTITIONS))})), 9
        )
    assert fetched["error_code"] == wire.NONE
    assert {p: o["offset"] for (t, p), o in fetched["offsets"].items()} == {p: PER_PARTITION for p in range(PARTITIONS)}


@pytest.mark.parametrize("protocol", ["range", "cooperative-sticky", "consumer"])
def test_librdkafka_group_failover(broker, tmp_path, protocol):
    """confluent-kafka members (classic eager range, classic cooperative-sticky, KIP-848):
    one is killed, the survivors take over and everything is consumed, nothing committed
    is consumed again."""
    group = f"rdkafka-{protocol}"

    def command(i, topic):
        return [sys.executable, str(RDKAFKA_CONSUMER), broker.bootstrap, group, topic, protocol, str(DELAY_MS)]

    run_failover(broker, tmp_path, group, command, incremental=protocol != "range")


@pytest.mark.parametrize("balancer", ["cooperative-sticky", "range", "server"])
def test_franz_go_group_failover(broker, tmp_path, balancer):
    """franz-go members (kgo.ConsumerGroup with its default cooperative-sticky balancer,
    the eager range balancer, and KIP-848 via kgo.ServerSideBalancer): the same failover."""
    binary = need(CACHE / "go" / "franzcheck")
    group = f"franz-{balancer}"

    def command(i, topic):
        return [str(binary), "group", broker.bootstrap, group, topic, balancer, str(DELAY_MS)]

    run_failover(broker, tmp_path, group, command, incremental=balancer != "range")


# ---- committed offsets and the admin views ---------------------------------------------------
COORDINATOR_NOT_READY = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
}


def retrying(fn, what):
    """fn(), again while it fails with "coordinator not ready" errors (up to TIMEOUT_S)."""

    def attempt():
        try:
            return (fn(),)
        except KafkaException as e:
            if e.args[0].code() in COORDINATOR_NOT_READY:
                return None
            raise

    return wait_until(attempt, what, TIMEOUT_S, interval_s=0.5)[0]


def test_committed_offsets_survive_restart_and_admin_views(broker):
    """Offsets committed with metadata (classic and KIP-848 groups) read back through
    confluent-kafka committed()/list_consumer_group_offsets and kadm FetchOffsets, before
    and after kill -9 and restart; list/describe groups and kadm Lag report state,
    members, assignments and lag."""
    binary = need(CACHE / "go" / "franzcheck")
    topic = "committed"
    partitions = 4
    ends = {p: 10 * (p + 1) for p in range(partitions)}  # 10, 20, 30, 40 records
    create_topic(broker.bootstrap, topic, partitions)
    produce_numbered(broker.bootstrap, topic, ends)
    want = {
        "classic-offsets": {p: 3 + p for p in range(partitions)},
        "consumer-offsets": {p: 5 + 2 * p for p in range(partitions)},
    }
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def member(group):
        config = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "client.id": f"{group}-member",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        if group == "consumer-offsets":
            config["group.protocol"] = "consumer"
        else:
            config.update(
                {"group.protocol": "classic", "partition.assignment.strategy": "range", "session.timeout.ms": 6000}
            )
        return Consumer(config)

    def wait_for_assignment(consumer):
        deadline = time.monotonic() + TIMEOUT_S
        while len(consumer.assignment()) < partitions:
            assert time.monotonic() < deadline, f"assignment {consumer.assignment()} after {TIMEOUT_S} s"
            consumer.poll(0.2)

    def commit(consumer, group):
        tps = [TopicPartition(topic, p, o, metadata=f"{group} meta {p}") for p, o in want[group].items()]
        done = consumer.commit(offsets=tps, asynchronous=False)
        assert all(tp.error is None for tp in done), done

    def committed_through_rdkafka(group):
        # A consumer that never subscribes: committed() is an OffsetFetch for its group.id.
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
        finally:
            c.close()
        return {tp.partition: (tp.offset, tp.metadata) for tp in tps}

    def committed_through_admin(group):
        f = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=10)[group]
        return {
            tp.partition: (tp.offset, tp.metadata) for tp in f.result(TIMEOUT_S).topic_partitions if tp.topic == topic
        }

    def kadm_report(group):
        return json.loads(run([binary, "offsets", broker.bootstrap, group, topic], timeout_s=TIMEOUT_S).stdout)

    def expected(group):
        return {p: (o, f"{group} meta {p}") for p, o in want[group].items()}

    def kadm_offsets(group):
        # confluent-kafka sends commit metadata as a C string, terminating NUL included,
        # and cuts it off again when reading; the broker keeps the bytes it was given,
        # so other clients see the NUL.
        return {str(p): {"offset": o, "metadata": f"{group} meta {p}\x00"} for p, o in want[group].items()}

    # Both groups active: each member owns all four partitions and commits.
    classic, kip848 = member("classic-offsets"), member("consumer-offsets")
    try:
        for c, group in ((classic, "classic-offsets"), (kip848, "consumer-offsets")):
            c.subscribe([topic])
            wait_for_assignment(c)
            commit(c, group)

        for group in want:
            assert committed_through_rdkafka(group) == expected(group)
            assert committed_through_admin(group) == expected(group)

        listed = admin.list_consumer_groups().result(TIMEOUT_S)
        states = {g.group_id: g.state for g in listed.valid}
        assert states.get("classic-offsets") == ConsumerGroupState.STABLE, states
        assert states.get("consumer-offsets") == ConsumerGroupState.STABLE, states

        described = {g: f.result(TIMEOUT_S) for g, f in admin.describe_consumer_groups(list(want)).items()}
        for group, d in described.items():
            assert d.state == ConsumerGroupState.STABLE, (group, d.state)
            assert [m.client_id for m in d.members] == [f"{group}-member"], d.members
            assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == list(range(partitions))
        assert described["classic-offsets"].partition_assignor == "range"

        # kadm on the classic group (DescribeGroups and Lag are classic-group APIs).
        report = kadm_report("classic-offsets")
        assert report["state"] == "Stable" and report["protocol_type"] == "consumer" and report["protocol"] == "range"
        assert [(m["client_id"], m["partitions"]) for m in report["members"]] == [
            ("classic-offsets-member", list(range(partitions)))
        ]
        assert report["offsets"] == kadm_offsets("classic-offsets")
        assert report["lag"] == {
            str(p): {"committed": o, "end": ends[p], "lag": ends[p] - o} for p, o in want["classic-offsets"].items()
        }
    finally:
        classic.close()
        kip848.close()

    # Crash and restart: the commits were acknowledged, so they are still there.
    broker.kill9()
    broker.start()
    # A fresh AdminClient: librdkafka's admin requests can time out for good on a client
    # whose connections the kill broke (seen against Apache Kafka too).
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for group in want:
        # Right after a start, the coordinator may still be loading __consumer_offsets.
        assert retrying(lambda g=group: committed_through_rdkafka(g), f"{group} committed()") == expected(group)
        assert retrying(lambda g=group: committed_through_admin(g), f"{group} offsets") == expected(group)

    listed = admin.list_consumer_groups().result(TIMEOUT_S)
    states = {g.group_id: g.state for g in listed.valid}
    assert states.get("classic-offsets") == ConsumerGroupState.EMPTY, states
    assert states.get("consumer-offsets") == ConsumerGroupState.EMPTY, states

    report = kadm_report("classic-offsets")
    assert report["state"] == "Empty" and report["members"] == []
    assert report["offsets"] == kadm_offsets("classic-offsets")
    assert report["lag"] == {
        str(p): {"committed": o, "end": ends[p], "lag": ends[p] - o} for p, o in want["classic-offsets"].items()
    }
