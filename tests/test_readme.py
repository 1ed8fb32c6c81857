"""The README's commands, run exactly as written, as a newcomer would run them.

Each test takes its commands out of README.md itself (the fenced blocks under a heading), so
an edit to the README is tested as it stands. The broker and its clients run inside a
network namespace the test makes (loopback only), so the README's fixed ports (9092, the
3-node example's 19092-39092 and 9093-9293) are free whatever else runs on the machine, and
`127.0.0.1:9092` is the broker started here. Nothing raises RLIMIT_MEMLOCK: the machine's
default is what a newcomer has.

ferrolog only: these are ferrolog's commands.
"""

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import TARGET
from support import CACHE, REPO_ROOT

pytestmark = pytest.mark.skipif(TARGET != "ferrolog", reason="the README's commands start ferrolog")

README = REPO_ROOT / "README.md"
# Fresh working directories live under the clone (in target/, git-ignored), so that
# `cargo run` finds the workspace from them as it does from the clone's root.
FRESH_ROOT = REPO_ROOT / "target" / "readme-tests"
KAFKA_BIN = CACHE / "kafka" / "bin"
READY_TIMEOUT_S = 300  # `cargo run` may have to build first
READY_LINE = re.compile(r"ferrolog is ready: Kafka clients connect to (\S+) .*data in (\S+); try")


def readme_blocks(heading):
    """The fenced code blocks under `## heading` in README.md, as (language, text)."""
    text = README.read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no section '## {heading}'"
    return re.findall(r"^```(\w*)\n(.*?)^```\n", match.group(1), re.M | re.S)


def readme_block(heading, index, language):
    blocks = readme_blocks(heading)
    assert len(blocks) > index, f"README.md '## {heading}' has {len(blocks)} code blocks"
    lang, body = blocks[index]
    assert lang == language, f"block {index} of '## {heading}' is {lang!r}, expected {language!r}"
    return body


