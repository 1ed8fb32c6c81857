"""ferrolog-check (scripts/ferrolog-check): its checkers find each anomaly in a history made
to hold it, and a short run against a 3-node ferrolog cluster under every fault finds none.

The long runs (an hour and more, ferrolog and Apache Kafka side by side) are not tests: they
are run by hand and their reports quoted, as the benchmark's are.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))

from check import batches, checker, nemesis, txn  # noqa: E402
from check.workload import History  # noqa: E402


def send(h, producer, seq, partition, offset, idempotent=True, t=1.0):
    h.sends.append([producer, idempotent, seq, f"{producer}-{seq}", partition, t, t + 0.01, offset, None])


def clean_history():
    """Two producers on partition 0 and a consumer that read everything once."""
    h, final = History(), {0: {}}
    for seq in range(4):
        send(h, "a.1", seq, 0, 2 * seq)
        send(h, "b.1", seq, 0, 2 * seq + 1, idempotent=False)
        final[0][2 * seq], final[0][2 * seq + 1] = f"a.1-{seq}", f"b.1-{seq}"
    h.resumes += [("assign", 1, 0.5, {0: 0}, False), ("subscribe", 1, 0.5, {0: -1}, True)]
    for o in range(8):
        h.polls.append(("assign", 1, 0, o, final[0][o], 2.0 + o))
        h.polls.append(("subscribe", 1, 0, o, final[0][o], 2.0 + o))
    h.commits += [(3.0, 3.1, {0: 4}), (5.0, 5.1, {0: 8})]
    h.committed_reads += [(4.0, 4.1, {0: 4}), (6.0, 6.1, {0: 8})]
    return h, final


def counts(h, final, **kw):
    anomalies, _ = checker.check(h, final, **kw)
    return {k: v for k, v in anomalies.counts.items() if v}


def test_a_clean_history_has_no_anomalies():
    assert counts(*clean_history()) == {}


def test_an_acknowledged_record_missing_from_the_log_is_lost():
    h, final = clean_history()
    del final[0][6]  # a.1-3, acknowledged at 0/6
    assert counts(h, final) == {"lost": 3}  # acknowledged, and polled by both consumers before it went


def test_a_record_at_another_offset_than_acknowledged_is_inconsistent():
    h, final = clean_history()
    final[0][2], final[0][4] = final[0][4], final[0][2]
    assert counts(h, final)["inconsistent-offsets"] == 6  # two sends, two polls by each consumer


def test_an_idempotent_duplicate_is_an_anomaly_and_others_are_counted_apart():
    h, final = clean_history()
    final[0][8] = "a.1-0"
    final[0][9] = "b.1-0"
    anomalies, notes = checker.check(h, final)
    assert anomalies.counts["duplicated"] == 1
    assert notes["duplicates-without-idempotence"] == 1


def header(pid, epoch, seq, offset):
    return {"base_offset": offset, "last_offset": offset, "producer_id": pid, "producer_epoch": epoch, "base_sequence": seq}


def test_a_duplicate_names_its_batches_and_one_resent_under_a_new_epoch_is_no_anomaly():
    """The same producer id and epoch twice: the broker took a retry anew (an anomaly). The
    same id under a bumped epoch: the client sent it again as new (counted apart)."""
    h, final = clean_history()
    final[0][8] = "a.1-0"
    same = {(0, 0): header(7, 0, 0, 0), (0, 8): header(7, 0, 0, 8)}
    anomalies, notes = checker.check(h, final, batch_of=lambda p, o: same[(p, o)])
    (example,) = anomalies.examples["duplicated"]
    assert example["what"] == ("a.1-0 at [(0, 0), (0, 8)]; at 0/0, batch 0..0: producer id 7, epoch 0, sequence 0..0; "
                               "at 0/8, batch 8..8: producer id 7, epoch 0, sequence 0..0")  # fmt: skip
    assert notes["duplicates-after-epoch-bump"] == 0
    bumped = {(0, 0): header(7, 0, 0, 0), (0, 8): header(7, 1, 0, 8)}
    h.sends[0][7] = 8  # acknowledged at the resent copy
    anomalies, notes = checker.check(h, final, batch_of=lambda p, o: bumped[(p, o)])
    assert anomalies.counts["duplicated"] == 0 and notes["duplicates-after-epoch-bump"] == 1
    assert "epoch 1" in notes["epoch-bump-examples"][0]
    # Not known, another producer id, or an older epoch after a newer one: an anomaly.
    for second in ("connection refused", header(8, 1, 0, 8)):
        anomalies, _ = checker.check(h, final, batch_of=lambda p, o: bumped[(p, o)] if o == 0 else second)
        assert anomalies.counts["duplicated"] == 1
    backwards = {(0, 0): header(7, 1, 0, 0), (0, 8): header(7, 0, 0, 8)}
    anomalies, _ = checker.check(h, final, batch_of=lambda p, o: backwards[(p, o)])
    assert anomalies.counts["duplicated"] == 1
    # The first copy acknowledged (a.1-0 at 0/0 in the history): the client gave up on
    # nothing, so a second copy is the broker's doing.
    assert checker.epoch_bumped([(0, 0), (0, 8)], [bumped[(0, 0)], bumped[(0, 8)]], (0, 0)) is False
    assert checker.epoch_bumped([(0, 0), (0, 8)], [bumped[(0, 0)], bumped[(0, 8)]], (0, 8)) is True
    assert checker.epoch_bumped([(0, 0), (1, 8)], [bumped[(0, 0)], bumped[(0, 8)]], None) is False


def test_batch_headers_read_from_a_broker_show_producer_id_epoch_and_sequence(broker):
    """What the report says of a duplicate comes from a bare Fetch: an idempotent
    producer's batches carry its id, epoch 0 and consecutive sequences; a plain one's none."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    idempotent = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for value in (b"a", b"b", b"c"):
        idempotent.produce("headers", value=value, partition=0)
        assert idempotent.flush(30) == 0  # one batch each
    idempotent.produce("headers", value=b"d", partition=0)
    idempotent.produce("headers", value=b"e", partition=0)
    assert idempotent.flush(30) == 0  # one batch of two, most likely
    plain = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    plain.produce("headers", value=b"f", partition=0)
    assert plain.flush(30) == 0
    host, port = broker.bootstrap.rsplit(":", 1)
    found = [batches.batch_at(host, int(port), "headers", 0, o) for o in range(6)]
    pid = found[0]["producer_id"]
    assert pid >= 0
    for o, h in enumerate(found[:5]):
        assert h["producer_id"] == pid and h["producer_epoch"] == 0
        assert h["base_offset"] <= o <= h["last_offset"]
        assert h["base_sequence"] == h["base_offset"]  # sequences count from 0 with offsets
    assert found[5]["producer_id"] == -1 and found[5]["base_offset"] == 5
    assert batches.batch_at(host, int(port), "headers", 0, 6) is None  # the end of the log
    batch_of = batches.reader(AdminClient({"bootstrap.servers": broker.bootstrap}), "headers")
    assert batch_of(0, 1) == found[1]
    assert batch_of(0, 6) == "not found"


