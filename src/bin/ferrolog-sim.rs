//! `ferrolog-sim`: runs the deterministic simulator (`ferrolog_raft::sim`, and with
//! `--replica` the broker's partition replica in it, `ferrolog::sim`) over seeds.
//!
//! ```text
//! ferrolog-sim --seeds 100            # seeds first..first+100
//! ferrolog-sim --minutes 30           # as many seeds as fit in 30 minutes
//! ferrolog-sim --seed 42 [--keep 3,7] # replays one run (and its shrunk schedule)
//! ferrolog-sim --replica --seeds 100  # the broker's Replica, with idempotent producers
//! ferrolog-sim --replica --groups --seeds 100  # and its group coordinator, with commits
//! ferrolog-sim --log --seeds 100      # io/'s log on a simulated disk, crashed at random
//! ```
//! A failing seed is shrunk to the fewest faults that still fail and printed with the
//! command that replays it; the exit status is 1 if any seed failed.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use ferrolog::sim::{ReplicaMode, GROUPS_UNFIXES, UNFIXES as REPLICA_UNFIXES};
use ferrolog_raft::sim::log_world::{log_command, run_log, LogOptions, UNFIXES};
use ferrolog_raft::sim::{command, describe, run, shrink, Options};

#[derive(Parser)]
#[command(about = "Deterministic simulation of a ferrolog partition's Raft group")]
struct Args {
    /// Replay this one seed.
    #[arg(long, conflicts_with_all = ["seeds", "minutes"])]
    seed: Option<u64>,
    /// Run this many seeds.
    #[arg(long)]
    seeds: Option<u64>,
    /// Run seeds for this many minutes.
    #[arg(long)]
    minutes: Option<u64>,
    /// The first seed of `--seeds`/`--minutes` (default: from the clock, printed).
    #[arg(long)]
    first: Option<u64>,
    /// Simulated seconds of faults per run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Undo a fix, to see the simulator find its defect: `a` lets a restarted leader take
    /// its term back; `h` leaves out check quorum, so a deaf leader keeps its followers
    /// from electing another (run it with `--deaf`); `purge` lets a purge record its
    /// purge point before the batches below it are on disk; with `--replica`, `c` confirms
    /// a retried batch once the HW passes its original's offsets, whichever batch landed
    /// there; with `--replica`, `producers` takes snapshots without the producer state, so a
    /// replica that restarts or installs one takes a retry of a purged batch as new; with
    /// `--replica`, `lease` lets a leader refuse a batch out of sequence without showing its
    /// lease, as a deposed one that does not know it yet does; with `--replica`, `reads`
    /// lets a leader answer fetches without a read lease (defect e of issue 17); with
    /// `--replica`, `resync` rebuilds a leader's producer state after a refused proposal
    /// while a batch that timed out uncommitted is still in its log; with `--replica`,
    /// `read-start` has reads see the log's own start, so a leader elected before it moved
    /// its log start to a log-start entry's serves deleted records; with `--replica`,
    /// `snapshot-start` takes snapshots without the log start that log-start entries asked
    /// for, so a replica restarted from one before its purge moved its log start forgets
    /// it and serves deleted records once it leads; with `--groups`, `f` shows committed
    /// offsets before their write commits (defect f of issue 17), `load-start` loads
    /// an offsets partition from its log's own start, not the start reads see, and
    /// `group-delete` has DeleteGroups remove a group before its tombstones are durable,
    /// and `expire` expired offsets; `straddle` lets a truncation
    /// of a log whose start lies inside its first entry's batch cut below the start; with
    /// `--log`, `g-open` calls a
    /// recovered tail durable without an fsync, `g-truncate` cuts a segment without
    /// syncing the deletions before it, `g-index` leaves stale index files of a cut
    /// segment to be trusted, `g-finish` lets the retention timer finish rolled segments
    /// while a truncation or restart reshapes them, `g-start` moves the log start without
    /// the segment-file lock, `g-read` trusts a segment file a read opened after the
    /// segment went, `g-failed` lets a failed log move its start, `g-orphan` keeps the
    /// index files of a deleted segment that came back after a power loss, for a segment
    /// later made at that base to trust, `g-cut-read` lets reads planned during a
    /// truncation read past the cut, and `g-start-past-end` clamps a persisted start above
    /// every segment down to their end in memory only. May be given more than once.
    #[arg(long)]
    unfix: Vec<String>,
    /// Run the controller's Raft group (its timing, a store that persists the commit point,
    /// no retention) instead of a partition's.
    #[arg(long, conflicts_with = "log")]
    controller: bool,
    /// Run the broker's partition replica (`Replica`: Kafka offsets, the idempotent
    /// producer state, retries confirmed) on every node, written by idempotent producers
    /// that retry, instead of openraft alone.
    #[arg(long, conflicts_with_all = ["log", "controller"])]
    replica: bool,
    /// With `--replica`: the partition is an offsets partition, written by the broker's
    /// group coordinator (its loads, offset writes and leadership checks) for consumers
    /// that commit their positions, and now and then delete them (DeleteGroups,
    /// OffsetDelete), read back by OffsetFetch, instead of producers'. Not
    /// with `--deaf`: a committer waits for each answer (so a late commit cannot land after
    /// the next one), and one sent to a deaf leader waits for its commit timeout, longer
    /// than the checks for writes during a deaf fault allow.
    #[arg(long, requires = "replica", conflicts_with = "deaf")]
    groups: bool,
    /// With `--seed`: run only these events of its schedule (comma-separated indexes).
    #[arg(long, requires = "seed")]
    keep: Option<String>,
    /// Run a schedule of long deaf-leader faults only, each checked for the other two nodes
    /// taking writes again (defect h of issue 17).
    #[arg(long)]
    deaf: bool,
    /// Run io/'s partition log on a simulated disk instead of a Raft group: killed and
    /// powered off at random while it appends, truncates and moves its start, and read back
    /// after every restart.
    #[arg(long, conflicts_with_all = ["deaf", "keep"])]
    log: bool,
    /// With `--log`: print every disk operation, crash and power loss to stderr.
    #[arg(long, requires = "log")]
    trace: bool,
    /// Report a failure without shrinking it.
    #[arg(long)]
    no_shrink: bool,
}