class Netns:
    """A network namespace with only loopback, and names of its own (/etc/netns/NAME/hosts,
    which `ip netns exec` mounts over /etc/hosts)."""

    def __init__(self, hosts=()):
        self.name = f"flreadme-{uuid.uuid4().hex[:8]}"
        self.etc = Path("/etc/netns") / self.name
        self.hosts = hosts

    def __enter__(self):
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        if self.hosts:
            self.etc.mkdir(parents=True)
            names = " ".join(self.hosts)
            (self.etc / "hosts").write_text(f"127.0.0.1 localhost {names}\n::1 localhost\n")
        return self

    def __exit__(self, *exc):
        subprocess.run(["ip", "netns", "del", self.name], check=False)
        shutil.rmtree(self.etc, ignore_errors=True)

    def command(self, script):
        return ["ip", "netns", "exec", self.name, "bash", "-euo", "pipefail", "-c", script]

    def run(self, script, cwd, input_text=None, timeout_s=120):
        """Runs `script` with bash in the namespace; a failure fails the test with its output."""
        try:
            p = subprocess.run(self.command(script), cwd=cwd, env=shell_env(), input=input_text,
                               capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"did not finish within {timeout_s} s:\n{script}\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
        if p.returncode != 0:
            pytest.fail(f"exited {p.returncode}:\n{script}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-4000:]}")
        return p.stdout

    def start(self, script, cwd, log_path):
        """Starts `script` in the background, in a process group of its own (Ctrl-C goes to
        the whole group, as a terminal sends it)."""
        log = open(log_path, "ab")
        return subprocess.Popen(self.command(script), cwd=cwd, env=shell_env(), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def shell_env():
    """The test's environment with Kafka's CLI tools on PATH, as the README says to set it."""
    if not (KAFKA_BIN / "kafka-topics.sh").is_file():
        pytest.fail(f"Kafka's CLI tools are not in {KAFKA_BIN}: run scripts/install-kafka-cli.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERROLOG_")}
    env["PATH"] = f"{KAFKA_BIN}:{env['PATH']}"
    return env


def fresh_dir(name):
    path = FRESH_ROOT / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return Path(os.path.realpath(path))


class Started:
    """A broker started by a README command, in its own process group."""

    def __init__(self, ns, script, cwd, log_path):
        self.ns, self.script, self.cwd, self.log_path = ns, script, cwd, log_path
        self.proc = None

    def start(self, port=9092):
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = self.ns.start(self.script, self.cwd, self.log_path)
        probe = ("import sys; sys.path.insert(0, sys.argv[1]); from conftest import answers_api_versions\n"
                 f"sys.exit(0 if answers_api_versions({port}) else 1)")  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self.proc.poll() is None, f"the broker exited during start-up:\n{self.log(offset)}"
            ready = subprocess.run(["ip", "netns", "exec", self.ns.name, "python3", "-c", probe, str(REPO_ROOT / "tests")])
            if ready.returncode == 0:
                break
            assert time.monotonic() < deadline, f"the broker did not start:\n{self.log(offset)}"
            time.sleep(0.3)
        # The first-run line: where clients connect and where the data is.
        deadline = time.monotonic() + 10
        while not READY_LINE.search(self.log(offset)) and time.monotonic() < deadline:
            time.sleep(0.1)
        match = READY_LINE.search(self.log(offset))
        assert match, f"no 'ferrolog is ready' line in the broker's output:\n{self.log(offset)}"
        return match.group(1), Path(match.group(2))

    def send(self, sig):
        os.killpg(self.proc.pid, sig)

    def stop(self, sig=signal.SIGINT, timeout_s=60):
        """Ctrl-C (or `sig`) to the process group; returns the exit status."""
        self.send(sig)
        code = self.proc.wait(timeout=timeout_s)
        self.proc = None
        return code

    def kill(self):
        if self.proc is not None:
            try:
                self.send(signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None

    def log(self, offset=0):
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")


def consume_values(ns, cwd, topic="demo", bootstrap="127.0.0.1:9092"):
    out = ns.run(f"kcat -b {bootstrap} -C -t {topic} -e -o beginning -q", cwd)
    return out.splitlines()


def test_first_command_in_a_fresh_directory(tmp_path):
    """`cargo run --release -- start` in an empty directory, no arguments, then every client
    example of the README against it, a Ctrl-C restart and a kill -9 restart."""
    start = readme_block("Run a broker", 0, "sh")
    kcat = readme_block("Point a client at it", 0, "sh").splitlines()
    producer = readme_block("Point a client at it", 1, "python")
    configs = readme_block("Point a client at it", 2, "sh")
    consumer = readme_block("Consumer groups", 0, "python")
    transactional = readme_block("Transactions and exactly-once", 0, "python")
    txn_tool = readme_block("Transactions and exactly-once", 1, "sh").splitlines()
    cwd = fresh_dir("first-command")
    with Netns() as ns:
        broker = Started(ns, start, cwd, tmp_path / "broker.log")
        try:
            client, data = broker.start()
            assert client == "127.0.0.1:9092"
            assert data == cwd / "ferrolog-data", "the data directory is ./ferrolog-data, shown absolute"
            assert sorted(p.name for p in cwd.iterdir()) == ["ferrolog-data"]

            # The kcat lines as written: the producer reads key:value lines from its input.
            ns.run(kcat[0], cwd, input_text="k1:v1\nk2:v2\n")
            assert ns.run(kcat[1], cwd).splitlines() == ["v1", "v2"]
            ns.run(f"python3 - <<'EOF'\n{producer}EOF", cwd)
            assert consume_values(ns, cwd) == ["v1", "v2", "v"]
            out = ns.run(configs, cwd)
            assert "retention.ms=604800000" in out, out
            # The group snippet as written, then a poll of what it subscribed to.
            poll = ("seen = []\n"
                    "for _ in range(60):\n"
                    "    m = c.poll(1.0)\n"
                    "    if m is not None and m.error() is None: seen.append(m.value())\n"
                    "    if len(seen) == 3: break\n"
                    "assert seen == [b'v1', b'v2', b'v'], seen\n"
                    "c.close()\n")  # fmt: skip
            ns.run(f"python3 - <<'EOF'\n{consumer}{poll}EOF", cwd, timeout_s=120)
            assert (data / "demo-0").is_dir()

            # Ctrl-C stops it cleanly; the same command starts it again on the same data.
            assert broker.stop(signal.SIGINT) == 0, broker.log()
            broker.start()
            assert consume_values(ns, cwd) == ["v1", "v2", "v"]
            ns.run(kcat[0], cwd, input_text="k3:v3\n")
            # kill -9 is safe too.
            broker.stop(signal.SIGKILL)
            broker.start()
            assert consume_values(ns, cwd) == ["v1", "v2", "v", "v3"]

            # The transactions example, then kafka-transactions.sh on what it did.
            ns.run(f"python3 - <<'EOF'\n{transactional}EOF", cwd, timeout_s=120)
            described = ns.run(txn_tool[0], cwd)
            assert "demo-txn" in described and "CompleteCommit" in described, described
            producers = ns.run(txn_tool[1], cwd).splitlines()
            assert producers[0].split()[:2] == ["ProducerId", "ProducerEpoch"], producers
            assert len(producers) == 2, producers  # the transactional producer's row
        finally:
            broker.kill()


def test_config_file_and_relative_log_dirs(tmp_path):
    """The README's server.properties example as written, in an empty directory: a relative
    --config file and a relative --override log.dirs, with advertised.listeners naming a host
    the namespace resolves to loopback."""
    script = readme_block("Run a broker", 1, "sh")
    cwd = fresh_dir("config-file")
    with Netns(hosts=["broker1.example"]) as ns:
        broker = Started(ns, script, cwd, tmp_path / "broker.log")
        try:
            client, data = broker.start()
            assert client == "broker1.example:9092"
            assert data == cwd / "data", "log.dirs=data is ./data, shown absolute"
            meta = ns.run("kcat -b 127.0.0.1:9092 -L", cwd)
            assert "broker 1 at broker1.example:9092" in meta, meta
            ns.run("kcat -b 127.0.0.1:9092 -P -t demo -K:", cwd, input_text="a:1\nb:2\nc:3\n")
            meta = ns.run("kcat -b 127.0.0.1:9092 -L -t demo", cwd)
            assert 'topic "demo" with 3 partitions' in meta, "num.partitions=3 from server.properties"
            assert sorted(consume_values(ns, cwd)) == ["1", "2", "3"]
            # log.retention.hours=72 from the file is the topic's default retention.ms.
            out = ns.run("kafka-configs.sh --bootstrap-server 127.0.0.1:9092 --entity-type topics "
                         "--entity-name demo --describe --all", cwd)  # fmt: skip
            assert "retention.ms=259200000" in out, out
            assert sorted(p.name for p in (data).iterdir() if p.name.startswith("demo-")) == ["demo-0", "demo-1", "demo-2"]
            assert broker.stop() == 0
            broker.start()
            assert sorted(consume_values(ns, cwd)) == ["1", "2", "3"]
        finally:
            broker.kill()


def test_three_node_cluster_as_written(tmp_path):
    """The README's 3-node example, run as written from the clone's root: three nodes, then
    the wait for registration and kafka-topics.sh creating a topic of replication factor 3."""
    script = readme_block("Run a 3-node cluster on one machine", 0, "sh")
    dirs = [Path(f"/tmp/ferrolog-{i}") for i in (1, 2, 3)]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    with Netns() as ns:
        proc = ns.start(script, REPO_ROOT, tmp_path / "cluster.log")
        try:
            try:
                code = proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                code = None
            log = (tmp_path / "cluster.log").read_text(errors="replace")
            assert code == 0, f"the example did not finish (exit {code}):\n{log[-6000:]}"
            describe = "kafka-topics.sh --bootstrap-server 127.0.0.1:29092 --describe --topic orders"
            out = ns.run(describe, REPO_ROOT)
            assert "PartitionCount: 6" in out and "ReplicationFactor: 3" in out, out
            # Each partition's Raft group elects its leader a moment after the creation.
            deadline = time.monotonic() + 30
            while len(re.findall(r"Isr: \d,\d,\d", out)) < 6 and time.monotonic() < deadline:
                time.sleep(1)
                out = ns.run(describe, REPO_ROOT)
            assert len(re.findall(r"Isr: \d,\d,\d", out)) == 6, out
            values = "".join(f"{i}\n" for i in range(100))
            ns.run("kcat -b 127.0.0.1:19092 -P -t orders -X acks=all", REPO_ROOT, input_text=values)
            seen = consume_values(ns, REPO_ROOT, topic="orders", bootstrap="127.0.0.1:39092")
            assert sorted(seen, key=int) == [str(i) for i in range(100)]
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
