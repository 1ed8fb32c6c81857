#!/usr/bin/env python3
"""Side-by-side benchmark of ferrolog and Apache Kafka on this machine.

Run it through scripts/bench.sh (which builds the load generator and fetches Kafka).
It starts each broker configuration in turn on loopback ports, drives it with the
same load generator (target/release/ferrolog-bench), measures the machine's own
limits, and writes a Markdown report, a JSON file with every figure and SVG plots to
bench/results/<date>-<commit>/.

Broker configurations (names used everywhere in the output):
  ferrolog     ferrolog in its default mode (fsync before acknowledging acks=all)
  kafka        Apache Kafka 4.1, defaults (no fsync per write; the OS flushes)
  kafka-flush  Apache Kafka 4.1 with log.flush.interval.messages=1 (fsync every write)

Each phase runs every configuration once per repetition, in an order rotated per
repetition (A B C, B C A, C A B), so slow drifts of a shared 2-core machine hit all
of them alike; the report gives medians and the spread [min-max] over repetitions.

Phases:
  1  startup, max-throughput          (Kafka's max sets the rates of phase 2)
  2  fixed-rate, fan-out, catch-up, catch-up-cold (+ the Kafka-tools cross-check, first rep only)
  3  many-partitions                  (on a loop-mounted scratch filesystem)
  4  replicated                       (3 nodes of each configuration, RF=3: throughput,
                                       latency at a fixed rate, many idle partitions)
  5  flame-graphs                     (ferrolog only, in a session of its own: perf record
                                       under max-throughput and catch-up, as SVG flame graphs)

Nothing here asserts a speed: a workload that fails is recorded with its error, the
report is written anyway, and the exit status says whether every workload ran.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_BIN = Path(os.environ.get("FERROLOG_BENCH_BIN", REPO / "target/release/ferrolog-bench"))
FERROLOG_BIN = Path(os.environ.get("FERROLOG_BIN", REPO / "target/release/ferrolog"))
sys.path.insert(0, str(REPO / "scripts"))
from check import wire  # noqa: E402  (bare Kafka requests, shared with ferrolog-check)
KAFKA_LIB = REPO / ".cache/apache-kafka/lib"
KAFKA_START = REPO / "scripts/start-apache-kafka.sh"
KAFKA_LOG4J = REPO / "scripts/apache-kafka/log4j2.properties"
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1

CONFIGS = ["ferrolog", "kafka", "kafka-flush"]
CLUSTER_SIZE = 3  # the replicated phase: nodes per cluster, and the replication factor
KAFKA_HEAP_OPTS = "-Xms1g -Xmx1g"  # what kafka-server-start.sh uses, and our start script's default
TOOLS_HEAP_OPTS = "-Xmx512m"

# Workload parameters. Records are 1 KiB, acks=all, 16 partitions, 2 producer
# connections; MB = 10^6 bytes everywhere.
PROFILES = {
    "full": {
        "reps": 3,
        "hw": {"file_mib": 1024, "fsync_count": 500, "tcp_seconds": 5},
        "record_bytes": 1024,
        "partitions": 16,
        "producers": 2,
        "startup": {"idle_s": 5},
        "max_throughput": {"duration_s": 12, "warmup_s": 4, "ramp": [0.5, 0.75, 0.9, 1.0], "ramp_duration_s": 10, "ramp_warmup_s": 3,
                           "flame_s": 8},
        "fixed_rate": {"fractions": [0.25, 0.5, 0.75], "duration_s": 15, "warmup_s": 4},
        "fan_out": {"fraction": 0.25, "consumers": 3, "duration_s": 15, "warmup_s": 4},
        "many_producers": {"producers": 50, "partitions": 100, "fraction": 0.5, "duration_s": 15, "warmup_s": 4},
        "keyed": {"keys": 10000, "fraction": 0.5, "duration_s": 15, "warmup_s": 4},
        "drain": {"bytes": 2 << 30, "fraction": 0.5, "duration_s": 15, "warmup_s": 0},
        "catch_up": {"bytes": 2 << 30},
        "transactional": {"records_per_txn": 100, "partitions": 4, "duration_s": 20, "warmup_s": 4},
        "many_partitions": {"partitions": 10000, "rate": 2000, "duration_s": 20, "warmup_s": 5, "idle_s": 10, "settle_max_s": 240, "reps": 1},
        "replicated": {"partitions": 16, "duration_s": 15, "warmup_s": 4, "rate": 20000, "many_partitions": 3000, "many_rate": 2000,
                       "idle_s": 10, "settle_max_s": 300, "reps": 1},
        "cross_check": {"records": 1_000_000, "consumer_timeout_ms": 30000},
    },
    "quick": {
        "reps": 1,
        "hw": {"file_mib": 64, "fsync_count": 50, "tcp_seconds": 0.5},
        "record_bytes": 1024,
        "partitions": 4,
        "producers": 2,
        "startup": {"idle_s": 1},
        "max_throughput": {"duration_s": 3, "warmup_s": 1, "ramp": [0.5], "ramp_duration_s": 2, "ramp_warmup_s": 0.5, "flame_s": 2},
        "fixed_rate": {"fractions": [0.25], "duration_s": 2, "warmup_s": 0.5},
        "fan_out": {"fraction": 0.1, "consumers": 3, "duration_s": 2, "warmup_s": 0.5},
        "many_producers": {"producers": 10, "partitions": 20, "fraction": 0.1, "duration_s": 2, "warmup_s": 0.5},
        "keyed": {"keys": 1000, "fraction": 0.1, "duration_s": 2, "warmup_s": 0.5},
        "drain": {"bytes": 32 << 20, "fraction": 0.1, "duration_s": 2, "warmup_s": 0},
        "catch_up": {"bytes": 32 << 20},
        "transactional": {"records_per_txn": 100, "partitions": 4, "duration_s": 2, "warmup_s": 0.5},
        "many_partitions": {"partitions": 50, "rate": 200, "duration_s": 2, "warmup_s": 0.5, "idle_s": 1, "settle_max_s": 20, "reps": 1},
        "replicated": {"partitions": 4, "duration_s": 2, "warmup_s": 0.5, "rate": 500, "many_partitions": 30, "many_rate": 200,
                       "idle_s": 1, "settle_max_s": 30, "reps": 1},
        "cross_check": {"records": 10_000, "consumer_timeout_ms": 8000},
    },
}

# Higher is better for these metric names; lower for the rest (latencies, CPU, memory, time).
HIGHER_IS_BETTER = re.compile(r"(mbps|rps|_pct_of_)")

# Before each measurement (full runs), wait up to QUIET_WAIT_MAX_S for the CPU used by other
# processes to fall below QUIET_CPU_PCT of the machine.
QUIET_CPU_PCT = 15
QUIET_WAIT_MAX_S = 90
QUIET_WAIT_TOTAL_MAX_S = 900

# The free space the disk guard keeps on the data filesystem: below it the broker is killed.
DISK_FREE_MIN_BYTES = 8 << 30


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Processes and /proc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_api_versions(port, timeout_s=1.0):
    """True when something on `port` answers ApiVersions v0 (scripts/check/wire.py)."""
    return wire.answers_api_versions("127.0.0.1", port, timeout_s)


def proc_cpu_split_s(pid):
    """(user, kernel) CPU-seconds of a process (all its threads: utime and stime); None once
    it is gone. With a list of pids (a cluster), their sums; None once any is gone."""
    if isinstance(pid, list):
        each = [proc_cpu_split_s(p) for p in pid]
        return None if None in each else (sum(u for u, _ in each), sum(k for _, k in each))
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_cpu_s(pid):
    """utime + stime of a process (or the sum over a list of pids); None once it is gone."""
    split = proc_cpu_split_s(pid)
    return None if split is None else sum(split)


def proc_rss_bytes(pid):
    if isinstance(pid, list):
        each = [proc_rss_bytes(p) for p in pid]
        return None if None in each else sum(each)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_busy_s():
    """CPU-seconds all cores spent busy since boot (everything but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v[:8])
    return (total - v[3] - v[4]) / CLK_TCK