/// The run under way, for the panic hook: a panic (openraft's assertions, the store's) aborts
/// the process, and the seed must not be lost with it.
static RUNNING: Mutex<String> = Mutex::new(String::new());

fn main() -> ExitCode {
    let args = Args::parse();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        if let Ok(cmd) = RUNNING.try_lock() {
            eprintln!("ferrolog-sim: the run panicked; replay it with: {cmd}");
        }
    }));
    let (mut leader_restore, mut no_check_quorum, mut undo) = (false, false, 0u16);
    let (mut purge_unsynced, mut straddle_truncate) = (false, false);
    let mut replica_unfix = Vec::new();
    for fix in &args.unfix {
        let log_fix = UNFIXES.iter().find(|(name, _)| name == fix).map(|f| f.1);
        match (fix.as_str(), args.log, log_fix) {
            ("a", false, _) => leader_restore = true,
            ("h", false, _) => no_check_quorum = true,
            ("purge", false, _) => purge_unsynced = true,
            ("straddle", false, _) => straddle_truncate = true,
            (fix, false, _)
                if args.replica
                    && REPLICA_UNFIXES.contains(&fix)
                    && (args.groups || !GROUPS_UNFIXES.contains(&fix)) =>
            {
                replica_unfix.push(fix)
            }
            (_, true, Some(flag)) => undo |= flag,
            (other, _, _) => {
                eprintln!(
                    "ferrolog-sim: unknown --unfix {other:?} (known: a, h, purge, straddle; with --replica: c, producers, lease, reads, resync, read-start, snapshot-start, and with --groups f, load-start, group-delete, expire; with --log: g-open, g-truncate, g-index, g-finish, g-start, g-read, g-failed, g-orphan, g-cut-read, g-start-past-end)"
                );
                return ExitCode::from(2);
            }
        }
    }
    if args.log {
        let options = |seed| LogOptions {
            seconds: args.seconds,
            undo,
            trace: args.trace,
            ..LogOptions::new(seed)
        };
        return seeds(&args, |seed| check_log(&options(seed)));
    }
    let keep = match args.keep.as_deref().map(parse_keep) {
        Some(Err(e)) => {
            eprintln!("ferrolog-sim: --keep: {e}");
            return ExitCode::from(2);
        }
        Some(Ok(k)) => Some(k),
        None => None,
    };
    let options = |seed| Options {
        seconds: args.seconds,
        leader_restore,
        no_check_quorum,
        purge_unsynced,
        straddle_truncate,
        controller: args.controller,
        keep: keep.clone(),
        deaf: args.deaf,
        mode: args.replica.then(|| {
            let mode = ReplicaMode::new(&replica_unfix, args.groups).expect("known fixes");
            Rc::new(mode) as _
        }),
        ..Options::new(seed)
    };
    if let Some(seed) = args.seed {
        for line in describe(&options(seed)) {
            println!("{line}");
        }
    }
    seeds(&args, |seed| check(&options(seed), args.no_shrink))
}

