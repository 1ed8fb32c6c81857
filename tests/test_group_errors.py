"""Consumer-group requests over the raw wire, pinned to what Apache Kafka 4.1 answers.

Client libraries hide most coordinator errors behind retries and rejoins, so these
tests send hand-built requests (kafka_wire) at the versions current clients use
(FindCoordinator v6, JoinGroup v9, SyncGroup v5, Heartbeat v4, LeaveGroup v5,
OffsetCommit v9, OffsetFetch v9, DescribeGroups v6, ListGroups v5, DeleteGroups v2,
OffsetDelete v0, ConsumerGroupHeartbeat v1, ConsumerGroupDescribe v1; a few older
versions where the answer differs) and check the exact error codes:

  * classic protocol: MEMBER_ID_REQUIRED and the two-step join (KIP-394), the leader
    alone getting the members' metadata, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
    REBALANCE_IN_PROGRESS, INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT,
    INVALID_GROUP_ID, static membership (KIP-345: a rejoin with the same instance id
    fences the old member id with FENCED_INSTANCE_ID), a member that never rejoins
    removed after the rebalance timeout;
  * offsets and group administration: OffsetCommit and OffsetFetch edge cases,
    DeleteGroups (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP), OffsetDelete
    (GROUP_SUBSCRIBED_TO_TOPIC), ListGroups filters, DescribeGroups of unknown groups;
  * KIP-848: ConsumerGroupHeartbeat joins, assignments and revocations by epoch,
    leaves, its INVALID_REQUEST field rules, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH,
    UNSUPPORTED_ASSIGNOR, UNRELEASED_INSTANCE_ID, STALE_MEMBER_EPOCH on commits;
    ConsumerGroupDescribe; and what happens where classic and KIP-848 requests meet
    the other kind of group.

Every test gets a fresh broker. Apache Kafka creates __consumer_offsets on the first
FindCoordinator and loads its partitions a moment later (COORDINATOR_NOT_AVAILABLE,
then NOT_COORDINATOR for a while), so each test first waits until the coordinator of
every group it uses answers.
"""

import base64
import threading
import time
import uuid

import kafka_wire as wire
import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import TARGET
from support import wait_for_partition_leaders, wait_until

TOPIC = "orders"  # 3 partitions
OTHER = "audit"  # 2 partitions
CLIENT_ID = "ferrolog-wire"
TIMEOUT_S = 30
RANGE = "range"


# ---- helpers ----------------------------------------------------------------------------------
def prepare(broker, *groups, topics=((TOPIC, 3), (OTHER, 2))):
    """Create the topics and wait until the coordinator of each group answers."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    if topics:
        futures = admin.create_topics([NewTopic(t, n, 1) for t, n in topics], operation_timeout=TIMEOUT_S)
        for f in futures.values():
            f.result(TIMEOUT_S)
        for t, n in topics:
            wait_for_partition_leaders(broker.bootstrap, t, n)
    wire.wait_for_coordinator(broker.bootstrap, groups[0] if groups else "probe", TIMEOUT_S)

    def loaded(group):
        # Unknown groups are described as Dead (v5), once their coordinator has loaded.
        with conn(broker) as c:
            return describe(c, [group], version=5)[0]["error_code"] == wire.NONE

    for g in groups:
        wait_until(lambda g=g: loaded(g), f"the coordinator of {g!r} answers", TIMEOUT_S, interval_s=0.2)


def conn(broker):
    return wire.Connection(broker.bootstrap, timeout_s=60, client_id=CLIENT_ID)


def call(c, api_key, version, body, parse):
    return parse(wire.group_call(c, api_key, version, body), version)


def join(c, group, version=9, **kw):
    return call(c, wire.JOIN_GROUP, version, wire.join_group(group, version=version, **kw), wire.parse_join_group)


def join_new(c, group, **kw):
    """A new dynamic member's two JoinGroups (KIP-394): MEMBER_ID_REQUIRED, then join with that id."""
    first = join(c, group, **kw)
    assert first["error_code"] == wire.MEMBER_ID_REQUIRED, first
    return join(c, group, member_id=first["member_id"], **kw)


def sync(c, group, generation, member_id, version=5, protocol_name=RANGE, **kw):
    body = wire.sync_group(group, generation, member_id, version=version, protocol_name=protocol_name, **kw)
    return call(c, wire.SYNC_GROUP, version, body, wire.parse_sync_group)


def heartbeat(c, group, generation, member_id, version=4, **kw):
    body = wire.heartbeat(group, generation, member_id, version=version, **kw)
    return call(c, wire.HEARTBEAT, version, body, wire.parse_heartbeat)["error_code"]


def leave(c, group, members, version=5):
    return call(c, wire.LEAVE_GROUP, version, wire.leave_group(group, members, version=version), wire.parse_leave_group)


def commit(c, group, offsets, version=9, **kw):
    body = wire.offset_commit(group, offsets, version=version, **kw)
    return call(c, wire.OFFSET_COMMIT, version, body, wire.parse_offset_commit)


def fetch(c, group, topics=None, version=9, **kw):
    body = wire.offset_fetch(group, topics, version=version, **kw)
    return call(c, wire.OFFSET_FETCH, version, body, wire.parse_offset_fetch)


def describe(c, groups, version=6):
    return call(
        c, wire.DESCRIBE_GROUPS, version, wire.describe_groups(groups, version=version), wire.parse_describe_groups
    )


def list_groups(c, states=(), types=(), version=5):
    body = wire.list_groups(states, types, version=version)
    return call(c, wire.LIST_GROUPS, version, body, wire.parse_list_groups)


def delete_groups(c, groups, version=2):
    body = wire.delete_groups(groups, version=version)
    return call(c, wire.DELETE_GROUPS, version, body, wire.parse_delete_groups)


def offset_delete(c, group, topics):
    return wire.parse_offset_delete(wire.group_call(c, wire.OFFSET_DELETE, 0, wire.offset_delete(group, topics)))


def cg_heartbeat(c, group, member_id, epoch, version=1, **kw):
    body = wire.consumer_group_heartbeat(group, member_id, epoch, version=version, **kw)
    return wire.parse_consumer_group_heartbeat(wire.group_call(c, wire.CONSUMER_GROUP_HEARTBEAT, version, body))


def cg_join(c, group, member_id, topics=(TOPIC,), **kw):
    """A KIP-848 join (epoch 0) with every field a join requires."""
    kw.setdefault("rebalance_timeout_ms", 30_000)
    kw.setdefault("topic_partitions", [])
    return cg_heartbeat(c, group, member_id, 0, subscribed_topic_names=list(topics), **kw)


def cg_describe(c, groups, version=1):
    body = wire.consumer_group_describe(groups, version=version)
    return wire.parse_consumer_group_describe(wire.group_call(c, wire.CONSUMER_GROUP_DESCRIBE, version, body), version)


