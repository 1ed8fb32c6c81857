"""A three-node ferrolog cluster on 127.0.0.1: the controller quorum (Raft group 0), broker
registration and liveness, partition placement across nodes, clients following leaders,
controller failover and whole-cluster restarts, with librdkafka (confluent-kafka) clients.
Unreplicated partitions here; test_replication.py covers replicated ones.

ferrolog only: the Apache reference start script runs one combined node, and a three-node
Apache cluster needs its own bootstrap (storage format with a shared cluster id).
"""

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import ConfigResource

from cluster import Cluster, check, consume_all, create, metadata, produce, registered
from conftest import TARGET, Broker
from kafka_wire import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_GROUPS,
    DELETE_TOPICS,
    GROUP_ID_NOT_FOUND,
    NOT_COORDINATOR,
    OFFSET_DELETE,
    INCREMENTAL_ALTER_CONFIGS,
    Connection,
    create_partitions_v1,
    create_topics_v4,
    delete_groups,
    delete_topics_v1,
    group_call,
    incremental_alter_topic_config_v0,
    offset_delete,
    parse_create_partitions_v1,
    parse_create_topics_v4,
    parse_delete_groups,
    parse_delete_topics_v1,
    parse_incremental_alter_configs_v0,
    parse_offset_delete,
    wait_for_coordinator,
)
from support import wait_until

pytestmark = pytest.mark.skipif(TARGET != "ferrolog", reason="needs three ferrolog nodes (see module docs)")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c.start()
    finally:
        c.kill()

def test_three_nodes_form_one_cluster(cluster):
    ids = [1, 2, 3]
    for i in ids:
        wait_until(lambda i=i: registered(cluster, i, ids), f"node {i} sees all three brokers")
    answers = [metadata(i, cluster) for i in ids]
    assert len({md.cluster_id for md in answers}) == 1, "one cluster id"
    assert len({md.controller_id for md in answers}) == 1, "one controller"
    for md in answers:
        for b in md.brokers.values():
            assert b.host == "127.0.0.1" and b.port == cluster.nodes[b.id].port


def test_a_node_started_twice_stops_at_start_up(cluster):
    """A second process of a running node exits at once, saying why: on the node's log.dirs
    it finds the directory locked (Kafka's `.lock`); on a directory of its own it finds the
    node's Kafka port or Raft port taken. (Shards bind the Kafka port with SO_REUSEPORT: without
    the check a second broker would silently share it, and the node's Raft traffic too.)"""
    ids = [1, 2, 3]
    wait_until(lambda: registered(cluster, 1, ids), "all brokers registered")
    node = cluster.nodes[1]
    cases = {
        "log.dirs": "another broker is using log.dirs",
        "kafka-port": "(listeners)",
        "raft-port": "(Raft traffic of a shard",
    }
    for case, why in cases.items():
        twin = Broker(node.workdir.parent / f"twin-{case}", overrides=node.overrides)
        twin.workdir.mkdir()
        if case == "log.dirs":
            twin.data_dir = node.data_dir
        elif case == "kafka-port":
            twin.port, twin.bootstrap = node.port, node.bootstrap
        twin.launch()
        try:
            assert twin.proc.wait(timeout=30) != 0, f"{case}: the second process exited cleanly"
        finally:
            twin.proc.kill()
            twin.proc.wait()
        assert why in twin.log_tail(), f"{case}:\n{twin.log_tail()}"
    # The node itself carries on.
    assert registered(cluster, 1, ids)
    assert registered(cluster, 2, ids)


def test_partitions_spread_and_clients_follow_leaders(cluster):
    wait_until(lambda: registered(cluster, 2, [1, 2, 3]), "all brokers registered")
    # Created through a node that may not be the controller: the client is redirected.
    assert create(cluster, 2, "spread", 6) == 0
    md = wait_until(lambda: metadata(1, cluster, "spread").topics.get("spread"), "topic visible on node 1")
    leaders = sorted(p.leader for p in md.partitions.values())
    assert leaders == [1, 1, 2, 2, 3, 3], "preferred leaders spread evenly"
    sent = produce(cluster.bootstrap(3), "spread", 6, 600, "a")
    got = consume_all(cluster.bootstrap(1), "spread", 600, "g-spread")
    check(sent, got)


def test_replication_factor_limits(cluster):
    wait_until(lambda: registered(cluster, 1, [1, 2, 3]), "all brokers registered")
    assert create(cluster, 1, "rf4", 1, rf=4) == 38  # INVALID_REPLICATION_FACTOR: 3 brokers
    assert create(cluster, 1, "rf2", 3, rf=2) == 0
    md = wait_until(lambda: metadata(3, cluster, "rf2").topics.get("rf2"), "rf2 visible")
    for p in md.partitions.values():
        assert len(p.replicas) == 2 and len(set(p.replicas)) == 2