def test_unpolled_records_are_unseen_only_when_the_consumers_caught_up():
    h, final = clean_history()
    h.polls = [p for p in h.polls if p[3] != 5 or p[0] == "assign"]  # one consumer skipped it
    assert counts(h, final) == {"unseen": 1, "poll-skip": 1}
    assert counts(h, final, consumers_caught_up=False) == {"poll-skip": 1}


def test_a_consumer_resuming_past_records_skips_them():
    h, final = clean_history()
    h.polls = [p for p in h.polls if p[0] != "subscribe" or p[3] >= 2]  # started at 2, nothing committed
    assert counts(h, final, consumers_caught_up=False) == {"poll-skip": 1}


def test_an_idempotent_producer_whose_batches_land_out_of_order():
    h, final = clean_history()
    h.sends[0][7], h.sends[2][7] = 2, 0  # a.1-0 acknowledged after a.1-1
    final[0][0], final[0][2] = "a.1-1", "a.1-0"
    h.polls = []
    assert counts(h, final, consumers_caught_up=False) == {"nonmonotonic-send": 1}


def test_a_consumer_going_back_within_one_assignment():
    h, final = clean_history()
    h.polls.append(("assign", 1, 0, 3, final[0][3], 20.0))
    h.resumes.append(("subscribe", 2, 20.5, {0: 8}, True))
    h.polls.append(("subscribe", 2, 0, 7, final[0][7], 21.0))  # below where it resumed
    assert counts(h, final) == {"nonmonotonic-poll": 2}


def test_committed_offsets_that_go_back():
    h, final = clean_history()
    h.commits.append((7.0, 7.1, {0: 6}))  # after 8 was acknowledged
    h.resumes.append(("subscribe", 2, 8.0, {0: 5}, True))  # resumed below it
    h.resumes.append(("subscribe", 3, 9.0, {0: -1}, True))  # or with nothing committed
    h.resumes.append(("assign", 2, 9.0, {0: 0}, False))  # not the group's: not compared
    assert counts(h, final, consumers_caught_up=False) == {"committed-regression": 3}


def test_a_stale_committed_offset_read_back():
    h, final = clean_history()
    h.committed_reads += [(8.0, 8.1, {0: 5}), (9.0, 9.1, {0: -1})]
    assert counts(h, final) == {"stale-offset-read": 2}


