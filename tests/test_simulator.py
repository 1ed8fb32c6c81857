"""The deterministic simulator (scripts/simulate.sh, ferrolog-sim): the README's command as
written passes, and with fix a undone (a restarted leader takes its term back) it finds the
defect, shrinks it, and prints a command that replays the failure. A seed replays to the same
fingerprint in another process. With `--deaf` (a leader that hears nothing while its
followers hear it) the group takes writes again, because the simulated leaders run the
broker's check quorum (ferrolog-raft's `check_quorum`); with that fix undone (`--unfix h`)
the simulator finds defect h. With `--log` (io/'s real log on a simulated disk) the README's
command for it passes, and each of defect g's four fixes undone is found with a command
that replays it. With `--replica --groups` (the broker's group coordinator on the replica)
the README's command passes, and defect f, the load from the log's own start, and a group
deletion or an expiry shown before it was durable, each undone, are found, shrunk and
replayed."""

import re
import shlex
import subprocess

import pytest

from support import REPO_ROOT
from test_readme import readme_block

# What defect a leaves: replicas that differ, or an acknowledged record lost or overwritten.
LOSS = r"replicas differ|acknowledged \S+ at \S+ (lost|overwritten)"


def simulate(args, timeout=900):
    return subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def test_the_readme_command_passes_its_seeds():
    command = readme_block("Simulate it: ferrolog-sim", 0, "sh").strip()
    run = simulate(shlex.split(command))
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    summary = re.search(r"(\d+) seeds from \d+, 0 failed", run.stdout)
    assert summary and int(summary.group(1)) == 1000, run.stdout[-2000:]


def test_undoing_fix_a_is_found_shrunk_and_replayed():
    run = simulate(["scripts/simulate.sh", "--seeds", "20", "--first", "1", "--unfix", "a"])
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(LOSS, run.stdout), run.stdout[-3000:]
    reproduce = re.search(r"reproduce: ferrolog-sim (.*)", run.stdout)
    assert reproduce, run.stdout[-3000:]
    args = shlex.split(reproduce.group(1))
    kept = args[args.index("--keep") + 1].split(",")
    faults = int(re.search(r"FAILED \((\d+) faults\)", run.stdout).group(1))
    assert len(kept) < faults, "shrinking dropped no fault"
    replay = simulate(["scripts/simulate.sh", *args, "--no-shrink"])
    assert replay.returncode == 1, replay.stdout[-3000:]
    assert re.search(LOSS, replay.stdout), replay.stdout[-3000:]


def test_a_seed_replays_exactly_in_another_process():
    runs = [simulate(["scripts/simulate.sh", "--seed", "11", "--seconds", "30"]) for _ in range(2)]
    prints = [re.search(r"seed 11: ok, (\d+) acks, \d+ faults, fingerprint (\w+)", r.stdout) for r in runs]
    assert all(prints), [r.stdout[-2000:] for r in runs]
    assert prints[0].groups() == prints[1].groups()


