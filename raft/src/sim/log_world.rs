//! io/'s real `Log` on a simulated disk ([`super::fs`]), killed and powered off at random
//! moments while a workload uses it as the Raft store does: appends, waits for durability,
//! truncates its tail, moves its start, while a timer asks for the retention point (which
//! finishes rolled segments beside all of that). Each life ends in a process crash (the page cache
//! survives) or a power loss (only what was synced survives, torn at sector granularity),
//! and some fsyncs fail. After every restart the checker reads the whole log back from disk:
//! - it opens (no damage reported, no overlapping segments);
//! - offsets run on from the log start without a gap, and each batch read is one the
//!   workload appended at that offset, so nothing truncated or deleted comes back;
//! - every batch acknowledged durable (`wait_durable` answered, or a log that called it
//!   durable at open) is still there, unless a truncation began to drop it since;
//! - the log start is never below one that `advance_start` returned;
//! - the log never fails but on a failed fsync.
//!
//! Beside the workload, a purger moves the start up to the commit point (as the replica
//! does off the Raft task, for retention and DeleteRecords) and readers read at random
//! offsets: each batch a read returns must be one appended at that offset and not truncated
//! away before the read began.
//!
//! `LogOptions::undo` undoes defect g's fixes ([`ferrolog_io::log::unfix`]), to show the
//! checker finds what they fix.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use ferrolog_io::batch::{self, make_batch};
use ferrolog_io::log::unfix;
use ferrolog_io::{Log, LogConfig};
use openraft::async_runtime::Instant as _;
use openraft::AsyncRuntime;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::fs::SimFs;
use super::runtime::{random_u64, spawn_here, spawn_on, Sim, SimInstant, SimRuntime};

#[derive(Clone, Debug)]
pub struct LogOptions {
    pub seed: u64,
    /// Simulated seconds of lives and crashes.
    pub seconds: u64,
    /// Defect g fixes to undo: a set of [`unfix`] flags.
    pub undo: u16,
    /// Out of 1000 fsyncs, how many fail.
    pub sync_failures_per_mille: u64,
    /// Print every disk operation, crash and power loss to stderr.
    pub trace: bool,
}

impl LogOptions {
    pub fn new(seed: u64) -> LogOptions {
        LogOptions {
            seed,
            seconds: 60,
            undo: 0,
            sync_failures_per_mille: 5,
            trace: false,
        }
    }
}

/// What a passing run did.
#[derive(Debug, Default, Clone)]
pub struct LogStats {
    pub crashes: u64,
    pub power_losses: u64,
    pub checks: u64,
    pub appended: u64,
    pub acked_max: i64,
    pub truncations: u64,
    pub start_moves: u64,
    /// `restart_at` calls that returned.
    pub restarts: u64,
    pub syncs_failed: u64,
}

/// What the workload knows of the log.
#[derive(Default)]
struct Model {
    /// Batches appended and not truncated away, as (base, next, id), in offset order.
    batches: Vec<(i64, i64, i64)>,
    /// Every offset below this was acknowledged durable and no truncation has begun below it.
    acked: i64,
    /// Bumped when a truncation begins: a waiter answered before it no longer counts.
    generation: u64,
    /// The highest log start `advance_start` returned.
    start_floor: i64,
    /// A batch boundary no truncation goes below and no purge goes above, as Raft's commit
    /// index bounds them.
    committed: i64,
    /// Where each batch was appended, by id.
    appended: HashMap<i64, (i64, i64)>,
    /// For each batch truncated or restarted away, the removal count when it went.
    removed: HashMap<i64, u64>,
    /// Truncations and restarts that have returned (and lives that lost batches).
    removals: u64,
    next_id: i64,
    violation: Option<String>,
    stats: LogStats,
}

impl Model {
    fn violate(&mut self, what: String) {
        self.violation.get_or_insert(what);
    }

    /// Batches that are gone from the log from now on.
    fn remove(&mut self, gone: impl Iterator<Item = i64>) {
        self.removals += 1;
        let now = self.removals;
        for id in gone {
            self.removed.entry(id).or_insert(now);
        }
    }
}

type Shared = Rc<RefCell<Model>>;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 6000,
        index_interval_bytes: 700,
        preallocate_bytes: 4096,
        cache_bytes_max: 3000,
        ..LogConfig::default()
    }
}

