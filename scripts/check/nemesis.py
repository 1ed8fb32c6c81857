"""Faults, one at a time, from a seeded schedule: a quiet spell, then a fault held for a few
seconds, then healed, then a wait (up to RECOVER_S) for every partition to have a leader and
a full ISR again, so faults do not pile up on a node still catching up. The kinds come in
rounds, each a shuffled order of every enabled kind, so a run of N kinds' worth of faults
has had each of them.

- kill: kill -9 a node; start it again when the fault ends.
- kill-leader: kill -9 the leader of a partition and start it again at once, within its
  followers' election timeout (a restarted leader must not take its old term back).
- pause: SIGSTOP a node; SIGCONT when the fault ends.
- restart: SIGTERM a node and start it again.
- partition: cut one node off from the others, both ways.
- partition-oneway: one node stops hearing the others (what they send it that carries data
  is dropped; TCP acknowledgements pass); they still hear it.
- partition-bridge: two groups of nodes that do not hear each other, and one node that
  hears and is heard by both.
- leader-move: a preferred-replica election (ElectLeaders, as kafka-leader-election.sh
  sends) of every partition whose leader is not its first replica, so leadership moves
  under load without a crash (the faults before it leave leaders away from where they
  started; Apache Kafka also moves them back by itself every 5 minutes).
- disk-error: a node's file system fails as after a disk error (ext4 aborts its journal
  and turns read-only: every later write and fsync fails, nothing written after the abort
  reaches the disk); when the fault ends the node is killed, its file system checked and mounted
  again, and the node started.
- disk-full: a node's file system has no free space left (ENOSPC); then the same repair.

A broker may stop by itself on a broken disk (Apache Kafka halts when its only log directory
fails): during a disk fault that is no crash if it exits with a status (not by a signal: a
panic aborts) and its log tells of the storage error. Machines without device-mapper (dm-flakey, dm-error) or the kernel's fault injection
get no slow or flaky disks, only these.
"""

import random
import threading
import time

from confluent_kafka import ElectionType, TopicPartition


KINDS = ("kill", "kill-leader", "pause", "restart", "partition", "partition-oneway", "partition-bridge",
         "leader-move", "disk-error", "disk-full")  # fmt: skip
DISK_KINDS = ("disk-error", "disk-full")
RECOVER_S = 60