def test_controller_failover_fencing_and_return(cluster):
    ids = [1, 2, 3]
    wait_until(lambda: registered(cluster, 1, ids), "all brokers registered")
    assert create(cluster, 1, "before", 3) == 0
    wait_until(lambda: metadata(2, cluster, "before").topics.get("before"), "topic visible")
    sent = produce(cluster.bootstrap(), "before", 3, 300, "b")
    victim = metadata(1, cluster).controller_id
    cluster.nodes[victim].kill9()
    survivors = [i for i in ids if i != victim]
    # A new controller within a few seconds, and metadata changes work again.
    # While no leader is known each node names itself (it takes CreateTopics and forwards
    # it), so both naming the same survivor means a new leader.
    def new_controller():
        named = {metadata(i, cluster).controller_id for i in survivors}
        return len(named) == 1 and named <= set(survivors)

    wait_until(new_controller, "a new controller", timeout_s=15)
    assert wait_until(lambda: create(cluster, survivors[0], "after", 2) in (0, 36), "create after failover") is not None
    # After broker.session.timeout.ms the dead node leaves Metadata; its partitions have no leader.
    wait_until(lambda: sorted(metadata(survivors[1], cluster).brokers) == survivors, "victim fenced", timeout_s=20)
    parts = metadata(survivors[1], cluster, "before").topics["before"].partitions.values()
    orphaned = [p for p in parts if p.leader == -1]
    assert len(orphaned) == 1 and orphaned[0].error.code() == KafkaError.LEADER_NOT_AVAILABLE
    # It comes back on its old disk, rejoins, and nothing it held is lost.
    cluster.nodes[victim].start()
    wait_until(lambda: registered(cluster, survivors[0], ids), "victim unfenced", timeout_s=20)
    got = consume_all(cluster.bootstrap(), "before", 300, "g-before")
    check(sent, got)


def test_any_node_takes_controller_requests_also_while_the_controller_moves(cluster):
    """As Kafka's brokers forward CreateTopics, CreatePartitions, IncrementalAlterConfigs and
    DeleteTopics to the active controller, a node that does not lead the controller quorum
    makes them through the leader; while a new leader is being elected it asks again until
    the request's timeout, so the client sees neither NOT_CONTROLLER nor a failure."""
    ids = [1, 2, 3]
    wait_until(lambda: registered(cluster, 1, ids), "all brokers registered")
    controller = metadata(1, cluster).controller_id
    others = [i for i in ids if i != controller]

    def ask(node, api, version, body, parse):
        with Connection(cluster.nodes[node].bootstrap, timeout_s=30) as conn:
            return parse(conn.request(api, version, body))

    follower = others[0]
    got = ask(follower, CREATE_TOPICS, 4, create_topics_v4([("via-follower", 2, 3), ("doomed", 1, 3)]),
              parse_create_topics_v4)  # fmt: skip
    assert got == {"via-follower": (0, None), "doomed": (0, None)}, got
    got = ask(follower, CREATE_PARTITIONS, 1, create_partitions_v1("via-follower", 4), parse_create_partitions_v1)
    assert got == {"via-follower": (0, None)}, got
    body = incremental_alter_topic_config_v0("via-follower", "retention.ms", "3600000")
    got = ask(follower, INCREMENTAL_ALTER_CONFIGS, 0, body, parse_incremental_alter_configs_v0)
    assert got == {"via-follower": (0, None)}, got
    wait_until(lambda: len(metadata(others[1], cluster, "via-follower").topics["via-follower"].partitions) == 4,
               "four partitions")  # fmt: skip
    resource = ConfigResource(ConfigResource.Type.TOPIC, "via-follower")
    admin = cluster.admin(others[1])
    assert admin.describe_configs([resource])[resource].result(30)["retention.ms"].value == "3600000"
    # Kill the controller leader and ask a survivor at once, before a new leader is elected.
    cluster.nodes[controller].kill9()
    survivor = others[1]
    body = create_topics_v4([("during-election", 1, 2)], timeout_ms=20000)
    assert ask(survivor, CREATE_TOPICS, 4, body, parse_create_topics_v4) == {"during-election": (0, None)}
    assert ask(survivor, DELETE_TOPICS, 1, delete_topics_v1(["doomed"]), parse_delete_topics_v1) == {"doomed": 0}
    names = set(metadata(follower, cluster).topics)
    assert "during-election" in names and "doomed" not in names, names


def test_whole_cluster_restart_keeps_metadata_and_data(cluster):
    ids = [1, 2, 3]
    wait_until(lambda: registered(cluster, 1, ids), "all brokers registered")
    assert create(cluster, 1, "durable", 3) == 0
    wait_until(lambda: metadata(3, cluster, "durable").topics.get("durable"), "topic visible")
    sent = produce(cluster.bootstrap(), "durable", 3, 300, "d")
    cluster.kill()
    cluster.start()
    wait_until(lambda: registered(cluster, 2, ids), "cluster back", timeout_s=30)
    md = metadata(2, cluster, "durable").topics["durable"]
    assert len(md.partitions) == 3
    got = consume_all(cluster.bootstrap(), "durable", 300, "g-durable")
    check(sent, got)


def test_group_deletions_sent_to_another_node_say_not_coordinator(cluster):
    """DeleteGroups and OffsetDelete sent to a node that does not coordinate the group answer
    NOT_COORDINATOR, as Kafka's do, so that the client looks the coordinator up again. They
    used to answer GROUP_ID_NOT_FOUND, which tells the client that the group does not exist.
    The coordinator itself answers GROUP_ID_NOT_FOUND for a group it does not have."""
    group = "elsewhere"
    coordinator = wait_for_coordinator(cluster.nodes[1].bootstrap, group)["node_id"]
    other = next(i for i in cluster.nodes if i != coordinator)

    def deletions(node_id):
        with Connection(cluster.nodes[node_id].bootstrap) as c:
            groups = parse_delete_groups(group_call(c, DELETE_GROUPS, 2, delete_groups([group], 2)), 2)
            offsets = parse_offset_delete(group_call(c, OFFSET_DELETE, 0, offset_delete(group, {"t": [0]})))
        return groups[group], offsets["error_code"]

    assert deletions(other) == (NOT_COORDINATOR, NOT_COORDINATOR)
    # The coordinator may still be loading its groups (COORDINATOR_LOAD_IN_PROGRESS).
    wait_until(
        lambda: deletions(coordinator) == (GROUP_ID_NOT_FOUND, GROUP_ID_NOT_FOUND),
        "the coordinator answers GROUP_ID_NOT_FOUND",
    )
