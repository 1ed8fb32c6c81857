"""Consumer groups through Kafka's Java client (kafka-clients 4.1) and Kafka's own tools.

Group members are real KafkaConsumer processes (tests/java GroupConsumer: subscribe,
poll, process, commitSync after every poll and on revocation) that log every
assignment, record and commit as JSON lines; the checks below read those logs. The
classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup, eager and cooperative
assignors) and KIP-848's (ConsumerGroupHeartbeat, group.protocol=consumer) are both
exercised, as are the operator's tools (ConsumerGroupCommand, i.e.
kafka-consumer-groups.sh) and the system-test tools (VerifiableProducer/Consumer).

Records are produced with confluent-kafka (setup only: explicit partitions, numbered
values, every offset known from the delivery reports).
"""

import json
import re
import signal
import subprocess
import time

import pytest

from support import CACHE, need, need_tool, java, wait_until

TOOLS = "org.apache.kafka.tools"
GROUP_COMMAND = f"{TOOLS}.consumer.group.ConsumerGroupCommand"
DRIVER = "dev.ferrolog.tests.GroupConsumer"

# Classic protocol: the client asks for its session timeout (within the broker's
# group.min/max.session.timeout.ms, 6 s..30 min by default). KIP-848's consumer protocol:
# the broker decides (group.consumer.session.timeout.ms, which must lie within
# group.consumer.min/max.session.timeout.ms, 45 s..60 s by default; heartbeat interval
# likewise, 5 s minimum by default); the client may not set either.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000
GROUP_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "group.consumer.min.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS),
    "group.consumer.min.heartbeat.interval.ms": str(HEARTBEAT_MS),
}


# ---- setup helpers ------------------------------------------------------------------


def produce_numbered(bootstrap, topic, counts):
    """Create `topic` with len(counts) partitions and write counts[p] records to partition p,
    key = value = a number unique across the topic. Returns {(partition, offset): value}."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, len(counts), 1)])[topic].result(timeout=30)
    acked, failed = {}, []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value().decode()

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    n = 0
    for p, count in enumerate(counts):
        for _ in range(count):
            while True:
                try:
                    producer.produce(topic, key=str(n), value=str(n), partition=p, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
    assert producer.flush(60) == 0, "producer did not deliver everything within 60 s"
    assert not failed, failed[:5]
    assert sorted(acked) == [(p, o) for p, c in enumerate(counts) for o in range(c)], "acks are not offsets 0..n-1"
    return acked


def java_command(main_class, *args):
    lib = need(CACHE / "java" / "lib" / "ferrolog-client-tests.jar").parent
    need_tool("java")
    return [
        "java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp", f"{lib}/*", main_class, *map(str, args),
    ]  # fmt: skip


class Member:
    """One GroupConsumer process; its JSON events go to NAME.jsonl, its stderr to NAME.err."""

    def __init__(self, workdir, name, bootstrap, group, topic, *args):
        self.name = name
        self.out_path = workdir / f"{name}.jsonl"
        self.err_path = workdir / f"{name}.err"
        cmd = java_command(DRIVER, "--bootstrap", bootstrap, "--group", group, "--topic", topic,
                           "--client-id", name, *args)  # fmt: skip
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)

    def events(self):
        evs = []
        with open(self.out_path, errors="replace") as f:
            for line in f:
                try:
                    evs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut short by kill -9
        return evs

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout_s):
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit within {timeout_s} s; stderr:\n{self.stderr_tail()}")

    def stderr_tail(self, lines=30):
        return "\n".join(self.err_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def members(tmp_path):
    """Start GroupConsumer processes with members(name, bootstrap, group, topic, *args);
    whatever still runs at teardown is killed."""
    started = []

    def start(*args):
        m = Member(tmp_path, *args)
        started.append(m)
        return m

    yield start
    for m in started:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


def ownership(events):
    """The partitions a member holds after its events, from the rebalance listener's deltas."""
    held = set()
    for e in events:
        if e["ev"] == "assigned":
            held |= set(e["partitions"])
        elif e["ev"] in ("revoked", "lost"):
            held -= set(e["partitions"])
    return held


def last_commits(events):
    """{partition: offset} of the latest successful commit per partition in one member's log."""
    out = {}
    for e in events:
        if e["ev"] == "commit":
            out.update({int(p): o for p, o in e["offsets"].items()})
    return out