class Nemesis(threading.Thread):
    def __init__(self, cluster, topic, history, kinds, seed, quiet_s=(4, 10), hold_s=(3, 12)):
        super().__init__(name="nemesis", daemon=True)
        self.cluster, self.topic, self.history = cluster, topic, history
        self.kinds = list(kinds)
        self.rng = random.Random(seed)
        self.quiet_s, self.hold_s = quiet_s, hold_s
        self.stop = threading.Event()
        self.faults = []  # {"kind", "nodes", "t0", "t1"}
        self.crashes = []  # (t, node, exit status)
        self.exits = []  # (t, node, exit status): stopped by itself on a broken disk
        self.unrecovered = []  # (t, what): the cluster did not come back within RECOVER_S
        self.error = None
        self.round = []

    def run(self):
        try:
            while not self.wait(self.rng.uniform(*self.quiet_s)):
                if not self.kinds:  # no faults: only watch for crashes
                    continue
                if not self.round:
                    self.round = list(self.kinds)
                    self.rng.shuffle(self.round)
                kind = self.round.pop()
                fault = {"kind": kind, "nodes": [], "t0": self.history.now(), "t1": None}
                self.faults.append(fault)
                undo = getattr(self, "start_" + kind.replace("-", "_"))(fault)
                self.wait(self.rng.uniform(*self.hold_s) if undo else 0)
                if undo:
                    undo()
                fault["t1"] = self.history.now()
                self.recover(f"after {kind} {fault['nodes']} at {fault['t0']:.1f} s")
        except Exception as err:  # the run reports it and heals what is left in `heal_all`
            self.error = err

    def recover(self, what):
        deadline = time.monotonic() + RECOVER_S
        while not self.stop.is_set():
            try:
                if self.cluster.all_led(self.topic, self.cluster.partitions):
                    return
            except Exception:  # a metadata request that failed while the cluster settles
                pass
            if time.monotonic() > deadline:
                self.unrecovered.append((self.history.now(), f"no leader or a short ISR {RECOVER_S} s {what}"))
                return
            self.wait(0.5)

    def wait(self, seconds):
        """Sleeps `seconds`, watching for brokers that died on their own; True once stopped."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.notice_crashes()
            if self.stop.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                return True
        return self.stop.is_set()

    def notice_crashes(self):
        for n in self.cluster.nodes.values():
            status = n.exited()
            if status is None:
                continue
            n.proc = None
            if n.may_exit and status >= 0 and n.storage_error_logged():  # stopped on its broken disk
                self.exits.append((self.history.now(), n.id, status))
                continue
            self.crashes.append((self.history.now(), n.id, status))
            if not n.may_exit:
                n.launch()

    def pick(self):
        return self.rng.choice(self.cluster.node_ids)

    def restart_node(self, node):
        node.launch()
        try:
            node.wait_ready()
        except RuntimeError as err:
            if node.exited() is None:  # still starting after READY_TIMEOUT_S: the run fails
                raise
            self.crashes.append((self.history.now(), node.id, f"start-up: {err}"))  # died starting
            node.proc = None
            node.launch()
            node.wait_ready()

    def stop_node(self, node):
        status = node.stop()
        if status is not None:
            self.crashes.append((self.history.now(), node.id, f"shutdown: {status}"))

    def start_kill(self, fault):
        node = self.cluster.nodes[self.pick()]
        fault["nodes"] = [node.id]
        node.kill9()
        return lambda: self.restart_node(node)

    def start_kill_leader(self, fault):
        partition, fallback = self.rng.randrange(self.cluster.partitions), self.pick()
        leader = self.leader_of(partition)
        node = self.cluster.nodes[leader if leader in self.cluster.nodes else fallback]
        fault["nodes"] = [node.id]
        fault["leader_of"] = partition if leader in self.cluster.nodes else None  # None: lookup failed
        node.kill9()
        self.restart_node(node)
        return None

    def start_pause(self, fault):
        node = self.cluster.nodes[self.pick()]
        fault["nodes"] = [node.id]
        node.pause()
        return node.resume

    def start_restart(self, fault):
        node = self.cluster.nodes[self.pick()]
        fault["nodes"] = [node.id]
        self.stop_node(node)
        self.restart_node(node)
        return None

    def start_partition(self, fault):
        alone = self.pick()
        fault["nodes"] = [alone]
        for other in self.cluster.node_ids:
            if other != alone:
                self.cluster.net.block(alone, other)
                self.cluster.net.block(other, alone)
        return self.cluster.net.heal

    def start_partition_oneway(self, fault):
        deaf = self.pick()
        fault["nodes"] = [deaf]
        for other in self.cluster.node_ids:
            if other != deaf:
                self.cluster.net.deafen(deaf, other)
        return self.cluster.net.heal

    def start_partition_bridge(self, fault):
        ids = list(self.cluster.node_ids)
        self.rng.shuffle(ids)
        bridge, rest = ids[0], ids[1:]
        left, right = rest[: len(rest) // 2], rest[len(rest) // 2 :]
        fault["nodes"] = [bridge]  # the bridge
        fault["sides"] = [left, right]
        for x in left:
            for y in right:
                self.cluster.net.block(x, y)
                self.cluster.net.block(y, x)
        return self.cluster.net.heal

    def start_leader_move(self, fault):
        """Elects the preferred replica of every partition led elsewhere; `fault["moved"]`
        says per partition what the election answered (None: it moved)."""
        md = self.cluster.admin().list_topics(self.topic, timeout=5)
        parts = md.topics[self.topic].partitions
        away = sorted(i for i, p in parts.items() if p.replicas and p.leader != p.replicas[0])
        fault["nodes"] = sorted({parts[i].replicas[0] for i in away})
        fault["moved"] = {}
        if away:
            wanted = [TopicPartition(self.topic, i) for i in away]
            try:
                # No timeout arguments: confluent-kafka 2.16 fails to parse them.
                results = self.cluster.admin().elect_leaders(ElectionType.PREFERRED, wanted).result(timeout=60)
                fault["moved"] = {tp.partition: (None if err is None else err.name()) for tp, err in results.items()}
            except Exception as err:  # the whole request failed: noted, not an anomaly
                fault["moved"] = {i: str(err) for i in away}
        return None

    def start_disk_error(self, fault):
        return self.break_disk(fault, lambda disk: disk.fail())

    def start_disk_full(self, fault):
        return self.break_disk(fault, lambda disk: disk.fill())

    def break_disk(self, fault, how):
        node = self.cluster.nodes[self.pick()]
        fault["nodes"] = [node.id]
        node.may_exit = True
        how(node.disk)
        return lambda: self.repair_disk(node)

    def repair_disk(self, node):
        """Kills the node (it may run on with failed logs), mends its disk and starts it."""
        self.notice_crashes()  # an exit during the fault, judged before the kill
        node.kill9()
        node.disk.repair()
        node.may_exit = False
        self.restart_node(node)

    def leader_of(self, partition):
        try:
            md = self.cluster.admin().list_topics(self.topic, timeout=5)
            return md.topics[self.topic].partitions[partition].leader
        except Exception:
            return None

    def heal_all(self):
        """Ends every fault: heals the network, resumes and starts every node."""
        self.cluster.net.heal()
        for n in self.cluster.nodes.values():
            if n.paused:
                n.resume()
            if n.disk is not None and n.disk.broken:  # a fault its undo did not end
                self.repair_disk(n)
        self.notice_crashes()
        for n in self.cluster.nodes.values():
            if n.proc is None:
                n.launch()
        for n in self.cluster.nodes.values():
            n.wait_ready()
        for f in self.faults:
            if f["t1"] is None:
                f["t1"] = self.history.now()
