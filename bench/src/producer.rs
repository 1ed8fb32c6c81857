//! Open-loop producers.
//!
//! Each producer owns one connection to a partition leader and a share of that leader's
//! partitions (`--producers` connections per leader, so a cluster gets one set per node
//! that leads something). Record `k`
//! of a producer is *intended* to be sent at `start + k / rate`, whatever the broker is
//! doing; its latency is measured from that intended time to the acknowledgement, so a
//! stalled broker is charged for every record that waited behind the stall
//! (coordinated omission corrected, like OpenMessaging Benchmark's publish delay).
//! With rate 0 the producer is closed-loop: a record is created as soon as the buffer
//! has room, and latency counts from its creation (as Kafka's ProducerPerformance does).
//!
//! Batching follows Kafka's producer: records go into one open batch per partition;
//! a batch is closed when the next record would make it exceed `batch_bytes` or when it
//! has been open for `linger`; the sticky partitioner then moves on to the next
//! partition (keyed records go where murmur2 of their key puts them, as in the Java
//! client). A sender drains closed batches (at most one per partition, like Kafka's
//! `RecordAccumulator.drain`) into Produce requests of at most `request_bytes_max`, with
//! at most `max_in_flight` unanswered requests on the connection. `buffer_bytes` bounds
//! the records waiting in the producer (Kafka's `buffer.memory`): when full, generation
//! waits, and the records it would have made keep their intended times.
//!
//! One thread writes requests, another reads responses in order and records latencies.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use crate::batch::{BatchBuilder, PAYLOAD_HEADER_BYTES};
use crate::stats::{self, LatencySummary, Timeline};
use crate::wire::{self, Conn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Partitioner {
    /// Fill one partition's batch, then move to the next (Kafka's default since KIP-480).
    Sticky,
    /// One record per partition in turn: every partition gets traffic, batches stay small.
    RoundRobin,
    /// Each record carries a key drawn at random from `--keys` distinct keys and goes to
    /// the partition the Java client's default partitioner picks for it (murmur2 of the
    /// key, modulo the topic's partitions): every partition gets traffic, as with keyed
    /// records in production.
    Keyed,
}

/// Kafka's murmur2 hash of a key (`Utils.murmur2` in the Java client; seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const SEED: u32 = 0x9747_b28c;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner gives a keyed record.
pub fn partition_for_key(key: &[u8], partitions: usize) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) as usize % partitions) as i32
}

/// The keys `Partitioner::Keyed` draws from: `key-0` .. `key-{n-1}`.
fn key(n: usize) -> Vec<u8> {
    format!("key-{n}").into_bytes()
}

#[derive(Clone, Debug, Serialize)]
pub struct ProduceOpts {
    pub bootstrap: String,
    pub topic: String,
    pub record_bytes: usize,
    /// Records per second over all producers; 0 = as fast as the broker takes them.
    pub rate_rps: f64,
    pub duration: Duration,
    pub warmup: Duration,
    pub producers: usize,
    pub max_in_flight: usize,
    pub batch_bytes: usize,
    pub linger: Duration,
    pub acks: i16,
    pub request_timeout_ms: i32,
    pub buffer_bytes: usize,
    pub request_bytes_max: usize,
    pub partitioner: Partitioner,
    /// Distinct keys of `Partitioner::Keyed`.
    pub keys: usize,
    /// Stop after this many records in total (0 = no cap; `duration` still bounds the run).
    pub records_max: u64,
    /// How long after `duration` the producers may take to send and get acknowledged the
    /// records intended before its end.
    pub drain_timeout: Duration,
}

/// Shared state of a running produce workload, read by the progress line.
pub struct ProduceLive {
    pub acked: Timeline,
    pub sent_records: AtomicU64,
    pub acked_records: AtomicU64,
    pub error_records: AtomicU64,
}