/// Runs `one` over the seeds the arguments ask for; the exit status says if any failed.
fn seeds(args: &Args, one: impl Fn(u64) -> bool) -> ExitCode {
    if let Some(seed) = args.seed {
        return if one(seed) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let first = args.first.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let deadline = args
        .minutes
        .map(|m| Instant::now() + Duration::from_secs(m * 60));
    let count = args
        .seeds
        .unwrap_or(if deadline.is_some() { u64::MAX } else { 10 });
    println!("ferrolog-sim: seeds from {first}");
    let (mut ran, mut failed) = (0u64, 0u64);
    for seed in first..first.saturating_add(count) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        ran += 1;
        if !one(seed) {
            failed += 1;
        }
    }
    println!("ferrolog-sim: {ran} seeds from {first}, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn parse_keep(list: &str) -> Result<BTreeSet<usize>, String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().map_err(|e| format!("{s:?}: {e}")))
        .collect()
}

/// Runs one seed of the log on a simulated disk; prints its outcome. True if it passed.
fn check_log(o: &LogOptions) -> bool {
    let started = Instant::now();
    *RUNNING.lock().expect("one thread") = log_command(o);
    match run_log(o) {
        Ok(s) => {
            println!(
                "seed {}: ok, {} restarts checked ({} crashes, {} power losses), {} batches appended, {} truncations, {} start moves, {} restarts at an offset, {} fsyncs failed, {:.1}s",
                o.seed,
                s.checks,
                s.crashes,
                s.power_losses,
                s.appended,
                s.truncations,
                s.start_moves,
                s.restarts,
                s.syncs_failed,
                started.elapsed().as_secs_f64()
            );
            true
        }
        Err(v) => {
            println!("seed {}: FAILED: {v}", o.seed);
            println!("  reproduce: {}", log_command(o));
            false
        }
    }
}

/// Runs one seed; on a failure prints it, shrunk unless told not to. True if it passed.
fn check(o: &Options, no_shrink: bool) -> bool {
    let started = Instant::now();
    *RUNNING.lock().expect("one thread") = command(o);
    let outcome = run(o);
    if outcome.violations.is_empty() {
        println!(
            "seed {}: ok, {} acks, {} faults, fingerprint {:016x}, {:.1}s; failed disks stopped {} Raft cores; {} purges, {} log starts inside a batch, {} snapshots installed, {} batches read, {} DeleteRecords answered, {} offset commits, {} offset fetches, {} rewrites, {} offset deletions, {} expiries",
            o.seed,
            outcome.acked,
            outcome.faults,
            outcome.fingerprint,
            started.elapsed().as_secs_f64(),
            outcome.stopped_by_disk,
            outcome.purges,
            outcome.starts_inside,
            outcome.snapshots_installed,
            outcome.reads,
            outcome.deletes,
            outcome.offset_commits,
            outcome.offset_fetches,
            outcome.rewrites,
            outcome.offset_deletes,
            outcome.offset_expiries
        );
        return true;
    }
    println!("seed {}: FAILED ({} faults)", o.seed, outcome.faults);
    for v in &outcome.violations {
        println!("  {v}");
    }
    let o = if no_shrink { o.clone() } else { shrink(o) };
    let small = run(&o);
    println!("  reproduce: {}", command(&o));
    for line in describe(&o) {
        println!("    {line}");
    }
    for v in &small.violations {
        println!("    {v}");
    }
    false
}
