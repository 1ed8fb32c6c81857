"""A three-node ferrolog cluster on 127.0.0.1: the controller quorum (Raft group 0), broker
registration and liveness, partition placement across nodes, clients following leaders,
controller failover and whole-cluster restarts, with librdkafka (confluent-kafka) clients.
Unreplicated partitions here; test_replication.py covers replicated ones.

ferrolog only: the Apache reference start script runs one combined node, and a three-node
Apache cluster needs its own bootstrap (storage format with a shared cluster id).
"""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import TARGET, Broker, free_port
from support import kafka_error_code, wait_until

pytestmark = pytest.mark.skipif(TARGET != "ferrolog", reason="needs three ferrolog nodes (see module docs)")

# Short sessions so fencing is observable quickly; Kafka's default is 9000 ms.
SESSION_MS = 2000


class Cluster:
    def __init__(self, tmp_path, size=3):
        raft_ports = {i: free_port() for i in range(1, size + 1)}
        voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in raft_ports.items())
        self.nodes = {}
        for i in raft_ports:
            node_dir = tmp_path / f"node-{i}"
            node_dir.mkdir()
            overrides = {
                "node.id": i,
                "controller.quorum.voters": voters,
                "broker.session.timeout.ms": SESSION_MS,
                "group.initial.rebalance.delay.ms": 0,
            }
            self.nodes[i] = Broker(node_dir, overrides=overrides)

    def start(self):
        # All at once: a node serves clients only once the quorum has elected a controller.
        for n in self.nodes.values():
            n.launch()
        for n in self.nodes.values():
            n.wait_ready()
        return self

    def bootstrap(self, *ids):
        ids = ids or tuple(self.nodes)
        return ",".join(self.nodes[i].bootstrap for i in ids if self.nodes[i].proc is not None)

    def admin(self, node_id):
        return AdminClient({"bootstrap.servers": self.nodes[node_id].bootstrap})

    def kill(self):
        for n in self.nodes.values():
            if n.proc is not None:
                n.proc.kill()
                n.proc.wait()
                n.proc = None


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c.start()
    finally:
        c.kill()


def metadata(node_id, cluster, topic=None):
    md = cluster.admin(node_id).list_topics(topic=topic, timeout=10)
    return md


def registered(cluster, node_id, expected):
    md = metadata(node_id, cluster)
    return sorted(md.brokers) == sorted(expected) and md.controller_id in expected


def create(cluster, node_id, topic, partitions, rf=1):
    admin = cluster.admin(node_id)  # kept alive until the answer is in
    futures = admin.create_topics([NewTopic(topic, partitions, rf)])
    return kafka_error_code(futures[topic])


def produce(bootstrap, topic, partitions, count, tag):
    """Keyed records, acks=all and idempotence; returns {partition: [values in send order]}."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    sent = {i: [] for i in range(partitions)}
    failures = []

    def done(err, msg):
        if err is not None:
            failures.append(err)
        else:
            sent[msg.partition()].append(msg.value().decode())

    for i in range(count):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % partitions, on_delivery=done)
        p.poll(0)
    assert p.flush(60) == 0, "records still in flight after 60 s"
    assert not failures, f"delivery failures: {failures[:3]}"
    return sent


def consume_all(bootstrap, topic, expected_total, group):
    """Everything in `topic` through a consumer group: {partition: [values in offset order]}."""
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })  # fmt: skip
    c.subscribe([topic])
    got = {}
    deadline = time.monotonic() + 60
    total = 0
    while total < expected_total and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
            continue
        got.setdefault(m.partition(), []).append(m.value().decode())
        total += 1
    c.close()
    return got


def check(sent, got):
    """Counts lost, duplicated and reordered records per partition; all must be zero."""
    lost = dup = reordered = 0
    for part, values in sent.items():
        seen = got.get(part, [])
        lost += len(set(values) - set(seen))
        dup += len(seen) - len(set(seen))
        expected_order = [v for v in seen if v in set(values)]
        if expected_order != [v for v in values if v in set(seen)]:
            reordered += 1
    assert (lost, dup, reordered) == (0, 0, 0), f"lost {lost}, duplicated {dup}, reordered partitions {reordered}"


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
    wait_until(
        lambda: metadata(survivors[0], cluster).controller_id in survivors, "a new controller", timeout_s=15
    )
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