#[derive(Serialize, Debug, Default)]
pub struct ProduceResult {
    pub target_rate_rps: f64,
    pub target_mbps: f64,
    /// Records whose intended send time fell in the measured window (after warm-up).
    pub intended_records: u64,
    pub sent_records: u64,
    pub acked_records: u64,
    pub error_records: u64,
    pub errors: Vec<(i16, String, u64)>,
    /// Records intended before the end that were still unacknowledged at the drain deadline.
    pub unacked_at_deadline: u64,
    pub window_s: f64,
    /// Acknowledged in the window (by acknowledgement time), per second.
    pub throughput_rps: f64,
    /// Record value bytes (MB = 10^6 bytes) acknowledged in the window, per second.
    pub throughput_mbps: f64,
    /// Latency from intended send time to acknowledgement, records intended in the window.
    pub latency: LatencySummary,
    /// Acknowledgement rate fell short of the target, or records were left unacknowledged
    /// (errors are counted in `error_records`, not here).
    pub saturated: bool,
    pub produce_requests: u64,
    pub batches: u64,
    pub mean_batch_records: f64,
    /// (second, records, value bytes) acknowledged in each second since the start.
    pub timeline: Vec<(u64, u64, u64)>,
    /// (second of intended send time, p50 us, p99 us, max us), warm-up included.
    pub latency_timeline: Vec<(u64, u64, u64, u64)>,
    pub api_versions: Vec<(String, i16)>,
    pub elapsed_s: f64,
}

/// Seconds of run covered by the per-second latency timeline.
const PER_SECOND_HISTOGRAMS_MAX: usize = 3600;

struct InFlight {
    count: Mutex<usize>,
    changed: Condvar,
}

struct ReadyBatch {
    partition: i32,
    data: Bytes,
    /// Intended send time of each record, nanoseconds since the start.
    intended_ns: Vec<u64>,
}

struct SentRequest {
    correlation_id: i32,
    version: i16,
    batches: Vec<(i32, Vec<u64>)>,
}

struct ReaderOut {
    histogram: Histogram<u64>,
    /// One histogram per second of intended send time, warm-up included.
    per_second: Vec<Histogram<u64>>,
    acked_in_window: u64,
    last_ack: Option<Instant>,
    errors: std::collections::BTreeMap<i16, u64>,
    produce_requests: u64,
    batches: u64,
    batch_records: u64,
}

struct WriterOut {
    intended_in_window: u64,
    unacked_at_deadline: u64,
}