def new_member_id():
    """What a KIP-848 client generates (ConsumerGroupHeartbeat v1): a random UUID, printed the Kafka way."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def subscription(*topics):
    return [(RANGE, wire.consumer_subscription(list(topics)))]


def assignment(partitions):
    return wire.consumer_assignment({TOPIC: partitions})


def topic_id(broker, topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    desc = admin.describe_topics(TopicCollection([topic]))[topic].result(TIMEOUT_S)
    # confluent-kafka prints it in standard base64; Kafka in URL-safe base64 without padding.
    return str(desc.topic_id).replace("+", "-").replace("/", "_").rstrip("=")


class Background:
    """Run a blocking request (a JoinGroup that waits for the rebalance) in a thread."""

    def __init__(self, fn):
        self.result = self.error = None
        self.started = time.monotonic()
        self.elapsed = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in get()
            self.error = e
        self.elapsed = time.monotonic() - self.started

    def get(self, timeout_s=TIMEOUT_S):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"no answer within {timeout_s} s"
        if self.error:
            raise self.error
        return self.result


def stable_group(broker, group, instance_id=None):
    """One member that has joined and synced, owning every partition of TOPIC.
    Returns (connection, member_id, generation)."""
    c = conn(broker)
    if instance_id is None:
        j = join_new(c, group, protocols=subscription(TOPIC))
    else:
        j = join(c, group, protocols=subscription(TOPIC), instance_id=instance_id)
    assert j["error_code"] == wire.NONE, j
    mid, gen = j["member_id"], j["generation_id"]
    s = sync(c, group, gen, mid, assignments={mid: assignment([0, 1, 2])}, instance_id=instance_id)
    assert s["error_code"] == wire.NONE, s
    return c, mid, gen


# ---- FindCoordinator --------------------------------------------------------------------------
def test_find_coordinator_before_and_after_the_offsets_topic(broker):
    """The first FindCoordinator on a new cluster makes Kafka create __consumer_offsets; Kafka
    answers it COORDINATOR_NOT_AVAILABLE (node -1, no host) until the topic is there, a
    moment later. A broker that has its coordinator ready at once may answer it at once.
    Then every version names this broker."""
    host, port = broker.bootstrap.rsplit(":", 1)
    with conn(broker) as c:
        first = wire.parse_find_coordinator(
            wire.group_call(c, wire.FIND_COORDINATOR, 6, wire.find_coordinator("g", 6)), 6
        )
        assert [(x["key"], x["error_code"], x["node_id"], x["host"], x["port"]) for x in first["coordinators"]] in (
            [("g", wire.COORDINATOR_NOT_AVAILABLE, -1, "", -1)],  # Apache Kafka 4.1
            [("g", wire.NONE, 1, host, int(port))],
        )
    wire.wait_for_coordinator(broker.bootstrap, "g", TIMEOUT_S)
    with conn(broker) as c:
        for version in (0, 1, 2, 3):
            body = wire.find_coordinator("g", version)
            resp = wire.parse_find_coordinator(wire.group_call(c, wire.FIND_COORDINATOR, version, body), version)
            [x] = resp["coordinators"]
            assert (x["error_code"], x["node_id"], x["host"], x["port"]) == (wire.NONE, 1, host, int(port)), version
        # v4+ batch keys: one answer per key, in order (the empty group id included).
        resp = wire.parse_find_coordinator(
            wire.group_call(c, wire.FIND_COORDINATOR, 6, wire.find_coordinator(["a", "b", ""], 6)), 6
        )
        assert [(x["key"], x["error_code"], x["node_id"], x["host"], x["port"]) for x in resp["coordinators"]] == [
            (k, wire.NONE, 1, host, int(port)) for k in ("a", "b", "")
        ]


# ---- JoinGroup / SyncGroup --------------------------------------------------------------------
def test_join_group_member_id_required_then_leader_and_follower(broker):
    group = "join"
    prepare(broker, group, "join-v3")
    meta_a, meta_b = wire.consumer_subscription([TOPIC]), wire.consumer_subscription([TOPIC], user_data=b"b")
    with conn(broker) as a, conn(broker) as b:
        # v4+ without a member id: MEMBER_ID_REQUIRED with the id to use (KIP-394),
        # "<client id>-<uuid>".
        first = join(a, group, protocols=[(RANGE, meta_a)])
        assert first["error_code"] == wire.MEMBER_ID_REQUIRED
        mid_a = first["member_id"]
        assert mid_a.startswith(CLIENT_ID + "-") and len(mid_a) > len(CLIENT_ID) + 30
        assert (first["generation_id"], first["leader"], first["members"]) == (-1, "", [])
        assert (first["protocol_type"], first["protocol_name"]) == (None, None)

        # The second join with that id completes at once (no other member to wait for).
        ja = join(a, group, member_id=mid_a, protocols=[(RANGE, meta_a)])
        assert ja["error_code"] == wire.NONE
        assert (ja["generation_id"], ja["member_id"], ja["leader"]) == (1, mid_a, mid_a)
        assert (ja["protocol_type"], ja["protocol_name"], ja["skip_assignment"]) == ("consumer", RANGE, False)
        assert [(m["member_id"], m["group_instance_id"], m["metadata"]) for m in ja["members"]] == [
            (mid_a, None, meta_a)
        ]
        sa = sync(a, group, 1, mid_a, assignments={mid_a: assignment([0, 1, 2])})
        assert (sa["error_code"], sa["protocol_type"], sa["protocol_name"]) == (wire.NONE, "consumer", RANGE)
        assert wire.parse_consumer_assignment(sa["assignment"]) == {TOPIC: [0, 1, 2]}

        # A second member: its join waits until A has rejoined too (A learns of the
        # rebalance from its heartbeat).
        first_b = join(b, group, protocols=[(RANGE, meta_b)])
        assert first_b["error_code"] == wire.MEMBER_ID_REQUIRED and first_b["member_id"] != mid_a
        mid_b = first_b["member_id"]
        jb = Background(lambda: join(b, group, member_id=mid_b, protocols=[(RANGE, meta_b)]))
        wait_until(lambda: heartbeat(a, group, 1, mid_a) == wire.REBALANCE_IN_PROGRESS, "A told to rejoin", TIMEOUT_S)
        ja = join(a, group, member_id=mid_a, protocols=[(RANGE, meta_a)])
        jb = jb.get()
        # The leader (the member that was there first) gets every member's metadata; the follower none.
        assert (ja["error_code"], ja["generation_id"], ja["leader"]) == (wire.NONE, 2, mid_a)
        assert sorted((m["member_id"], m["metadata"]) for m in ja["members"]) == sorted(
            [(mid_a, meta_a), (mid_b, meta_b)]
        )
        assert (jb["error_code"], jb["generation_id"], jb["leader"], jb["member_id"], jb["members"]) == (
            wire.NONE, 2, mid_a, mid_b, []
        )  # fmt: skip

        # The follower's SyncGroup waits for the leader's, which carries the assignments.
        sb = Background(lambda: sync(b, group, 2, mid_b))
        assert describe(a, [group])[0]["state"] == "CompletingRebalance"
        assert heartbeat(a, group, 2, mid_a) == wire.NONE  # heartbeats are fine while the leader assigns
        sa = sync(a, group, 2, mid_a, assignments={mid_a: assignment([0, 1]), mid_b: assignment([2])})
        assert sa["error_code"] == wire.NONE and wire.parse_consumer_assignment(sa["assignment"]) == {TOPIC: [0, 1]}
        sb = sb.get()
        assert sb["error_code"] == wire.NONE and wire.parse_consumer_assignment(sb["assignment"]) == {TOPIC: [2]}

        [d] = describe(a, [group])
        assert (d["error_code"], d["state"], d["protocol_type"], d["protocol_data"]) == (
            wire.NONE,
            "Stable",
            "consumer",
            RANGE,
        )
        members = {m["member_id"]: m for m in d["members"]}
        assert set(members) == {mid_a, mid_b}
        assert members[mid_b]["metadata"] == meta_b
        assert wire.parse_consumer_assignment(members[mid_b]["assignment"]) == {TOPIC: [2]}
        assert (members[mid_a]["client_id"], members[mid_a]["client_host"]) == (CLIENT_ID, "/127.0.0.1")

        # JoinGroup v3 (before KIP-394) gets no MEMBER_ID_REQUIRED: the member is in at once.
        j3 = join(a, "join-v3", version=3, protocols=subscription(TOPIC))
        assert (j3["error_code"], j3["generation_id"]) == (wire.NONE, 1)
        assert j3["member_id"].startswith(CLIENT_ID + "-") and j3["leader"] == j3["member_id"]
        # Before v7 the protocol name is a non-nullable string: "" in errors, as in this one.
        assert join(a, "", version=4, protocols=subscription(TOPIC))["protocol_name"] == ""


def test_unknown_member_and_illegal_generation(broker):
    group = "generations"
    prepare(broker, group, "no-such-group", "no-such-group-v8")
    c, mid, gen = stable_group(broker, group)
    with c:
        assert heartbeat(c, group, gen, mid) == wire.NONE
        # Unknown member id.
        assert heartbeat(c, group, gen, "intruder") == wire.UNKNOWN_MEMBER_ID
        assert sync(c, group, gen, "intruder")["error_code"] == wire.UNKNOWN_MEMBER_ID
        assert commit(c, group, {(TOPIC, 0): 5}, generation_id=gen, member_id="intruder") == {
            (TOPIC, 0): wire.UNKNOWN_MEMBER_ID
        }
        # JoinGroup with a member id the group never gave out; the error echoes the id.
        j = join(c, group, member_id="made-up", protocols=subscription(TOPIC))
        assert (j["error_code"], j["member_id"]) == (wire.UNKNOWN_MEMBER_ID, "made-up")
        # LeaveGroup: v3+ answer per member, older versions at the top level.
        resp = leave(c, group, [("intruder", None)])
        assert resp["error_code"] == wire.NONE
        assert [(m["member_id"], m["error_code"]) for m in resp["members"]] == [("intruder", wire.UNKNOWN_MEMBER_ID)]
        assert leave(c, group, [("intruder", None)], version=2)["error_code"] == wire.UNKNOWN_MEMBER_ID

        # Known member, wrong generation (ahead or behind; -1 too).
        for wrong in (gen + 1, gen - 1, -1):
            assert heartbeat(c, group, wrong, mid) == wire.ILLEGAL_GENERATION, wrong
        assert sync(c, group, gen + 5, mid)["error_code"] == wire.ILLEGAL_GENERATION
        assert commit(c, group, {(TOPIC, 0): 5}, generation_id=gen + 1, member_id=mid) == {
            (TOPIC, 0): wire.ILLEGAL_GENERATION
        }
        # SyncGroup v5 checks the protocol type and name against the group's.
        assert sync(c, group, gen, mid, protocol_name="roundrobin")["error_code"] == wire.INCONSISTENT_GROUP_PROTOCOL
        assert sync(c, group, gen, mid, protocol_type="connect")["error_code"] == wire.INCONSISTENT_GROUP_PROTOCOL

        # A commit from outside the group (generation -1, no member id) into a group
        # with members is refused; the member's own commit is fine.
        assert commit(c, group, {(TOPIC, 1): 6}) == {(TOPIC, 1): wire.UNKNOWN_MEMBER_ID}
        assert commit(c, group, {(TOPIC, 1): 6}, generation_id=gen, member_id=mid) == {(TOPIC, 1): wire.NONE}
        # Unknown topic or partition in a commit.
        assert commit(c, group, {("absent", 0): 1, (TOPIC, 7): 1}, generation_id=gen, member_id=mid) == {
            ("absent", 0): wire.UNKNOWN_TOPIC_OR_PARTITION,
            (TOPIC, 7): wire.UNKNOWN_TOPIC_OR_PARTITION,
        }

        # Groups that do not exist: heartbeat and sync say UNKNOWN_MEMBER_ID; a member's
        # commit (generation >= 0) says GROUP_ID_NOT_FOUND from OffsetCommit v9 on,
        # ILLEGAL_GENERATION before.
        assert heartbeat(c, "no-such-group", 1, "m") == wire.UNKNOWN_MEMBER_ID
        assert sync(c, "no-such-group", 1, "m")["error_code"] == wire.UNKNOWN_MEMBER_ID
        assert commit(c, "no-such-group", {(TOPIC, 0): 1}, generation_id=1, member_id="m") == {
            (TOPIC, 0): wire.GROUP_ID_NOT_FOUND
        }
        assert commit(c, "no-such-group-v8", {(TOPIC, 0): 1}, generation_id=1, member_id="m", version=8) == {
            (TOPIC, 0): wire.ILLEGAL_GENERATION
        }
        assert describe(c, ["no-such-group", "no-such-group-v8"], version=5)[0]["state"] == "Dead"


def test_heartbeat_during_rebalance(broker):
    group = "rebalance"
    prepare(broker, group)
    a, mid_a, gen = stable_group(broker, group)
    # (b's JoinGroup waits for the rebalance, and Kafka answers one request per connection
    # at a time: requests that must not wait go through a and c.)
    with a, conn(broker) as b, conn(broker) as c:
        mid_b = join(b, group, protocols=subscription(TOPIC))["member_id"]
        jb = Background(lambda: join(b, group, member_id=mid_b, protocols=subscription(TOPIC)))
        wait_until(lambda: describe(a, [group])[0]["state"] == "PreparingRebalance", "rebalance started", TIMEOUT_S)
        # A has not rejoined yet: its heartbeat and a SyncGroup of the old generation say
        # REBALANCE_IN_PROGRESS; a commit in the current (old) generation is still accepted.
        assert heartbeat(a, group, gen, mid_a) == wire.REBALANCE_IN_PROGRESS
        assert sync(a, group, gen, mid_a)["error_code"] == wire.REBALANCE_IN_PROGRESS
        assert commit(a, group, {(TOPIC, 0): 3}, generation_id=gen, member_id=mid_a) == {(TOPIC, 0): wire.NONE}
        [d] = describe(a, [group])
        assert (d["state"], len(d["members"])) == ("PreparingRebalance", 2)
        # A member with another protocol type still cannot join.
        other = join(c, group, protocols=[("x", b"")], protocol_type="connect")
        assert other["error_code"] == wire.INCONSISTENT_GROUP_PROTOCOL

        ja = join(a, group, member_id=mid_a, protocols=subscription(TOPIC))
        assert (ja["error_code"], ja["generation_id"]) == (wire.NONE, gen + 1)
        assert jb.get()["generation_id"] == gen + 1
        # The old generation is gone.
        assert heartbeat(a, group, gen, mid_a) == wire.ILLEGAL_GENERATION
        assert commit(a, group, {(TOPIC, 0): 4}, generation_id=gen, member_id=mid_a) == {
            (TOPIC, 0): wire.ILLEGAL_GENERATION
        }


def test_inconsistent_group_protocol(broker):
    group = "protocols"
    prepare(broker, group, "no-protocols", "empty-type")
    a, mid_a, gen = stable_group(broker, group)
    with a, conn(broker) as b:
        # Another protocol type than the group's.
        j = join(b, group, protocols=[(RANGE, wire.consumer_subscription([TOPIC]))], protocol_type="connect")
        assert (j["error_code"], j["member_id"], j["generation_id"]) == (wire.INCONSISTENT_GROUP_PROTOCOL, "", -1)
        # The same type, but no protocol in common with the members'.
        j = join(b, group, protocols=[("roundrobin", wire.consumer_subscription([TOPIC]))])
        assert j["error_code"] == wire.INCONSISTENT_GROUP_PROTOCOL
        # Not even a first member may join with no protocols, or with an empty protocol type.
        assert join(b, "no-protocols", protocols=[])["error_code"] == wire.INCONSISTENT_GROUP_PROTOCOL
        assert join(b, "empty-type", protocol_type="", protocols=subscription(TOPIC))["error_code"] == (
            wire.INCONSISTENT_GROUP_PROTOCOL
        )
        # The group is undisturbed.
        assert heartbeat(a, group, gen, mid_a) == wire.NONE
        [d] = describe(a, [group])
        assert (d["state"], [m["member_id"] for m in d["members"]]) == ("Stable", [mid_a])


def test_invalid_session_timeout_and_empty_group_id(broker):
    """group.min.session.timeout.ms (6 s) and group.max.session.timeout.ms (30 min) bound
    a JoinGroup's session timeout; the empty group id is refused by the membership APIs
    (and the KIP-848 ones) but, as in every Kafka version, accepted for offsets."""
    prepare(broker, "sessions", "sessions-6000", "sessions-1800000", "")
    with conn(broker) as c:
        for timeout_ms in (5_999, 1_800_001):
            j = join(c, "sessions", protocols=subscription(TOPIC), session_timeout_ms=timeout_ms)
            assert (j["error_code"], j["member_id"], j["generation_id"]) == (wire.INVALID_SESSION_TIMEOUT, "", -1)
        # Checked before the member id: the error echoes the id it was given.
        j = join(c, "sessions", member_id="someone", protocols=subscription(TOPIC), session_timeout_ms=1000)
        assert (j["error_code"], j["member_id"]) == (wire.INVALID_SESSION_TIMEOUT, "someone")
        for bound in (6_000, 1_800_000):
            j = join(c, f"sessions-{bound}", protocols=subscription(TOPIC), session_timeout_ms=bound)
            assert j["error_code"] == wire.MEMBER_ID_REQUIRED, bound

        for version in (9, 4, 0):
            assert join(c, "", version=version, protocols=subscription(TOPIC))["error_code"] == wire.INVALID_GROUP_ID
        assert heartbeat(c, "", 1, "m") == wire.INVALID_GROUP_ID
        assert sync(c, "", 1, "m")["error_code"] == wire.INVALID_GROUP_ID
        assert cg_join(c, "", new_member_id())["error_code"] == wire.INVALID_REQUEST
        [d] = cg_describe(c, [""])
        assert d["error_code"] == wire.INVALID_GROUP_ID

        assert commit(c, "", {(TOPIC, 0): 1}) == {(TOPIC, 0): wire.NONE}
        assert fetch(c, "", {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == 1


# ---- static membership (KIP-345) -------------------------------------------------------------
def test_static_member_rejoin_fences_the_old_member_id(broker):
    group = "static"
    prepare(broker, group)
    instance = "instance-1"
    old, old_mid, gen = stable_group(broker, group, instance_id=instance)
    with old, conn(broker) as new:
        # A static member joins without MEMBER_ID_REQUIRED; its id is "<instance id>-<uuid>".
        assert old_mid.startswith(instance + "-")
        assert commit(old, group, {(TOPIC, 0): 7}, generation_id=gen, member_id=old_mid, instance_id=instance) == {
            (TOPIC, 0): wire.NONE
        }

        # The same instance id again (a restarted process): a new member id takes the
        # old one's place, without a rebalance (same generation); it was the leader,
        # so the new id is the leader and gets the members' metadata.
        j = join(new, group, protocols=subscription(TOPIC), instance_id=instance)
        new_mid = j["member_id"]
        assert j["error_code"] == wire.NONE and new_mid != old_mid and new_mid.startswith(instance + "-")
        assert (j["generation_id"], j["leader"]) == (gen, new_mid)
        assert [(m["member_id"], m["group_instance_id"]) for m in j["members"]] == [(new_mid, instance)]

        # The old member id is fenced everywhere.
        assert heartbeat(old, group, gen, old_mid, instance_id=instance) == wire.FENCED_INSTANCE_ID
        assert sync(old, group, gen, old_mid, instance_id=instance)["error_code"] == wire.FENCED_INSTANCE_ID
        assert commit(old, group, {(TOPIC, 0): 8}, generation_id=gen, member_id=old_mid, instance_id=instance) == {
            (TOPIC, 0): wire.FENCED_INSTANCE_ID
        }
        j = join(old, group, member_id=old_mid, protocols=subscription(TOPIC), instance_id=instance)
        assert (j["error_code"], j["member_id"]) == (wire.FENCED_INSTANCE_ID, old_mid)
        resp = leave(old, group, [(old_mid, instance)])
        assert [(m["member_id"], m["error_code"]) for m in resp["members"]] == [(old_mid, wire.FENCED_INSTANCE_ID)]

        # The new member id carries on with the old assignment.
        assert heartbeat(new, group, gen, new_mid, instance_id=instance) == wire.NONE
        s = sync(new, group, gen, new_mid, instance_id=instance)
        assert s["error_code"] == wire.NONE and wire.parse_consumer_assignment(s["assignment"]) == {TOPIC: [0, 1, 2]}
        assert fetch(new, group, {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == 7
        [d] = describe(new, [group])
        assert [(m["member_id"], m["group_instance_id"]) for m in d["members"]] == [(new_mid, instance)]

        # A static member can leave by instance id alone.
        resp = leave(new, group, [("", instance)])
        assert (resp["error_code"], [(m["group_instance_id"], m["error_code"]) for m in resp["members"]]) == (
            wire.NONE, [(instance, wire.NONE)]
        )  # fmt: skip
        assert describe(new, [group])[0]["state"] == "Empty"


# ---- a member that never rejoins ---------------------------------------------------------------
def test_member_that_never_rejoins_is_removed_after_the_rebalance_timeout(broker):
    """A joins with a 3 s rebalance timeout and keeps heartbeating but never rejoins when B
    arrives; B's JoinGroup completes after about 3 s with B alone, and A is out."""
    group = "stalled"
    rebalance_s = 3
    prepare(broker, group)
    kw = {"protocols": subscription(TOPIC), "rebalance_timeout_ms": rebalance_s * 1000, "session_timeout_ms": 30_000}
    with conn(broker) as a, conn(broker) as b:
        ja = join_new(a, group, **kw)
        mid_a = ja["member_id"]
        assert sync(a, group, 1, mid_a, assignments={mid_a: assignment([0, 1, 2])})["error_code"] == wire.NONE

        mid_b = join(b, group, **kw)["member_id"]
        jb = Background(lambda: join(b, group, member_id=mid_b, **kw))
        wait_until(
            lambda: describe(a, [group])[0]["state"] == "PreparingRebalance", "rebalance started", TIMEOUT_S, 0.05
        )
        answers = []
        while jb.thread.is_alive() and time.monotonic() - jb.started < 20:
            answers.append(heartbeat(a, group, 1, mid_a))
            time.sleep(0.5)
        background, jb = jb, jb.get()
        took = background.elapsed
        # The last heartbeat may cross B's completed join (A is then out already).
        assert set(answers[:-1]) == {wire.REBALANCE_IN_PROGRESS}, answers
        assert answers[-1] in (wire.REBALANCE_IN_PROGRESS, wire.UNKNOWN_MEMBER_ID), answers
        assert rebalance_s - 0.5 <= took <= rebalance_s + 3, f"B's JoinGroup took {took:.1f} s"
        assert (jb["error_code"], jb["generation_id"], jb["leader"]) == (wire.NONE, 2, mid_b)
        assert [m["member_id"] for m in jb["members"]] == [mid_b]

        assert heartbeat(a, group, 1, mid_a) == wire.UNKNOWN_MEMBER_ID
        assert join(a, group, member_id=mid_a, **kw)["error_code"] == wire.UNKNOWN_MEMBER_ID
        assert [m["member_id"] for m in describe(b, [group])[0]["members"]] == [mid_b]