def test_a_deaf_leader_does_not_leave_the_group_unwritable():
    run = simulate(["scripts/simulate.sh", "--seeds", "2", "--first", "1", "--deaf", "--no-shrink"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_undoing_check_quorum_leaves_a_deaf_leaders_group_unwritable():
    run = simulate(["scripts/simulate.sh", "--seeds", "2", "--first", "1", "--deaf", "--unfix", "h", "--no-shrink"])
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"unwritable: no write acknowledged .* while a node was deaf", run.stdout), run.stdout[-3000:]


def test_the_controller_group_passes_fresh_seeds():
    # The controller's group: its timing, a store that persists the commit point, no purges.
    run = simulate(["scripts/simulate.sh", "--controller", "--seeds", "200", "--no-shrink"])
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert re.search(r"200 seeds from \d+, 0 failed", run.stdout), run.stdout[-2000:]


def test_the_readme_replica_command_passes_its_seeds():
    # The broker's Replica on every node, written by idempotent producers that retry.
    command = readme_block("Simulate it: ferrolog-sim", 1, "sh").strip()
    assert "--replica" in command, command
    run = simulate(shlex.split(command))
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    summary = re.search(r"(\d+) seeds from \d+, 0 failed", run.stdout)
    assert summary and int(summary.group(1)) == 300, run.stdout[-2000:]


# Each fix of the broker's replica undone (`--replica --unfix`), a seed that finds it, and
# what the checker reports.
UNFIXED_REPLICA = {
    # Defect c: a retry confirmed by its original's offsets alone, while another batch
    # landed there (or none did).
    "c": ("93", r"misreported: \S+ acknowledged at offset \d+, applied (at|nowhere)"),
    # Snapshots without the producer state: a replica that restarted or installed one took
    # a retry of a batch purged since as a new batch.
    "producers": ("2", r"record \S+ applied at index \d+ and at \d+"),
    # A leader deposed without knowing it (cut off) refused a producer's next batch as out
    # of sequence, having not seen its successor's batches, instead of showing its lease.
    "lease": ("397", r"refused: \S+ \(sequence \d+\) refused by node \d: .*out of order sequence"),
    # Defect e: a leader cut off from its followers answered a consumer's fetch or
    # ListOffsets without a lease, with a HW below what clients had been shown committed
    # meanwhile.
    "reads": ("10", r"stale read: node \d answered (a fetch with HW|the latest offset) \d+"),
}


def assert_found_shrunk_and_replayed(mode, fix, seed, finding):
    """With `fix` undone, the world `mode` (ferrolog-sim flags) fails `seed` with `finding`,
    prints a shrunk command that replays the failure, and passes the seed with the fix."""
    run = simulate(["scripts/simulate.sh", *mode, "--seed", seed, "--unfix", fix])
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(finding, run.stdout), run.stdout[-3000:]
    reproduce = re.search(r"reproduce: ferrolog-sim (.*)", run.stdout)
    assert reproduce and f"{' '.join(mode)} --unfix {fix}" in reproduce.group(1), run.stdout[-3000:]
    replay = simulate(["scripts/simulate.sh", *shlex.split(reproduce.group(1)), "--no-shrink"])
    assert replay.returncode == 1, replay.stdout[-3000:]
    assert re.search(finding, replay.stdout), replay.stdout[-3000:]
    fixed = simulate(["scripts/simulate.sh", *mode, "--seed", seed])
    assert fixed.returncode == 0, fixed.stdout[-3000:]


@pytest.mark.parametrize("fix", sorted(UNFIXED_REPLICA))
def test_undoing_a_fix_of_the_replica_is_found_shrunk_and_replayed(fix):
    assert_found_shrunk_and_replayed(["--replica"], fix, *UNFIXED_REPLICA[fix])


# Each fix of the Raft store undone, a seed that finds it, and what the checker reports.
UNFIXED_STORE = {
    # A purge point recorded before the batches below it are on disk: a node whose log lost
    # batches below its recorded purge point stops.
    "purge": "13",
    # A truncation of every entry, the first of whose batch holds the log start (moved inside
    # it, as DeleteRecords does), cut below the start: the node's Raft core stops.
    "straddle": "576",
}


@pytest.mark.parametrize("fix", sorted(UNFIXED_STORE))
def test_undoing_a_fix_of_the_raft_store_is_found(fix):
    seed = UNFIXED_STORE[fix]
    run = simulate(["scripts/simulate.sh", "--seed", seed, "--unfix", fix, "--no-shrink"])
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"unrecovered: .* node \d stopped: .*out of range", run.stdout), run.stdout[-3000:]
    fixed = simulate(["scripts/simulate.sh", "--seed", seed])
    assert fixed.returncode == 0, fixed.stdout[-3000:]


def test_the_readme_groups_command_passes_its_seeds():
    # The broker's group coordinator over the replica: offset commits and deletions,
    # OffsetFetch, loads on every change of leader, rewrites of the live state that move the
    # log start.
    command = readme_block("Simulate it: ferrolog-sim", 2, "sh").strip()
    assert "--replica --groups" in command, command
    run = simulate(shlex.split(command))
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    summary = re.search(r"(\d+) seeds from \d+, 0 failed", run.stdout)
    assert summary and int(summary.group(1)) == 300, run.stdout[-2000:]
    counts = re.findall(
        r"(\d+) offset commits, (\d+) offset fetches, (\d+) rewrites, (\d+) offset deletions, (\d+) expiries",
        run.stdout,
    )
    assert len(counts) == 300, run.stdout[-2000:]
    # Offsets expire only when faults keep a committer from committing for 5 s: most runs.
    assert sum(int(c[4]) for c in counts) > 1000, run.stdout[-2000:]
    counts = [c[:4] for c in counts]
    # Every run commits, checks fetches, moves the log start and deletes offsets; none is
    # vacuous.
    assert all(min(int(n) for n in c) > 0 for c in counts), run.stdout[-2000:]