/// Runs the producers from `start` (shared with consumers) and returns what they measured.
pub fn run(
    opts: &ProduceOpts,
    start: Instant,
    start_unix_us: u64,
    live: Arc<ProduceLive>,
) -> Result<ProduceResult> {
    let mut probe = Conn::connect(&opts.bootstrap, Duration::from_secs(10))?;
    let leaders = probe.partition_leaders(&opts.topic)?;
    let api_versions = probe.versions_used();
    drop(probe);
    // `opts.producers` connections to each leader (one on a single broker), each with its
    // share of that leader's partitions.
    let mut shares: Vec<(Conn, Vec<i32>)> = Vec::new();
    for (leader, partitions) in &leaders {
        let n = opts.producers.clamp(1, partitions.len());
        for j in 0..n {
            let mine = partitions.iter().skip(j).step_by(n).copied().collect();
            shares.push((Conn::connect(leader, Duration::from_secs(10))?, mine));
        }
    }
    let producers = shares.len();
    // Keyed: each producer draws from the keys whose partition it owns (its slot for each).
    let topic_partitions: usize = leaders.values().map(Vec::len).sum();
    let mut keys_of: Vec<Vec<(usize, Vec<u8>)>> = vec![Vec::new(); producers];
    if opts.partitioner == Partitioner::Keyed {
        for n in 0..opts.keys {
            let k = key(n);
            let p = partition_for_key(&k, topic_partitions);
            let owner = shares
                .iter()
                .enumerate()
                .find_map(|(j, (_, mine))| mine.iter().position(|&q| q == p).map(|slot| (j, slot)));
            let (j, slot) = owner.with_context(|| format!("no producer owns partition {p}"))?;
            keys_of[j].push((slot, k));
        }
        if let Some(j) = keys_of.iter().position(Vec::is_empty) {
            anyhow::bail!(
                "--keys {} leave producer {j} without a key: use more keys or fewer producers",
                opts.keys
            );
        }
    }
    let filler: Arc<Vec<u8>> = Arc::new(filler_bytes(
        opts.record_bytes.saturating_sub(PAYLOAD_HEADER_BYTES),
    ));
    // Every thread waits here so that connection set-up is not charged to the first records.
    let mut handles = Vec::new();
    for ((j, (conn, mine)), keys) in shares.into_iter().enumerate().zip(keys_of) {
        // Each producer's share of the rate: even, or keyed, its share of the keys, so each
        // key (and partition) gets the traffic the Java client would send it.
        let rate_share = match opts.partitioner {
            Partitioner::Keyed => keys.len() as f64 / opts.keys as f64,
            _ => 1.0 / producers as f64,
        };
        let opts = opts.clone();
        let live = live.clone();
        let filler = filler.clone();
        handles.push(
            thread::Builder::new()
                .name(format!("producer-{j}"))
                .spawn(move || {
                    producer(
                        j,
                        producers,
                        rate_share,
                        conn,
                        mine,
                        &keys,
                        &opts,
                        start,
                        start_unix_us,
                        &filler,
                        &live,
                    )
                })?,
        );
    }
    let mut result = ProduceResult {
        api_versions,
        ..Default::default()
    };
    let mut histogram = stats::new_histogram();
    let mut per_second: Vec<Histogram<u64>> = Vec::new();
    let mut errors = std::collections::BTreeMap::new();
    let mut batch_records = 0;
    let mut last_ack: Option<Instant> = None;
    for h in handles {
        let (w, r) = h
            .join()
            .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
        histogram.add(&r.histogram).context("merging histograms")?;
        for (i, h) in r.per_second.iter().enumerate() {
            if per_second.len() <= i {
                per_second.push(stats::new_coarse_histogram());
            }
            per_second[i].add(h).context("merging histograms")?;
        }
        result.intended_records += w.intended_in_window;
        result.unacked_at_deadline += w.unacked_at_deadline;
        result.acked_records += r.acked_in_window;
        last_ack = last_ack.max(r.last_ack);
        for (code, n) in r.errors {
            *errors.entry(code).or_insert(0) += n;
        }
        result.produce_requests += r.produce_requests;
        result.batches += r.batches;
        batch_records += r.batch_records;
    }
    // A run capped by `records_max` ends with its last acknowledgement.
    let window_end = match last_ack {
        Some(t) if opts.records_max > 0 => (t - start).min(opts.duration),
        _ => opts.duration,
    };
    let window = window_end.saturating_sub(opts.warmup);
    result.window_s = window.as_secs_f64();
    result.target_rate_rps = opts.rate_rps;
    result.target_mbps = opts.rate_rps * opts.record_bytes as f64 / 1e6;
    result.sent_records = live.sent_records.load(Ordering::Relaxed);
    result.error_records = live.error_records.load(Ordering::Relaxed);
    result.errors = errors
        .into_iter()
        .map(|(c, n)| (c, wire::error_name(c).to_string(), n))
        .collect();
    result.throughput_rps = result.acked_records as f64 / result.window_s.max(1e-9);
    result.throughput_mbps = result.throughput_rps * opts.record_bytes as f64 / 1e6;
    result.latency = LatencySummary::of(&histogram);
    result.latency_timeline = per_second
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.is_empty())
        .map(|(i, h)| {
            (
                i as u64,
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max(),
            )
        })
        .collect();
    result.mean_batch_records = if result.batches > 0 {
        batch_records as f64 / result.batches as f64
    } else {
        0.0
    };
    result.saturated = result.unacked_at_deadline > 0
        || (opts.rate_rps > 0.0 && result.throughput_rps < 0.95 * opts.rate_rps);
    result.elapsed_s = start.elapsed().as_secs_f64();
    let seconds = result.elapsed_s.ceil() as usize;
    result.timeline = live
        .acked
        .points(seconds)
        .into_iter()
        .map(|(s, r, _)| (s, r, r * opts.record_bytes as u64))
        .collect();
    Ok(result)
}

