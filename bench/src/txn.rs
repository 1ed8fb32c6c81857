//! Transactional produce (`ferrolog-bench txn-produce`): one producer with a
//! `transactional.id`, doing what Kafka's Java producer does when an application commits
//! every N records: per transaction, AddPartitionsToTxn for the partitions it writes, one
//! acks=all Produce with a transactional batch per partition, then EndTxn (commit), each
//! waiting for the one before. CONCURRENT_TRANSACTIONS (the previous commit's markers are
//! still being written) is retried after 20 ms, as the Java client's first retry of
//! AddPartitionsToTxn. One broker: the coordinator and every partition's leader must be
//! the broker it connects to (the bench's single-node configurations).
//!
//! Measured: committed transactions and records per second, and the commit latency (first
//! AddPartitionsToTxn to EndTxn's answer) over the measured window.

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Result};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, EndTxnRequest, FindCoordinatorRequest,
    InitProducerIdRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use crate::batch::BatchBuilder;
use crate::stats::{new_histogram, record_us, LatencySummary};
use crate::wire::{error_name, Conn};

const CONCURRENT_TRANSACTIONS: i16 = 51;
const COORDINATOR_ERRORS: &[i16] = &[14, 15, 16]; // load in progress, not available, not ours
const RETRY_BACKOFF: Duration = Duration::from_millis(20);

#[derive(clap::Args)]
pub struct TxnOpts {
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    #[arg(long)]
    pub topic: String,
    /// Partitions of the topic (created if missing); each transaction writes to all.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    #[arg(long, default_value_t = 100)]
    pub records_per_txn: usize,
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    #[arg(long, default_value_t = 30.0)]
    pub duration_s: f64,
    #[arg(long, default_value_t = 5.0)]
    pub warmup_s: f64,
}

#[derive(Serialize)]
pub struct TxnResult {
    pub transactions: u64,
    pub records: u64,
    pub elapsed_s: f64,
    pub transactions_per_s: f64,
    pub records_per_s: f64,
    pub throughput_mbps: f64,
    /// First AddPartitionsToTxn to EndTxn's answer, measured transactions only.
    pub commit_latency: LatencySummary,
    /// CONCURRENT_TRANSACTIONS answers retried, over the whole run.
    pub concurrent_retries: u64,
}

fn txn_id(s: &str) -> TransactionalId {
    TransactionalId(StrBytes::from_string(s.to_string()))
}

/// Calls `f` until its error code is not one of `retry` (sleeping `backoff` between), for at
/// most `timeout`; returns its answer and how many retries it took.
fn retry<T>(
    what: &str,
    retry: &[i16],
    backoff: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> Result<(i16, T)>,
) -> Result<(T, u64)> {
    let start = Instant::now();
    let mut retries = 0;
    loop {
        let (code, answer) = f()?;
        if code == 0 {
            return Ok((answer, retries));
        }
        ensure!(
            retry.contains(&code) && start.elapsed() < timeout,
            "{what}: {} ({code})",
            error_name(code)
        );
        retries += 1;
        thread::sleep(backoff);
    }
}

