"""Helpers shared by the client tests: paths, running client programs with deadlines."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE = REPO_ROOT / ".cache"


def need(path: Path, hint="run scripts/install-test-deps.sh"):
    if not Path(path).exists():
        pytest.fail(f"{path} is missing: {hint}")
    return Path(path)


def need_tool(name, hint="run scripts/install-test-deps.sh"):
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not on PATH: {hint}")
    return found


def run(cmd, timeout_s, input_text=None, check=True, env=None):
    """Run a client program with a deadline; a non-zero exit fails the test with its output."""
    try:
        p = subprocess.run(
            cmd, input=input_text, capture_output=True, text=True, timeout=timeout_s,
            env=None if env is None else dict(os.environ, **env),
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{cmd[0]} did not finish within {timeout_s} s\nstdout:\n{_tail(e.stdout)}\nstderr:\n{_tail(e.stderr)}")
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))}\nexited {p.returncode}\nstdout:\n{_tail(p.stdout)}\nstderr:\n{_tail(p.stderr)}")
    return p


def _tail(text, lines=60):
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def java(main_class, *args, timeout_s=180, input_text=None, check=True):
    """Run a class from the Java test classpath (.cache/java/lib, built by mvn package)."""
    lib = need(CACHE / "java" / "lib" / "ferrolog-client-tests.jar").parent
    need_tool("java")
    cmd = [
        "java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp", f"{lib}/*", main_class, *map(str, args),
    ]  # fmt: skip
    return run(cmd, timeout_s, input_text=input_text, check=check)


def wait_until(predicate, what, timeout_s=30.0, interval_s=0.1):
    """Poll `predicate` until it returns a truthy value, which is returned; fail the test after timeout_s.

    For state that a broker makes visible asynchronously (Apache Kafka's brokers
    apply topic creations and deletions from the metadata log a moment after the
    controller accepted them), never for timing assertions.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not true after {timeout_s} s (last value {value!r})")
        time.sleep(interval_s)


def kafka_error_code(future, timeout_s=30.0):
    """The Kafka error code a confluent-kafka admin future failed with, or 0 if it succeeded."""
    from confluent_kafka import KafkaException

    try:
        future.result(timeout=timeout_s)
    except KafkaException as e:
        return e.args[0].code()
    return 0


def wait_for_partition_leaders(bootstrap, topic, partitions, timeout_s=30.0):
    """Wait until the leader of each of the topic's partitions answers ListOffsets.

    Apache Kafka's Metadata can name a new partition's leader a moment before that
    broker acts as leader (produce and list-offsets get NOT_LEADER_OR_FOLLOWER);
    tests that then send raw requests, which nothing retries, wait for this.
    """
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(topic, p) for p in range(partitions)]

    def answered():
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=timeout_s)
        try:
            return all(f.result(timeout=timeout_s).offset >= 0 for f in futures.values())
        except KafkaException:
            return False

    wait_until(answered, f"every partition of {topic} answers ListOffsets", timeout_s, interval_s=0.2)


def when_coordinator_ready(call, what, timeout_s=60.0):
    """Run a confluent-kafka group call until the group coordinator takes it; return its result.

    Apache Kafka answers COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR and then
    COORDINATOR_LOAD_IN_PROGRESS while it creates and loads __consumer_offsets (and after a
    restart); explicit commits and `committed()` in librdkafka do not retry them.
    """
    from confluent_kafka import KafkaError, KafkaException

    not_ready = (KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    result = []

    def attempt():
        try:
            result.append(call())
            return True
        except KafkaException as e:
            if e.args[0].code() not in not_ready:
                raise
            return False

    wait_until(attempt, what, timeout_s, interval_s=0.5)
    return result[0]


def read_all(bootstrap, topic, partitions, isolation="read_uncommitted", timeout_s=60):
    """Every record of `topic`, from the start to the end of each partition, as a consumer
    with `isolation` reads it: [(key, value)] as bytes, in the order polled."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-all-{isolation}", "isolation.level": isolation,
                  "enable.partition.eof": True, "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, eof = [], set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                eof.add(m.partition())
                continue
            eof.discard(m.partition())
            records.append((m.key(), m.value()))
    finally:
        c.close()
    assert len(eof) == partitions, f"{isolation}: did not reach the end of every partition of {topic}"
    return records
