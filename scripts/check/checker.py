"""The checkers of Jepsen's Kafka queue workload, over a `History` and the final log.

Each anomaly kind counts cases and keeps a few examples:

- lost: an acknowledged value that is not in the final log, or a value a consumer polled
  that is not in it (the log lost a record that was acknowledged or shown).
- inconsistent-offsets: an acknowledged or polled value at an offset where the final log
  holds another value or nothing, or two values acknowledged at one offset.
- duplicated: a value at two offsets of the final log, from an idempotent producer, in
  batches of one producer id and epoch (or not known). For the others, retries make
  duplicates legitimate; and where the copies carry one producer id under different epochs,
  the client sent the record again after bumping its epoch, which no broker can recognise
  (librdkafka does so after a message timeout, with records possibly written:
  confluentinc/librdkafka#4953). Both are counted apart, not anomalies.
- unseen: an acknowledged value that a consumer never polled, although it read up to the
  final high watermark (each consumer reads every partition, so each is checked alone).
- nonmonotonic-send: an idempotent producer's acknowledged offsets on one partition that go
  down while its sequence goes up (batch n+1 before batch n).
- nonmonotonic-poll: one consumer, in one assignment, polling an offset of a partition at or
  below one it already polled.
- poll-skip: one consumer, in one assignment, jumping over offsets the final log holds
  (from where the assignment started on).
- committed-regression: a group's acknowledged commits going down, or an assignment starting
  below (or without) a commit acknowledged before it.
- stale-offset-read: a committed offset read back (OffsetFetch) lower than, or missing after,
  a commit acknowledged before the read began.
- offset-reset: a consumer told its position is out of range (nothing is deleted here).
- crash: a broker process that exited without the nemesis killing it, or failed its shutdown.
- unrecovered: the cluster not back to a leader and full ISR for every partition within the
  nemesis's recovery time, or a final read that could not reach the high watermark.
- txn-*: the transactional workload's, described in `txn.py`.

An acknowledgement without an offset (librdkafka's answer to DUPLICATE_SEQUENCE_NUMBER) is
checked only for loss.
"""

import bisect
from collections import defaultdict

KINDS = (
    "lost", "inconsistent-offsets", "duplicated", "unseen", "nonmonotonic-send", "nonmonotonic-poll",
    "poll-skip", "committed-regression", "stale-offset-read", "offset-reset", "crash", "unrecovered",
    # The transactional workload's (`txn.check`).
    "txn-lost-commit", "txn-aborted-read", "txn-partial", "txn-duplicated", "txn-dirty-read", "txn-order", "txn-stuck",
)  # fmt: skip
EXAMPLES = 10


class Anomalies:
    def __init__(self):
        self.counts = {k: 0 for k in KINDS}
        self.examples = {k: [] for k in KINDS}

    def add(self, kind, t, what):
        """`t`: when (seconds into the run) the anomaly shows, for the timeline."""
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append({"t": round(t, 3), "what": what})

    def total(self):
        return sum(self.counts.values())