# ---- offsets and group administration -----------------------------------------------------------
def test_offset_commit_and_fetch_edge_cases(broker):
    group = "offsets"
    prepare(broker, group, "never-seen")
    with conn(broker) as c:
        # A group nobody ever used: offset -1, empty metadata, no error, for every version.
        for version in (9, 8, 7, 5, 1):
            f = fetch(c, "never-seen", {TOPIC: [0, 1]}, version=version)
            assert f["error_code"] == wire.NONE, version
            assert {k: (o["offset"], o["metadata"], o["error_code"]) for k, o in f["offsets"].items()} == {
                (TOPIC, 0): (-1, "", wire.NONE),
                (TOPIC, 1): (-1, "", wire.NONE),
            }, version
        f = fetch(c, "never-seen")  # all topics: none
        assert (f["error_code"], f["offsets"]) == (wire.NONE, {})
        assert describe(c, ["never-seen"])[0]["error_code"] == wire.GROUP_ID_NOT_FOUND  # fetching creates nothing

        # Commits from outside any group create a "simple" group (protocol type "", Empty).
        resp = commit(c, group, {(TOPIC, 0): (10, "ten"), (TOPIC, 1): (11, None), (OTHER, 0): (12, "x" * 4096, 3)})
        assert resp == {(TOPIC, 0): wire.NONE, (TOPIC, 1): wire.NONE, (OTHER, 0): wire.NONE}
        # offset.metadata.max.bytes (4096)
        assert commit(c, group, {(TOPIC, 2): (1, "x" * 4097)}) == {(TOPIC, 2): wire.OFFSET_METADATA_TOO_LARGE}
        f = fetch(c, group, {TOPIC: [0, 1, 2], OTHER: [0], "absent": [0]})
        assert f["error_code"] == wire.NONE
        assert {
            k: (o["offset"], o["leader_epoch"], o["metadata"], o["error_code"]) for k, o in f["offsets"].items()
        } == {
            (TOPIC, 0): (10, -1, "ten", wire.NONE),
            (TOPIC, 1): (11, -1, "", wire.NONE),  # null metadata reads back as ""
            (TOPIC, 2): (-1, -1, "", wire.NONE),
            (OTHER, 0): (12, 3, "x" * 4096, wire.NONE),
            ("absent", 0): (-1, -1, "", wire.NONE),
        }
        # All topics of the group (null topic list): only what was committed.
        assert sorted(fetch(c, group)["offsets"]) == [(OTHER, 0), (TOPIC, 0), (TOPIC, 1)]
        assert sorted(fetch(c, group, version=7)["offsets"]) == [(OTHER, 0), (TOPIC, 0), (TOPIC, 1)]
        # A later commit replaces the earlier one.
        assert commit(c, group, {(TOPIC, 0): (4, "back")}) == {(TOPIC, 0): wire.NONE}
        assert fetch(c, group, {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == 4

        [d] = describe(c, [group])
        assert (d["error_code"], d["state"], d["protocol_type"], d["protocol_data"], d["members"]) == (
            wire.NONE, "Empty", "", "", []
        )  # fmt: skip
        assert list_groups(c)["groups"][group] == {
            "group_id": group,
            "protocol_type": "",
            "state": "Empty",
            "type": "classic",
        }


def test_describe_and_list_groups(broker):
    prepare(broker, "active", "simple", "unknown")
    a, mid, gen = stable_group(broker, "active")
    with a:
        assert commit(a, "simple", {(TOPIC, 0): 1}) == {(TOPIC, 0): wire.NONE}

        # Unknown groups: Dead; from v6 on with GROUP_ID_NOT_FOUND and a message.
        [d] = describe(a, ["unknown"])
        assert (d["error_code"], d["state"], d["protocol_type"], d["protocol_data"], d["members"]) == (
            wire.GROUP_ID_NOT_FOUND, "Dead", "", "", []
        )  # fmt: skip
        assert d["error_message"]
        for version in (5, 0):
            [d] = describe(a, ["unknown"], version=version)
            assert (d["error_code"], d["state"], d["members"]) == (wire.NONE, "Dead", []), version
        # Several groups in one request: one answer each (not necessarily in request order).
        assert sorted(
            (d["group_id"], d["error_code"], d["state"]) for d in describe(a, ["active", "unknown", "simple"])
        ) == [
            ("active", wire.NONE, "Stable"),
            ("simple", wire.NONE, "Empty"),
            ("unknown", wire.GROUP_ID_NOT_FOUND, "Dead"),
        ]

        def listed(**kw):
            resp = list_groups(a, **kw)
            assert resp["error_code"] == wire.NONE
            return {g: (x["protocol_type"], x["state"], x["type"]) for g, x in resp["groups"].items()}

        everything = {"active": ("consumer", "Stable", "classic"), "simple": ("", "Empty", "classic")}
        assert listed() == everything
        assert listed(states=["Stable"]) == {"active": everything["active"]}
        assert listed(states=["stable"]) == {"active": everything["active"]}  # case-insensitive
        assert listed(states=["Empty", "Dead"]) == {"simple": everything["simple"]}
        assert listed(states=["PreparingRebalance"]) == {}
        assert listed(types=["classic"]) == everything
        assert listed(types=["consumer"]) == {}
        # v4 has the states filter but no group type; v0-v3 neither state nor type.
        assert list_groups(a, states=["Empty"], version=4)["groups"] == {
            "simple": {"group_id": "simple", "protocol_type": "", "state": "Empty", "type": None}
        }
        assert {g: x["protocol_type"] for g, x in list_groups(a, version=2)["groups"].items()} == {
            "active": "consumer",
            "simple": "",
        }


def test_delete_groups(broker):
    prepare(broker, "busy", "idle", "simple", "unknown")
    busy, mid, gen = stable_group(broker, "busy")
    with busy:
        assert commit(busy, "busy", {(TOPIC, 0): 5}, generation_id=gen, member_id=mid) == {(TOPIC, 0): wire.NONE}
        idle_conn, idle_mid, idle_gen = stable_group(broker, "idle")
        with idle_conn:
            assert commit(idle_conn, "idle", {(TOPIC, 0): 6}, generation_id=idle_gen, member_id=idle_mid) == {
                (TOPIC, 0): wire.NONE
            }
            assert leave(idle_conn, "idle", [(idle_mid, None)])["members"][0]["error_code"] == wire.NONE
        assert describe(busy, ["idle"])[0]["state"] == "Empty"

        # One answer per group: unknown, non-empty, empty.
        assert delete_groups(busy, ["unknown", "busy", "idle"]) == {
            "unknown": wire.GROUP_ID_NOT_FOUND,
            "busy": wire.NON_EMPTY_GROUP,
            "idle": wire.NONE,
        }
        # The deleted group and its offsets are gone.
        [d] = describe(busy, ["idle"])
        assert (d["error_code"], d["state"]) == (wire.GROUP_ID_NOT_FOUND, "Dead")
        assert fetch(busy, "idle", {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == -1
        assert fetch(busy, "idle")["offsets"] == {}
        assert "idle" not in list_groups(busy)["groups"]
        assert delete_groups(busy, ["idle"]) == {"idle": wire.GROUP_ID_NOT_FOUND}
        # The busy group is untouched.
        assert heartbeat(busy, "busy", gen, mid) == wire.NONE
        assert fetch(busy, "busy", {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == 5

        # Once its last member leaves, it can be deleted too; a simple (commit-only) group as well.
        assert leave(busy, "busy", [(mid, None)])["members"][0]["error_code"] == wire.NONE
        assert commit(busy, "simple", {(TOPIC, 1): 1}) == {(TOPIC, 1): wire.NONE}
        assert delete_groups(busy, ["busy", "simple"]) == {"busy": wire.NONE, "simple": wire.NONE}
        assert fetch(busy, "busy")["offsets"] == {}


def test_offset_delete(broker):
    group = "offset-delete"
    prepare(broker, group, "unknown")
    c, mid, gen = stable_group(broker, group)  # subscribed to TOPIC only
    with c:
        offsets = {(TOPIC, 0): 3, (TOPIC, 1): 4, (OTHER, 0): 5, (OTHER, 1): 6}
        assert set(commit(c, group, offsets, generation_id=gen, member_id=mid).values()) == {wire.NONE}

        # A topic the active group subscribes to: GROUP_SUBSCRIBED_TO_TOPIC per partition;
        # a topic it does not: deleted. The top-level error stays NONE.
        resp = offset_delete(c, group, {TOPIC: [0], OTHER: [0]})
        assert resp == {
            "error_code": wire.NONE,
            "partitions": {(TOPIC, 0): wire.GROUP_SUBSCRIBED_TO_TOPIC, (OTHER, 0): wire.NONE},
        }
        assert {k: o["offset"] for k, o in fetch(c, group)["offsets"].items()} == {
            (TOPIC, 0): 3,
            (TOPIC, 1): 4,
            (OTHER, 1): 6,
        }
        # Unknown topic: per partition; unknown group: top level.
        assert offset_delete(c, group, {"absent": [0]}) == {
            "error_code": wire.NONE,
            "partitions": {("absent", 0): wire.UNKNOWN_TOPIC_OR_PARTITION},
        }
        assert offset_delete(c, "unknown", {TOPIC: [0]}) == {"error_code": wire.GROUP_ID_NOT_FOUND, "partitions": {}}

        # Once the group is empty, its subscriptions no longer protect anything.
        assert leave(c, group, [(mid, None)])["members"][0]["error_code"] == wire.NONE
        resp = offset_delete(c, group, {TOPIC: [0, 1]})
        assert resp == {"error_code": wire.NONE, "partitions": {(TOPIC, 0): wire.NONE, (TOPIC, 1): wire.NONE}}
        assert {k: o["offset"] for k, o in fetch(c, group)["offsets"].items()} == {(OTHER, 1): 6}
        assert describe(c, [group])[0]["state"] == "Empty"  # the group itself stays


# ---- KIP-848 ------------------------------------------------------------------------------------
def test_consumer_group_heartbeat_join_assign_revoke_leave(broker):
    group = "kip848"
    prepare(broker, group, "kip848-v0")
    tid = topic_id(broker, TOPIC)
    with conn(broker) as c:
        # v1: the client makes up its member id; epoch 0 joins; the answer has the epoch,
        # the heartbeat interval (group.consumer.heartbeat.interval.ms, 5 s) and the assignment.
        m1 = new_member_id()
        r = cg_join(c, group, m1)
        assert (r["error_code"], r["member_id"], r["member_epoch"], r["heartbeat_interval_ms"]) == (
            wire.NONE,
            m1,
            1,
            5000,
        )
        assert r["assignment"] == {tid: [0, 1, 2]}
        # Heartbeats that change nothing: no assignment in the answer (null = unchanged).
        r = cg_heartbeat(c, group, m1, 1, topic_partitions=[(tid, [0, 1, 2])])
        assert (r["error_code"], r["member_epoch"], r["assignment"]) == (wire.NONE, 1, None)
        assert cg_heartbeat(c, group, m1, 1)["assignment"] is None

        # A second member: group epoch 2; it gets nothing until m1 has given partitions up.
        m2 = new_member_id()
        r = cg_join(c, group, m2)
        assert (r["error_code"], r["member_epoch"], r["assignment"]) == (wire.NONE, 2, {})
        # m1 is told what it keeps, still at epoch 1 (revocation pending)...
        r = cg_heartbeat(c, group, m1, 1, topic_partitions=[(tid, [0, 1, 2])])
        assert r["error_code"] == wire.NONE and r["member_epoch"] == 1
        kept = r["assignment"][tid]
        assert 0 < len(kept) < 3
        # ...and moves to epoch 2 once it says it owns only those.
        r = cg_heartbeat(c, group, m1, 1, topic_partitions=[(tid, kept)])
        assert (r["error_code"], r["member_epoch"]) == (wire.NONE, 2)
        r = cg_heartbeat(c, group, m2, 2, topic_partitions=[])
        assert r["error_code"] == wire.NONE and sorted(kept + r["assignment"][tid]) == [0, 1, 2]
        given = r["assignment"][tid]

        [d] = cg_describe(c, [group])
        assert (d["error_code"], d["state"], d["epoch"], d["assignment_epoch"], d["assignor"]) == (
            wire.NONE, "Stable", 2, 2, "uniform"
        )  # fmt: skip
        members = {m["member_id"]: m for m in d["members"]}
        assert set(members) == {m1, m2}
        assert members[m2]["member_epoch"] == 2 and members[m2]["assignment"] == {TOPIC: given}
        assert members[m1]["target_assignment"] == {TOPIC: kept}
        assert (members[m1]["subscribed_topic_names"], members[m1]["client_id"], members[m1]["member_type"]) == (
            [TOPIC], CLIENT_ID, 1
        )  # fmt: skip
        assert list_groups(c)["groups"][group] == {
            "group_id": group,
            "protocol_type": "consumer",
            "state": "Stable",
            "type": "consumer",
        }

        # Leaving: epoch -1; the answer echoes the member id with epoch -1. Again: unknown.
        r = cg_heartbeat(c, group, m1, -1)
        assert (r["error_code"], r["member_id"], r["member_epoch"]) == (wire.NONE, m1, -1)
        assert cg_heartbeat(c, group, m1, -1)["error_code"] == wire.UNKNOWN_MEMBER_ID
        r = cg_heartbeat(c, group, m2, -1)
        assert (r["error_code"], r["member_epoch"]) == (wire.NONE, -1)
        [d] = cg_describe(c, [group])
        assert (d["state"], d["members"]) == ("Empty", [])

        # v0: the coordinator makes the member id up (Kafka: a random UUID, printed the Kafka way).
        r = cg_join(c, "kip848-v0", "", version=0)
        assert r["error_code"] == wire.NONE and r["member_id"] and r["member_epoch"] == 1


def test_consumer_group_heartbeat_errors(broker):
    group = "kip848-errors"
    prepare(broker, group, "kip848-unknown", "kip848-static", "kip848-regex", f"{group}-uniform", f"{group}-range")
    full = {"rebalance_timeout_ms": 30_000, "subscribed_topic_names": [TOPIC], "topic_partitions": []}
    with conn(broker) as c:
        member = new_member_id()
        r = cg_join(c, group, member)
        assert (r["error_code"], r["member_epoch"]) == (wire.NONE, 1)
        # The same join again (as if the answer had been lost): accepted, same epoch.
        r = cg_join(c, group, member)
        assert (r["error_code"], r["member_id"], r["member_epoch"]) == (wire.NONE, member, 1)

        def error(member_id, epoch, **kw):
            r = cg_heartbeat(c, group, member_id, epoch, **kw)
            assert (r["member_id"], r["member_epoch"], r["assignment"]) == (None, 0, None), r
            return r["error_code"]

        # Joins (epoch 0) missing what a join needs: INVALID_REQUEST.
        assert error("", 0, **full) == wire.INVALID_REQUEST  # v1: the client must make up a member id
        assert error(new_member_id(), 0, **dict(full, rebalance_timeout_ms=-1)) == wire.INVALID_REQUEST
        assert error(new_member_id(), 0, **dict(full, subscribed_topic_names=None)) == wire.INVALID_REQUEST
        assert error(new_member_id(), 0, **dict(full, topic_partitions=None)) == wire.INVALID_REQUEST
        # Epoch -2 (a static member's temporary leave) without an instance id.
        assert error(member, -2) == wire.INVALID_REQUEST
        # A server-side assignor the broker does not have (it has uniform and range).
        assert error(new_member_id(), 0, server_assignor="sticky", **full) == wire.UNSUPPORTED_ASSIGNOR
        for assignor in ("uniform", "range"):
            assert (
                cg_join(c, f"{group}-{assignor}", new_member_id(), server_assignor=assignor)["error_code"] == wire.NONE
            )

        # Members the group does not know; groups that do not exist.
        assert error(new_member_id(), 1) == wire.UNKNOWN_MEMBER_ID
        r = cg_heartbeat(c, "kip848-unknown", new_member_id(), 1)
        assert r["error_code"] == wire.GROUP_ID_NOT_FOUND
        # A known member with an epoch the coordinator did not give it.
        assert error(member, 5) == wire.FENCED_MEMBER_EPOCH

        # Epochs behind, after an epoch bump: the previous epoch is accepted if the member
        # owns no more than its assignment (the answer with the new epoch may have been lost).
        other = new_member_id()
        assert cg_join(c, group, other)["member_epoch"] == 2
        tid = topic_id(broker, TOPIC)
        r = cg_heartbeat(c, group, member, 1, topic_partitions=[(tid, [0, 1, 2])])
        kept = r["assignment"][tid]
        r = cg_heartbeat(c, group, member, 1, topic_partitions=[(tid, kept)])
        assert r["member_epoch"] == 2
        r = cg_heartbeat(c, group, member, 1, topic_partitions=[(tid, kept)])
        assert (r["error_code"], r["member_epoch"]) == (wire.NONE, 2)
        assert error(member, 1, topic_partitions=[(tid, [0, 1, 2])]) == wire.FENCED_MEMBER_EPOCH
        assert error(member, 1) == wire.FENCED_MEMBER_EPOCH
        # Epoch 0 (a rejoin) for a member that is past epoch 1: fenced too.
        assert error(member, 0, **full) == wire.FENCED_MEMBER_EPOCH

        # Static members: an instance id in use by another member id.
        r = cg_join(c, "kip848-static", new_member_id(), instance_id="i1")
        assert r["error_code"] == wire.NONE
        r = cg_join(c, "kip848-static", new_member_id(), instance_id="i1")
        assert r["error_code"] == wire.UNRELEASED_INSTANCE_ID

        # Regular-expression subscriptions (v1): resolved later, so the first assignment is empty.
        r = cg_heartbeat(
            c,
            "kip848-regex",
            new_member_id(),
            0,
            rebalance_timeout_ms=30_000,
            subscribed_topic_regex="ord.*",
            topic_partitions=[],
        )
        assert (r["error_code"], r["assignment"]) == (wire.NONE, {})
        r = cg_heartbeat(
            c,
            "kip848-regex",
            new_member_id(),
            0,
            rebalance_timeout_ms=30_000,
            subscribed_topic_regex="ord[",
            topic_partitions=[],
        )
        assert r["error_code"] == INVALID_REGULAR_EXPRESSION


INVALID_REGULAR_EXPRESSION = 128


def test_consumer_group_offsets_and_administration(broker):
    group = "kip848-offsets"
    prepare(broker, group)
    with conn(broker) as c:
        member = new_member_id()
        epoch = cg_join(c, group, member)["member_epoch"]
        # OffsetCommit carries the member epoch in the generation field.
        assert commit(c, group, {(TOPIC, 0): (11, "k")}, generation_id=epoch, member_id=member) == {
            (TOPIC, 0): wire.NONE
        }
        for wrong in (epoch + 3, 0):
            assert commit(c, group, {(TOPIC, 0): 12}, generation_id=wrong, member_id=member) == {
                (TOPIC, 0): wire.STALE_MEMBER_EPOCH
            }, wrong
        assert commit(c, group, {(TOPIC, 0): 12}, generation_id=epoch, member_id="nobody") == {
            (TOPIC, 0): wire.UNKNOWN_MEMBER_ID
        }
        assert commit(c, group, {(TOPIC, 0): 12}) == {(TOPIC, 0): wire.UNKNOWN_MEMBER_ID}  # from outside the group
        # OffsetFetch v9 with the member's id and epoch (KIP-848 clients send them); errors at group level.
        f = fetch(c, group, {TOPIC: [0]}, member_id=member, member_epoch=epoch)
        assert (f["error_code"], f["offsets"][(TOPIC, 0)]["offset"], f["offsets"][(TOPIC, 0)]["metadata"]) == (
            wire.NONE,
            11,
            "k",
        )
        f = fetch(c, group, {TOPIC: [0]}, member_id=member, member_epoch=epoch + 7)
        assert (f["error_code"], f["offsets"]) == (wire.STALE_MEMBER_EPOCH, {})
        f = fetch(c, group, {TOPIC: [0]}, member_id="nobody", member_epoch=1)
        assert (f["error_code"], f["offsets"]) == (wire.UNKNOWN_MEMBER_ID, {})
        assert fetch(c, group, {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == 11  # from outside: fine

        assert delete_groups(c, [group]) == {group: wire.NON_EMPTY_GROUP}
        assert offset_delete(c, group, {TOPIC: [0]})["partitions"] == {(TOPIC, 0): wire.GROUP_SUBSCRIBED_TO_TOPIC}
        assert cg_heartbeat(c, group, member, -1)["error_code"] == wire.NONE
        [d] = cg_describe(c, [group])
        assert (d["error_code"], d["state"]) == (wire.NONE, "Empty")
        assert list_groups(c, states=["Empty"], types=["consumer"])["groups"][group]["state"] == "Empty"
        assert delete_groups(c, [group]) == {group: wire.NONE}
        [d] = cg_describe(c, [group])
        assert d["error_code"] == wire.GROUP_ID_NOT_FOUND
        assert fetch(c, group)["offsets"] == {}


def test_classic_and_consumer_protocols_meet(broker):
    """Kafka 4.1 lets the two protocols share a group where it can (KIP-848's online
    migration, group.consumer.migration.policy=bidirectional by default); where the
    group is not a consumer-protocol group it cannot: these are the answers."""
    prepare(broker, "classic", "connect", "kip848", "empty-classic")
    classic, mid, gen = stable_group(broker, "classic")
    with classic, conn(broker) as c, conn(broker) as other:
        # Describe APIs of the other kind.
        [d] = cg_describe(c, ["classic"])
        assert d["error_code"] == wire.GROUP_ID_NOT_FOUND
        member = new_member_id()
        assert cg_join(c, "kip848", member)["error_code"] == wire.NONE
        [d] = describe(c, ["kip848"])
        assert (d["error_code"], d["state"]) == (wire.GROUP_ID_NOT_FOUND, "Dead")
        [d] = describe(c, ["kip848"], version=5)
        assert (d["error_code"], d["state"]) == (wire.NONE, "Dead")

        # A classic group of another protocol type (say Kafka Connect's) cannot take a KIP-848 member.
        j = join_new(other, "connect", protocols=[("default", b"worker")], protocol_type="connect")
        assert sync(other, "connect", j["generation_id"], j["member_id"], protocol_type="connect", protocol_name="default",
                    assignments={j["member_id"]: b""})["error_code"] == wire.NONE  # fmt: skip
        assert cg_join(c, "connect", new_member_id())["error_code"] == wire.GROUP_ID_NOT_FOUND
        # Nor can a consumer-protocol group take a classic member of another protocol type.
        j = join(other, "kip848", protocols=[("default", b"worker")], protocol_type="connect")
        assert j["error_code"] == wire.INCONSISTENT_GROUP_PROTOCOL
        # Classic heartbeats and syncs for ids the consumer group does not know.
        assert heartbeat(other, "kip848", 1, member) == wire.UNKNOWN_MEMBER_ID

        # An empty classic group (offsets only) becomes a consumer group on the first
        # KIP-848 join, and keeps its offsets.
        assert commit(c, "empty-classic", {(TOPIC, 0): (5, "kept")}) == {(TOPIC, 0): wire.NONE}
        r = cg_join(c, "empty-classic", new_member_id())
        assert (r["error_code"], r["member_epoch"]) == (wire.NONE, 1)
        f = fetch(c, "empty-classic", {TOPIC: [0]})["offsets"][(TOPIC, 0)]
        assert (f["offset"], f["metadata"]) == (5, "kept")
        assert list_groups(c)["groups"]["empty-classic"]["type"] == "consumer"


@pytest.mark.xfail(
    TARGET == "ferrolog",
    strict=True,
    reason="ferrolog does not migrate live groups between the classic and consumer protocols yet (KIP-848 online migration)",
)
def test_online_migration_between_protocols(broker):
    """Kafka 4.1's default group.consumer.migration.policy=bidirectional: a classic consumer
    may join a consumer-protocol group, and a KIP-848 member joining a live classic consumer
    group upgrades it in place."""
    prepare(broker, "classic", "kip848")
    classic, mid, gen = stable_group(broker, "classic")
    with classic, conn(broker) as c, conn(broker) as other:
        assert cg_join(c, "kip848", new_member_id())["error_code"] == wire.NONE
        # A classic consumer joining a consumer group: the usual two-step join.
        j = join(other, "kip848", protocols=subscription(TOPIC))
        assert j["error_code"] == wire.MEMBER_ID_REQUIRED
        # A KIP-848 member joining a live classic consumer group upgrades it in place.
        r = cg_join(c, "classic", new_member_id())
        assert r["error_code"] == wire.NONE and r["member_epoch"] > 0
        assert list_groups(c)["groups"]["classic"]["type"] == "consumer"


@pytest.mark.broker_config({"group.consumer.migration.policy": "disabled"})
def test_online_migration_disabled(broker):
    """group.consumer.migration.policy=disabled: a KIP-848 member cannot join a live classic
    group (GROUP_ID_NOT_FOUND); empty groups still change protocol."""
    prepare(broker, "classic", "empty-classic")
    classic, mid, gen = stable_group(broker, "classic")
    with classic, conn(broker) as c:
        r = cg_join(c, "classic", new_member_id())
        assert r["error_code"] == wire.GROUP_ID_NOT_FOUND
        assert heartbeat(classic, "classic", gen, mid) == wire.NONE
        assert commit(c, "empty-classic", {(TOPIC, 0): 5}) == {(TOPIC, 0): wire.NONE}
        assert cg_join(c, "empty-classic", new_member_id())["error_code"] == wire.NONE
        assert fetch(c, "empty-classic", {TOPIC: [0]})["offsets"][(TOPIC, 0)]["offset"] == 5