fn now_ms() -> i64 {
    SimInstant::now().since_start().as_millis() as i64
}

/// Runs one seed. `Err` holds the first violation, with what led to it.
pub fn run_log(options: &LogOptions) -> Result<LogStats, String> {
    unfix::set(options.undo);
    let result = run_inner(options);
    unfix::set(0);
    result
}

fn run_inner(options: &LogOptions) -> Result<LogStats, String> {
    let sim = Sim::new(options.seed);
    let mut rng = SmallRng::seed_from_u64(options.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let fs = SimFs::new();
    fs.fail_syncs(options.sync_failures_per_mille);
    fs.trace(options.trace);
    let model: Shared = Rc::default();
    let dir = PathBuf::from("/sim/topic-0");
    let end = SimInstant::default() + Duration::from_secs(options.seconds);
    while sim.now() < end {
        spawn_on(1, life(fs.clone(), dir.clone(), model.clone(), true));
        let up = Duration::from_millis(rng.random_range(5..1500));
        sim.run_until(sim.now() + up);
        sim.crash(1);
        let power = rng.random_bool(0.5);
        if options.trace {
            eprintln!(
                "[{:?}] {}",
                sim.now().since_start(),
                if power { "power loss" } else { "process crash" }
            );
        }
        let mut m = model.borrow_mut();
        if power {
            fs.power_loss(&mut rng);
            m.stats.power_losses += 1;
        } else {
            m.stats.crashes += 1;
        }
        if let Some(v) = &m.violation {
            return Err(format!("{v} (at {:?})", sim.now().since_start()));
        }
    }
    // A last life that only checks, with no fsync failing.
    fs.fail_syncs(0);
    let checks = model.borrow().stats.checks;
    spawn_on(1, life(fs.clone(), dir, model.clone(), false));
    sim.run_until(sim.now() + Duration::from_secs(60));
    let mut m = model.borrow_mut();
    if let Some(v) = &m.violation {
        return Err(v.clone());
    }
    if m.stats.checks == checks {
        return Err("the last restart did not finish its check within 60 s".into());
    }
    m.stats.syncs_failed = fs.syncs_failed();
    Ok(m.stats.clone())
}

/// One life of the process: open, check, then (with `work`) use the log until it crashes.
async fn life(fs: SimFs, dir: PathBuf, model: Shared, work: bool) {
    let log = match Log::open_on(fs, &dir, config(), now_ms()).await {
        Ok(log) => log,
        Err(e) => {
            // A failed fsync during open is weather, not damage: the next life opens again.
            if !e.to_string().contains("simulated EIO") {
                model
                    .borrow_mut()
                    .violate(format!("the log does not open: {e}"));
            }
            return;
        }
    };
    if !check(&log, &model).await {
        return;
    }
    // The Raft store trusts what an open log holds: it is durable from now on.
    {
        let mut m = model.borrow_mut();
        m.acked = m.acked.max(log.durable_offset());
    }
    if work {
        // Now and then the process idles before it writes, so a power loss may strike before
        // anything syncs what the open found.
        if random_u64().is_multiple_of(4) {
            SimRuntime::sleep(Duration::from_millis(random_u64() % 2000)).await;
        }
        // The broker's shard timer asks for the retention point while Raft appends and
        // truncates: it finishes rolled segments concurrently with everything else.
        let (l, m) = (log.clone(), model.clone());
        spawn_here(async move { retention(&l, &m).await });
        let (l, m) = (log.clone(), model.clone());
        spawn_here(async move { purger(&l, &m).await });
        for whole_batches in [false, true] {
            let (l, m) = (log.clone(), model.clone());
            spawn_here(async move { reader(&l, &m, whole_batches).await });
        }
        workload(&log, &model).await;
    }
}

/// Asks for the retention point now and then, as the shard timer does.
async fn retention(log: &Rc<Log<SimFs>>, model: &Shared) {
    loop {
        SimRuntime::sleep(Duration::from_millis(random_u64() % 200)).await;
        let bytes = match random_u64() % 3 {
            0 => 3000,
            _ => -1,
        };
        if let Err(e) = log.retention_point(now_ms(), -1, bytes).await {
            failed_by_itself(&e.to_string(), model);
        }
    }
}

/// Moves the start up to the commit point now and then, off the workload's task, as the
/// replica applies retention and DeleteRecords beside Raft's appends and truncations.
async fn purger(log: &Rc<Log<SimFs>>, model: &Shared) {
    loop {
        SimRuntime::sleep(Duration::from_millis(random_u64() % 300)).await;
        let to = {
            let m = model.borrow();
            let boundaries: Vec<i64> = m
                .batches
                .iter()
                .map(|b| b.0)
                .filter(|&b| b <= m.committed && b > log.start_offset())
                .collect();
            match boundaries.len() {
                0 => continue,
                n => boundaries[(random_u64() as usize) % n],
            }
        };
        match log.advance_start(to).await {
            Ok(start) => {
                let mut m = model.borrow_mut();
                m.start_floor = m.start_floor.max(start);
                m.stats.start_moves += 1;
            }
            Err(e) => failed_by_itself(&e.to_string(), model),
        }
    }
}

/// Reads at random offsets and checks each batch read against what the workload did. A
/// Fetch reader (`whole_batches` false) reads below the commit point, as Fetch reads below
/// the high watermark, which truncations never go below; a Raft reader reads whole batches
/// up to the durable end, as the store reads entries to send to followers, beside
/// truncations of that very tail.
async fn reader(log: &Rc<Log<SimFs>>, model: &Shared, whole_batches: bool) {
    loop {
        SimRuntime::sleep(Duration::from_micros(random_u64() % 20_000)).await;
        let (start, end) = if whole_batches {
            (log.whole_batches_start(), log.durable_offset())
        } else {
            (log.start_offset(), model.borrow().committed)
        };
        if end <= start {
            continue;
        }
        let offset = start + (random_u64() % (end - start) as u64) as i64;
        let began = model.borrow().removals;
        let read = if whole_batches {
            log.read_whole_batches(offset, 4096).await
        } else {
            log.read(offset, 4096, end, true).await
        };
        let bytes = match read {
            Ok(b) => b,
            Err(e) => {
                let out_of_range = matches!(e, ferrolog_io::LogError::OffsetOutOfRange { .. });
                if !out_of_range && !e.to_string().contains("simulated EIO") {
                    model
                        .borrow_mut()
                        .violate(format!("a read at {offset} failed: {e}"));
                }
                continue;
            }
        };
        let mut rest = &bytes[..];
        let mut m = model.borrow_mut();
        while !rest.is_empty() {
            let h = match batch::verify(rest) {
                Ok(h) => h,
                Err(e) => {
                    m.violate(format!("a read at {offset} returned a bad batch: {e}"));
                    break;
                }
            };
            let id = h.max_timestamp;
            let at = (h.base_offset, h.next_offset());
            let appended = m.appended.get(&id).copied();
            if appended != Some(at) {
                m.violate(format!(
                    "a read at {offset} returned batch #{id} at {at:?}, appended at {appended:?}"
                ));
            } else if m.removed.get(&id).is_some_and(|&gone| gone <= began) {
                m.violate(format!(
                    "a read at {offset} returned batch #{id} at {at:?}, removed before the \
                     read began"
                ));
            }
            rest = &rest[h.total_bytes()..];
        }
    }
}

/// A log may fail only on a failed fsync; any other failure is a defect.
fn failed_by_itself(error: &str, model: &Shared) {
    if !error.contains("simulated EIO") {
        model
            .borrow_mut()
            .violate(format!("the log failed: {error}"));
    }
}

/// Reads the log back and compares it with the model; true if it holds (the model then
/// becomes what survived).
async fn check(log: &Rc<Log<SimFs>>, model: &Shared) -> bool {
    let start = log.start_offset();
    let end = log.end_offset();
    let mut got = Vec::new();
    let mut offset = start;
    let mut fail = None;
    while offset < end && fail.is_none() {
        let bytes = match log.read(offset, 64 << 10, i64::MAX, true).await {
            Ok(b) => b,
            Err(e) => {
                fail = Some(format!("reading at {offset}: {e}"));
                break;
            }
        };
        if bytes.is_empty() {
            fail = Some(format!("nothing read at {offset}, below the log end {end}"));
            break;
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let h = match batch::verify(rest) {
                Ok(h) => h,
                Err(e) => {
                    fail = Some(format!("a bad batch read at {offset}: {e}"));
                    break;
                }
            };
            if h.base_offset != offset {
                fail = Some(format!(
                    "a gap: the batch after offset {offset} starts at {}",
                    h.base_offset
                ));
                break;
            }
            got.push((h.base_offset, h.next_offset(), h.max_timestamp));
            offset = h.next_offset();
            rest = &rest[h.total_bytes()..];
        }
    }
    let mut m = model.borrow_mut();
    if fail.is_none() && start < m.start_floor {
        fail = Some(format!(
            "the log starts at {start}, below {} that advance_start returned",
            m.start_floor
        ));
    }
    if fail.is_none() {
        fail = got.iter().find_map(|&(base, next, id)| {
            let known = m
                .batches
                .binary_search_by_key(&base, |b| b.0)
                .ok()
                .map(|i| m.batches[i]);
            (known != Some((base, next, id))).then(|| {
                format!("batch #{id} at {base}..{next} read back, but the log held {known:?} there")
            })
        });
    }
    if fail.is_none() && end < m.acked {
        fail = Some(format!(
            "acknowledged offsets {end}..{} are gone (log {start}..{end})",
            m.acked
        ));
    }
    if let Some(f) = fail {
        m.violate(f);
        return false;
    }
    // Batches wholly below the start were purged, not lost: their bytes may still be in the
    // first segment, and a whole-batches read may still return them.
    let kept: Vec<i64> = got.iter().map(|b| b.2).collect();
    let lost: Vec<i64> = m
        .batches
        .iter()
        .filter(|b| b.1 > start)
        .map(|b| b.2)
        .filter(|id| !kept.contains(id))
        .collect();
    m.remove(lost.into_iter());
    m.batches = got;
    m.acked = m.acked.min(end);
    // What survived a restart is what Raft may treat as committed no further than it was.
    m.committed = m.committed.min(m.acked).max(start);
    m.stats.checks += 1;
    true
}

/// Appends, waits, truncates and moves the start at random until the log fails or the
/// process is killed.
async fn workload(log: &Rc<Log<SimFs>>, model: &Shared) {
    loop {
        if let Some(e) = log.failure() {
            failed_by_itself(&e.to_string(), model);
            // A failed log takes nothing more; the next crash restarts it.
            SimRuntime::sleep(Duration::from_secs(10)).await;
            continue;
        }
        match random_u64() % 100 {
            0..60 => append(log, model),
            60..68 => {
                let end = log.end_offset();
                if log.wait_durable(end).await.is_ok() {
                    let mut m = model.borrow_mut();
                    m.acked = m.acked.max(end);
                }
            }
            68..74 => truncate(log, model).await,
            74..77 => advance_start(log, model).await,
            77 => restart_at(log, model).await,
            78..82 => commit(log, model),
            _ => SimRuntime::sleep(Duration::from_micros(random_u64() % 5000)).await,
        }
    }
}

fn append(log: &Rc<Log<SimFs>>, model: &Shared) {
    let (id, gen) = {
        let mut m = model.borrow_mut();
        m.next_id += 1;
        (m.next_id, m.generation)
    };
    let count = (random_u64() % 4 + 1) as i32;
    let value = (random_u64() % 900) as usize;
    let bytes = BytesMut::from(&make_batch(0, count, id, value)[..]);
    let Ok(info) = log.append(bytes, 1, now_ms()) else {
        return;
    };
    let next = info.last_offset + 1;
    {
        let mut m = model.borrow_mut();
        m.batches.push((info.base_offset, next, id));
        m.appended.insert(id, (info.base_offset, next));
        m.stats.appended += 1;
    }
    if random_u64().is_multiple_of(2) {
        let (log, model) = (log.clone(), model.clone());
        spawn_here(async move {
            if log.wait_durable(next).await.is_ok() {
                let mut m = model.borrow_mut();
                if m.generation == gen {
                    m.acked = m.acked.max(next);
                    m.stats.acked_max = m.stats.acked_max.max(next);
                }
            }
        });
    }
}

/// Truncates to one of the last batches, as a follower drops entries that conflict.
async fn truncate(log: &Rc<Log<SimFs>>, model: &Shared) {
    let offset = {
        let mut m = model.borrow_mut();
        let start = log.start_offset();
        let candidates: Vec<i64> = m
            .batches
            .iter()
            .rev()
            .take(12)
            .map(|b| b.0)
            .filter(|&b| b >= start && b >= m.committed)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let offset = candidates[(random_u64() as usize) % candidates.len()];
        m.generation += 1;
        m.acked = m.acked.min(offset);
        offset
    };
    if log.truncate(offset, now_ms()).await.is_ok() {
        let mut m = model.borrow_mut();
        let gone: Vec<i64> = m
            .batches
            .iter()
            .filter(|b| b.0 >= offset)
            .map(|b| b.2)
            .collect();
        m.remove(gone.into_iter());
        m.batches.retain(|b| b.0 < offset);
        m.stats.truncations += 1;
    }
}

/// Moves the log start to a durable batch boundary, as a snapshot's purge or DeleteRecords.
async fn advance_start(log: &Rc<Log<SimFs>>, model: &Shared) {
    let to = {
        let m = model.borrow();
        let durable = log.durable_offset();
        let boundaries: Vec<i64> = m
            .batches
            .iter()
            .map(|b| b.0)
            .filter(|&b| b <= durable)
            .collect();
        // Keep most of the log: the start moves a little at a time.
        match boundaries.len() {
            0..4 => return,
            n => boundaries[(random_u64() as usize) % (n / 4)],
        }
    };
    if let Ok(start) = log.advance_start(to).await {
        let mut m = model.borrow_mut();
        m.start_floor = m.start_floor.max(start);
        m.stats.start_moves += 1;
    }
}

/// Moves the commit point to a durable batch boundary, as Raft commits entries.
fn commit(log: &Rc<Log<SimFs>>, model: &Shared) {
    let mut m = model.borrow_mut();
    let durable = log.durable_offset().min(m.acked);
    let boundaries: Vec<i64> = m
        .batches
        .iter()
        .map(|b| b.0)
        .filter(|&b| b > m.committed && b <= durable)
        .collect();
    if let Some(&to) = boundaries.get((random_u64() as usize) % boundaries.len().max(1)) {
        m.committed = to;
    }
}

/// Empties the log and starts it again, past its end or within it, as a follower that takes
/// a leader's snapshot does. Nothing durable is promised while it runs: a crash part-way may
/// leave a prefix of the old log's segments (even one ending below its start), or an empty
/// log at the old start.
async fn restart_at(log: &Rc<Log<SimFs>>, model: &Shared) {
    let end = log.end_offset();
    let offset = if random_u64().is_multiple_of(2) {
        end + (random_u64() % 50) as i64
    } else {
        // A snapshot a follower installs is never behind its commit point.
        let from = log.start_offset().max(model.borrow().committed);
        from + (random_u64() % (end - from + 1) as u64) as i64
    };
    {
        let mut m = model.borrow_mut();
        m.generation += 1;
        let floor = log.whole_batches_start();
        m.acked = m.acked.min(floor);
        m.start_floor = m.start_floor.min(floor);
        m.committed = m.committed.min(floor);
    }
    if log.restart_at(offset, now_ms()).await.is_ok() {
        let mut m = model.borrow_mut();
        let gone: Vec<i64> = m.batches.iter().map(|b| b.2).collect();
        m.remove(gone.into_iter());
        m.batches.clear();
        m.committed = offset;
        m.start_floor = m.start_floor.max(offset);
        m.acked = offset;
        m.stats.restarts += 1;
    }
}

/// The log's fixes (defect g and its kin) that `--unfix` undoes, by the name it takes.
pub const UNFIXES: [(&str, u16); 10] = [
    ("g-open", unfix::OPEN_SYNC),
    ("g-truncate", unfix::TRUNCATE_DIR_SYNC),
    ("g-index", unfix::STALE_INDEXES),
    ("g-finish", unfix::FINISH_LOCK),
    ("g-start", unfix::START_LOCK),
    ("g-read", unfix::RESHAPED_READ),
    ("g-failed", unfix::FAILED_START),
    ("g-orphan", unfix::ORPHAN_INDEXES),
    ("g-cut-read", unfix::CUT_READ),
    ("g-start-past-end", unfix::START_PAST_END),
];

/// The command that replays a run.
pub fn log_command(o: &LogOptions) -> String {
    let mut cmd = format!(
        "ferrolog-sim --log --seed {} --seconds {}",
        o.seed, o.seconds
    );
    for (name, flag) in UNFIXES {
        if o.undo & flag != 0 {
            cmd.push_str(" --unfix ");
            cmd.push_str(name);
        }
    }
    cmd
}