/// Bytes that do not compress (xorshift), so a broker or codec gains nothing from them.
fn filler_bytes(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn producer(
    index: usize,
    producers: usize,
    rate_share: f64,
    conn: Conn,
    partitions: Vec<i32>,
    keys: &[(usize, Vec<u8>)],
    opts: &ProduceOpts,
    start: Instant,
    start_unix_us: u64,
    filler: &[u8],
    live: &ProduceLive,
) -> Result<(WriterOut, ReaderOut)> {
    let in_flight = InFlight {
        count: Mutex::new(0),
        changed: Condvar::new(),
    };
    let (tx, rx) = mpsc::channel::<SentRequest>();
    let reader_stream = conn.stream.try_clone()?;
    let in_flight = &in_flight;
    thread::scope(|s| -> Result<(WriterOut, ReaderOut)> {
        let r = s.spawn(move || read_responses(reader_stream, rx, in_flight, opts, start, live));
        let w = write_requests(
            index,
            producers,
            rate_share,
            conn,
            &partitions,
            keys,
            opts,
            start,
            start_unix_us,
            filler,
            live,
            tx,
            in_flight,
        );
        let r = r
            .join()
            .map_err(|_| anyhow::anyhow!("reader thread panicked"))?;
        Ok((w?, r?))
    })
}

#[allow(clippy::too_many_arguments)]
fn write_requests(
    index: usize,
    producers: usize,
    rate_share: f64,
    mut conn: Conn,
    partitions: &[i32],
    keys: &[(usize, Vec<u8>)],
    opts: &ProduceOpts,
    start: Instant,
    start_unix_us: u64,
    filler: &[u8],
    live: &ProduceLive,
    tx: mpsc::Sender<SentRequest>,
    in_flight: &InFlight,
) -> Result<WriterOut> {
    let duration_ns = opts.duration.as_nanos() as u64;
    let warmup_ns = opts.warmup.as_nanos() as u64;
    let deadline = start + opts.duration + opts.drain_timeout;
    let rate = opts.rate_rps * rate_share;
    let interval_ns = if rate > 0.0 { 1e9 / rate } else { 0.0 };
    // Producers start out of phase so that their records interleave evenly.
    let phase_ns = interval_ns * index as f64 / producers as f64;
    let key_bytes_max = keys.iter().map(|(_, k)| k.len()).max().unwrap_or(0);
    let record_bytes_max = BatchBuilder::record_bytes_max(opts.record_bytes, key_bytes_max);
    // Keyed records draw their keys from a generator of their own per producer.
    let mut random = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(index as u64 + 1) | 1;
    let topic = TopicName(StrBytes::from_string(opts.topic.clone()));

    // Each producer stops generating after its share of `records_max` (0 = no cap).
    let records_cap = if opts.records_max > 0 {
        opts.records_max / producers as u64
            + u64::from((index as u64) < opts.records_max % producers as u64)
    } else {
        u64::MAX
    };
    let mut next_k: u64 = 0;
    let mut acc = Accumulator::new(partitions, opts.batch_bytes);
    let mut intended_in_window = 0u64;
    let mut generation_done = false;

    loop {
        let now = Instant::now();
        let now_ns = (now - start).as_nanos() as u64;

        // Generate every record that is due and fits in the buffer.
        while !generation_done {
            let intended_ns = if interval_ns > 0.0 {
                (phase_ns + next_k as f64 * interval_ns) as u64
            } else {
                now_ns
            };
            if intended_ns >= duration_ns || next_k >= records_cap {
                generation_done = true;
                break;
            }
            if intended_ns > now_ns || acc.buffered_bytes + record_bytes_max > opts.buffer_bytes {
                break;
            }
            let (slot, key) = match opts.partitioner {
                Partitioner::Sticky => (acc.sticky, None),
                Partitioner::RoundRobin => ((next_k as usize) % partitions.len(), None),
                Partitioner::Keyed => {
                    // xorshift64
                    random ^= random << 13;
                    random ^= random >> 7;
                    random ^= random << 17;
                    let (slot, key) = &keys[(random % keys.len() as u64) as usize];
                    (*slot, Some(&key[..]))
                }
            };
            if acc.open[slot]
                .as_ref()
                .is_some_and(|o| o.builder.bytes() + record_bytes_max > opts.batch_bytes)
            {
                acc.close(slot);
                if opts.partitioner == Partitioner::Sticky {
                    continue;
                }
            }
            let send_unix_us = start_unix_us + intended_ns / 1000;
            acc.append(slot, now, intended_ns, send_unix_us, key, filler);
            if intended_ns >= warmup_ns {
                intended_in_window += 1;
            }
            next_k += 1;
        }

        // Close batches whose linger has passed (all of them once generation is over).
        while let Some(slot) = acc.oldest_open(now, opts.linger, generation_done) {
            acc.close(slot);
        }
        // Send while the connection has room.
        while !acc.ready.is_empty() && *in_flight.count.lock().unwrap() < opts.max_in_flight {
            let (taken, bytes) = acc.drain(opts.request_bytes_max);
            let req = ProduceRequest::default()
                .with_acks(opts.acks)
                .with_timeout_ms(opts.request_timeout_ms)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(topic.clone())
                    .with_partition_data(
                        taken
                            .iter()
                            .map(|b| {
                                PartitionProduceData::default()
                                    .with_index(b.partition)
                                    .with_records(Some(b.data.clone()))
                            })
                            .collect(),
                    )]);
            let (correlation_id, version, frame) = conn.encode(&req)?;
            let records: u64 = taken.iter().map(|b| b.intended_ns.len() as u64).sum();
            acc.buffered_bytes -= bytes;
            *in_flight.count.lock().unwrap() += 1;
            let sent = SentRequest {
                correlation_id,
                version,
                batches: taken
                    .into_iter()
                    .map(|b| (b.partition, b.intended_ns))
                    .collect(),
            };
            tx.send(sent)
                .map_err(|_| anyhow::anyhow!("response reader stopped"))?;
            conn.stream
                .write_all(&frame)
                .context("writing a produce request")?;
            live.sent_records.fetch_add(records, Ordering::Relaxed);
        }

        let idle = generation_done && acc.ready.is_empty() && acc.open_count == 0;
        if idle {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }

        // Sleep until the next thing to do: a record due (if the buffer has room for it), a
        // linger expiring, a response (which frees a request slot and buffer space). Never
        // spin: on a 2-core machine a busy client takes CPU from the broker it measures.
        let buffer_has_room = acc.buffered_bytes + record_bytes_max <= opts.buffer_bytes;
        let mut wake = now + Duration::from_millis(5);
        if !generation_done && buffer_has_room {
            let next = if interval_ns > 0.0 {
                start + Duration::from_nanos((phase_ns + next_k as f64 * interval_ns) as u64)
            } else {
                now
            };
            wake = wake.min(next);
        }
        if let Some(created) = acc.oldest_created() {
            wake = wake.min(created + opts.linger);
        }
        let now = Instant::now();
        if wake > now {
            let count = in_flight.count.lock().unwrap();
            if !acc.ready.is_empty() && *count < opts.max_in_flight {
                // A response came in since the send loop: send at once.
            } else if *count > 0 && (*count >= opts.max_in_flight || !buffer_has_room) {
                // Waiting for a response frees a slot; wake on it or on the timer.
                let _ = in_flight.changed.wait_timeout(count, wake - now).unwrap();
            } else {
                drop(count);
                thread::sleep(wake - now);
            }
        }
    }

    // Wait for the outstanding responses (the reader stops when the channel closes).
    drop(tx);
    let mut unacked = 0u64;
    {
        let mut count = in_flight.count.lock().unwrap();
        while *count > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            count = in_flight
                .changed
                .wait_timeout(count, deadline - now)
                .unwrap()
                .0;
        }
    }
    // Records still in the producer at the deadline: never sent, or sent and unanswered.
    for b in &acc.ready {
        unacked += b.intended_ns.iter().filter(|t| **t >= warmup_ns).count() as u64;
    }
    for o in acc.open.iter().flatten() {
        unacked += o.intended_ns.iter().filter(|t| **t >= warmup_ns).count() as u64;
    }
    if interval_ns > 0.0 && !generation_done {
        let total = (((duration_ns as f64 - phase_ns) / interval_ns)
            .ceil()
            .max(0.0) as u64)
            .min(records_cap);
        let first_in_window = ((warmup_ns as f64 - phase_ns) / interval_ns)
            .ceil()
            .max(0.0) as u64;
        let never_made = total.saturating_sub(next_k.max(first_in_window));
        unacked += never_made;
        intended_in_window += never_made;
    }
    if *in_flight.count.lock().unwrap() > 0 {
        // Unanswered requests at the deadline: shut the socket so the reader returns.
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
    }
    Ok(WriterOut {
        intended_in_window,
        unacked_at_deadline: unacked,
    })
}

