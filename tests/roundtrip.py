"""The round trip every client does, described once.

Every client test produces the same records and checks what comes back against
the same expectations, so a difference between clients is a difference in what
the broker tells them, not in what the tests ask. A *spec* (plain JSON, so the
Java and Go drivers can read it) lists the records to produce, grouped by
compression codec, each with an explicit partition and CreateTime timestamp,
and the timestamp look-ups to make. A driver produces each group with its own
idempotent producer (acks=all), in order, and waits for every ack before the
next group; then it reads every partition from the beginning with `assign`
(consumer groups are not used) and answers the look-ups. It reports back a
*result*:

    {"acks":    [{"partition": p, "offset": o}, ...]   one per spec record, in spec order
     "start_offsets": {"0": n, ...}, "end_offsets": {"0": n, ...}
     "records": [{"partition", "offset", "key", "value", "headers", "timestamp"}, ...]
     "time_queries": [{"partition", "timestamp", "offset"}, ...]   offset null = none}

Keys, values and header values are UTF-8 strings or null; headers are
[key, value] pairs in order.
"""

import json
import time

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 3
RECORDS_PER_CODEC = 300
# Records of one partition are 3 * STEP_MS apart, so a look-up a few ms before a
# record's timestamp must land on that record and not on its predecessor.
STEP_MS = 10


def make_spec(topic, codecs=CODECS, records_per_codec=RECORDS_PER_CODEC, null_header_values=True):
    """Records to produce and timestamp look-ups to make, for one topic.

    Timestamps start ten minutes in the past: Kafka rejects CreateTime more than
    log.message.timestamp.after.max.ms (1 h) in the future, and the past is
    unbounded by default.
    """
    base_ms = int(time.time() * 1000) - 10 * 60 * 1000
    groups = []
    g = 0
    for codec in codecs:
        records = []
        for i in range(records_per_codec):
            key = f"key-{g % 17}"
            # Repetitive text so that every codec really compresses something.
            value = f"value {codec} {i} " + "abcdefgh" * (g % 20)
            headers = [["codec", codec], ["seq", str(g)], ["h", "first"], ["h", "second"]]
            if i == 5:
                key = None  # a record without a key
            if i == 7:
                value = None  # a tombstone
            if i == 9:
                value = "large " + ("0123456789" * 20000)  # 200 kB, many fetches' worth of one record
            if i == 11:
                headers = []
            if i == 13:
                headers.append(["empty", ""])
                if null_header_values:
                    headers.append(["null", None])
            if i == 15:
                key = "ключ-é-键"
                value = "значение ✓"
            records.append(
                {
                    "partition": g % PARTITIONS,
                    "key": key,
                    "value": value,
                    "headers": headers,
                    "timestamp": base_ms + g * STEP_MS,
                }
            )
            g += 1
        groups.append({"compression": codec, "records": records})

    queries = []
    by_partition = _by_partition([r for grp in groups for r in grp["records"]])
    for p, recs in sorted(by_partition.items()):
        first, middle, last = recs[0], recs[len(recs) // 2], recs[-1]
        queries += [
            {"partition": p, "timestamp": base_ms - 60_000},  # before everything -> first offset
            {"partition": p, "timestamp": first["timestamp"]},  # exact hit
            {"partition": p, "timestamp": middle["timestamp"] - 3},  # between two records
            {"partition": p, "timestamp": middle["timestamp"]},
            {"partition": p, "timestamp": last["timestamp"]},
            {"partition": p, "timestamp": last["timestamp"] + 1},  # after everything -> none
        ]
    return {"topic": topic, "partitions": PARTITIONS, "groups": groups, "time_queries": queries}


def _by_partition(records):
    out = {}
    for r in records:
        out.setdefault(r["partition"], []).append(r)
    return out


def expected(spec):
    """What a correct broker returns for `spec` on a fresh topic."""
    records = [r for grp in spec["groups"] for r in grp["records"]]
    acks = []
    next_offset = {p: 0 for p in range(spec["partitions"])}
    per_partition = {p: [] for p in range(spec["partitions"])}
    for r in records:
        o = next_offset[r["partition"]]
        next_offset[r["partition"]] += 1
        acks.append({"partition": r["partition"], "offset": o})
        per_partition[r["partition"]].append(dict(r, offset=o))
    answers = []
    for q in spec["time_queries"]:
        hit = next((r["offset"] for r in per_partition[q["partition"]] if r["timestamp"] >= q["timestamp"]), None)
        answers.append(dict(q, offset=hit))
    return acks, per_partition, next_offset, answers


def check(spec, result, check_timestamps=True):
    """Assert that `result` is exactly what a user of a correct broker sees."""
    acks, per_partition, end_offsets, answers = expected(spec)

    assert result["acks"] == acks, "acknowledged (partition, offset) differ from the order records were sent in"

    got_end = {int(p): o for p, o in result["end_offsets"].items()}
    got_start = {int(p): o for p, o in result["start_offsets"].items()}
    assert got_start == {p: 0 for p in end_offsets}, "log start offsets of a fresh topic"
    assert got_end == end_offsets, "log end offsets (ListOffsets latest) after producing"

    got = {p: [] for p in per_partition}
    for r in result["records"]:
        got.setdefault(r["partition"], []).append(r)
    fields = ("offset", "key", "value", "headers") + (("timestamp",) if check_timestamps else ())
    for p, want in per_partition.items():
        have = got.get(p, [])
        assert len(have) == len(want), f"partition {p}: read {len(have)} records, produced {len(want)}"
        for w, h in zip(want, have):
            for f in fields:
                assert h[f] == w[f], (
                    f"partition {p} offset {w['offset']} ({w['headers'][:2] if w['headers'] else 'no headers'}): "
                    f"{f} is {_short(h[f])}, produced {_short(w[f])}"
                )

    if answers:
        assert result["time_queries"] == answers, "offsets for timestamps (ListOffsets by timestamp)"


def _short(v):
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) < 120 else s[:100] + f"... ({len(s)} chars)"