# ---- the group-log checker ----------------------------------------------------------


# commitSync failures that mean the broker did not (or could not) apply the commit.
REJECTED = re.compile(
    r"RebalanceInProgressException|CommitFailedException|FencedInstanceIdException"
    r"|UnknownMemberIdException|StaleMemberEpochException"
)


def check_group_logs(logs, produced):
    """Judge a group's behaviour from its members' logs ({member name: events}).

    `produced` is {(partition, offset): value}. Returns a list of violations:
    - every produced record was consumed at least once, with its value;
    - a record is consumed again only at or above the partition's committed offset
      (the latest successful commit, by any member, logged before the re-consumption);
    - within one member and generation, no record is consumed twice;
    - a member consumes a partition only while it holds it (between its assigned and
      revoked/lost callbacks), and in each such span reads consecutive offsets starting
      exactly at the group's committed offset when it got the partition (0 if none); a
      commit that was sent but never confirmed (its member was killed) may have landed.
    """
    problems = []
    commits = {}  # partition -> [(ts, offset, confirmed)]: confirmed, or maybe applied
    for evs in logs.values():
        attempt = None
        for e in evs + [None]:
            if attempt is not None and (e is None or e["ev"] != "commit" and not REJECTED.search(e.get("error", ""))):
                # A commitSync with no outcome (the member was killed during it) or one that
                # failed ambiguously (a timeout) may have been applied. Rejected ones were not.
                for p, o in attempt["offsets"].items():
                    commits.setdefault(int(p), []).append((attempt["ts"], o, False))
            attempt = None
            if e is None:
                break
            if e["ev"] == "committing":
                attempt = e
            elif e["ev"] == "commit":
                for p, o in e["offsets"].items():
                    commits.setdefault(int(p), []).append((e["ts"], o, True))
    for c in commits.values():
        c.sort()

    def committed_at(p, ts):
        """(latest confirmed commit before ts or 0, {offsets possibly committed then})."""
        confirmed, possible, confirmed_ts = 0, set(), -1
        for cts, o, ok in commits.get(p, []):
            if cts >= ts:
                break
            if ok:
                confirmed, confirmed_ts = o, cts
        possible.add(confirmed)
        for cts, o, ok in commits.get(p, []):
            if confirmed_ts < cts < ts and not ok:
                possible.add(o)
        return confirmed, possible

    all_records = sorted(
        (e["ts"], name, e) for name, evs in logs.items() for e in evs if e["ev"] == "record"
    )  # fmt: skip
    seen = set()
    per_generation = set()
    for ts, name, e in all_records:
        key = (e["p"], e["o"])
        if key not in produced:
            problems.append(f"{name} consumed p{e['p']}@{e['o']}, which was never produced")
            continue
        if e["value"] != produced[key] or e["key"] != produced[key]:
            problems.append(f"{name} read p{e['p']}@{e['o']} as {e['key']}={e['value']}, produced {produced[key]}")
        if key in seen:
            confirmed, _ = committed_at(e["p"], ts)
            if e["o"] < confirmed:
                problems.append(f"{name} re-consumed p{e['p']}@{e['o']} after offset {confirmed} was committed")
        seen.add(key)
        gkey = (name, e["gen"], key)
        if gkey in per_generation:
            problems.append(f"{name} consumed p{e['p']}@{e['o']} twice in generation {e['gen']}")
        per_generation.add(gkey)
    missing = sorted(set(produced) - seen)
    if missing:
        problems.append(f"{len(missing)} produced records never consumed, e.g. {missing[:5]}")

    for name, evs in logs.items():
        spans = {}  # partition -> (assigned ts, [offsets]) while held
        for e in evs:
            if e["ev"] == "assigned":
                for p in e["partitions"]:
                    spans[p] = (e["ts"], [])
            elif e["ev"] == "record":
                if e["p"] not in spans:
                    problems.append(f"{name} consumed p{e['p']}@{e['o']} while not holding p{e['p']}")
                else:
                    spans[e["p"]][1].append(e["o"])
            if e["ev"] in ("revoked", "lost") or e is evs[-1]:
                ended = e["partitions"] if e["ev"] in ("revoked", "lost") else list(spans)
                for p in ended:
                    if p not in spans:
                        continue
                    start_ts, offsets = spans.pop(p)
                    if not offsets:
                        continue
                    _, possible = committed_at(p, start_ts)
                    if offsets[0] not in possible:
                        problems.append(
                            f"{name} got p{p} when its committed offset was {sorted(possible)}, "
                            f"but started reading at {offsets[0]}"
                        )
                    bad = next((i for i, o in enumerate(offsets) if o != offsets[0] + i), None)
                    if bad is not None:
                        around = offsets[max(0, bad - 2) : bad + 3]
                        problems.append(f"{name} read p{p} out of order or with gaps: ... {around} ...")
    return problems


