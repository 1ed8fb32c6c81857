//! Consumers: one connection each, all partitions of one topic assigned (no consumer
//! group, so no coordinator is measured), one Fetch in flight at a time as Kafka's
//! consumer keeps per broker.
//!
//! A live consumer starts at the log end before the producers start and measures
//! end-to-end latency: receive time minus the intended send time the producer wrote in
//! each record's value. A catch-up consumer starts at the log start and reads until it
//! reaches the end offsets it saw when it started.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use crate::batch;
use crate::stats::{self, LatencySummary, Timeline};
use crate::wire::{self, Conn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartAt {
    /// The log end when the consumer starts: live tail, end-to-end latency.
    Latest,
    /// The log start; read up to the end offsets seen at start (a backlog).
    Earliest,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConsumeOpts {
    pub bootstrap: String,
    pub topic: String,
    pub start_at: StartAt,
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
    /// Parse every record to read its send time (end-to-end latency).
    pub parse_records: bool,
    pub verify_crc: bool,
    /// Fetch with isolation_level READ_COMMITTED (up to the last stable offset).
    pub read_committed: bool,
    /// Catch-up: give up after this long.
    pub timeout: Duration,
}

pub struct ConsumeLive {
    pub received: Timeline,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
}

#[derive(Serialize, Debug, Default, Clone)]
pub struct ConsumerResult {
    pub records: u64,
    /// Bytes of complete record batches received (headers included).
    pub batch_bytes: u64,
    pub value_bytes: u64,
    pub fetches: u64,
    pub empty_fetches: u64,
    pub crc_errors: u64,
    pub errors: Vec<(i16, String, u64)>,
    /// From the first fetch sent to the last record received.
    pub elapsed_s: f64,
    pub throughput_mbps: f64,
    pub throughput_rps: f64,
    /// Receive time minus intended send time, for records intended in the measured window.
    pub e2e_latency: LatencySummary,
    /// Catch-up: every partition reached the end offsets seen at start.
    pub reached_end: bool,
}

/// The part of a consumer that runs before the producers start: connect, find partitions
/// and starting offsets.
pub struct Prepared {
    conn: Conn,
    offsets: Vec<(i32, i64)>,
    end_offsets: HashMap<i32, i64>,
}

pub fn prepare(opts: &ConsumeOpts) -> Result<Prepared> {
    let mut conn = Conn::connect(&opts.bootstrap, Duration::from_secs(10))?;
    let partitions = conn.partitions(&opts.topic)?;
    let end_offsets = conn.list_offsets(&opts.topic, &partitions, -1)?;
    let start = match opts.start_at {
        StartAt::Latest => end_offsets.clone(),
        StartAt::Earliest => conn.list_offsets(&opts.topic, &partitions, -2)?,
    };
    let offsets = partitions.iter().map(|p| (*p, start[p])).collect();
    Ok(Prepared {
        conn,
        offsets,
        end_offsets,
    })
}

/// Reads until `stop` is set and the consumer has caught up with the high watermarks it
/// last saw (live), or until it reaches the end offsets (catch-up).
#[allow(clippy::too_many_arguments)]
pub fn run(
    prepared: Prepared,
    opts: &ConsumeOpts,
    start: Instant,
    start_unix_us: u64,
    window: (Duration, Duration),
    stop: &AtomicBool,
    live: Arc<ConsumeLive>,
) -> Result<ConsumerResult> {
    let Prepared {
        mut conn,
        mut offsets,
        end_offsets,
    } = prepared;
    let topic = TopicName(StrBytes::from_string(opts.topic.clone()));
    let window_start_us = start_unix_us + window.0.as_micros() as u64;
    let window_end_us = start_unix_us + window.1.as_micros() as u64;
    let mut histogram = stats::new_histogram();
    let mut result = ConsumerResult::default();
    let mut errors: HashMap<i16, u64> = HashMap::new();
    let mut high_watermarks: HashMap<i32, i64> = HashMap::new();
    let begun = Instant::now();
    let mut last_record_at = begun;
    let mut stop_seen_at: Option<Instant> = None;
    let catch_up = opts.start_at == StartAt::Earliest;
    loop {
        if catch_up {
            if offsets.iter().all(|(p, o)| *o >= end_offsets[p]) {
                result.reached_end = true;
                break;
            }
            if begun.elapsed() > opts.timeout {
                break;
            }
        } else if stop.load(Ordering::Relaxed) {
            let seen = *stop_seen_at.get_or_insert_with(Instant::now);
            let caught_up = offsets
                .iter()
                .all(|(p, o)| high_watermarks.get(p).is_some_and(|hw| o >= hw));
            if caught_up || seen.elapsed() > Duration::from_secs(10) {
                result.reached_end = caught_up;
                break;
            }
        }
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(if stop_seen_at.is_some() {
                100
            } else {
                opts.max_wait_ms
            })
            .with_min_bytes(opts.min_bytes)
            .with_max_bytes(opts.max_bytes)
            .with_isolation_level(i8::from(opts.read_committed))
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic.clone())
                .with_partitions(
                    offsets
                        .iter()
                        .map(|(p, o)| {
                            FetchPartition::default()
                                .with_partition(*p)
                                .with_current_leader_epoch(-1)
                                .with_fetch_offset(*o)
                                .with_last_fetched_epoch(-1)
                                .with_log_start_offset(-1)
                                .with_partition_max_bytes(opts.partition_max_bytes)
                        })
                        .collect(),
                )]);
        let (correlation_id, version, frame) = conn.encode(&req)?;
        conn.stream
            .write_all(&frame)
            .context("writing a fetch request")?;
        let body = wire::read_frame(&mut conn.stream).context("reading a fetch response")?;
        let received_at = Instant::now();
        let now_unix_us = start_unix_us + (received_at - start).as_micros() as u64;
        let resp = wire::decode_response::<FetchRequest>(body, correlation_id, version)?;
        result.fetches += 1;
        if resp.error_code != 0 {
            bail!(
                "fetch failed: error {} ({})",
                resp.error_code,
                wire::error_name(resp.error_code)
            );
        }
        let mut fetched_records = 0u64;
        let mut fetched_bytes = 0u64;
        for t in &resp.responses {
            for pd in &t.partitions {
                if pd.error_code != 0 {
                    *errors.entry(pd.error_code).or_insert(0) += 1;
                    if pd.error_code == 1 {
                        bail!("partition {}: OFFSET_OUT_OF_RANGE", pd.partition_index);
                    }
                    continue;
                }
                high_watermarks.insert(pd.partition_index, pd.high_watermark);
                let Some(records) = &pd.records else { continue };
                let Some(slot) = offsets.iter_mut().find(|(p, _)| *p == pd.partition_index) else {
                    continue;
                };
                let w = batch::walk_batches(
                    records,
                    slot.1,
                    opts.parse_records,
                    opts.verify_crc,
                    &mut |sent_us| {
                        if sent_us >= window_start_us && sent_us < window_end_us {
                            stats::record_us(
                                &mut histogram,
                                Duration::from_micros(now_unix_us.saturating_sub(sent_us)),
                            );
                        }
                    },
                )?;
                if let Some(next) = w.next_offset {
                    slot.1 = slot.1.max(next);
                }
                result.records += w.records;
                result.batch_bytes += w.batch_bytes;
                result.value_bytes += w.value_bytes;
                result.crc_errors += w.crc_errors;
                fetched_records += w.records;
                fetched_bytes += w.batch_bytes;
            }
        }
        if fetched_records == 0 {
            result.empty_fetches += 1;
        } else {
            last_record_at = received_at;
            live.received
                .add(received_at - start, fetched_records, fetched_bytes);
            live.records.fetch_add(fetched_records, Ordering::Relaxed);
            live.bytes.fetch_add(fetched_bytes, Ordering::Relaxed);
        }
    }
    result.elapsed_s = (last_record_at - begun).as_secs_f64();
    if result.elapsed_s > 0.0 {
        result.throughput_mbps = result.batch_bytes as f64 / 1e6 / result.elapsed_s;
        result.throughput_rps = result.records as f64 / result.elapsed_s;
    }
    result.e2e_latency = LatencySummary::of(&histogram);
    let mut e: Vec<_> = errors
        .into_iter()
        .map(|(c, n)| (c, wire::error_name(c).to_string(), n))
        .collect();
    e.sort();
    result.errors = e;
    Ok(result)
}
