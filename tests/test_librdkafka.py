"""librdkafka, through confluent-kafka (Python) and kcat (Debian's build, an older librdkafka).

librdkafka is the C client under most non-JVM Kafka clients (Python, Go's
confluent-kafka-go, .NET, Node, Rust's rdkafka), so what it needs from a broker
is what most of the ecosystem needs.
"""

import functools
import time

import roundtrip
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import need_tool, run

TIMEOUT_S = 60


def _create_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30).values():
        future.result(TIMEOUT_S)


def _bytes(s):
    return None if s is None else s.encode()


def _text(b):
    return None if b is None else b.decode()


def _produce_group(bootstrap, topic, codec, records):
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    acks = [None] * len(records)
    errors = []

    def delivered(i, err, msg):
        if err is not None:
            errors.append(err)
        else:
            acks[i] = {"partition": msg.partition(), "offset": msg.offset()}

    for i, r in enumerate(records):
        producer.produce(
            topic,
            key=_bytes(r["key"]),
            value=_bytes(r["value"]),
            partition=r["partition"],
            timestamp=r["timestamp"],
            headers=[(k, _bytes(v)) for k, v in r["headers"]],
            on_delivery=functools.partial(delivered, i),
        )
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, f"{codec}: records still undelivered after {TIMEOUT_S} s"
    assert not errors, f"{codec}: delivery failed: {errors[:3]}"
    return acks


def _consumer(bootstrap):
    # confluent-kafka insists on a group.id even for assign(); offsets are never
    # committed and every partition gets an explicit start offset, so the group
    # is never joined.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ferrolog-tests-assign-only",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )


def test_confluent_kafka_round_trip(broker):
    """AdminClient creates the topic; idempotent Producer with every codec; Consumer.assign
    reads everything back exactly; offsets_for_times finds the right offsets."""
    spec = roundtrip.make_spec("librdkafka-roundtrip")
    topic, partitions = spec["topic"], spec["partitions"]
    _create_topic(broker.bootstrap, topic, partitions)

    result = {"acks": [], "start_offsets": {}, "end_offsets": {}, "records": [], "time_queries": []}
    for group in spec["groups"]:
        result["acks"] += _produce_group(broker.bootstrap, topic, group["compression"], group["records"])

    consumer = _consumer(broker.bootstrap)
    try:
        end = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
            result["start_offsets"][str(p)], result["end_offsets"][str(p)] = low, high
            end[p] = high

        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        next_offset = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + TIMEOUT_S
        while any(next_offset[p] < end[p] for p in end):
            assert time.monotonic() < deadline, f"read up to {next_offset}, end offsets are {end}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            ts_type, ts = msg.timestamp()
            result["records"].append(
                {
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "timestamp": ts,
                    "key": _text(msg.key()),
                    "value": _text(msg.value()),
                    "headers": [[k, _text(v)] for k, v in (msg.headers() or [])],
                }
            )
            next_offset[msg.partition()] = msg.offset() + 1

        # One call per round of look-ups, each partition at most once per call (a call
        # takes about half a second in librdkafka, whatever it asks).
        answers = {}
        pending = list(enumerate(spec["time_queries"]))
        while pending:
            round_, seen = [], set()
            for i, q in pending:
                if q["partition"] not in seen:
                    seen.add(q["partition"])
                    round_.append((i, q))
            pending = [iq for iq in pending if iq not in round_]
            tps = consumer.offsets_for_times(
                [TopicPartition(topic, q["partition"], q["timestamp"]) for _, q in round_], timeout=TIMEOUT_S
            )
            for (i, q), tp in zip(round_, tps):
                assert tp.error is None and tp.partition == q["partition"], tp
                # librdkafka reports "no such offset" as -1 (OFFSET_END).
                answers[i] = dict(q, offset=None if tp.offset < 0 else tp.offset)
        result["time_queries"] = [answers[i] for i in range(len(spec["time_queries"]))]
    finally:
        consumer.close()

    roundtrip.check(spec, result)


def test_kcat(broker):
    """kcat -P with -K keys, -H headers and -z codecs; kcat -C -e -o beginning reads all
    partitions back exactly; kcat -Q looks offsets up by timestamp."""
    need_tool("kcat")
    topic = "kcat-roundtrip"
    _create_topic(broker.bootstrap, topic, 3)
    b = broker.bootstrap

    want = {0: [], 1: [], 2: []}
    for ci, codec in enumerate(roundtrip.CODECS):
        p = ci % 3
        lines = [f"key-{codec}-{i}|kcat {codec} value {i} " + "xyz" * i for i in range(40)]
        run(["kcat", "-b", b, "-t", topic, "-P", "-p", str(p), "-K", "|", "-z", codec,
             "-H", f"codec={codec}", "-H", "h=1", "-H", "h=2",
             "-X", "enable.idempotence=true", "-X", "acks=all"],
            timeout_s=TIMEOUT_S, input_text="\n".join(lines) + "\n")  # fmt: skip
        for line in lines:
            key, value = line.split("|", 1)
            want[p].append((key, value, f"codec={codec},h=1,h=2"))

    out = run(["kcat", "-b", b, "-t", topic, "-C", "-e", "-o", "beginning",
               "-f", "%p\t%o\t%k\t%s\t%h\t%T\n"], timeout_s=TIMEOUT_S).stdout  # fmt: skip
    got = {0: [], 1: [], 2: []}
    timestamps = {0: [], 1: [], 2: []}
    for line in out.splitlines():
        p, o, k, v, h, ts = line.split("\t")
        p = int(p)
        assert int(o) == len(got[p]), f"partition {p}: offset {o} out of sequence"
        got[p].append((k, v, h))
        timestamps[p].append(int(ts))
    assert got == want

    # Look-ups by timestamp for the middle record of each partition, then past the end.
    # Records produced in the same millisecond share a timestamp, so the answer is the
    # first offset whose timestamp is at or after the query. One partition appears
    # once per look-up, as librdkafka's offsets_for_times expects.
    middle = {p: ts[len(ts) // 2] for p, ts in timestamps.items()}
    after_end = {p: ts[-1] + 1 for p, ts in timestamps.items()}
    for query, answer in (
        (middle, {p: next(i for i, t in enumerate(timestamps[p]) if t >= middle[p]) for p in range(3)}),
        (after_end, {p: -1 for p in range(3)}),
    ):
        args = [a for p in range(3) for a in ("-t", f"{topic}:{p}:{query[p]}")]
        out = run(["kcat", "-b", b, "-Q", *args], timeout_s=TIMEOUT_S).stdout
        assert sorted(out.splitlines()) == [f"{topic} [{p}] offset {answer[p]}" for p in range(3)], query