def kernel_threads_cpu_s():
    """CPU-seconds used so far by kernel threads (page-cache writeback, journal commits, I/O
    completion): work the brokers cause that no broker process is charged for."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[6]) & 0x00200000:  # PF_KTHREAD
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def raise_memlock():
    # ferrolog (glommio) locks its I/O memory; the test conftest does the same.
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        except (ValueError, OSError):
            pass


# `--pinned`: the CPU the brokers run on and the one the load generator runs on.
BROKER_CPU, CLIENT_CPU = 0, 1


def pinned_to(cpu, then=None):
    """A preexec_fn that pins the child (and every thread or process it starts) to `cpu`."""
    def pin():
        if then:
            then()
        os.sched_setaffinity(0, {cpu})
    return pin


def disk_free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Broker:
    """One broker process: started, sampled, stopped. Only processes it started are signalled."""

    def __init__(self, config, work_dir, ferrolog_cores, pinned=False):
        self.config = config
        self.pinned = pinned
        self.work_dir = Path(work_dir)
        self.data_dir = self.work_dir / "data"
        self.port = free_port()
        self.controller_port = free_port()
        self.ferrolog_cores = ferrolog_cores
        # (node id, voters, cluster id) when this broker is one node of a `Cluster`.
        self.member = None
        self.proc = None
        self.log_path = self.work_dir / "broker.log"
        self.exec_ns = None
        self.disk_guard_tripped = False
        self.guard_interval_s = 0.05
        self._guard_stop = threading.Event()
        self._guard = None

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def command(self):
        if self.config == "ferrolog":
            return [
                str(FERROLOG_BIN), "start", "--cores", str(self.ferrolog_cores),
                "--override", f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "--override", f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "--override", f"log.dirs={self.data_dir}",
                *(["--override", f"node.id={self.member[0]}", "--override", f"controller.quorum.voters={self.member[1]}"]
                  if self.member else []),
            ]
        extra = ["log.flush.interval.messages=1"] if self.config == "kafka-flush" else []
        return ["bash", str(KAFKA_START), str(self.port), str(self.data_dir), *extra]

    def settings(self):
        """What the report says about this broker's configuration."""
        s = {"command": self.command()}
        if self.config != "ferrolog":
            props = self.data_dir / "server.properties"
            if props.exists():
                s["server.properties"] = [l for l in props.read_text().splitlines() if l and not l.startswith("#")]
            try:
                s["jvm_cmdline"] = Path(f"/proc/{self.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
            except OSError:
                pass
        return s

    def start(self, ready_timeout_s=180):
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.config != "ferrolog":
            env.update({"FOREGROUND": "1", "CONTROLLER_PORT": str(self.controller_port), "KAFKA_HEAP_OPTS": KAFKA_HEAP_OPTS})
            if self.member:
                env.update({"KAFKA_NODE_ID": str(self.member[0]), "KAFKA_VOTERS": self.member[1], "KAFKA_CLUSTER_ID": self.member[2]})
        logf = open(self.log_path, "ab")
        self.exec_ns = time.time_ns()
        self.proc = subprocess.Popen(
            self.command(), stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
            preexec_fn=pinned_to(BROKER_CPU, raise_memlock) if self.pinned else raise_memlock,
        )
        logf.close()
        self._guard_stop = threading.Event()
        self._start_guard()
        return self.exec_ns

    def wait_ready(self, timeout_s=180):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.config} exited during start-up (status {self.proc.returncode}); log tail:\n{self.log_tail()}")
            if answers_api_versions(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.config} not ready after {timeout_s} s; log tail:\n{self.log_tail()}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=30):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _start_guard(self):
        """Kill the broker if the data filesystem runs low: the machine is shared."""
        def guard():
            while not self._guard_stop.wait(self.guard_interval_s):
                try:
                    free = disk_free_bytes(self.work_dir)
                except OSError:
                    continue
                if free < DISK_FREE_MIN_BYTES and self.alive():
                    self.disk_guard_tripped = True
                    log(f"disk guard: {free >> 20} MiB free under {self.work_dir}; killing {self.config} (pid {self.pid})")
                    self.proc.send_signal(signal.SIGKILL)
                    return
        self._guard = threading.Thread(target=guard, daemon=True)
        self._guard.start()

    def terminate(self):
        """SIGTERM (clean shutdown) without waiting; False when it was not running."""
        self._guard_stop.set()
        if not self.alive():
            return False
        self.proc.send_signal(signal.SIGTERM)
        return True

    def stop(self, timeout_s=60):
        """SIGTERM (clean shutdown), SIGKILL after timeout_s; returns seconds taken or None."""
        t = time.time()
        if not self.terminate():
            return None
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log(f"{self.config} did not stop in {timeout_s} s; SIGKILL")
            self.proc.kill()
            self.proc.wait()
            return None
        return time.time() - t

    def kill(self):
        self._guard_stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Cluster:
    """CLUSTER_SIZE brokers of one configuration on loopback, every node a broker and a
    controller voter (ferrolog: `--cores 1` each; Kafka: KRaft combined mode, a static voter
    set, the same heap as a single node). Duck-types the parts of Broker the workloads use."""

    def __init__(self, config, work_dir, pinned=False):
        self.config = config
        self.work_dir = Path(work_dir)
        self.nodes = [Broker(config, self.work_dir / f"node-{i}", 1, pinned) for i in range(1, CLUSTER_SIZE + 1)]
        voters = ",".join(f"{i}@127.0.0.1:{b.controller_port}" for i, b in enumerate(self.nodes, 1))
        cluster_id = "B" + hashlib.sha256(str(work_dir).encode() + os.urandom(8)).hexdigest()[:21]
        for i, b in enumerate(self.nodes, 1):
            b.member = (i, voters, cluster_id)

    @property
    def bootstrap(self):
        return ",".join(b.bootstrap for b in self.nodes)

    @property
    def pid(self):
        return [b.pid for b in self.nodes]

    @property
    def disk_guard_tripped(self):
        return any(b.disk_guard_tripped for b in self.nodes)

    def start(self):
        # All at once: neither ferrolog nor Kafka serves clients before its quorum has a leader.
        for b in self.nodes:
            b.start()
        for b in self.nodes:
            b.wait_ready()

    def log_tail(self, n=10):
        return "\n".join(f"node {i}:\n{b.log_tail(n)}" for i, b in enumerate(self.nodes, 1))

    def stop(self, timeout_s=30):
        """SIGTERM to every node at once (one by one, the last Kafka nodes would wait for a
        controller quorum that is gone), SIGKILL to those still running after timeout_s."""
        live = [b for b in self.nodes if b.terminate()]
        deadline = time.time() + timeout_s
        for b in live:
            try:
                b.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                b.kill()


