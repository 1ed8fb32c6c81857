"""ferrolog-check: runs the queue workload (and the transactional one, `txn`) against a
cluster it starts (ferrolog or Apache Kafka), with the nemesis's faults, then heals
everything, reads the whole log back and checks the history. Exit status 0: no anomaly; 1:
anomalies (see the report); 2: the run itself failed.
"""

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from confluent_kafka.admin import NewTopic

from check import batches, checker, nemesis, report, txn
from check.cluster import REPO_ROOT, Cluster, raise_memlock
from check.workload import ConsumerWorker, History, ProducerWorker, read_everything

TOPIC = "ferrolog-check"
# Internal topics replicated like the data, and groups that start at once, on both targets.
COMMON_CONFIGS = {"offsets.topic.replication.factor": 3, "min.insync.replicas": 2, "group.initial.rebalance.delay.ms": 0}
# Apache Kafka only: a killed broker's registration blocks its restart until the session
# expires (9 s by default); shorter heartbeats keep kill cycles short (and fence a broker cut
# off from the controller sooner).
APACHE_CONFIGS = {"broker.heartbeat.interval.ms": 500, "broker.session.timeout.ms": 3000}


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="ferrolog-check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--target", choices=("ferrolog", "apache"), default="ferrolog")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    length = ap.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float)
    length.add_argument("--minutes", type=float)
    ap.add_argument("--faults", default="all",
                    help=f"comma-separated, from {','.join(nemesis.KINDS)}; 'all' or 'none'")  # fmt: skip
    ap.add_argument("--seed", type=int, help="drives the fault schedule (default: random, printed)")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--idempotent", type=int, default=2, help="how many of the producers use idempotence")
    ap.add_argument("--rate", type=float, default=100, help="records per second per producer")
    ap.add_argument("--transactional", type=int, default=1,
                    help="transactional producers, on a topic of their own (0: none)")  # fmt: skip
    ap.add_argument("--cores", type=int, default=2, help="ferrolog: shards per node")
    ap.add_argument("--bin", help="ferrolog binary (default: $FERROLOG_BIN, else target/release/ferrolog, built if missing)")
    ap.add_argument("--out", help="report directory (default: check-results/<time>-<target>)")
    ap.add_argument("--keep", action="store_true", help="keep the nodes' data directories")
    args = ap.parse_args(argv)
    args.seconds = args.minutes * 60 if args.minutes is not None else (args.seconds or 60)
    args.faults = [] if args.faults == "none" else list(nemesis.KINDS) if args.faults == "all" else args.faults.split(",")
    unknown = set(args.faults) - set(nemesis.KINDS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; known: {', '.join(nemesis.KINDS)}")
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    return args


def ferrolog_binary(args):
    binary = Path(args.bin or os.environ.get("FERROLOG_BIN") or REPO_ROOT / "target" / "release" / "ferrolog")
    if not binary.is_file():
        print(f"ferrolog-check: building {binary} (cargo build --release)", flush=True)
        subprocess.run(["cargo", "build", "--release", "--bin", "ferrolog"], cwd=REPO_ROOT, check=True)
    return binary.resolve()


def say(history, text):
    print(f"[{history.now():7.1f} s] {text}", flush=True)


def wait_for(what, predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except Exception:  # a client error while the cluster settles: try again
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not reached after {timeout_s} s")
        time.sleep(0.5)


def create_topic(cluster, args):
    admin = cluster.admin()
    wait_for("every broker registered", lambda: len(admin.list_topics(timeout=5).brokers) == args.nodes, 120)
    topic = NewTopic(TOPIC, args.partitions, args.nodes, config={"min.insync.replicas": str(min(2, args.nodes))})
    topics = [topic]
    if args.transactional:
        topics.append(NewTopic(txn.TOPIC, args.partitions, args.nodes, config={"min.insync.replicas": str(min(2, args.nodes))}))
    for name, future in admin.create_topics(topics).items():
        future.result(timeout=60)
        wait_for(f"every partition of {name} led with a full ISR", lambda: cluster.all_led(name, args.partitions), 120)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("ferrolog-check: needs root, for the network namespaces and iptables rules", file=sys.stderr)
        return 2
    # A SIGTERM (a timeout, a CI runner) tears down like Ctrl-C does, through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    raise_memlock()
    started = datetime.now(timezone.utc)
    out = Path(args.out or REPO_ROOT / "check-results" / f"{started:%Y-%m-%dT%H%M%S}-{args.target}")
    out.mkdir(parents=True, exist_ok=True)
    configs = dict(COMMON_CONFIGS, **(APACHE_CONFIGS if args.target == "apache" else {}))
    if args.target == "apache" and not any((REPO_ROOT / ".cache" / "apache-kafka" / "lib").glob("kafka_2.13-*.jar")):
        print("ferrolog-check: no Apache Kafka jars; run scripts/fetch-apache-kafka.sh", file=sys.stderr)
        return 2
    binary = ferrolog_binary(args) if args.target == "ferrolog" else None
    workdir = Path(tempfile.mkdtemp(prefix="ferrolog-check-"))
    disks = any(k in nemesis.DISK_KINDS for k in args.faults)
    cluster = Cluster(args.target, workdir, size=args.nodes, binary=binary, cores=args.cores, configs=configs, disks=disks)
    cluster.partitions = args.partitions
    print(f"ferrolog-check: {args.target}, {args.nodes} nodes, {args.seconds:.0f} s, faults {args.faults or 'none'}, "
          f"seed {args.seed}; report in {out}", flush=True)  # fmt: skip
    run = Run(cluster, args, out)
    try:
        cluster.start()
        create_topic(cluster, args)
        run.go()
    finally:
        # A second Ctrl-C or SIGTERM must not cut the teardown short: the brokers run in
        # sessions of their own and would outlive the harness.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            run.stop()
        finally:
            cluster.teardown()
        for n in cluster.nodes.values():
            if n.log_path.exists():
                shutil.copy(n.log_path, out / f"node-{n.id}.log")
        # A file system that would not unmount stays, with everything below it.
        mounted = os.path.ismount(workdir) or any(n.disk and os.path.ismount(n.disk.mountpoint) for n in cluster.nodes.values())
        if args.keep or mounted or run.anomalies is None or run.anomalies.total() or run.failures:
            print(f"ferrolog-check: data directories kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if run.failures:
        print(f"ferrolog-check: the run itself failed ({'; '.join(run.failures)}); report: {out / 'report.md'}", file=sys.stderr)
        return 2
    print(f"ferrolog-check: {run.anomalies.total()} anomalies; report: {out / 'report.md'}", flush=True)
    return 1 if run.anomalies.total() else 0


class Run:
    """The workload, the nemesis and the check. Whatever happens after the workload started,
    the history is checked and reported: a cluster that does not come back is an anomaly
    (unrecovered), a client thread or the nemesis failing is a failure of the run itself."""

    def __init__(self, cluster, args, out):
        self.cluster, self.args, self.out = cluster, args, out
        self.history = History()
        self.stop_producing, self.stop_consuming = threading.Event(), threading.Event()
        self.producers, self.consumers, self.nemesis = [], [], None
        self.anomalies = None
        self.failures = []  # of the harness itself
        self.reported = set()  # threads whose failure is in `failures`
        self.unrecovered = []  # (t, what)
        self.final, self.highs, self.caught_up = None, {}, False  # final: None until read
        self.txn_final, self.txn_stuck = None, {}  # the transactional topic, read_committed

    def go(self):
        args, h = self.args, History()
        self.history = h  # times count from the start of the workload
        bootstrap = self.cluster.bootstrap()
        say(h, f"cluster up at {bootstrap}")
        self.producers = [
            ProducerWorker(f"p{i}", bootstrap, TOPIC, args.partitions, i < args.idempotent, args.rate, h, self.stop_producing)
            for i in range(args.producers)
        ]  # fmt: skip
        self.consumers = [
            ConsumerWorker(mode, bootstrap, TOPIC, args.partitions, mode, h, self.stop_consuming)
            for mode in ("assign", "subscribe")
        ]  # fmt: skip
        self.producers += [
            txn.TxnProducerWorker(f"t{i}", bootstrap, args.partitions, args.rate / 5, h, self.stop_producing, args.seed + i)
            for i in range(args.transactional)
        ]  # fmt: skip
        if args.transactional:
            self.consumers.append(txn.TxnConsumerWorker("read-committed", bootstrap, args.partitions, h, self.stop_consuming))
        self.nemesis = nemesis.Nemesis(self.cluster, TOPIC, h, args.faults, args.seed)
        for w in (*self.consumers, *self.producers, self.nemesis):
            w.start()
        deadline, last_said = time.monotonic() + args.seconds, time.monotonic()
        while time.monotonic() < deadline and not self.broken():
            time.sleep(min(1, max(0, deadline - time.monotonic())))
            if time.monotonic() - last_said >= 30:
                last_said = time.monotonic()
                acked = sum(1 for s in h.sends if s[7] is not None)
                say(h, f"{len(h.sends)} sent, {acked} acknowledged, {len(self.nemesis.faults)} faults, "
                       f"{len(self.nemesis.crashes)} crashes")  # fmt: skip
        self.nemesis.stop.set()
        self.nemesis.join()
        say(h, "healing: network, paused and stopped nodes")
        try:
            self.nemesis.heal_all()
            wait_for("every partition led with a full ISR after healing", lambda: self.cluster.all_led(TOPIC, args.partitions), 180)
        except Exception as err:  # a node that does not start again, no leaders, a rule left
            detail = getattr(err, "stderr", None) or ""
            self.unrecovered.append((h.now(), f"after healing: {err!r} {detail}".strip()))
        self.stop_producing.set()
        for p in self.producers:
            p.join()
        say(h, "producers stopped; reading the whole log")
        try:
            self.final, self.highs, problems = read_everything(bootstrap, TOPIC, args.partitions)
        except Exception as err:  # KafkaException: no watermarks at all
            self.failures.append(f"final read failed: {err}")
            return
        self.unrecovered += [(h.now(), f"final read: {p}") for p in problems]
        queue_consumers = [c for c in self.consumers if not isinstance(c, txn.TxnConsumerWorker)]
        txn_consumers = [c for c in self.consumers if isinstance(c, txn.TxnConsumerWorker)]
        if args.transactional:
            say(h, "waiting for every transaction to close; reading the transactional topic")
            self.txn_stuck = txn.stable_offsets(bootstrap, args.partitions, txn.SETTLE_S)
            try:
                self.txn_final, txn_highs, problems = txn.read_committed_log(bootstrap, args.partitions)
            except Exception as err:  # KafkaException: no watermarks at all
                self.failures.append(f"final read of {txn.TOPIC} failed: {err}")
                return
            self.unrecovered += [(h.now(), f"final read of {txn.TOPIC}: {p}") for p in problems]
        else:
            txn_highs = {}
        try:
            wait_for("consumers to reach the high watermarks", lambda: all(
                c.positions.get(p, 0) >= hw for c in queue_consumers for p, hw in self.highs.items() if hw > 0) and all(
                c.positions.get(p, 0) >= hw for c in txn_consumers for p, hw in txn_highs.items() if hw > 0), 120)  # fmt: skip
            self.caught_up = True
        except RuntimeError as err:
            say(h, f"{err}; unseen records are not checked")

    def broken(self):
        """Records, once, each client thread or nemesis failure; True if there is one."""
        for w in (*self.producers, *self.consumers):
            if w.failure and w.name not in self.reported:
                self.reported.add(w.name)
                self.failures.append(f"{w.name} failed: {w.failure.strip().splitlines()[-1]}")
                print(w.failure, file=sys.stderr)
        if self.nemesis is not None and self.nemesis.error is not None and "nemesis" not in self.reported:
            self.reported.add("nemesis")
            self.failures.append(f"nemesis failed: {self.nemesis.error!r}")
        return bool(self.failures)

    def stop(self):
        """Stops every thread, then checks and reports whatever history there is."""
        h, nem = self.history, self.nemesis
        self.stop_producing.set()
        self.stop_consuming.set()
        if nem is not None:
            nem.stop.set()
        deadline = time.monotonic() + 240  # for every join together: a flush takes up to 60 s
        for t in (nem, *self.producers, *self.consumers):
            if t is not None and t.ident is not None:  # started
                t.join(timeout=max(0, deadline - time.monotonic()))
        if nem is None:
            return
        if nem.is_alive():  # still in a restart: it owns the nodes, so nothing more is noticed
            self.failures.append("the nemesis did not stop within 240 s")
        else:
            nem.notice_crashes()
        self.broken()
        if self.final is None:  # interrupted, or no final read: only what needs no log is checked
            self.failures.append("no final read of the log: records were not checked")
        batch_of = batches.reader(self.cluster.admin(), TOPIC) if self.final is not None else None
        self.anomalies, notes = checker.check(h, self.final, nem.crashes, self.unrecovered + nem.unrecovered,
                                              consumers_caught_up=self.caught_up, batch_of=batch_of)  # fmt: skip
        if self.txn_final is not None:
            notes.update(txn.check(h, self.txn_final, self.txn_stuck, self.anomalies))
        elif self.args.transactional:
            self.failures.append(f"no final read of {txn.TOPIC}: transactions were not checked")
        args = self.args
        summary = {
            "target": args.target, "seed": args.seed, "seconds": h.now(), "nodes": args.nodes,
            "partitions": args.partitions, "producers": args.producers, "idempotent": min(args.idempotent, args.producers),
            "rate": args.rate, "faults_enabled": args.faults, "sends": len(h.sends),
            "acked": sum(1 for s in h.sends if s[7] is not None), "polls": len(h.polls),
            "final_records": sum(len(v) for v in (self.final or {}).values()), "commits": len(h.commits),
            "committed_reads": len(h.committed_reads), "resumes": len(h.resumes),
            "consumers_caught_up": self.caught_up, "unflushed": sum(p.unflushed for p in self.producers),
            "run_failures": self.failures, "disk_exits": [list(e) for e in nem.exits],
        }  # fmt: skip
        report.write(self.out, summary, h, nem.faults, self.anomalies, notes)
        with gzip.open(self.out / "history.jsonl.gz", "wt") as f:
            for kind in ("sends", "polls", "commits", "committed_reads", "resumes", "resets", "client_errors", "txns",
                         "txn_polls"):  # fmt: skip
                for row in getattr(h, kind):
                    f.write(json.dumps([kind, *row]) + "\n")
        for kind, count in self.anomalies.counts.items():
            if count:
                say(h, f"ANOMALY {kind}: {count}, e.g. {self.anomalies.examples[kind][0]['what']}")
