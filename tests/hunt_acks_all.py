"""A hunt, not part of the suite (pytest collects only test_*.py): repeats the core of
test_replication.py's test_acks_one_does_not_wait_for_followers on one three-node cluster, to
look for the acks=all success without a quorum seen once in CI at 00c4bde.

Each round creates an RF 3 topic through a fresh AdminClient right after the previous round's
SIGCONT (which also exercises a controller election), writes "first" (acks=1) and "second"
(acks=all), SIGSTOPs both followers, writes "alone" (acks=1) and "no-quorum" (acks=all,
message.timeout.ms 4000, no retries), and SIGCONTs them. A round is bad when "no-quorum" is
acknowledged or has no delivery report within 15 s; its three broker logs are kept.

    ROUNDS=150 HUNT_DIR=/tmp/hunt FERROLOG_LOG=info,ferrolog=debug,ferrolog_raft=debug \\
        python3 -m pytest tests/hunt_acks_all.py

About 5 s a round; events (one line each, with times) go to $HUNT_DIR/events.log.
"""

import os
import shutil
import signal
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from cluster import registered
from support import wait_until
from test_replication import IDS, all_led, cluster  # noqa: F401 (the fixture)

ROUNDS = int(os.environ.get("ROUNDS", "60"))
HUNT_DIR = Path(os.environ.get("HUNT_DIR", "/tmp/hunt"))


def test_hunt(cluster):
    HUNT_DIR.mkdir(parents=True, exist_ok=True)
    events = open(HUNT_DIR / "events.log", "a")

    def event(*words):
        events.write(f"{time.time():.6f} " + " ".join(str(w) for w in words) + "\n")
        events.flush()

    bad = []
    for n in range(ROUNDS):
        topic = f"hunt-{n}"
        wait_until(lambda: registered(cluster, 1, IDS), "all brokers registered", timeout_s=30)
        admin = cluster.admin(1)  # kept alive until the answer is in
        try:
            admin.create_topics([NewTopic(topic, 1, 3)], request_timeout=60)[topic].result(timeout=60)
        except Exception as e:  # a fenced node right after SIGCONT: INVALID_REPLICATION_FACTOR
            event(n, "create failed", repr(e))  # the next round waits for the node again
            continue
        leader = wait_until(lambda: all_led(cluster, topic, 1), f"{topic}: led, full ISR").partitions[0].leader
        followers = [i for i in IDS if i != leader]
        bootstrap = cluster.nodes[leader].bootstrap
        one = Producer({"bootstrap.servers": bootstrap, "acks": "1", "enable.idempotence": False, "linger.ms": 0})
        everyone = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                             "linger.ms": 0, "message.timeout.ms": 4000, "retries": 0})  # fmt: skip
        one.produce(topic, value=b"first", partition=0)
        assert one.flush(10) == 0
        everyone.produce(topic, value=b"second", partition=0)
        assert everyone.flush(10) == 0
        procs = [cluster.nodes[i].proc for i in followers]
        event(n, topic, "leader", leader, "stopping", followers)
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        try:
            one.produce(topic, value=b"alone", partition=0)
            assert one.flush(3) == 0
            reports, sent = [], time.monotonic()
            everyone.produce(topic, value=b"no-quorum", partition=0,
                             on_delivery=lambda err, msg: reports.append((err, time.monotonic() - sent)))  # fmt: skip
            left = everyone.flush(15)
            event(n, "no-quorum", "unflushed", left, "reports", reports)
            if left != 0 or not reports or reports[0][0] is None:
                bad.append((n, topic, leader, left, reports))
                for i in IDS:
                    shutil.copy(cluster.nodes[i].log_path, HUNT_DIR / f"bad-{n}-node{i}.log")
        finally:
            for p in procs:
                p.send_signal(signal.SIGCONT)
        wait_until(lambda: all_led(cluster, topic, 1), f"{topic}: followers back", timeout_s=30)
    assert not bad, bad
