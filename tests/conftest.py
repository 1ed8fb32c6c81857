"""Fixtures for the end-to-end tests: a real broker process and real clients.

The system under test is chosen by FERROLOG_TARGET:

  ferrolog (default)  $FERROLOG_BIN, else <repo>/target/release/ferrolog, started as
                      `ferrolog start --cores 2 --override listeners=... ...`
  apache              Apache Kafka 4.1 via scripts/start-apache-kafka.sh, the
                      reference: the whole suite must pass against it, so that a
                      failure against ferrolog is ferrolog's.

Each test that asks for `broker` gets a fresh process on free loopback ports with
its own data directory under pytest's tmp_path. A test that needs other broker
configs says so with a marker, which works for both targets (ferrolog gets
`--override KEY=VALUE`, Apache Kafka gets the line in server.properties):

  @pytest.mark.broker_config({"auto.create.topics.enable": "false", "num.partitions": "3"})

The broker's stdout and stderr go to broker.log next to the data directory; when
a test fails, the tail of that log is attached to the report. The process is
always killed at teardown.

Client prerequisites come from scripts/install-test-deps.sh (and, for the
apache target, scripts/fetch-apache-kafka.sh); a missing one fails the test
with the command to run, rather than skipping it.
"""

import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import CACHE, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from check import wire  # noqa: E402  (scripts/check/wire.py)

TARGET = os.environ.get("FERROLOG_TARGET", "ferrolog")

# Kafka answers nothing until its KRaft controller has registered the broker;
# after kill -9 that waits for the old registration's session to expire.
READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30

# Apache Kafka only: a killed broker's old registration blocks the restarted one
# (DUPLICATE_BROKER_REGISTRATION) until broker.session.timeout.ms (9 s) passes.
# Shorter heartbeats make kill/restart cycles quicker; nothing a client sees changes.
APACHE_TEST_CONFIG = ("broker.heartbeat.interval.ms=500", "broker.session.timeout.ms=3000")


# Ports handed out so far: a later pick never lands in an earlier one's span.
_GIVEN_PORTS = set()


def free_port(span=1):
    """A free port P on 127.0.0.1, below the ephemeral range, with P+1 .. P+span-1 free too (a ferrolog node's shard s
    takes Raft traffic at its Raft port + s), none of them handed out before."""
    # Below the kernel's ephemeral range, which other nodes' outgoing connections take from
    # (a port free when chosen could be a connection's source port by the time it listens).
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(10000, low - span)
        ports = set(range(port, port + span))
        if not ports & _GIVEN_PORTS and all(_bindable(p) for p in ports):
            _GIVEN_PORTS.update(ports)
            return port


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def answers_api_versions(port, timeout_s=2.0, host="127.0.0.1"):
    """True when something on `port` answers an ApiVersions v0 request (a listening
    socket is not enough: Apache Kafka binds its port before it serves requests)."""
    return wire.answers_api_versions(host, port, timeout_s)


def _raise_memlock():
    # ferrolog's io_uring/Direct I/O buffers are locked memory; we run as root,
    # so the hard limit can be raised too. Best effort: a lower limit shows up
    # in the broker's own error message.
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass


class Broker:
    """One broker process of the system under test, on fixed ports and one data dir."""

    def __init__(self, workdir: Path, overrides=None, host="127.0.0.1", netns=None):
        self.workdir = workdir
        # Where it listens, and the network namespace it runs in (ferrolog only), for tests
        # that cut a node off the network.
        self.host = host
        self.netns = netns
        # Extra broker configs (Kafka names), applied after the fixture's own.
        self.overrides = {str(k): str(v) for k, v in (overrides or {}).items()}
        self.data_dir = workdir / "data"
        self.log_path = workdir / "broker.log"
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"{host}:{self.port}"
        self.proc = None
        self.starts = 0
        # ferrolog's --cores (shards); a cluster test may give nodes different counts.
        self.cores = 2

    def _command(self):
        if TARGET == "apache":
            script = REPO_ROOT / "scripts" / "start-apache-kafka.sh"
            lib = CACHE / "apache-kafka" / "lib"
            if not any(lib.glob("kafka_2.13-*.jar")):
                pytest.fail(f"Apache Kafka is not in {lib}: run scripts/fetch-apache-kafka.sh")
            env = dict(os.environ, FOREGROUND="1", CONTROLLER_PORT=str(self.controller_port))
            extra = [f"{k}={v}" for k, v in self.overrides.items()]
            return ["bash", str(script), str(self.port), str(self.data_dir), *APACHE_TEST_CONFIG, *extra], env, None
        if TARGET == "ferrolog":
            binary = Path(os.environ.get("FERROLOG_BIN", REPO_ROOT / "target" / "release" / "ferrolog"))
            if not binary.is_file():
                pytest.fail(f"no ferrolog binary at {binary}: build it (cargo build --release) or set FERROLOG_BIN")
            listener = f"PLAINTEXT://{self.host}:{self.port}"
            cmd = ["ip", "netns", "exec", self.netns] if self.netns else []
            cmd += [
                str(binary), "start", "--cores", str(self.cores),
                "--override", f"listeners={listener}",
                "--override", f"advertised.listeners={listener}",
                "--override", f"log.dirs={self.data_dir}",
                "--override", "num.partitions=1",
            ]  # fmt: skip
            for k, v in self.overrides.items():
                cmd += ["--override", f"{k}={v}"]
            env = dict(os.environ, RUST_BACKTRACE="1")
            return cmd, env, _raise_memlock
        pytest.fail(f"FERROLOG_TARGET={TARGET!r}: expected 'ferrolog' or 'apache'")

    def start(self):
        self.launch()
        return self.wait_ready()

    def launch(self):
        """Starts the process without waiting for it to serve (cluster nodes need each other)."""
        assert self.proc is None, "broker already running"
        cmd, env, preexec = self._command()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            # Own session: a test's Ctrl-C does not reach the broker before teardown does.
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, preexec_fn=preexec, start_new_session=True,
            )  # fmt: skip
        return self

    def wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not answers_api_versions(self.port, host=self.host):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                pytest.fail(f"broker exited with status {code} during start-up:\n{self.log_tail(40)}")
            if time.monotonic() > deadline:
                pytest.fail(f"broker did not answer ApiVersions on {self.bootstrap} within {READY_TIMEOUT_S} s")
            time.sleep(0.1)
        return self

    def kill9(self):
        """SIGKILL, as a crash or power-off of the process would be; waits until it is gone."""
        assert self.proc is not None, "broker not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self.proc = None

    def stop(self):
        """Clean shutdown (SIGTERM), escalating to SIGKILL after STOP_TIMEOUT_S."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self):
        """Start again on the same port and data directory (stopping it first if running)."""
        self.stop()
        return self.start()

    def log_tail(self, lines=80):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * 1024))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return "(no broker log)"
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def broker(request, tmp_path):
    marker = request.node.get_closest_marker("broker_config")
    b = Broker(tmp_path, overrides=marker.args[0] if marker else None)
    try:
        yield b.start()
    finally:
        if b.proc is not None:
            b.proc.kill()
            b.proc.wait()
            b.proc = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    b = getattr(item, "funcargs", {}).get("broker")
    if report.failed and isinstance(b, Broker):
        report.sections.append((f"broker output, tail of {b.log_path}", b.log_tail()))
    c = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and c is not None:
        for node_id, node in c.nodes.items():
            report.sections.append((f"node {node_id} output, tail of {node.log_path}", node.log_tail(40)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "broker_config(dict): extra broker configs (Kafka names) for the `broker` fixture"
    )


def pytest_report_header(config):
    return f"system under test: FERROLOG_TARGET={TARGET}"