class Perf:
    """`perf record` of a broker's threads while the `with` body runs; on exit the samples
    become plots/flame-<workload>.svg and an entry of `harness.flames` (total samples, top
    functions). perf.data and the script output are deleted afterwards (hundreds of MB)."""

    FREQ_HZ = 199
    STACK_BYTES = 16384

    def __init__(self, harness, broker, workload):
        self.h, self.broker, self.workload = harness, broker, workload
        self.data = harness.work / f"perf-{workload}.data"

    def __enter__(self):
        with open(self.h.logs / f"perf-{self.workload}.log", "w") as err:
            self.proc = subprocess.Popen(
                ["perf", "record", "-F", str(self.FREQ_HZ), "--call-graph", f"dwarf,{self.STACK_BYTES}", "-p", str(self.broker.pid),
                 "-o", str(self.data)], stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(0.5)  # perf attaches to every thread before the load starts
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        script = self.h.work / f"perf-{self.workload}.txt"
        try:
            if exc[0] is None:
                self.fold(script)
        finally:
            self.data.unlink(missing_ok=True)
            script.unlink(missing_ok=True)
        return False

    def fold(self, script):
        with open(script, "w") as out:
            r = subprocess.run(["perf", "script", "-i", str(self.data), "--no-inline", "-F", "comm,pid,tid,ip,sym,dso"],
                               stdout=out, stderr=subprocess.PIPE, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"perf script exited {r.returncode}: {r.stderr[-500:]}")
        (self.h.out_dir / "plots").mkdir(parents=True, exist_ok=True)
        svg = f"plots/flame-{self.workload}.svg"
        top = self.h.raw_dir / f"flame-{self.workload}.json"
        title = f"ferrolog, {self.workload}: on-CPU stacks of every broker thread, user and kernel ({self.FREQ_HZ} Hz)"
        rc, _, _ = run_child([str(BENCH_BIN), "flamegraph", "--perf-script", str(script), "--out", str(self.h.out_dir / svg),
                              "--title", title, "--top-json", str(top)], 600, self.h.logs / "bench.log")
        if rc != 0:
            raise RuntimeError(f"ferrolog-bench flamegraph exited {rc}")
        self.h.flames.append({"workload": self.workload, "svg": svg, **json.loads(top.read_text())})


class Sampler:
    """Samples a broker's RSS while a measurement runs; with CPU of broker, client and machine."""

    # Called with the broker's pid before each measurement starts (the harness's quiet gate).
    gate = None
    # CPUs the load generator may run on.
    client_cpus = NCPU

    def __init__(self, broker_pid):
        self.pid = broker_pid
        self.rss_peak = 0
        self._stop = threading.Event()
        self._t = None

    def __enter__(self):
        if Sampler.gate:
            Sampler.gate(self.pid)
        self.t0 = time.time()
        self.split0 = proc_cpu_split_s(self.pid) or (0.0, 0.0)
        self.busy0 = machine_busy_s()
        self.kthreads0 = kernel_threads_cpu_s()
        self.rss_peak = proc_rss_bytes(self.pid) or 0

        def loop():
            while not self._stop.wait(0.25):
                r = proc_rss_bytes(self.pid)
                if r:
                    self.rss_peak = max(self.rss_peak, r)
        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.elapsed_s = time.time() - self.t0
        split1 = proc_cpu_split_s(self.pid)
        # The broker's CPU and its kernel part (system calls, io_uring submission, TCP).
        self.broker_kernel_s = (split1[1] - self.split0[1]) if split1 is not None else None
        self.broker_cpu_s = (sum(split1) - sum(self.split0)) if split1 is not None else None
        self.busy_s = machine_busy_s() - self.busy0
        # Kernel threads that exit take their CPU time out of the sum: never below 0.
        self.kthreads_s = max(0.0, kernel_threads_cpu_s() - self.kthreads0)
        return False

    def figures(self, client_cpu_s=0.0):
        other = self.busy_s - (self.broker_cpu_s or 0.0) - client_cpu_s - self.kthreads_s
        return {
            # The load generator's share of the CPUs it may use (one when pinned).
            "client_cpu_pct": round(client_cpu_s / (self.elapsed_s * Sampler.client_cpus) * 100, 1),
            "broker_cpu_s": round(self.broker_cpu_s, 3) if self.broker_cpu_s is not None else None,
            "broker_kernel_cpu_s": round(self.broker_kernel_s, 3) if self.broker_kernel_s is not None else None,
            "client_cpu_s": round(client_cpu_s, 3),
            # Kernel threads working for the broker (writeback of Kafka's page cache, ext4 journal).
            "kernel_threads_cpu_s": round(self.kthreads_s, 3),
            # CPU used by other user processes on the machine, % of all cores: the noise.
            "other_cpu_pct": round(max(0.0, other) / (self.elapsed_s * NCPU) * 100, 1),
            "broker_rss_peak_mb": round(self.rss_peak / 1e6, 1),
        }


def settle(pids, max_s):
    """Waits (up to max_s) until the broker, or each node of a cluster, uses under 10% of a
    core over 2 s: done with what it does in the background after a big create. Returns the
    seconds waited."""
    t = time.time()
    nodes = len(pids) if isinstance(pids, list) else 1
    while time.time() - t < max_s:
        with Sampler(pids) as s:
            time.sleep(2)
        if (s.broker_cpu_s or 0) / s.elapsed_s < 0.10 * nodes:
            break
    return round(time.time() - t, 1)


def run_child(cmd, timeout_s, log_path=None, env=None, cpu=None):
    """Runs a command (pinned to `cpu` if given); returns (exit status, stdout, CPU seconds it
    used)."""
    out_f = open(log_path, "ab") if log_path else subprocess.DEVNULL
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=out_f, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                         preexec_fn=None if cpu is None else pinned_to(cpu))
    timer = threading.Timer(timeout_s, lambda: p.poll() is None and p.kill())
    timer.start()
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(p.stdout.read()), daemon=True)
    reader.start()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    timer.cancel()
    reader.join()
    if log_path:
        out_f.close()
    return p.returncode, (chunks[0] if chunks else b"").decode(errors="replace"), ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------------------
# The load generator