# ---- a. failover ----------------------------------------------------------------------

PARTITIONS = 12
PER_PARTITION = 400
PACE_MS = 10  # 100 records/s per member: the 4800 records take ~20 s, so the kill lands mid-stream
TAKEOVER_MARGIN_S = 10


@pytest.mark.broker_config(GROUP_CONFIG)
@pytest.mark.parametrize(
    "protocol,strategy",
    [("classic", "range"), ("classic", "cooperative-sticky"), ("consumer", None)],
    ids=["classic-range", "classic-cooperative-sticky", "consumer"],
)
def test_group_failover_after_kill9(broker, tmp_path, members, protocol, strategy):
    """Three members share a 12-partition topic; one is kill -9ed mid-stream. The two
    survivors take its partitions over within the session timeout (plus a margin), resume
    them from its last committed offsets, and every record is consumed, none again below a
    committed offset. Cooperative assignors (cooperative-sticky, KIP-848) do not take
    partitions away from the survivors to do it."""
    topic, group = "failover", f"failover-{protocol}-{strategy or 'server'}"
    produced = produce_numbered(broker.bootstrap, topic, [PER_PARTITION] * PARTITIONS)
    stop_file = tmp_path / "stop"
    args = ["--protocol", protocol, "--pace-ms", PACE_MS, "--max-poll-records", 20,
            "--idle-ms", 120000, "--stop-file", stop_file]  # fmt: skip
    if protocol == "classic":
        args += ["--strategy", strategy, "--session-timeout-ms", SESSION_TIMEOUT_MS,
                 "--heartbeat-interval-ms", HEARTBEAT_MS]  # fmt: skip
    group_members = [members(f"m{i}", broker.bootstrap, group, topic, *args) for i in range(3)]

    def settled():
        for m in group_members:
            if m.proc.poll() is not None:
                pytest.fail(f"{m.name} exited early ({m.proc.returncode}):\n{m.stderr_tail()}")
        held = [ownership(m.events()) for m in group_members]
        committed = all(last_commits(m.events()) for m in group_members)
        balanced = all(len(h) == PARTITIONS // 3 for h in held) and set().union(*held) == set(range(PARTITIONS))
        return held if balanced and committed else None

    held = wait_until(settled, "3 members hold 4 partitions each and have committed", timeout_s=60, interval_s=0.05)
    victim, survivors = group_members[1], [group_members[0], group_members[2]]
    kill_ts = int(time.time() * 1_000_000)
    victim.kill9()
    victim_events = victim.events()
    victim_consumed = {(e["p"], e["o"]) for e in victim_events if e["ev"] == "record"}
    left = [(p, o) for p in held[1] for o in range(PER_PARTITION) if (p, o) not in victim_consumed]
    assert left, "the victim had already consumed all its partitions: the kill came too late to test a takeover"

    def all_consumed():
        got = {(e["p"], e["o"]) for m in group_members for e in m.events() if e["ev"] == "record"}
        for m in survivors:
            if m.proc.poll() is not None:
                pytest.fail(f"{m.name} exited early ({m.proc.returncode}):\n{m.stderr_tail()}")
        return len(got) == len(produced)

    wait_until(all_consumed, "every record consumed by the group", timeout_s=90, interval_s=0.2)
    stop_file.touch()
    for m in survivors:
        assert m.wait(30) == 0, f"{m.name} failed:\n{m.stderr_tail()}"

    logs = {m.name: m.events() for m in group_members}
    for name in ("m0", "m2"):
        errors = [e for e in logs[name] if e["ev"] == "error"]
        assert not errors and logs[name][-1]["ev"] == "closed", f"{name}: {errors or logs[name][-1]}"

    problems = check_group_logs(logs, produced)
    assert not problems, "\n".join(problems[:20])

    # Takeover: the survivors' holdings, replayed in time order, cover every partition again.
    timeline = sorted(
        (e["ts"], name, e) for name in ("m0", "m2") for e in logs[name] if e["ev"] in ("assigned", "revoked", "lost")
    )
    holding = {"m0": set(), "m2": set()}
    takeover_ts = None
    for ts, name, e in timeline:
        if e["ev"] == "assigned":
            holding[name] |= set(e["partitions"])
        else:
            holding[name] -= set(e["partitions"])
        covered = holding["m0"] | holding["m2"] == set(range(PARTITIONS))
        if ts > kill_ts and covered and not holding["m0"] & holding["m2"]:
            takeover_ts = ts
            break
    assert takeover_ts is not None, f"the survivors never held all {PARTITIONS} partitions after the kill"
    takeover_s = (takeover_ts - kill_ts) / 1e6
    limit_s = SESSION_TIMEOUT_MS / 1000 + TAKEOVER_MARGIN_S
    assert takeover_s <= limit_s, f"takeover took {takeover_s:.1f} s (session timeout {SESSION_TIMEOUT_MS} ms)"

    if strategy == "cooperative-sticky" or protocol == "consumer":
        # Incremental rebalancing: the survivors keep what they had and only gain.
        for i, name in ((0, "m0"), (2, "m2")):
            closing = next(e["ts"] for e in logs[name] if e["ev"] == "closing")
            revoked = [
                e for e in logs[name]
                if e["ev"] in ("revoked", "lost") and kill_ts < e["ts"] < closing and e["partitions"]
            ]  # fmt: skip
            assert not revoked, f"{name} lost partitions it kept holding in the kill's rebalance: {revoked}"
            final = ownership([e for e in logs[name] if e["ts"] < closing])
            assert held[i] <= final, f"{name} held {sorted(held[i])} before the kill, {sorted(final)} after"
    print(f"takeover after {takeover_s:.1f} s; victim left {len(left)} records unconsumed")


# ---- static membership ------------------------------------------------------------------

STATIC_SESSION_TIMEOUT_MS = 20000


@pytest.mark.broker_config(GROUP_CONFIG)
def test_static_member_restart_keeps_assignment(broker, tmp_path, members):
    """KIP-345 static membership (group.instance.id), classic protocol with the eager range
    assignor: a member kill -9ed and restarted within its session timeout gets exactly its
    old partitions back at once and resumes from its committed offsets; the other members
    see no rebalance at all (eager would otherwise take every partition away from them)."""
    topic, group, partitions, per_partition = "static", "static-group", 6, 300
    produced = produce_numbered(broker.bootstrap, topic, [per_partition] * partitions)
    stop_file = tmp_path / "stop"
    args = ["--protocol", "classic", "--strategy", "range", "--session-timeout-ms", STATIC_SESSION_TIMEOUT_MS,
            "--heartbeat-interval-ms", HEARTBEAT_MS, "--pace-ms", PACE_MS, "--max-poll-records", 20,
            "--idle-ms", 120000, "--stop-file", stop_file]  # fmt: skip
    group_members = [
        members(f"s{i}", broker.bootstrap, group, topic, "--instance-id", f"instance-{i}", *args) for i in range(3)
    ]

    def settled():
        for m in group_members:
            if m.proc.poll() is not None:
                pytest.fail(f"{m.name} exited early ({m.proc.returncode}):\n{m.stderr_tail()}")
        held = [ownership(m.events()) for m in group_members]
        balanced = all(len(h) == 2 for h in held) and set().union(*held) == set(range(partitions))
        return held if balanced and all(last_commits(m.events()) for m in group_members) else None

    held = wait_until(settled, "3 static members hold 2 partitions each and have committed", 60, interval_s=0.05)
    kill_ts = int(time.time() * 1_000_000)
    group_members[1].kill9()
    restarted = members("s1-again", broker.bootstrap, group, topic, "--instance-id", "instance-1", *args)

    def all_consumed():
        for m in (group_members[0], group_members[2], restarted):
            if m.proc.poll() is not None:
                pytest.fail(f"{m.name} exited early ({m.proc.returncode}):\n{m.stderr_tail()}")
        got = {(e["p"], e["o"]) for m in group_members + [restarted] for e in m.events() if e["ev"] == "record"}
        return len(got) == len(produced)

    wait_until(all_consumed, "every record consumed by the group", timeout_s=90, interval_s=0.2)
    stop_file.touch()
    for m in (group_members[0], group_members[2], restarted):
        assert m.wait(30) == 0, f"{m.name} failed:\n{m.stderr_tail()}"

    logs = {m.name: m.events() for m in group_members + [restarted]}
    problems = check_group_logs(logs, produced)
    assert not problems, "\n".join(problems[:20])

    again = logs["s1-again"]
    first = next(e for e in again if e["ev"] == "assigned")
    got = first["partitions"]
    assert set(got) == held[1], f"the restarted static member got {got}, had {sorted(held[1])}"
    waited_s = (first["ts"] - again[0]["ts"]) / 1e6
    assert waited_s < STATIC_SESSION_TIMEOUT_MS / 1000, f"the restarted member waited {waited_s:.1f} s for partitions"
    for name in ("s0", "s2"):
        closing = next(e["ts"] for e in logs[name] if e["ev"] == "closing")
        moved = [e for e in logs[name] if e["ev"] in ("revoked", "lost", "assigned") and kill_ts < e["ts"] < closing]
        assert not moved, f"{name} saw a rebalance when a static member restarted: {moved}"
    print(f"restarted static member had its partitions {waited_s:.1f} s after starting")


# ---- b. committed offsets survive a restart --------------------------------------------


@pytest.mark.broker_config(GROUP_CONFIG)
def test_committed_offsets_survive_restart(broker, tmp_path):
    """Offsets committed with metadata are still there, exactly, after a clean restart
    and after kill -9; a new member of the group resumes exactly at them."""
    topic, group, counts = "durable", "durable-group", [100, 100, 100]
    produced = produce_numbered(broker.bootstrap, topic, counts)

    def run_member(name, budget, metadata):
        p = java(DRIVER, "--bootstrap", broker.bootstrap, "--group", group, "--topic", topic, "--client-id", name,
                 "--max-records", budget, "--metadata", metadata, "--idle-ms", 30000, timeout_s=90)  # fmt: skip
        events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        failed = [e for e in events if e["ev"] in ("error", "commit_failed")]
        assert events[-1]["ev"] == "closed" and not failed, failed or events[-3:]
        assert next(e for e in events if e["ev"] == "closing")["reason"] == "max-records", events[-3:]
        return events

    def committed():
        out = java("dev.ferrolog.tests.Committed", broker.bootstrap, group, topic, len(counts), timeout_s=90).stdout
        return {int(p): v for p, v in json.loads(out).items()}

    first = run_member("first", 150, "first {partition}@{offset}")
    want = {p: None for p in range(len(counts))}
    want.update({p: {"offset": o, "metadata": f"first {p}@{o}"} for p, o in last_commits(first).items()})
    assert sum(v["offset"] for v in want.values() if v) == 150, want
    assert committed() == want

    broker.restart()
    assert committed() == want, "committed offsets or metadata changed across a clean restart"

    second = run_member("second", 150, "second {partition}@{offset}")
    for p in range(len(counts)):
        got = [e["o"] for e in second if e["ev"] == "record" and e["p"] == p]
        start = want[p]["offset"] if want[p] else 0
        assert got == list(range(start, counts[p])), f"p{p}: resumed at {got[:1]}, committed {want[p]}"
    assert all(e["value"] == produced[(e["p"], e["o"])] for e in second if e["ev"] == "record")

    # Partitions the second member committed carry its metadata; the others keep the first's.
    want.update({p: {"offset": o, "metadata": f"second {p}@{o}"} for p, o in last_commits(second).items()})
    assert {p: v["offset"] for p, v in want.items()} == dict(enumerate(counts)), want
    broker.kill9()
    broker.start()
    assert committed() == want, "committed offsets or metadata changed across kill -9"


# ---- c. kafka-consumer-groups (ConsumerGroupCommand) -----------------------------------


def group_command(broker, *args):
    p = java(GROUP_COMMAND, "--bootstrap-server", broker.bootstrap, *args, timeout_s=60)
    return p.stdout + p.stderr


def table(text, first_column):
    """Rows of a whitespace-separated table whose header starts with `first_column`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cols = line.split()
        if cols and cols[0] == first_column:
            # Split on whitespace: "COORDINATOR (ID)" in --state's header is two columns, and
            # so is its value "HOST:PORT  (ID)".
            header = cols
            rows = []
            for row in lines[i + 1 :]:
                if not row.strip():
                    break
                rows.append(dict(zip(header, row.split())))
            return rows
    return None


@pytest.mark.broker_config(GROUP_CONFIG)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consumer_group_command(broker, tmp_path, members, protocol):
    """kafka-consumer-groups: --list, --describe (offsets, lag, owner), --members, --state;
    --delete and --reset-offsets refused while a member is active; after it leaves,
    --reset-offsets --to-earliest --execute, --delete-offsets, --delete."""
    topic, group, counts = "cgc", f"cgc-{protocol}", [50, 30, 20]
    produce_numbered(broker.bootstrap, topic, counts)
    stop_file = tmp_path / "stop"
    m = members("cgc-member", broker.bootstrap, group, topic, "--protocol", protocol, "--max-records", 40,
                "--hold", "--stop-file", stop_file)  # fmt: skip

    def holding():
        if m.proc.poll() is not None:
            pytest.fail(f"member exited ({m.proc.returncode}):\n{m.stderr_tail()}")
        return any(e["ev"] == "hold" for e in m.events())

    wait_until(holding, "the member consumed 40 records and holds", timeout_s=60)
    events = m.events()
    member_id = next(e["member_id"] for e in events if e["ev"] == "assigned")
    commits = last_commits(events)
    assert sum(commits.values()) == 40, commits

    out = group_command(broker, "--list")
    assert group in out.split(), out

    out = group_command(broker, "--describe", "--group", group)
    rows = table(out, "GROUP")
    assert rows is not None, out
    got = {int(r["PARTITION"]): r for r in rows}
    assert sorted(got) == [0, 1, 2], out
    for p, r in got.items():
        current = commits.get(p)
        want = {"GROUP": group, "TOPIC": topic, "PARTITION": str(p),
                "CURRENT-OFFSET": "-" if current is None else str(current), "LOG-END-OFFSET": str(counts[p]),
                "LAG": "-" if current is None else str(counts[p] - current),
                "CONSUMER-ID": member_id, "HOST": "/127.0.0.1", "CLIENT-ID": "cgc-member"}  # fmt: skip
        assert r == want, f"partition {p}:\n{out}"

    out = group_command(broker, "--describe", "--group", group, "--members", "--verbose")
    rows = table(out, "GROUP")
    assert rows and len(rows) == 1, out
    assert rows[0]["CONSUMER-ID"] == member_id and rows[0]["CLIENT-ID"] == "cgc-member", out
    assert rows[0]["#PARTITIONS"] == "3", out
    assert rows[0]["CURRENT-ASSIGNMENT"] == f"{topic}:0,1,2", out
    if protocol == "consumer":
        # ConsumerGroupDescribe: member epoch and target assignment (KIP-848).
        assert rows[0]["TARGET-ASSIGNMENT"] == f"{topic}:0,1,2", out
        assert rows[0]["CURRENT-EPOCH"] == rows[0]["TARGET-EPOCH"] != "-", out

    out = group_command(broker, "--describe", "--group", group, "--state")
    rows = table(out, "GROUP")
    assert rows and len(rows) == 1, out
    state = rows[0]
    assert state["STATE"] == "Stable" and state["#MEMBERS"] == "1", out
    assert state["ASSIGNMENT-STRATEGY"] == ("range" if protocol == "classic" else "uniform"), out
    assert broker.bootstrap in out, f"coordinator should be this broker:\n{out}"

    out = group_command(broker, "--delete", "--group", group)
    assert "GroupNotEmptyException" in out, out
    out = group_command(broker, "--reset-offsets", "--to-earliest", "--execute", "--group", group, "--topic", topic)
    assert "can only be reset if the group" in out and "inactive" in out, out

    stop_file.touch()
    assert m.wait(30) == 0, m.stderr_tail()

    out = group_command(broker, "--describe", "--group", group, "--state")
    state = table(out, "GROUP")[0]
    assert state["STATE"] == "Empty" and state["#MEMBERS"] == "0", out

    out = group_command(broker, "--reset-offsets", "--to-earliest", "--execute", "--group", group, "--topic", topic)
    rows = table(out, "GROUP")
    assert rows and {int(r["PARTITION"]): r["NEW-OFFSET"] for r in rows} == {0: "0", 1: "0", 2: "0"}, out
    out = group_command(broker, "--describe", "--group", group)
    rows = table(out, "GROUP")
    got = {int(r["PARTITION"]): (r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"], r["CONSUMER-ID"]) for r in rows}
    assert got == {p: ("0", str(c), str(c), "-") for p, c in enumerate(counts)}, out

    out = group_command(broker, "--delete-offsets", "--group", group, "--topic", f"{topic}:2")
    rows = table(out, "TOPIC")
    assert rows == [{"TOPIC": topic, "PARTITION": "2", "STATUS": "Successful"}], out
    out = group_command(broker, "--describe", "--group", group)
    assert sorted(int(r["PARTITION"]) for r in table(out, "GROUP")) == [0, 1], out

    out = group_command(broker, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out, out
    out = group_command(broker, "--list")
    assert group not in out.split(), out
    # The group's offsets went with it.
    got = json.loads(java("dev.ferrolog.tests.Committed", broker.bootstrap, group, topic, 3).stdout)
    assert got == {"0": None, "1": None, "2": None}, got


# ---- d. VerifiableProducer -> VerifiableConsumer ----------------------------------------


def verifiable_consumer(broker, topic, group, protocol, max_messages):
    args = ["--bootstrap-server", broker.bootstrap, "--topic", topic, "--group-id", group,
            "--group-protocol", protocol, "--max-messages", max_messages, "--verbose"]  # fmt: skip
    if protocol == "classic":
        args += ["--session-timeout", SESSION_TIMEOUT_MS]
    p = java(f"{TOOLS}.VerifiableConsumer", *args, timeout_s=90)
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


@pytest.mark.broker_config(GROUP_CONFIG)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_verifiable_consumer(broker, protocol):
    """VerifiableConsumer reads what VerifiableProducer wrote: exactly once, every commit
    succeeds, it shuts down cleanly; a second run in the same group reads exactly the rest."""
    topic, group = "verifiable", f"verifiable-{protocol}"
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    out = java(f"{TOOLS}.VerifiableProducer", "--bootstrap-server", broker.bootstrap, "--topic", topic,
               "--max-messages", 1500, "--acks", -1).stdout  # fmt: skip
    produced = {}
    for e in (json.loads(line) for line in out.splitlines() if line.startswith("{")):
        if e["name"] == "producer_send_success":
            produced[(e["partition"], e["offset"])] = e["value"]
        assert e["name"] != "producer_send_error", e
    assert len(produced) == 1500 and sorted(produced.values(), key=int) == [str(i) for i in range(1500)]

    consumed, committed_before = {}, {}
    for run, budget in (("first", 1000), ("second", 500)):
        events = verifiable_consumer(broker, topic, group, protocol, budget)
        names = [e["name"] for e in events]
        assert names[0] == "startup_complete" and names[-1] == "shutdown_complete", names[:3] + names[-3:]
        records = [e for e in events if e["name"] == "record_data"]
        assert len(records) == budget, f"{run} run consumed {len(records)} records, wanted {budget}"
        starts = {}
        for r in records:
            key = (r["partition"], r["offset"])
            assert key not in consumed, f"{run} run consumed p{key[0]}@{key[1]} again"
            assert r["value"] == produced.get(key), f"p{key[0]}@{key[1]} is {r['value']}, produced {produced.get(key)}"
            consumed[key] = run
            starts.setdefault(r["partition"], r["offset"])
        commits = [e for e in events if e["name"] == "offsets_committed"]
        assert commits and all(e["success"] for e in commits), [e for e in commits if not e["success"]][:3]
        last = {}
        for e in commits:
            last.update({o["partition"]: o["offset"] for o in e["offsets"]})
        for p in {r["partition"] for r in records}:
            high = max(r["offset"] for r in records if r["partition"] == p)
            assert last[p] == high + 1, f"{run}: p{p} consumed up to {high}, committed {last.get(p)}"
        for p, o in starts.items():
            want = committed_before.get(p, 0)
            assert o == want, f"{run} run started p{p} at {o}, the group's committed offset was {want}"
        committed_before.update(last)
    assert set(consumed) == set(produced), "the two runs together did not read every record exactly once"
