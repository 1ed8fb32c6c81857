"""A failed disk under a partition leader (issue 17, e). A replicated partition whose Raft
core stopped on a storage error must be led elsewhere soon, and take writes again. A node
whose metadata log failed halts, as Kafka's broker does: it can no longer follow the cluster,
and running on, it kept answering Metadata from a frozen image, so that clients kept sending
to it the partitions it had led (the first test failed so before that fix).

Each node keeps its data on an ext4 file system of its own, a sparse image on a loop device
made by the test (root only); ext4's trigger_fs_error fails it as a dying disk would: the
journal aborts and every later write and fsync fails. ferrolog only: Apache Kafka halts a
broker whose only log directory failed.
"""

import subprocess
import time
from pathlib import Path

import pytest

from confluent_kafka import Producer

from cluster import Cluster, check, registered
from conftest import TARGET
from support import wait_until
from test_replication import IDS, LAG_MS, leader_of, read_partition, replicated_topic

pytestmark = pytest.mark.skipif(TARGET != "ferrolog", reason="Apache Kafka halts when its only log dir fails")

DISK_BYTES = 1 << 30  # sparse: only what is written takes space


class Disk:
    """An ext4 file system on a loop device, mounted with errors=remount-ro."""

    def __init__(self, image: Path, mountpoint: Path):
        self.image, self.mountpoint = image, mountpoint
        with open(image, "wb") as f:
            f.truncate(DISK_BYTES)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        mountpoint.mkdir()
        subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mountpoint)], check=True)

    def fail(self):
        source = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(self.mountpoint)],
                                check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
        Path(f"/sys/fs/ext4/{Path(source).name}/trigger_fs_error").write_text("test_disk_failure\n")

    def unmount(self):
        subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)


def start_on_disks(tmp_path, metadata_apart):
    """Three nodes, each with its data on a Disk of its own, and with `metadata_apart` its
    metadata log beside it (metadata.log.dir) on the test's own file system:
    (cluster, {node id: Disk})."""
    c = Cluster(tmp_path, extra={"replica.lag.time.max.ms": LAG_MS})
    disks = {}
    try:
        for i, node in c.nodes.items():
            disks[i] = Disk(tmp_path / f"node-{i}.img", tmp_path / f"node-{i}" / "disk")
            node.data_dir = disks[i].mountpoint / "data"
            if metadata_apart:
                node.overrides["metadata.log.dir"] = str(tmp_path / f"node-{i}" / "metadata")
        c.start()
        wait_until(lambda: registered(c, 1, IDS), "all brokers registered")
        yield c, disks
    finally:
        c.kill()
        for d in disks.values():
            d.unmount()


@pytest.fixture
def disked(tmp_path):
    yield from start_on_disks(tmp_path, metadata_apart=False)


@pytest.fixture
def disked_metadata_apart(tmp_path):
    yield from start_on_disks(tmp_path, metadata_apart=True)


def fail_quiet_leader(cluster, disks):
    """Fails the disk of partition 0's leader once every group is quiet (beats, no Raft
    heartbeats), and writes on to every partition with the producer that wrote before (it
    has its producer id: a node with a failed disk cannot hand out new ones): the writes the
    victim leads fail on its disk, and it must give those partitions up. Checks every
    acknowledged record is read back; returns (victim, survivors)."""
    topic = "disk-fails"
    partitions = 3
    replicated_topic(cluster, topic, partitions)
    producer = Producer({"bootstrap.servers": cluster.bootstrap(), "enable.idempotence": True, "acks": "all"})
    sent = {p: [] for p in range(partitions)}
    failures = []

    def done(err, msg):
        if err is not None:
            failures.append(err)
        else:
            sent[msg.partition()].append(msg.value().decode())

    def write(tag, count):
        for i in range(count):
            producer.produce(topic, value=f"{tag}-{i}".encode(), partition=i % partitions, on_delivery=done)
        assert producer.flush(60) == 0, "records still in flight after 60 s"
        assert not failures, f"delivery failures: {failures[:3]}"

    write("a", 30)
    time.sleep(6)  # every group quiet
    victim = leader_of(cluster, topic, 0, 1)
    survivors = [i for i in IDS if i != victim]
    disks[victim].fail()
    write("b", 60)
    wait_until(lambda: leader_of(cluster, topic, 0, survivors[0]) in survivors, "a new leader for partition 0", timeout_s=20)
    got = {p: [v for _, v in read_partition(cluster.bootstrap(*survivors), topic, p)] for p in range(partitions)}
    check(sent, got)
    return victim, survivors


def test_failed_disk_halts_the_node_once_its_metadata_log_fails(disked):
    """The metadata log shares the failed disk: the node halts, as Kafka's broker does, with
    the reason in its log, and its partitions move as after a crash."""
    cluster, disks = disked
    victim, _ = fail_quiet_leader(cluster, disks)
    node = cluster.nodes[victim]
    wait_until(lambda: node.proc.poll() is not None, "the node with the failed disk halts", timeout_s=30)
    assert node.proc.returncode == 1
    assert "the node halts" in node.log_path.read_text(errors="replace")


def test_failed_disk_under_a_quiet_leader_moves_its_leadership(disked_metadata_apart):
    """The metadata log is on another disk, so the node runs on with the Raft cores of the
    partitions it wrote to stopped; their followers elect another leader, and the node's own
    Metadata names it."""
    cluster, disks = disked_metadata_apart
    victim, survivors = fail_quiet_leader(cluster, disks)
    assert cluster.nodes[victim].proc.poll() is None, "the node exited though its metadata log is intact"
    wait_until(lambda: leader_of(cluster, "disk-fails", 0, victim) in survivors, "the node names the new leader")