struct OpenBatch {
    builder: BatchBuilder,
    created: Instant,
    intended_ns: Vec<u64>,
}

/// Kafka's RecordAccumulator in miniature: one open batch per partition, closed batches
/// in the order they closed, and the bytes held (for `buffer_bytes`).
struct Accumulator<'a> {
    partitions: &'a [i32],
    batch_bytes: usize,
    open: Vec<Option<OpenBatch>>,
    open_count: usize,
    /// (slot, created) in creation order; stale entries (closed early) are skipped.
    open_order: VecDeque<(usize, Instant)>,
    ready: VecDeque<ReadyBatch>,
    buffered_bytes: usize,
    /// Slot the sticky partitioner fills.
    sticky: usize,
}

impl<'a> Accumulator<'a> {
    fn new(partitions: &'a [i32], batch_bytes: usize) -> Accumulator<'a> {
        Accumulator {
            partitions,
            batch_bytes,
            open: (0..partitions.len()).map(|_| None).collect(),
            open_count: 0,
            open_order: VecDeque::new(),
            ready: VecDeque::new(),
            buffered_bytes: 0,
            sticky: 0,
        }
    }

    fn append(
        &mut self,
        slot: usize,
        now: Instant,
        intended_ns: u64,
        send_unix_us: u64,
        key: Option<&[u8]>,
        filler: &[u8],
    ) {
        if self.open[slot].is_none() {
            let builder = BatchBuilder::new(self.batch_bytes);
            self.buffered_bytes += builder.bytes();
            self.open[slot] = Some(OpenBatch {
                builder,
                created: now,
                intended_ns: Vec::new(),
            });
            self.open_count += 1;
            self.open_order.push_back((slot, now));
        }
        let o = self.open[slot].as_mut().expect("open batch");
        let before = o.builder.bytes();
        o.builder
            .append((send_unix_us / 1000) as i64, send_unix_us, key, filler);
        self.buffered_bytes += o.builder.bytes() - before;
        o.intended_ns.push(intended_ns);
    }

    fn close(&mut self, slot: usize) {
        let o = self.open[slot].take().expect("open batch");
        self.open_count -= 1;
        let data = o.builder.finish();
        self.ready.push_back(ReadyBatch {
            partition: self.partitions[slot],
            data,
            intended_ns: o.intended_ns,
        });
        if slot == self.sticky {
            self.sticky = (self.sticky + 1) % self.partitions.len();
        }
    }

    fn is_current(&self, slot: usize, created: Instant) -> bool {
        self.open[slot]
            .as_ref()
            .is_some_and(|o| o.created == created)
    }

    /// The slot of the oldest open batch if its linger has passed (or `all`).
    fn oldest_open(&mut self, now: Instant, linger: Duration, all: bool) -> Option<usize> {
        while let Some(&(slot, created)) = self.open_order.front() {
            if !self.is_current(slot, created) {
                self.open_order.pop_front();
                continue;
            }
            if all || now.duration_since(created) >= linger {
                self.open_order.pop_front();
                return Some(slot);
            }
            return None;
        }
        None
    }

    fn oldest_created(&mut self) -> Option<Instant> {
        while let Some(&(slot, created)) = self.open_order.front() {
            if self.is_current(slot, created) {
                return Some(created);
            }
            self.open_order.pop_front();
        }
        None
    }

    /// Closed batches for one request: oldest first, one per partition (as Kafka's
    /// sender drains), at most `request_bytes_max` (but always at least one batch).
    fn drain(&mut self, request_bytes_max: usize) -> (Vec<ReadyBatch>, usize) {
        let mut taken: Vec<ReadyBatch> = Vec::new();
        let mut in_request = std::collections::HashSet::new();
        let mut bytes = 0usize;
        let mut kept = VecDeque::new();
        while let Some(b) = self.ready.pop_front() {
            let fits = taken.is_empty() || bytes + b.data.len() <= request_bytes_max;
            if fits && !in_request.contains(&b.partition) {
                bytes += b.data.len();
                in_request.insert(b.partition);
                taken.push(b);
                if bytes >= request_bytes_max {
                    break;
                }
            } else {
                kept.push_back(b);
                if !fits {
                    break;
                }
            }
        }
        while let Some(b) = kept.pop_back() {
            self.ready.push_front(b);
        }
        (taken, bytes)
    }
}

fn read_responses(
    mut stream: std::net::TcpStream,
    rx: mpsc::Receiver<SentRequest>,
    in_flight: &InFlight,
    opts: &ProduceOpts,
    start: Instant,
    live: &ProduceLive,
) -> Result<ReaderOut> {
    let warmup_ns = opts.warmup.as_nanos() as u64;
    let duration_ns = opts.duration.as_nanos() as u64;
    let warmup_end = start + opts.warmup;
    let window_end = start + opts.duration;
    let mut out = ReaderOut {
        histogram: stats::new_histogram(),
        per_second: Vec::new(),
        acked_in_window: 0,
        last_ack: None,
        errors: Default::default(),
        produce_requests: 0,
        batches: 0,
        batch_records: 0,
    };
    let mut codes: Vec<(i32, i16)> = Vec::new();
    while let Ok(sent) = rx.recv() {
        let body = match wire::read_frame(&mut stream) {
            Ok(b) => b,
            Err(e) => {
                // The writer shut the socket at the drain deadline, or the broker went away.
                let mut count = in_flight.count.lock().unwrap();
                *count = 0;
                in_flight.changed.notify_all();
                if Instant::now() >= start + opts.duration + opts.drain_timeout {
                    return Ok(out);
                }
                return Err(e.context("reading a produce response"));
            }
        };
        let acked_at = Instant::now();
        let resp =
            wire::decode_response::<ProduceRequest>(body, sent.correlation_id, sent.version)?;
        codes.clear();
        for t in &resp.responses {
            for p in &t.partition_responses {
                codes.push((p.index, p.error_code));
            }
        }
        let acked_ns = (acked_at - start).as_nanos() as u64;
        let in_window = acked_at >= warmup_end && acked_at < window_end;
        let mut acked_records = 0u64;
        for (partition, times) in &sent.batches {
            let code = codes
                .iter()
                .find(|(p, _)| p == partition)
                .map(|(_, c)| *c)
                .unwrap_or(-1);
            out.batches += 1;
            out.batch_records += times.len() as u64;
            if code != 0 {
                *out.errors.entry(code).or_insert(0) += times.len() as u64;
                live.error_records
                    .fetch_add(times.len() as u64, Ordering::Relaxed);
                continue;
            }
            acked_records += times.len() as u64;
            for &t in times {
                let latency = Duration::from_nanos(acked_ns.saturating_sub(t));
                if t >= warmup_ns && t < duration_ns {
                    stats::record_us(&mut out.histogram, latency);
                }
                let second = (t / 1_000_000_000) as usize;
                if second < PER_SECOND_HISTOGRAMS_MAX {
                    while out.per_second.len() <= second {
                        out.per_second.push(stats::new_coarse_histogram());
                    }
                    stats::record_us(&mut out.per_second[second], latency);
                }
            }
        }
        if in_window {
            out.acked_in_window += acked_records;
        }
        out.last_ack = Some(acked_at);
        out.produce_requests += 1;
        live.acked.add(acked_at - start, acked_records, 0);
        live.acked_records
            .fetch_add(acked_records, Ordering::Relaxed);
        let mut count = in_flight.count.lock().unwrap();
        *count -= 1;
        in_flight.changed.notify_all();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values the Java client's `Utils.murmur2` gives (kafka-python agrees).
    #[test]
    fn murmur2_matches_the_java_client() {
        for (key, want) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
            (b"key-0", 29_210_041),
            (b"key-12345", -952_703_915),
        ] {
            assert_eq!(murmur2(key), want, "{}", String::from_utf8_lossy(key));
        }
        assert_eq!(
            partition_for_key(b"key-12345", 16),
            (-952_703_915i32 & 0x7fff_ffff) % 16
        );
    }
}