class Harness:
    def __init__(self, args, profile):
        self.args = args
        self.p = profile
        self.out_dir = Path(args.out)
        self.raw_dir = self.out_dir / "raw"
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work_dir)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.runs = []
        self.errors = []
        self.flames = []
        self.settings = {}
        self.kafka_max_mbps = None
        self.api_versions = {}
        self.loop_mount = None
        self.bench_bin = BENCH_BIN
        self.hw = None
        self.quiet_wait_s = 0.0

    def wait_for_quiet(self, pid):
        """On a shared machine, waits (up to QUIET_WAIT_MAX_S) until the CPU used by everything
        but the broker is below QUIET_CPU_PCT of the machine, so that a measurement does not
        start in the middle of someone else's build. Returns the seconds waited."""
        t = time.time()
        limit = min(QUIET_WAIT_MAX_S, max(0.0, QUIET_WAIT_TOTAL_MAX_S - self.quiet_wait_s))
        while True:
            b0, c0, k0 = machine_busy_s(), proc_cpu_s(pid) or 0.0, kernel_threads_cpu_s()
            time.sleep(1.0)
            other = machine_busy_s() - b0 - ((proc_cpu_s(pid) or 0.0) - c0) - (kernel_threads_cpu_s() - k0)
            if time.time() - t >= limit:
                break
            if other / NCPU * 100 < QUIET_CPU_PCT:
                break
        waited = time.time() - t - 1.0
        if waited > 1:
            log(f"waited {waited:.0f} s for the machine to quieten")
        self.quiet_wait_s += max(0.0, waited)
        return waited

    def bench(self, broker, label, args, timeout_s, sampler=None):
        """Runs `ferrolog-bench run` against `broker`; returns its JSON and the client CPU."""
        raw = self.raw_dir / f"{label}.json"
        cmd = [str(BENCH_BIN), "run", "--bootstrap", broker.bootstrap, "--label", label, "--json", str(raw), *map(str, args)]
        rc, _, cpu = run_child(cmd, timeout_s, self.logs / "bench.log", cpu=CLIENT_CPU if self.args.pinned else None)
        if rc != 0:
            tail = "\n".join((self.logs / "bench.log").read_text(errors="replace").splitlines()[-5:])
            raise RuntimeError(f"ferrolog-bench {label} exited {rc}: {tail}")
        data = json.loads(raw.read_text())
        if data.get("produce") and data["produce"].get("api_versions"):
            self.api_versions[broker.config] = dict(data["produce"]["api_versions"])
        return data, cpu, raw

    def record(self, phase, config, rep, workload, metrics, raw=None, step=None):
        r = {"phase": phase, "config": config, "rep": rep, "workload": workload, "step": step, "metrics": metrics}
        if raw:
            r["raw"] = str(Path(raw).relative_to(self.out_dir))
        self.runs.append(r)

    def fail(self, phase, config, rep, workload, err):
        log(f"FAILED {workload} on {config} (rep {rep}): {err}")
        self.errors.append({"phase": phase, "config": config, "rep": rep, "workload": workload, "error": str(err)[-2000:]})

    def common_produce_args(self):
        return ["--record-bytes", self.p["record_bytes"], "--producers", self.p["producers"]]

    # --- sessions ------------------------------------------------------------

    def session(self, config, rep, name, work_dir=None):
        wd = Path(work_dir or (self.work / f"{name}-{config}-r{rep}"))
        if wd.exists():
            shutil.rmtree(wd)
        return Broker(config, wd, self.args.ferrolog_cores, self.args.pinned)

    def end_session(self, broker):
        took = broker.stop()
        keep = self.logs / f"{broker.work_dir.name}.log"
        try:
            shutil.copy(broker.log_path, keep)
        except OSError:
            pass
        shutil.rmtree(broker.work_dir, ignore_errors=True)
        return took

    def phase1(self, config, rep):
        """startup (first start and restart), then max-throughput (closed loop + open-loop ramp)."""
        b = self.session(config, rep, "p1")
        try:
            m = {}
            exec_ns = b.start()
            rc, out, _ = run_child([str(BENCH_BIN), "startup-probe", "--bootstrap", b.bootstrap, "--topic", "startup", "--create",
                                    "--since-unix-ns", str(exec_ns), "--timeout-s", "180"], 200, self.logs / "bench.log")
            if rc != 0:
                raise RuntimeError(f"startup probe failed; broker log:\n{b.log_tail()}")
            m["first_start_to_ack_ms"] = round(json.loads(out)["since_ms"], 1)
            if config not in self.settings:
                self.settings[config] = b.settings()
            m["shutdown_s"] = round(b.stop() or float("nan"), 2)
            exec_ns = b.start()
            rc, out, _ = run_child([str(BENCH_BIN), "startup-probe", "--bootstrap", b.bootstrap, "--topic", "startup",
                                    "--since-unix-ns", str(exec_ns), "--timeout-s", "180"], 200, self.logs / "bench.log")
            if rc != 0:
                raise RuntimeError(f"startup probe after restart failed; broker log:\n{b.log_tail()}")
            m["restart_to_ack_ms"] = round(json.loads(out)["since_ms"], 1)
            idle = self.p["startup"]["idle_s"]
            with Sampler(b.pid) as s:
                time.sleep(idle)
            m["idle_rss_mb"] = round((proc_rss_bytes(b.pid) or 0) / 1e6, 1)
            m["idle_cpu_pct"] = round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 2)
            self.record(1, config, rep, "startup", m)
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            self.fail(1, config, rep, "startup", e)
            if not b.alive():
                self.end_session(b)
                return
        try:
            self.max_throughput(b, config, rep)
        except Exception as e:  # noqa: BLE001
            self.fail(1, config, rep, "max-throughput", e)
        finally:
            self.end_session(b)

    def max_throughput(self, b, config, rep):
        q = self.p["max_throughput"]
        label = f"max-throughput-{config}-r{rep}"
        with Sampler(b.pid) as s:
            data, cpu, raw = self.bench(b, label, [
                "--topic", "mt", "--create-partitions", self.p["partitions"], *self.common_produce_args(),
                "--rate", 0, "--duration-s", q["duration_s"], "--warmup-s", q["warmup_s"]], q["duration_s"] + 120)
        pr = data["produce"]
        self.check_produce(pr, label, closed_loop=True)
        m = {
            "throughput_mbps": round(pr["throughput_mbps"], 2),
            "throughput_rps": round(pr["throughput_rps"]),
            "closed_loop_p50_ms": ms(pr["latency"]["p50_us"]),
            "closed_loop_p99_ms": ms(pr["latency"]["p99_us"]),
            "mean_batch_records": round(pr["mean_batch_records"], 1),
            **s.figures(cpu),
        }
        m["broker_cpu_s_per_gib"] = cpu_per_gib(s.broker_cpu_s, pr["acked_records"] * self.p["record_bytes"], q["duration_s"], pr["window_s"])
        m["broker_kernel_cpu_s_per_gib"] = cpu_per_gib(s.broker_kernel_s, pr["acked_records"] * self.p["record_bytes"], q["duration_s"], pr["window_s"])
        m["broker_and_kernel_cpu_s_per_gib"] = cpu_per_gib((s.broker_cpu_s or 0) + s.kthreads_s, pr["acked_records"] * self.p["record_bytes"],
                                                           q["duration_s"], pr["window_s"])
        self.record(1, config, rep, "max-throughput", m, raw)
        # Open-loop ramp at fractions of this broker's closed-loop maximum.
        first_p99 = None
        sustainable = 0.0
        for f in q["ramp"]:
            rate = f * pr["throughput_rps"]
            label = f"ramp-{int(f * 100)}-{config}-r{rep}"
            with Sampler(b.pid) as s:
                d, cpu, raw = self.bench(b, label, [
                    "--topic", "mt", *self.common_produce_args(), "--rate", round(rate),
                    "--duration-s", q["ramp_duration_s"], "--warmup-s", q["ramp_warmup_s"]], q["ramp_duration_s"] + 60)
            r = d["produce"]
            p99 = r["latency"]["p99_us"]
            first_p99 = first_p99 or max(p99, 1)
            broke = r["saturated"] or p99 > max(10 * first_p99, 50_000)
            if not broke:
                sustainable = max(sustainable, r["throughput_mbps"])
            self.record(1, config, rep, "max-throughput-ramp", {
                "target_mbps": round(r["target_mbps"], 2), "throughput_mbps": round(r["throughput_mbps"], 2),
                **latency_ms(r["latency"]), "saturated": r["saturated"], "broke_down": broke, **s.figures(cpu)}, raw, step=f)
        self.record(1, config, rep, "max-throughput-sustainable", {"sustainable_mbps": round(sustainable, 2)})

    def check_produce(self, pr, label, closed_loop=False):
        if pr["error_records"]:
            raise RuntimeError(f"{label}: {pr['error_records']} records failed: {pr['errors']}")
        if pr["acked_records"] == 0:
            raise RuntimeError(f"{label}: nothing acknowledged in the measured window")

    def phase2(self, config, rep):
        b = self.session(config, rep, "p2")
        try:
            b.start()
            b.wait_ready()
            if config not in self.settings:
                self.settings[config] = b.settings()
            # catch-up first among the backlog readers, on a disk that only fixed-rate and
            # fan-out wrote to, as before the critique workloads were added.
            for name, fn in (("fixed-rate", self.fixed_rate), ("fan-out", self.fan_out), ("catch-up", self.catch_up),
                             ("many-producers", self.many_producers), ("keyed", self.keyed),
                             ("drain-while-producing", self.drain_while_producing),
                             ("transactional", self.transactional)):
                # catch_up also runs catch-up-cold, on the same backlog.
                names = {name, "catch-up-cold"} if name == "catch-up" else {name}
                if not names & set(self.args.workloads):
                    continue
                if not b.alive():
                    self.fail(2, config, rep, name, f"broker not running; log tail:\n{b.log_tail()}")
                    continue
                try:
                    fn(b, config, rep)
                except Exception as e:  # noqa: BLE001
                    self.fail(2, config, rep, name, e)
            if rep == 0 and not self.args.no_cross_check and b.alive():
                try:
                    self.cross_check(b, config)
                except Exception as e:  # noqa: BLE001
                    self.fail(2, config, rep, "cross-check", e)
        except Exception as e:  # noqa: BLE001
            self.fail(2, config, rep, "phase-2", e)
        finally:
            self.end_session(b)

    def reference_rps(self):
        """Kafka's (default mode) median closed-loop max, records/s: the base of fixed rates."""
        return self.kafka_max_rps

    def fixed_rate(self, b, config, rep):
        q = self.p["fixed_rate"]
        for f in q["fractions"]:
            rate = f * self.reference_rps()
            label = f"fixed-rate-{int(f * 100)}-{config}-r{rep}"
            with Sampler(b.pid) as s:
                d, cpu, raw = self.bench(b, label, [
                    "--topic", f"fixed{int(f * 100)}", "--create-partitions", self.p["partitions"], *self.common_produce_args(),
                    "--rate", round(rate), "--duration-s", q["duration_s"], "--warmup-s", q["warmup_s"], "--consumers", 1], q["duration_s"] + 90)
            r = d["produce"]
            self.check_produce(r, label)
            c = d["consumers"][0]["e2e_latency"]
            self.record(2, config, rep, "fixed-rate", {
                "target_mbps": round(r["target_mbps"], 2), "throughput_mbps": round(r["throughput_mbps"], 2),
                **latency_ms(r["latency"]), "saturated": r["saturated"],
                "e2e_p50_ms": ms(c["p50_us"]), "e2e_p99_ms": ms(c["p99_us"]), "e2e_p999_ms": ms(c["p999_us"]), "e2e_max_ms": ms(c["max_us"]),
                **s.figures(cpu)}, raw, step=f)

    def fan_out(self, b, config, rep):
        q = self.p["fan_out"]
        rate = q["fraction"] * self.reference_rps()
        label = f"fan-out-{config}-r{rep}"
        with Sampler(b.pid) as s:
            d, cpu, raw = self.bench(b, label, [
                "--topic", "fanout", "--create-partitions", self.p["partitions"], *self.common_produce_args(),
                "--rate", round(rate), "--duration-s", q["duration_s"], "--warmup-s", q["warmup_s"], "--consumers", q["consumers"]], q["duration_s"] + 90)
        r = d["produce"]
        self.check_produce(r, label)
        t = d["consume_total"]
        produced = r["sent_records"]
        self.record(2, config, rep, "fan-out", {
            "consumers": q["consumers"], "produce_mbps": round(r["throughput_mbps"], 2),
            "consume_total_mbps": round(sum(c["value_bytes"] for c in d["consumers"]) / 1e6 / max(r["elapsed_s"], 1e-9), 2),
            "produce_p99_ms": ms(r["latency"]["p99_us"]),
            "e2e_p50_ms_worst_consumer": ms(t["e2e_p50_us_max"]), "e2e_p99_ms_worst_consumer": ms(t["e2e_p99_us_max"]),
            "e2e_p999_ms_worst_consumer": ms(t["e2e_p999_us_max"]), "e2e_max_ms": ms(t["e2e_max_us"]),
            "all_consumers_got_everything": all(c["records"] >= produced for c in d["consumers"]) and t["reached_end"],
            **s.figures(cpu)}, raw)

    def open_loop(self, b, config, rep, workload, q, args):
        """One open-loop produce run at `q["fraction"]` of Kafka's max with the record size of
        the profile and `args` (producers, partitions, partitioner); produce latency only."""
        rate = q["fraction"] * self.reference_rps()
        label = f"{workload}-{config}-r{rep}"
        with Sampler(b.pid) as s:
            d, cpu, raw = self.bench(b, label, [
                "--record-bytes", self.p["record_bytes"], *args, "--rate", round(rate),
                "--duration-s", q["duration_s"], "--warmup-s", q["warmup_s"]], q["duration_s"] + 90)
        r = d["produce"]
        self.check_produce(r, label)
        self.record(2, config, rep, workload, {
            "target_mbps": round(r["target_mbps"], 2), "throughput_mbps": round(r["throughput_mbps"], 2),
            **latency_ms(r["latency"]), "saturated": r["saturated"],
            "mean_batch_records": round(r["mean_batch_records"], 1), **s.figures(cpu)}, raw)

    def many_producers(self, b, config, rep):
        """Many producer connections over many partitions (public critiques of thread-per-core
        brokers used 50 producers over 100 partitions)."""
        q = self.p["many_producers"]
        self.open_loop(b, config, rep, "many-producers", q, [
            "--topic", "manyproducers", "--create-partitions", q["partitions"], "--producers", q["producers"]])

    def keyed(self, b, config, rep):
        """Keyed records placed by the Java client's default partitioner (murmur2 of the key):
        records scatter over every partition, so batches are small and many."""
        q = self.p["keyed"]
        self.open_loop(b, config, rep, "keyed", q, [
            "--topic", "keyed", "--create-partitions", self.p["partitions"], "--producers", self.p["producers"],
            "--partitioner", "keyed", "--keys", q["keys"]])

    def drain_while_producing(self, b, config, rep):
        """A backlog just written, read from the start by one consumer while producers write
        on at a fraction of Kafka's max: how fast the backlog drains, and what the drain costs
        the producers' latency."""
        q = self.p["drain"]
        records, _ = self.write_backlog(b, f"drain-backlog-{config}-r{rep}", "drain", q["bytes"])
        label = f"drain-while-producing-{config}-r{rep}"
        with Sampler(b.pid) as s:
            d, cpu, raw = self.bench(b, label, [
                "--topic", "drain", *self.common_produce_args(), "--rate", round(q["fraction"] * self.reference_rps()),
                "--duration-s", q["duration_s"], "--warmup-s", q["warmup_s"],
                "--consumers", 1, "--consume-from", "earliest", "--no-parse-records", "--consume-timeout-s", 900], 1000)
        r, c = d["produce"], d["consumers"][0]
        self.check_produce(r, label)
        if not c["reached_end"]:
            raise RuntimeError(f"{label}: the consumer did not reach the end of the backlog ({c['records']} of {records} records)")
        self.record(2, config, rep, "drain-while-producing", {
            "backlog_gib": round(c["batch_bytes"] / 2**30, 3), "drain_mbps": round(c["throughput_mbps"], 2),
            "drain_worst_second_p99_ms": drain_worst_second_p99_ms(r, c["elapsed_s"]),
            "drain_s": round(c["elapsed_s"], 2), "target_mbps": round(r["target_mbps"], 2),
            "throughput_mbps": round(r["throughput_mbps"], 2), **latency_ms(r["latency"]), "saturated": r["saturated"],
            **s.figures(cpu)}, raw)

    def transactional(self, b, config, rep):
        """One transactional producer committing every `records_per_txn` records
        (`ferrolog-bench txn-produce`), then what it wrote read from the start with
        read_committed."""
        q = self.p["transactional"]
        label = f"transactional-{config}-r{rep}"
        raw = self.raw_dir / f"{label}.json"
        with Sampler(b.pid) as s:
            rc, _, cpu = run_child([str(BENCH_BIN), "txn-produce", "--bootstrap", b.bootstrap, "--topic", "txn",
                                    "--partitions", str(q["partitions"]), "--records-per-txn", str(q["records_per_txn"]),
                                    "--record-bytes", str(self.p["record_bytes"]), "--duration-s", str(q["duration_s"]),
                                    "--warmup-s", str(q["warmup_s"]), "--json", str(raw)],
                                   q["duration_s"] + 180, self.logs / "bench.log",
                                   cpu=CLIENT_CPU if self.args.pinned else None)  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"ferrolog-bench txn-produce exited {rc}; broker log:\n{b.log_tail(5)}")
        t = json.loads(raw.read_text())
        # The consumer reads on until the last stable offset reaches the end offsets it saw.
        d, _, _ = self.bench(b, f"{label}-read-committed", ["--topic", "txn", "--producers", 0, "--consumers", 1,
                                                            "--consume-from", "earliest", "--no-parse-records",
                                                            "--read-committed", "--consume-timeout-s", 600], 700)  # fmt: skip
        c = d["consumers"][0]
        if not c["reached_end"]:
            raise RuntimeError(f"{label}: the read_committed consumer did not reach the end ({c['records']} records)")
        lat = t["commit_latency"]
        self.record(2, config, rep, "transactional", {
            "records_per_txn": q["records_per_txn"], "transactions_per_s": round(t["transactions_per_s"], 1),
            "throughput_mbps": round(t["throughput_mbps"], 2), "commit_p50_ms": ms(lat["p50_us"]),
            "commit_p99_ms": ms(lat["p99_us"]), "commit_max_ms": ms(lat["max_us"]),
            "concurrent_transactions_retries": t["concurrent_retries"],
            "read_committed_mbps": round(c["throughput_mbps"], 2), "read_committed_records": c["records"],
            **s.figures(cpu)}, raw)

    def write_backlog(self, b, label, topic, size_bytes):
        """Writes `size_bytes` of records to a new `topic`, closed loop; returns the record
        count and the load generator's produce figures."""
        records = size_bytes // self.p["record_bytes"]
        d, _, _ = self.bench(b, label, [
            "--topic", topic, "--create-partitions", self.p["partitions"], *self.common_produce_args(),
            "--rate", 0, "--records", records, "--duration-s", 1800, "--warmup-s", 0], 1900)
        self.check_produce(d["produce"], label)
        time.sleep(1)
        return records, d["produce"]

    def catch_up(self, b, config, rep):
        """A backlog written, then read from the start: as the writes left the page cache
        (catch-up), then again after dropping the page cache (catch-up-cold)."""
        records, pr = self.write_backlog(b, f"backlog-{config}-r{rep}", "backlog", self.p["catch_up"]["bytes"])
        if "catch-up" in self.args.workloads:
            self.read_backlog(b, config, rep, "catch-up", records, pr)
        if "catch-up-cold" in self.args.workloads:
            try:
                os.sync()
                Path("/proc/sys/vm/drop_caches").write_text("3\n")
            except OSError as e:
                raise RuntimeError(f"catch-up-cold needs to drop the page cache (as root): {e}") from e
            time.sleep(1)
            self.read_backlog(b, config, rep, "catch-up-cold", records, pr)

    def read_backlog(self, b, config, rep, workload, records, pr):
        label = f"{workload}-{config}-r{rep}"
        with Sampler(b.pid) as s:
            d, cpu, raw = self.bench(b, label, ["--topic", "backlog", "--producers", 0, "--consumers", 1, "--consume-from", "earliest",
                                                "--no-parse-records", "--consume-timeout-s", 900], 1000)
        c = d["consumers"][0]
        if not c["reached_end"]:
            raise RuntimeError(f"{label}: consumer did not reach the end of the backlog ({c['records']} of {records} records)")
        self.record(2, config, rep, workload, {
            "backlog_gib": round(pr["acked_records"] * self.p["record_bytes"] / 2**30, 3),
            "backlog_produce_mbps": round(pr["throughput_mbps"], 2),
            "throughput_mbps": round(c["throughput_mbps"], 2),
            "broker_cpu_s_per_gib": round((s.broker_cpu_s or 0) / (c["batch_bytes"] / 2**30), 3) if c["batch_bytes"] else None,
            "broker_kernel_cpu_s_per_gib": round((s.broker_kernel_s or 0) / (c["batch_bytes"] / 2**30), 3) if c["batch_bytes"] else None,
            "client_cpu_s_per_gib": round(cpu / (c["batch_bytes"] / 2**30), 3) if c["batch_bytes"] else None,
            **s.figures(cpu)}, raw)

    def cross_check(self, b, config):
        """Kafka's own ProducerPerformance and ConsumerPerformance against this broker."""
        n = self.p["cross_check"]["records"]
        rc, out, _ = run_child([str(BENCH_BIN), "create-topic", "--bootstrap", b.bootstrap, "--topic", "perf", "--partitions", str(self.p["partitions"])],
                               180, self.logs / "bench.log")
        if rc != 0:
            raise RuntimeError("creating the cross-check topic failed")
        java = ["java", TOOLS_HEAP_OPTS, f"-Dlog4j2.configurationFile={KAFKA_LOG4J}", "-cp", f"{KAFKA_LIB}/*"]
        m = {"records": n}
        with Sampler(b.pid) as s:
            rc, out, _ = run_child(java + ["org.apache.kafka.tools.ProducerPerformance", "--topic", "perf", "--num-records", str(n),
                                           "--record-size", str(self.p["record_bytes"]), "--throughput", "-1", "--producer-props",
                                           f"bootstrap.servers={b.bootstrap}", "acks=all", "batch.size=131072", "linger.ms=5"],
                                   600, self.logs / "kafka-tools.log")
        last = [l for l in out.splitlines() if "records sent" in l]
        if rc != 0 or not last:
            m["producer_performance"] = f"failed (exit {rc})"
        else:
            line = last[-1]
            m["producer_performance_line"] = line.strip()
            g = re.search(r"([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th", line)
            if g:
                rps = float(g.group(1))
                m.update({"pp_throughput_rps": round(rps), "pp_throughput_mbps": round(rps * self.p["record_bytes"] / 1e6, 2),
                          "pp_avg_ms": float(g.group(3)), "pp_p50_ms": int(g.group(5)), "pp_p99_ms": int(g.group(7)),
                          "pp_p999_ms": int(g.group(8)), "pp_max_ms": float(g.group(4))})
        m["pp_broker_cpu_s"] = round(s.broker_cpu_s or 0, 2)
        rc, out, _ = run_child(java + ["org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", b.bootstrap, "--topic", "perf",
                                       "--messages", str(n), "--timeout", str(self.p["cross_check"]["consumer_timeout_ms"]), "--hide-header"],
                               180, self.logs / "kafka-tools.log")
        rows = [l.split(",") for l in out.splitlines() if l.count(",") >= 9]
        if rc == 0 and rows:
            row = [x.strip() for x in rows[-1]]
            m.update({"cp_mb": float(row[2]), "cp_mbps_incl_group_join": round(float(row[3]) * 1.048576, 2),
                      "cp_rebalance_ms": int(row[6]), "cp_fetch_mbps": round(float(row[8]) * 1.048576, 2)})
        else:
            m["consumer_performance"] = ("not supported yet: ConsumerPerformance subscribes through a consumer group, "
                                         "and ferrolog has no group coordinator" if config == "ferrolog" else f"failed (exit {rc})")
        self.record(2, config, 0, "cross-check", m)

    def phase3(self, config, rep):
        q = self.p["many_partitions"]
        mnt = self.scratch_fs() if self.args.many_partitions_fs == "loop" else None
        b = self.session(config, rep, "p3", work_dir=(mnt / f"p3-{config}-r{rep}") if mnt else None)
        try:
            b.start()
            b.wait_ready()
            m = {"partitions": q["partitions"], "filesystem": "loop-mounted ext4 (sparse image)" if mnt else "data disk"}
            b.guard_interval_s = 0.02
            t = time.time()
            rc, out, _ = run_child([str(BENCH_BIN), "create-topic", "--bootstrap", b.bootstrap, "--topic", "many",
                                    "--partitions", str(q["partitions"]), "--timeout-ms", "600000"], 900, self.logs / "bench.log")
            if rc != 0:
                raise RuntimeError(f"creating {q['partitions']} partitions failed; broker log:\n{b.log_tail(5)}")
            m["create_s"] = round(time.time() - t, 2)
            # Wait for the broker to settle (Kafka creates the partition logs in the background).
            m["settle_s"] = settle(b.pid, q["settle_max_s"])
            with Sampler(b.pid) as s:
                time.sleep(q["idle_s"])
            m["idle_cpu_pct"] = round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 2)
            m["idle_rss_mb"] = round((proc_rss_bytes(b.pid) or 0) / 1e6, 1)
            # One record to every partition first, so that the measured run sees partitions
            # that have been written (ferrolog creates a partition's files on its first write).
            t = time.time()
            with Sampler(b.pid) as s:
                d, cpu, _ = self.bench(b, f"many-partitions-first-write-{config}-r{rep}", [
                    "--topic", "many", *self.common_produce_args(), "--partitioner", "round-robin", "--rate", 0,
                    "--records", q["partitions"], "--duration-s", 600, "--warmup-s", 0, "--linger-ms", 20], 700)
            m["first_write_all_s"] = round(time.time() - t, 2)
            m["first_write_broker_cpu_s"] = s.figures(cpu)["broker_cpu_s"]
            m["first_write_errors"] = d["produce"]["error_records"]
            m["broker_open_fds"] = open_fds(b.pid)
            label = f"many-partitions-{config}-r{rep}"
            with Sampler(b.pid) as s:
                d, cpu, raw = self.bench(b, label, ["--topic", "many", *self.common_produce_args(), "--partitioner", "round-robin",
                                                    "--rate", q["rate"], "--duration-s", q["duration_s"], "--warmup-s", q["warmup_s"]],
                                         q["duration_s"] + 120)
            r = d["produce"]
            m.update({"rate_rps": q["rate"], "throughput_rps": round(r["throughput_rps"]), **latency_ms(r["latency"]),
                      "error_records": r["error_records"], "errors": r["errors"], "saturated": r["saturated"],
                      "under_load_cpu_pct": round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 1), **s.figures(cpu)})
            with Sampler(b.pid) as s:
                time.sleep(q["idle_s"])
            m["idle_after_writes_cpu_pct"] = round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 2)
            m["data_disk_used_mb"] = round(du_bytes(b.data_dir) / 1e6, 1)
            if b.disk_guard_tripped:
                m["disk_guard_tripped"] = True
            self.record(3, config, rep, "many-partitions", m, raw)
            if r["error_records"]:
                self.fail(3, config, rep, "many-partitions", f"{r['error_records']} records failed: {r['errors']}; broker log tail:\n{b.log_tail(3)}")
        except Exception as e:  # noqa: BLE001
            self.fail(3, config, rep, "many-partitions", e)
        finally:
            self.end_session(b)

    def phase4(self, config, rep):
        """replicated: a CLUSTER_SIZE-node cluster of `config`, topics with RF=CLUSTER_SIZE
        (min.insync.replicas stays 1 on both brokers; acks=all still waits for the whole ISR on
        Kafka, a Raft majority on ferrolog): closed-loop max, latency at a fixed rate, then
        many idle partitions (the cost of idle Raft groups / replica fetchers) and a
        round-robin produce over all of them. CPU and memory are the sums over the nodes."""
        q = self.p["replicated"]
        c = Cluster(config, self.work / f"p4-{config}-r{rep}", self.args.pinned)
        rf = str(CLUSTER_SIZE)
        try:
            c.start()
            if f"{config} cluster node 1" not in self.settings:
                self.settings[f"{config} cluster node 1"] = c.nodes[0].settings()
            # CreateTopics is refused (INVALID_REPLICATION_FACTOR) until every node registered.
            deadline = time.time() + 120
            while True:
                rc, _, _ = run_child([str(BENCH_BIN), "create-topic", "--bootstrap", c.bootstrap, "--topic", "rf",
                                      "--partitions", str(q["partitions"]), "--replication-factor", rf], 200, self.logs / "bench.log")
                if rc == 0:
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"creating an RF={rf} topic failed for 120 s; log tails:\n{c.log_tail(5)}")
                time.sleep(2)
            produce = ["--topic", "rf", *self.common_produce_args()]
            with Sampler(c.pid) as s:
                d, cpu, raw = self.bench(c, f"replicated-max-{config}-r{rep}", [*produce, "--rate", 0, "--duration-s", q["duration_s"],
                                                                             "--warmup-s", q["warmup_s"]], q["duration_s"] + 120)
            r = d["produce"]
            self.check_produce(r, "replicated closed loop", closed_loop=True)
            self.record(4, config, rep, "replicated-throughput", {
                "throughput_mbps": round(r["throughput_mbps"], 2), "throughput_rps": round(r["throughput_rps"]), **latency_ms(r["latency"]),
                "broker_cpu_pct": round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 1), **s.figures(cpu)}, raw)
            with Sampler(c.pid) as s:
                d, cpu, raw = self.bench(c, f"replicated-fixed-{config}-r{rep}", [*produce, "--rate", q["rate"], "--duration-s", q["duration_s"],
                                                                               "--warmup-s", q["warmup_s"]], q["duration_s"] + 120)
            r = d["produce"]
            self.check_produce(r, "replicated fixed rate")
            self.record(4, config, rep, "replicated-fixed-rate", {
                "rate_rps": q["rate"], "throughput_rps": round(r["throughput_rps"]), **latency_ms(r["latency"]), "saturated": r["saturated"],
                "broker_cpu_pct": round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 1), **s.figures(cpu)}, raw)
            self.replicated_many(c, config, rep)
        except Exception as e:  # noqa: BLE001
            self.fail(4, config, rep, "replicated", e)
        finally:
            c.stop()
            for b in c.nodes:
                try:
                    shutil.copy(b.log_path, self.logs / f"p4-{config}-r{rep}-{b.work_dir.name}.log")
                except OSError:
                    pass
            shutil.rmtree(c.work_dir, ignore_errors=True)

    def replicated_many(self, c, config, rep):
        q = self.p["replicated"]
        n = q["many_partitions"]
        m = {"partitions": n, "replication_factor": CLUSTER_SIZE}
        t = time.time()
        rc, _, _ = run_child([str(BENCH_BIN), "create-topic", "--bootstrap", c.bootstrap, "--topic", "many", "--partitions", str(n),
                              "--replication-factor", str(CLUSTER_SIZE), "--timeout-ms", "600000"], 900, self.logs / "bench.log")
        if rc != 0:
            raise RuntimeError(f"creating {n} RF={CLUSTER_SIZE} partitions failed; log tails:\n{c.log_tail(5)}")
        m["create_s"] = round(time.time() - t, 2)
        m["settle_s"] = settle(c.pid, q["settle_max_s"])
        per_node0 = [proc_cpu_s(p) or 0.0 for p in c.pid]
        with Sampler(c.pid) as s:
            time.sleep(q["idle_s"])
        m["idle_cpu_pct"] = round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 2)
        m["idle_cpu_pct_busiest_node"] = round(max((proc_cpu_s(p) or 0.0) - c0 for p, c0 in zip(c.pid, per_node0)) / s.elapsed_s * 100, 2)
        m["idle_rss_mb"] = round((proc_rss_bytes(c.pid) or 0) / 1e6, 1)
        produce = ["--topic", "many", *self.common_produce_args(), "--partitioner", "round-robin"]
        t = time.time()
        d, _, _ = self.bench(c, f"replicated-many-first-write-{config}-r{rep}", [*produce, "--rate", 0, "--records", n,
                                                                              "--duration-s", 600, "--warmup-s", 0, "--linger-ms", 20], 700)
        m["first_write_all_s"] = round(time.time() - t, 2)
        m["first_write_errors"] = d["produce"]["error_records"]
        with Sampler(c.pid) as s:
            d, cpu, raw = self.bench(c, f"replicated-many-{config}-r{rep}", [*produce, "--rate", q["many_rate"], "--duration-s", q["duration_s"],
                                                                          "--warmup-s", q["warmup_s"]], q["duration_s"] + 120)
        r = d["produce"]
        m.update({"rate_rps": q["many_rate"], "throughput_rps": round(r["throughput_rps"]), **latency_ms(r["latency"]),
                  "error_records": r["error_records"], "saturated": r["saturated"],
                  "under_load_cpu_pct": round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 1), **s.figures(cpu)})
        with Sampler(c.pid) as s:
            time.sleep(q["idle_s"])
        m["idle_after_writes_cpu_pct"] = round((s.broker_cpu_s or 0) / s.elapsed_s * 100, 2)
        if c.disk_guard_tripped:
            m["disk_guard_tripped"] = True
        self.record(4, config, rep, "replicated-many-partitions", m, raw)
        if r["error_records"]:
            self.fail(4, config, rep, "replicated-many-partitions", f"{r['error_records']} records failed: {r['errors']}")

    def scratch_fs(self):
        """A loop-mounted ext4 on a sparse image for many-partitions: whatever a broker
        preallocates per partition stays inside it and cannot fill the shared disk.
        None (use the data disk, under the disk guard) when loop mounts are unavailable."""
        if self.loop_mount is not None:
            return self.loop_mount or None
        img = self.work / "scratch.img"
        mnt = self.work / "scratch"
        try:
            mnt.mkdir(parents=True, exist_ok=True)
            subprocess.run(["truncate", "-s", "1T", str(img)], check=True, capture_output=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", str(img)], check=True, capture_output=True)
            subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
            self.loop_mount = mnt
            return mnt
        except (subprocess.CalledProcessError, OSError) as e:
            log(f"no loop mount for many-partitions ({e}); using the data disk under the disk guard")
            self.loop_mount = False
            img.unlink(missing_ok=True)
            return None

    def release_scratch_fs(self):
        if self.loop_mount:
            subprocess.run(["umount", str(self.loop_mount)], check=False, capture_output=True)
            (self.work / "scratch.img").unlink(missing_ok=True)
            self.loop_mount = None

    # --- the whole run -----------------------------------------------------------

    def hardware(self):
        hw = self.p["hw"]
        d = self.work / "hwprobe"
        raw = self.raw_dir / "hardware.json"
        rc, _, _ = run_child([str(BENCH_BIN), "hw-probe", "--dir", str(d), "--file-mib", str(hw["file_mib"]), "--fsync-count", str(hw["fsync_count"]),
                              "--tcp-seconds", str(hw["tcp_seconds"]), "--json", str(raw)], 600, self.logs / "bench.log")
        shutil.rmtree(d, ignore_errors=True)
        if rc != 0:
            raise RuntimeError("hw-probe failed; see logs/bench.log")
        return json.loads(raw.read_text())

    def order(self, rep):
        cs = list(self.args.configs)
        k = rep % len(cs)
        return cs[k:] + cs[:k]

    def run(self):
        t0 = time.time()
        log(f"machine limits (probe files under {self.work})")
        try:
            self.hw = self.hardware()
        except Exception as e:  # noqa: BLE001
            self.hw = None
            self.fail(0, "machine", 0, "hardware-limits", e)
        reps = self.p["reps"]
        wl = set(self.args.workloads)
        if wl & {"startup", "max-throughput", "fixed-rate", "fan-out"}:
            for rep in range(reps):
                for c in self.order(rep):
                    log(f"phase 1 rep {rep + 1}/{reps}: {c}")
                    self.phase1(c, rep)
        self.kafka_max_rps = self.median_metric("max-throughput", "throughput_rps", "kafka") \
            or self.median_metric("max-throughput", "throughput_rps", None) or 10_000
        log(f"fixed rates are fractions of {self.kafka_max_rps:.0f} records/s")
        if wl & {"fixed-rate", "fan-out", "many-producers", "keyed", "drain-while-producing", "catch-up", "catch-up-cold",
                 "transactional"}:
            for rep in range(reps):
                for c in self.order(rep):
                    log(f"phase 2 rep {rep + 1}/{reps}: {c}")
                    self.phase2(c, rep)
        if "many-partitions" in wl:
            try:
                for rep in range(min(reps, self.p["many_partitions"]["reps"])):
                    for c in self.order(rep):
                        log(f"phase 3 rep {rep + 1}: {c}")
                        self.phase3(c, rep)
            finally:
                self.release_scratch_fs()
        if "replicated" in wl:
            for rep in range(min(reps, self.p["replicated"]["reps"])):
                for c in self.order(rep):
                    log(f"phase 4 rep {rep + 1}: {c} ({CLUSTER_SIZE} nodes)")
                    self.phase4(c, rep)
        if "flame-graphs" in wl and "ferrolog" in self.args.configs:
            log("flame graphs of ferrolog (perf record)")
            self.flame_graphs()
        self.elapsed_s = time.time() - t0

    def flame_graphs(self):
        """Flame graphs of ferrolog under max-throughput and catch-up: a session of its own
        after the measured phases, so perf's sampling costs none of the figures. Each
        workload runs as in its phase while `perf record --call-graph dwarf` samples every
        thread of the broker (user and kernel stacks); ferrolog-bench folds `perf script`'s
        output into plots/flame-<workload>.svg and lists the functions most often on CPU."""
        if not shutil.which("perf"):
            self.fail(5, "ferrolog", 0, "flame-graphs", "perf is not installed (scripts/install-test-deps.sh installs it)")
            return
        b = self.session("ferrolog", 0, "flame")
        try:
            b.start()
            b.wait_ready()
            q = self.p["max_throughput"]
            with Perf(self, b, "max-throughput"):
                self.bench(b, "flame-max-throughput", [
                    "--topic", "flame-mt", "--create-partitions", self.p["partitions"], *self.common_produce_args(),
                    "--rate", 0, "--duration-s", q["flame_s"], "--warmup-s", 0], q["flame_s"] + 120)
            records, _ = self.write_backlog(b, "flame-backlog", "backlog", self.p["catch_up"]["bytes"])
            # The backlog is read again until the profile spans `flame_s`: on a fast disk one
            # read of the quick profile's backlog lasts a few milliseconds, a sample or two.
            with Perf(self, b, "catch-up"):
                started = time.monotonic()
                while True:
                    d, _, _ = self.bench(b, "flame-catch-up", ["--topic", "backlog", "--producers", 0, "--consumers", 1,
                                                               "--consume-from", "earliest", "--no-parse-records", "--consume-timeout-s", 900], 1000)
                    if not d["consumers"][0]["reached_end"]:
                        raise RuntimeError(f"flame-catch-up: the consumer did not reach the end of the {records}-record backlog")
                    if time.monotonic() - started >= q["flame_s"]:
                        break
        except Exception as e:  # noqa: BLE001
            self.fail(5, "ferrolog", 0, "flame-graphs", e)
        finally:
            self.end_session(b)

    def median_metric(self, workload, metric, config, step=None):
        vals = [r["metrics"][metric] for r in self.runs if r["workload"] == workload and (config is None or r["config"] == config)
                and r["step"] == step and isinstance(r["metrics"].get(metric), (int, float))]
        return statistics.median(vals) if vals else None


def ms(us):
    return round(us / 1000, 3) if us is not None else None


def latency_ms(lat):
    return {"p50_ms": ms(lat["p50_us"]), "p99_ms": ms(lat["p99_us"]), "p999_ms": ms(lat["p999_us"]),
            "p9999_ms": ms(lat["p9999_us"]), "max_ms": ms(lat["max_us"])}


def drain_worst_second_p99_ms(produce, drain_s):
    """The highest per-second produce p99 among the seconds (of intended send time) that the
    drain lasted, from the load generator's latency timeline."""
    during = [p99 for second, _, p99, _ in produce["latency_timeline"] if second < max(1, math.ceil(drain_s))]
    return ms(max(during)) if during else None


def cpu_per_gib(cpu_s, bytes_in_window, duration_s, window_s):
    """Broker CPU over the whole run scaled to the bytes of the whole run, per GiB."""
    if cpu_s is None or not bytes_in_window or not window_s:
        return None
    total_bytes = bytes_in_window * duration_s / window_s
    return round(cpu_s / (total_bytes / 2**30), 3)


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def du_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


# ---------------------------------------------------------------------------
# Summary, report, plots

import report  # noqa: E402  (bench/report.py, next to this file)


def machine_info(work):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    commit = sh(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    dirty = sh(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "io", "Cargo.toml", "Cargo.lock", "vendor"])
    df = sh(["df", "-h", "--output=source,fstype,size", str(work)]).splitlines()
    digest = ""
    try:
        digest = hashlib.sha256(FERROLOG_BIN.read_bytes()).hexdigest()[:16]
    except OSError:
        pass
    kafka_jars = sorted(p.name for p in KAFKA_LIB.glob("kafka_2.13-*.jar"))
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": platform.node(), "kernel": platform.release(), "cpu": cpu, "cores": NCPU, "memory_gib": round(mem / 2**30, 1),
        "data_filesystem": df[-1] if df else "", "commit": commit, "broker_sources_dirty": bool(dirty),
        "dirty_files": dirty.splitlines()[:20], "ferrolog_bin": str(FERROLOG_BIN), "ferrolog_bin_sha256_16": digest,
        "ferrolog_bin_mtime": datetime.datetime.fromtimestamp(FERROLOG_BIN.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if FERROLOG_BIN.exists() else None,
        "kafka_version": kafka_jars[-1].removeprefix("kafka_2.13-").removesuffix(".jar") if kafka_jars else None,
        "java": java_version(),
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
        "rlimit_memlock": resource.getrlimit(resource.RLIMIT_MEMLOCK), "rlimit_nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    }


def java_version():
    try:
        r = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        return " / ".join(l.strip() for l in r.stderr.splitlines()[:2])
    except (OSError, subprocess.TimeoutExpired):
        return None


def rerender(out_dir):
    """Writes report.md, results.json and the plots again from an earlier run's results.json
    (after a change to the report code; nothing is measured)."""
    out_dir = Path(out_dir)
    r = json.loads((out_dir / "results.json").read_text())
    args = argparse.Namespace(configs=r["configs"], quick=r["quick"], ferrolog_cores=r["ferrolog_cores"], out=str(out_dir),
                              work_dir=None, pinned=r.get("pinned", False))
    h = Harness.__new__(Harness)
    h.args, h.p, h.out_dir, h.raw_dir = args, r["profile"], out_dir, out_dir / "raw"
    h.runs, h.errors, h.settings, h.api_versions = r["runs"], [e for e in r["errors"] if e["workload"] != "plots"], r["settings"], r["api_versions"]
    h.hw, h.machine, h.kafka_max_rps, h.elapsed_s = r["hardware"], r["machine"], r["kafka_reference_rps"], r["elapsed_s"]
    h.quiet_wait_s = r.get("quiet_wait_s", 0.0)
    h.bench_bin = BENCH_BIN
    return report.write(h, r["interrupted"])


def main():
    global FERROLOG_BIN, BENCH_BIN
    if len(sys.argv) == 3 and sys.argv[1] == "--rerender":
        log(f"report: {rerender(sys.argv[2])}")
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke test of the harness (a few minutes)")
    ap.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)}")
    ap.add_argument("--workloads", default="startup,max-throughput,fixed-rate,fan-out,many-producers,keyed,drain-while-producing,"
                                           "catch-up,catch-up-cold,transactional,many-partitions,replicated,flame-graphs")
    ap.add_argument("--no-cross-check", action="store_true", help="skip Kafka's ProducerPerformance/ConsumerPerformance")
    ap.add_argument("--ferrolog-cores", type=int, help="ferrolog --cores (default: all cores; 1 with --pinned)")
    ap.add_argument("--pinned", action="store_true",
                    help=f"each broker (every node of a cluster too) on CPU {BROKER_CPU} only, the load generator on CPU {CLIENT_CPU}, "
                         "so they do not compete for a core; ferrolog gets --cores 1")
    ap.add_argument("--many-partitions-fs", choices=["disk", "loop"], default="disk",
                    help="where many-partitions keeps its data: the data disk (under the disk guard) or a loop-mounted "
                         "sparse ext4 image that nothing can fill the disk through (its fsyncs are ~4x slower)")
    ap.add_argument("--out", help="output directory (default bench/results/<date>-<commit>[-quick])")
    ap.add_argument("--work-dir", help="broker data and logs (default <repo>/.cache/bench-work)")
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    for c in args.configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c}")
    args.workloads = [w for w in args.workloads.split(",") if w]
    if args.pinned and len(os.sched_getaffinity(0) & {BROKER_CPU, CLIENT_CPU}) < 2:
        sys.exit(f"bench: --pinned needs CPUs {BROKER_CPU} and {CLIENT_CPU}")
    args.ferrolog_cores = args.ferrolog_cores or (1 if args.pinned else NCPU)
    profile = json.loads(json.dumps(PROFILES["quick" if args.quick else "full"]))
    if args.reps:
        profile["reps"] = args.reps
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "nogit"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    args.out = args.out or str(REPO / "bench/results" / f"{stamp}-{commit}{'-quick' if args.quick else ''}")
    args.work_dir = args.work_dir or str(REPO / ".cache/bench-work")
    for p in (BENCH_BIN, FERROLOG_BIN):
        if not p.exists():
            sys.exit(f"bench: {p} missing; scripts/bench.sh builds it")
    if any(c != "ferrolog" for c in args.configs) and not list(KAFKA_LIB.glob("kafka_2.13-*.jar")):
        sys.exit("bench: no Apache Kafka jars; run scripts/fetch-apache-kafka.sh")
    work = Path(args.work_dir)
    if work.exists():
        # A previous run's loop mount, if it was interrupted.
        subprocess.run(["umount", str(work / "scratch")], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    raise_memlock()
    machine = machine_info(work)
    # Run copies of the binaries: the working tree is shared, and a rebuild in the middle of
    # a run would otherwise mix two brokers in one report.
    (work / "bin").mkdir()
    FERROLOG_BIN = Path(shutil.copy2(FERROLOG_BIN, work / "bin" / "ferrolog"))
    BENCH_BIN = Path(shutil.copy2(BENCH_BIN, work / "bin" / "ferrolog-bench"))
    h = Harness(args, profile)
    h.machine = machine
    if not args.quick:
        Sampler.gate = h.wait_for_quiet
    Sampler.client_cpus = 1 if args.pinned else NCPU
    if disk_free_bytes(work) < DISK_FREE_MIN_BYTES + 2 * profile["catch_up"]["bytes"]:
        sys.exit(f"bench: less than {(DISK_FREE_MIN_BYTES + 2 * profile['catch_up']['bytes']) >> 30} GiB free under {work}")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    log(f"{'quick' if args.quick else 'full'} run, {profile['reps']} repetition(s), configs {args.configs}, output {args.out}")
    interrupted = None
    try:
        h.run()
    except KeyboardInterrupt as e:
        interrupted = str(e) or "interrupted"
        h.elapsed_s = None
        log(f"interrupted ({interrupted}); writing what was measured")
    finally:
        h.release_scratch_fs()
    out = report.write(h, interrupted)
    log(f"report: {out}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if not h.errors and not interrupted else 1)


if __name__ == "__main__":
    main()