def test_an_acknowledgement_without_an_offset_is_checked_for_loss_only():
    h, final = clean_history()
    send(h, "a.1", 4, 0, -1001)
    assert counts(h, final) == {"lost": 1}
    final[0][8] = "a.1-4"
    assert counts(h, final, consumers_caught_up=False) == {}


def test_offset_resets_and_an_unrecovered_cluster():
    h, final = clean_history()
    h.resets.append(("assign", 3.0, "Broker: Offset out of range"))
    assert counts(h, final, unrecovered=[(4.0, "no leader for 60 s")]) == {"offset-reset": 1, "unrecovered": 1}
    assert counts(h, None, unrecovered=[(4.0, "no leader for 60 s")]) == {"offset-reset": 1, "unrecovered": 1}


def test_a_broker_that_exits_by_itself_is_a_crash():
    h, final = clean_history()
    assert counts(h, final, crashes=[(3.0, 2, 134)]) == {"crash": 1}


def txn_history():
    """Three transactions of one producer over two partitions, committed, aborted and
    unknown (the last not written), a read_committed consumer that read the committed one,
    and the final read_committed log."""
    h = History()
    for n, outcome in ((1, "committed"), (2, "aborted"), (3, "unknown")):
        records = [(f"t0.1-t{n}-{i}", i % 2) for i in range(3)]
        h.txns.append({"id": f"t0.1-t{n}", "records": records, "commit": n != 2, "outcome": outcome, "t0": n, "t1": n + 0.5})
    final = {0: {0: "t0.1-t1-0", 1: "t0.1-t1-2"}, 1: {0: "t0.1-t1-1"}}
    h.txn_polls += [(0, 0, "t0.1-t1-0", 2.0), (1, 0, "t0.1-t1-1", 2.0), (0, 1, "t0.1-t1-2", 2.1)]
    return h, final


def txn_counts(h, final, stuck=None):
    a = checker.Anomalies()
    txn.check(h, final, stuck or {}, a)
    return {k: v for k, v in a.counts.items() if v}


def test_a_clean_transactional_history_has_no_anomalies():
    assert txn_counts(*txn_history()) == {}


def test_a_committed_transaction_missing_a_record_is_lost_and_partial():
    h, final = txn_history()
    del final[1][0]
    h.txn_polls.pop(1)
    assert txn_counts(h, final) == {"txn-lost-commit": 1, "txn-partial": 1}


def test_records_of_an_aborted_transaction_read_committed():
    h, final = txn_history()
    final[1][5] = "t0.1-t2-1"
    h.txn_polls.append((0, 7, "t0.1-t2-0", 3.0))
    # In the final log (and partial there), and polled.
    assert txn_counts(h, final) == {"txn-aborted-read": 2, "txn-partial": 1}


def test_a_polled_record_not_in_the_final_log_is_a_dirty_read():
    h, final = txn_history()
    h.txn_polls.append((1, 9, "t0.1-t3-1", 4.0))
    assert txn_counts(h, final) == {"txn-dirty-read": 1}


def test_transactional_duplicates_disorder_and_a_stuck_partition():
    h, final = txn_history()
    final[0] = {0: "t0.1-t1-2", 1: "t0.1-t1-0", 2: "t0.1-t1-2"}
    assert txn_counts(h, final, stuck={1: "last stable offset 3, high watermark 9"}) == {
        "txn-duplicated": 1, "txn-order": 1, "txn-stuck": 1}  # fmt: skip


def test_help_lists_the_options():
    run = subprocess.run(["scripts/ferrolog-check", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for option in ("--seconds", "--minutes", "--faults", "--seed", "--target", "--out"):
        assert option in run.stdout


def test_a_short_run_under_every_fault_finds_no_anomaly():
    """The README's command, as written, from the repository root: 3 minutes of the queue workload
    on 3 ferrolog nodes (in network namespaces, each on a file system of its own) under one round
    of every fault: kill, kill of a leader restarted at once, pause, restart, full, one-way and
    bridge partitions, a leader move, a failed disk and a full one."""
    # On a timeout, SIGTERM: the harness tears its cluster down and still writes its report.
    proc = subprocess.Popen(["scripts/ferrolog-check", "--seconds", "180", "--seed", "7"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=300)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    found = re.search(r"report in (\S+)", run.stdout)
    if run.returncode == 2 or not found:
        pytest.fail(f"the run failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    out = Path(found.group(1))
    report = json.loads((out / "report.json").read_text())
    assert {f["kind"] for f in report["faults"]} == set(nemesis.KINDS), report["faults"]
    assert report["acked"] > 1000 and report["commits"] > 10, report
    assert report["consumers_caught_up"], "unseen records were not checked"
    assert report["anomalies"]["total"] == 0, (out / "report.md").read_text()
    assert run.returncode == 0