pub fn run(o: &TxnOpts) -> Result<TxnResult> {
    let id = format!("ferrolog-bench-txn-{}", std::process::id());
    let mut conn = Conn::connect(&o.bootstrap, Duration::from_secs(10))?;
    conn.create_topic(&o.topic, o.partitions, 1, &[], 120_000)?;
    let setup = Duration::from_secs(120);
    let ((), _) = retry(
        "FindCoordinator",
        COORDINATOR_ERRORS,
        Duration::from_millis(200),
        setup,
        || {
            let req = FindCoordinatorRequest::default().with_key_type(1);
            let key = StrBytes::from_string(id.clone());
            let req = match conn.version(ApiKey::FindCoordinator)? {
                v if v >= 4 => req.with_coordinator_keys(vec![key]),
                _ => req.with_key(key),
            };
            let resp = conn.call(&req)?;
            let code = resp
                .coordinators
                .first()
                .map_or(resp.error_code, |c| c.error_code);
            Ok((code, ()))
        },
    )?;
    let ((producer_id, epoch), _) = retry(
        "InitProducerId",
        &[COORDINATOR_ERRORS, &[CONCURRENT_TRANSACTIONS]].concat(),
        Duration::from_millis(200),
        setup,
        || {
            let req = InitProducerIdRequest::default()
                .with_transactional_id(Some(txn_id(&id)))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            let resp = conn.call(&req)?;
            Ok((resp.error_code, (resp.producer_id.0, resp.producer_epoch)))
        },
    )?;

    let filler = vec![
        b'x';
        o.record_bytes
            .saturating_sub(crate::batch::PAYLOAD_HEADER_BYTES)
    ];
    let per_partition = o.records_per_txn.div_ceil(o.partitions as usize);
    let mut sequences = vec![0i32; o.partitions as usize];
    let mut latency = new_histogram();
    let (mut transactions, mut records, mut concurrent_retries) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let (warmup, end) = (
        Duration::from_secs_f64(o.warmup_s),
        Duration::from_secs_f64(o.duration_s),
    );
    let mut measured_from = None;
    while start.elapsed() < end {
        let t0 = Instant::now();
        let measured = t0.duration_since(start) >= warmup;
        if measured && measured_from.is_none() {
            measured_from = Some(t0);
        }
        let add = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(txn_id(&id))
            .with_v3_and_below_producer_id(ProducerId(producer_id))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_string(o.topic.clone())))
                .with_partitions((0..o.partitions).collect())]);
        let ((), retries) = retry(
            "AddPartitionsToTxn",
            &[CONCURRENT_TRANSACTIONS],
            RETRY_BACKOFF,
            setup,
            || {
                let resp = conn.call(&add)?;
                let code = resp
                    .results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| t.results_by_partition.iter())
                    .map(|p| p.partition_error_code)
                    .find(|c| *c != 0)
                    .unwrap_or(resp.error_code);
                Ok((code, ()))
            },
        )?;
        concurrent_retries += retries;

        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
        let now_us = now_ms as u64 * 1000;
        let mut left = o.records_per_txn;
        let mut data = Vec::with_capacity(o.partitions as usize);
        for p in 0..o.partitions {
            let n = per_partition.min(left);
            if n == 0 {
                break;
            }
            left -= n;
            let mut b = BatchBuilder::new(n * BatchBuilder::record_bytes_max(o.record_bytes, 0));
            for _ in 0..n {
                b.append(now_ms, now_us, None, &filler);
            }
            let seq = &mut sequences[p as usize];
            data.push(
                PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(b.finish_transactional(producer_id, epoch, *seq))),
            );
            *seq = seq.wrapping_add(n as i32);
        }
        let produce = ProduceRequest::default()
            .with_transactional_id(Some(txn_id(&id)))
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(o.topic.clone())))
                .with_partition_data(data)]);
        let resp = conn.call(&produce)?;
        for t in &resp.responses {
            for p in &t.partition_responses {
                if p.error_code != 0 {
                    bail!(
                        "Produce to partition {}: {} ({})",
                        p.index,
                        error_name(p.error_code),
                        p.error_code
                    );
                }
            }
        }

        let end_txn = EndTxnRequest::default()
            .with_transactional_id(txn_id(&id))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(epoch)
            .with_committed(true);
        let ((), retries) = retry(
            "EndTxn",
            &[CONCURRENT_TRANSACTIONS],
            RETRY_BACKOFF,
            setup,
            || Ok((conn.call(&end_txn)?.error_code, ())),
        )?;
        concurrent_retries += retries;
        if measured {
            record_us(&mut latency, t0.elapsed());
            transactions += 1;
            records += o.records_per_txn as u64;
        }
    }
    let elapsed_s = measured_from.map_or(0.0, |t| t.elapsed().as_secs_f64());
    ensure!(
        transactions > 0,
        "no transaction committed in the measured window"
    );
    Ok(TxnResult {
        transactions,
        records,
        elapsed_s,
        transactions_per_s: transactions as f64 / elapsed_s,
        records_per_s: records as f64 / elapsed_s,
        throughput_mbps: (records * o.record_bytes as u64) as f64 / elapsed_s / 1e6,
        commit_latency: LatencySummary::of(&latency),
        concurrent_retries,
    })
}
