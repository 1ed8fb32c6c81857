"""A ferrolog cluster of several processes on 127.0.0.1 for the cluster tests, and the
checker they share: produce with acknowledgements recorded, read everything back, and
count lost, duplicated and reordered records.
"""

import time

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import Broker, free_port
from support import kafka_error_code

# Short sessions so fencing is observable quickly; Kafka's default is 9000 ms.
SESSION_MS = 2000


# Most shards a test node runs: each takes Raft traffic on its own port (Raft port + shard).
MAX_CORES = 2


class Cluster:
    def __init__(self, tmp_path, size=3, extra=None, cores=None, hosts=None, netns=None):
        """`cores`, `hosts` and `netns` map node ids to their shard count, listening address
        and network namespace, where they differ from 2, 127.0.0.1 and none."""
        raft_ports = {i: free_port(span=MAX_CORES) for i in range(1, size + 1)}
        self.raft_ports = raft_ports
        hosts = {i: (hosts or {}).get(i, "127.0.0.1") for i in raft_ports}
        voters = ",".join(f"{i}@{hosts[i]}:{p}" for i, p in raft_ports.items())
        self.nodes = {}
        for i in raft_ports:
            node_dir = tmp_path / f"node-{i}"
            node_dir.mkdir()
            overrides = {
                "node.id": i,
                "controller.quorum.voters": voters,
                "broker.session.timeout.ms": SESSION_MS,
                "group.initial.rebalance.delay.ms": 0,
                **(extra or {}),
            }
            self.nodes[i] = Broker(node_dir, overrides=overrides, host=hosts[i], netns=(netns or {}).get(i))
            self.nodes[i].cores = (cores or {}).get(i, MAX_CORES)

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


def produce(bootstrap, topic, partitions, count, tag, targets=None):
    """Keyed records, acks=all and idempotence, round-robin over `targets` (default: every
    partition); returns {partition: [values in send order]}."""
    targets = list(range(partitions)) if targets is None else targets
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    sent = {i: [] for i in range(partitions)}
    failures = []

    def done(err, msg):
        if err is not None:
            failures.append(err)
        else:
            sent[msg.partition()].append(msg.value().decode())

    for i in range(count):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=targets[i % len(targets)], on_delivery=done)
        p.poll(0)
    assert p.flush(60) == 0, "records still in flight after 60 s"
    assert not failures, f"delivery failures: {failures[:3]}"
    return sent


def consume_all(bootstrap, topic, expected_total, group, commit=False):
    """Everything in `topic` through a consumer group: {partition: [values in offset order]};
    with `commit`, the group's position is committed (synchronously) at the end."""
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
    if commit and total:
        c.commit(asynchronous=False)
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