def check(history, final, crashes=(), unrecovered=(), consumers_caught_up=True, batch_of=None):
    """`final`: {partition: {offset: value}}; `crashes`: [(t, node, exit status)];
    `unrecovered`: [(t, what)]; `batch_of(partition, offset)`: the header of the batch there
    (`batches.batch_at`), or a string saying why it is not known, for the duplicates of
    idempotent producers. Without a final log (None), only the checks that need none run:
    commits, offset resets, crashes and recovery."""
    a = Anomalies()
    if final is None:
        check_commits(history, a)
        add_events(history, a, crashes, unrecovered)
        return a, {"duplicates-without-idempotence": 0, "duplicates-after-epoch-bump": 0, "epoch-bump-examples": [],
                   "indeterminate": 0, "indeterminate-found-in-log": 0}  # fmt: skip
    where = defaultdict(list)  # value -> [(partition, offset)] in the final log
    for p, log in final.items():
        for o, v in log.items():
            where[v].append((p, o))
    acked = [s for s in history.sends if s[7] is not None]
    sends = [s for s in acked if s[7] >= 0]  # acknowledged with their offset
    idempotent = {s[3] for s in history.sends if s[1]}
    for s in acked:
        if s[7] < 0 and s[3] not in where:
            a.add("lost", s[6], f"{s[3]} acknowledged (offset not given), not in the final log")

    at = {}
    for pname, _, seq, value, p, t_sent, t_done, offset, _ in sends:
        if (p, offset) in at and at[(p, offset)] != value:
            a.add("inconsistent-offsets", t_done, f"{value} and {at[(p, offset)]} both acknowledged at {p}/{offset}")
        at[(p, offset)] = value
        held = final.get(p, {}).get(offset)
        if value not in where:
            a.add("lost", t_done, f"{value} acknowledged at {p}/{offset}, not in the final log")
        elif held != value:
            a.add("inconsistent-offsets", t_done,
                  f"{value} acknowledged at {p}/{offset}, final log has {held!r} there and {value} at {where[value]}")  # fmt: skip

    acked_at = {s[3]: (s[4], s[7]) for s in sends}  # value -> (partition, offset) acknowledged
    allowed_dups, bumped = 0, []
    for v, places in sorted(where.items()):
        if len(places) > 1:
            if v in idempotent:
                copies = [batch_of(p, o) for p, o in sorted(places)] if batch_of is not None else []
                what = f"{v} at {sorted(places)}" + "".join(
                    f"; at {p}/{o}, {describe_batch(b)}" for (p, o), b in zip(sorted(places), copies))
                if epoch_bumped(sorted(places), copies, acked_at.get(v)):
                    bumped.append(what)
                else:
                    a.add("duplicated", 0.0, what)
            else:
                allowed_dups += 1

    # An idempotent producer session's acknowledged offsets per partition follow its sequence.
    by_session = defaultdict(list)
    for pname, idem, seq, value, p, t_sent, t_done, offset, _ in sends:
        if idem:
            by_session[(pname, p)].append((seq, offset, t_done, value))
    for (pname, p), acks in by_session.items():
        acks.sort()
        for (s1, o1, _, v1), (s2, o2, t2, v2) in zip(acks, acks[1:]):
            if o2 <= o1:
                a.add("nonmonotonic-send", t2, f"{v2} at {p}/{o2} after {v1} at {p}/{o1}")

    polled = defaultdict(set)  # consumer -> values
    # (consumer, epoch, partition) -> the last offset polled, or the one before the start
    last = {(c, e, p): max(o, 0) - 1 for c, e, _, offsets, _ in history.resumes for p, o in offsets.items()}
    for consumer, epoch, p, o, v, t in history.polls:
        polled[consumer].add(v)
        held = final.get(p, {}).get(o)
        if v not in where:
            a.add("lost", t, f"{consumer} polled {v} at {p}/{o}, not in the final log")
        elif held != v:
            a.add("inconsistent-offsets", t, f"{consumer} polled {v} at {p}/{o}, final log has {held!r} there")
        key = (consumer, epoch, p)
        prev = last.get(key)
        if prev is not None:
            if o <= prev:
                a.add("nonmonotonic-poll", t, f"{consumer} polled {p}/{o} after {p}/{prev}")
            elif any(x in final.get(p, {}) for x in range(prev + 1, o)):
                a.add("poll-skip", t, f"{consumer} jumped from {p}/{prev} to {p}/{o}")
        last[key] = o

    if consumers_caught_up:
        for consumer in sorted({r[0] for r in history.resumes} | {r[0] for r in history.polls}):
            for pname, _, seq, value, p, t_sent, t_done, offset, _ in sends:
                if value not in polled[consumer] and value in where:
                    a.add("unseen", t_done, f"{value} at {p}/{offset} never polled by {consumer}")

    check_commits(history, a)
    add_events(history, a, crashes, unrecovered)
    indeterminate = {s[3] for s in history.sends if s[7] is None}
    return a, {
        "duplicates-without-idempotence": allowed_dups,
        "duplicates-after-epoch-bump": len(bumped),
        "epoch-bump-examples": bumped[:EXAMPLES],
        "indeterminate": len(indeterminate),
        "indeterminate-found-in-log": len(indeterminate & where.keys()),
    }


def describe_batch(b):
    if not isinstance(b, dict):
        return f"batch unknown ({b})"
    seq_end = b["base_sequence"] + b["last_offset"] - b["base_offset"]
    return (f"batch {b['base_offset']}..{b['last_offset']}: producer id {b['producer_id']}, "
            f"epoch {b['producer_epoch']}, sequence {b['base_sequence']}..{seq_end}")  # fmt: skip


def epoch_bumped(places, copies, acked):
    """The copies of one record (`places`, in offset order, and their batches) are what a
    client's resend under a bumped epoch leaves: one partition, one producer id, epochs
    rising with the offset, and the acknowledgement (if any) at the last copy, the resent
    one (the client never acknowledges the first, which it gave up on). An older epoch
    after a newer one, another partition or producer, or an acknowledged first copy is the
    broker's doing."""
    if len(copies) < 2 or not all(isinstance(b, dict) for b in copies):
        return False
    epochs = [b["producer_epoch"] for b in copies]
    return (
        len({p for p, _ in places}) == 1
        and len({b["producer_id"] for b in copies}) == 1 and copies[0]["producer_id"] >= 0
        and all(a < b for a, b in zip(epochs, epochs[1:]))
        and acked in (None, places[-1])
    )  # fmt: skip


def add_events(history, a, crashes, unrecovered):
    for consumer, t, err in history.resets:
        a.add("offset-reset", t, f"{consumer}: {err}")
    for t, node, status in crashes:
        a.add("crash", t, f"node {node}: {status}")
    for t, what in unrecovered:
        a.add("unrecovered", t, what)


def check_commits(history, a):
    acked = sorted(history.commits, key=lambda c: c[1])
    best = {}  # partition -> highest acknowledged commit so far, and when it was acknowledged
    done_at, running = [], []  # after each acknowledged commit: its time and the maxima so far
    for t_start, t_done, offsets in acked:
        for p, o in offsets.items():
            if p in best and o < best[p][0] and best[p][1] < t_start:
                a.add("committed-regression", t_done, f"commit of {p}@{o} after {p}@{best[p][0]} was acknowledged")
            if p not in best or o > best[p][0]:
                best[p] = (o, t_done)
        done_at.append(t_done)
        running.append({p: b[0] for p, b in best.items()})
    reads = [("stale-offset-read", t0, t1, offsets, "read back") for t0, t1, offsets in history.committed_reads]
    reads += [("committed-regression", t, t, offsets, f"{c} resumed at") for c, _, t, offsets, grouped in history.resumes if grouped]
    for kind, t_start, t_done, offsets, how in reads:
        i = bisect.bisect_left(done_at, t_start)  # commits acknowledged before the read began
        if i == 0:
            continue
        for p, o in offsets.items():
            if o < running[i - 1].get(p, -1):
                shown = "no offset" if o < 0 else f"{p}@{o}"
                a.add(kind, t_done, f"{how} {shown} after a commit of {p}@{running[i - 1][p]} was acknowledged")