# Each fix of the group coordinator undone (`--replica --groups --unfix`), a seed that finds
# it, and what the checker reports.
UNFIXED_GROUPS = {
    # Defect f: an offset shown by OffsetFetch once its write was appended, before it
    # committed; the write lost in a failover, a later OffsetFetch answered an older state.
    "f": ("1", r"regressed: node \d answered an OffsetFetch of committer \d with -?\d+, after"),
    # A load replayed from the first offset the log held, not the log start reads see: a
    # leader that applied a rewrite's log-start entry before its log moved there failed its
    # load, and its groups stayed unavailable after the faults healed.
    "load-start": ("29", r"unrecovered: no write acknowledged within"),
    # DeleteGroups removed the group as soon as its tombstones were appended: OffsetFetch
    # answered none, the tombstones were lost in a failover, and the next leader answered the
    # offset from before the deletion.
    "group-delete": (
        "28",
        r"regressed: node \d answered an OffsetFetch of committer \d with \d+, after its deletion after \d+ was",
    ),
    # Expired offsets went from memory as soon as their tombstones were appended: the same,
    # for an expiry.
    "expire": (
        "34",
        r"regressed: node \d answered an OffsetFetch of committer \d with \d+, after its deletion after \d+ was",
    ),
}


@pytest.mark.parametrize("fix", sorted(UNFIXED_GROUPS))
def test_undoing_a_fix_of_the_group_coordinator_is_found_shrunk_and_replayed(fix):
    assert_found_shrunk_and_replayed(["--replica", "--groups"], fix, *UNFIXED_GROUPS[fix])


def test_the_readme_log_command_passes_its_seeds():
    command = readme_block("Simulate it: ferrolog-sim", 3, "sh").strip()
    assert "--log" in command, command
    run = simulate(shlex.split(command))
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    summary = re.search(r"(\d+) seeds from \d+, 0 failed", run.stdout)
    assert summary and int(summary.group(1)) == 1000, run.stdout[-2000:]
    checked = [int(n) for n in re.findall(r": ok, (\d+) restarts checked", run.stdout)]
    assert len(checked) == 1000 and min(checked) > 0, run.stdout[-2000:]


# Each fix of defect g undone, the first seeds that find it, and what the checker reports.
# (g-start-past-end is not here either: seed 3689 found it until the log's open read the
# segments' .txnindex files, which moved the simulated disk's schedules; none of seeds
# 1-2,747 and 6,001-8,741 of today's schedule finds it, nor a longer search from seed 1.
# The fix stays; only its pinned seed is gone, to be searched for again.)
# (g-orphan is not here: CI's fresh seeds met it once, as seed 1796441720 at 0c0832b, but
# none of seeds 1-14,000 of today's schedule finds it; io's unit test
# open_deletes_index_files_whose_segment_is_gone covers it.)
UNFIXED_G = {
    "g-truncate": (["--seed", "4"], r"a gap: the batch after offset \d+ starts at \d+"),
    "g-open": (["--seed", "10"], r"batch #\d+ at \d+\.\.\d+ read back, but the log held None there"),
    "g-index": (["--seed", "2"], r"the log does not open: .*closed segment is damaged at byte \d+"),
    "g-finish": (["--seed", "11"], r"the log failed: storage error: creating \S+\.log: file exists"),
    "g-start": (["--seed", "46"], r"the log starts at \d+, below \d+ that advance_start returned"),
    "g-read": (["--seed", "4"], r"a read at \d+ failed: storage error: opening \S+\.log"),
    "g-failed": (["--seed", "2543"], r"a gap: the batch after offset \d+ starts at \d+"),
    "g-cut-read": (["--seed", "1"], r"a read at \d+ failed: invalid batch: batch truncated"),
}


@pytest.mark.parametrize("fix", sorted(UNFIXED_G))
def test_undoing_a_fix_of_defect_g_is_found_and_replayed(fix):
    seeds, finding = UNFIXED_G[fix]
    run = simulate(["scripts/simulate.sh", "--log", *seeds, "--unfix", fix])
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(finding, run.stdout), run.stdout[-3000:]
    reproduce = re.search(r"reproduce: ferrolog-sim (.*)", run.stdout)
    assert reproduce, run.stdout[-3000:]
    replay = simulate(["scripts/simulate.sh", *shlex.split(reproduce.group(1))])
    assert replay.returncode == 1, replay.stdout[-3000:]
    assert re.search(finding, replay.stdout), replay.stdout[-3000:]
    fixed = simulate(["scripts/simulate.sh", "--log", *seeds])
    assert fixed.returncode == 0, fixed.stdout[-3000:]
