"""Kafka Streams (kafka-streams from Maven Central) with processing.guarantee=exactly_once_v2:
a KTable that counts its input per key, whose every update goes to an output topic. Under
exactly-once, each key's counts read back with read_committed are 1, 2, ..., n with none
missing or repeated, even when the Streams instance is killed with -9 mid-run (its open
transaction is aborted, its state restored from the changelog) and, in a 3-node cluster,
when a ferrolog node is killed too. The single-node test also runs against Apache Kafka
(FERROLOG_TARGET=apache).
"""

import signal
import subprocess
import threading
import time
from collections import defaultdict

import pytest
from cluster import Cluster, metadata, registered
from conftest import TARGET
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from support import CACHE, need, need_tool, read_all, wait_until

KEYS = 20


class Streams:
    """The StreamsEos application in a JVM of its own."""

    def __init__(self, tmp_path, bootstrap, app_id, input_topic, output_topic, replication):
        self.args = [bootstrap, app_id, input_topic, output_topic, tmp_path / "streams-state", replication]
        self.log_path = tmp_path / "streams.log"
        self.proc = None
        self.running = threading.Event()
        self.starts = 0

    def start(self):
        lib = need(CACHE / "java" / "lib" / "ferrolog-client-tests.jar").parent
        need_tool("java")
        self.running.clear()
        self.starts += 1
        cmd = ["java", "-Xmx384m", "-XX:+UseSerialGC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", f"{lib}/*", "dev.ferrolog.tests.StreamsEos", *map(str, self.args)]  # fmt: skip
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts}\n".encode())
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)

        def watch(proc):
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if line.strip() == b"RUNNING":
                    self.running.set()

        threading.Thread(target=watch, args=(self.proc,), daemon=True).start()
        return self

    def wait_running(self, timeout_s=120):
        if not self.running.wait(timeout_s):
            pytest.fail(f"Kafka Streams not RUNNING within {timeout_s} s:\n{self.log_tail()}")

    def kill9(self):
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def log_tail(self, lines=40):
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Feeder(threading.Thread):
    """Produces `total` records over KEYS keys, idempotently, at about `rate` per second;
    counts what was acknowledged per key."""

    def __init__(self, bootstrap, topic, total, rate):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.total, self.rate = bootstrap, topic, total, rate
        self.acked = defaultdict(int)
        self.failures = []

    def run(self):
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                      "message.timeout.ms": 120_000})  # fmt: skip

        def done(err, msg):
            if err is not None:
                self.failures.append(err)
            else:
                self.acked[msg.key().decode()] += 1

        start = time.monotonic()
        for i in range(self.total):
            p.produce(self.topic, key=f"k{i % KEYS}".encode(), value=str(i).encode(), on_delivery=done)
            p.poll(0)
            ahead = i / self.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        p.flush(180)


def read_counts(bootstrap, topic, partitions):
    """The output as read_committed shows it: {key: [counts in offset order]}."""
    counts = defaultdict(list)
    for key, value in read_all(bootstrap, topic, partitions, "read_committed"):
        counts[key.decode()].append(int(value))
    return counts


def run_and_check(tmp_path, bootstrap, streams, feeder, faults):
    """Feeds the input while `faults` (callables, one every few seconds) strike, waits until
    the output has caught up, and checks that every key's counts are exactly 1..n."""
    streams.start().wait_running()
    feeder.start()
    for fault in faults:
        time.sleep(4)
        fault()
    feeder.join(240)
    assert not feeder.is_alive() and not feeder.failures, feeder.failures[:3]
    expected = dict(feeder.acked)
    assert sum(expected.values()) == feeder.total

    def caught_up():
        counts = read_counts(bootstrap, "streams-eos-out", 2)
        return counts if {k: max(v) for k, v in counts.items()} == expected else None

    counts = wait_until(caught_up, "the output reaches every key's input count", timeout_s=180, interval_s=2)
    streams.kill9()
    bad = {k: v for k, v in counts.items() if v != list(range(1, expected[k] + 1))}
    assert not bad, {k: _gaps_and_repeats(v) for k, v in bad.items()}


def _gaps_and_repeats(values):
    seen = set()
    repeats = sorted({v for v in values if v in seen or seen.add(v)})
    missing = sorted(set(range(1, max(values) + 1)) - set(values))
    return {"missing": missing[:10], "repeated": repeats[:10], "n": len(values)}


def _topics(bootstrap, rf):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic("streams-eos-in", 2, rf), NewTopic("streams-eos-out", 2, rf)])
    for f in futures.values():
        f.result(60)


def test_streams_exactly_once_across_an_instance_kill(broker, tmp_path):
    """One broker; the Streams instance is killed with -9 twice mid-run and restarted on the
    same state directory."""
    _topics(broker.bootstrap, 1)
    streams = Streams(tmp_path, broker.bootstrap, "streams-eos", "streams-eos-in", "streams-eos-out", 1)
    feeder = Feeder(broker.bootstrap, "streams-eos-in", 6000, 400)

    def restart_streams():
        streams.kill9()
        streams.start().wait_running()

    try:
        run_and_check(tmp_path, broker.bootstrap, streams, feeder, [restart_streams, restart_streams])
    finally:
        streams.kill9()


@pytest.mark.skipif(TARGET != "ferrolog", reason="the cluster harness starts ferrolog nodes")
def test_streams_exactly_once_across_an_instance_kill_and_a_node_kill(tmp_path):
    """Three nodes, every topic (internal ones too) replicated 3 times; the Streams instance
    is killed with -9 and restarted, then a ferrolog node is killed with -9 and restarted."""
    cluster = Cluster(tmp_path).start()
    streams = None
    try:
        bootstrap = cluster.bootstrap()
        wait_until(lambda: registered(cluster, 1, [1, 2, 3]), "every node registered")
        _topics(bootstrap, 3)
        wait_until(lambda: all(p.leader > 0 for t in ("streams-eos-in", "streams-eos-out")
                               for p in metadata(1, cluster, t).topics[t].partitions.values()),
                   "every partition has a leader")  # fmt: skip
        streams = Streams(tmp_path, bootstrap, "streams-eos", "streams-eos-in", "streams-eos-out", 3)
        feeder = Feeder(bootstrap, "streams-eos-in", 6000, 300)

        def restart_streams():
            streams.kill9()
            streams.start().wait_running()

        def restart_node():
            node = cluster.nodes[2]
            node.kill9()
            time.sleep(2)
            node.start()

        run_and_check(tmp_path, bootstrap, streams, feeder, [restart_streams, restart_node])
    finally:
        if streams is not None:
            streams.kill9()
        cluster.kill()
