//! Fetch (API 1): reads from each partition up to its HW, long-polls on `max_wait_ms` /
//! `min_bytes`, bounds the answer by `max_bytes` (the first batch always whole, KIP-74), and
//! keeps incremental fetch sessions (KIP-227).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{select, select_all, Either};
use futures::FutureExt;
use indexmap::IndexMap;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::errors::BrokerError;
use crate::fetch_session::{SessionPartition, SESSION_PARTITIONS_MAX};
use crate::kafka::RequestContext;
use crate::metadata::MetadataImage;
use crate::types::{ShardId, TopicPartition};

/// Kafka's broker-side `fetch.max.bytes` default: the most one response carries (plus one
/// oversized first batch, KIP-74).
const FETCH_MAX_BYTES: usize = 57_671_680;
/// Longest long-poll a client may ask for.
const MAX_WAIT_MS_MAX: u64 = 60_000;

/// What one partition read returned.
#[derive(Debug, Clone)]
struct Read {
    error: Option<BrokerError>,
    records: Bytes,
    high_watermark: i64,
    log_start_offset: i64,
}

pub async fn handle(ctx: Rc<RequestContext>, req: FetchRequest) -> FetchResponse {
    let image = ctx.shard.image();
    let use_ids = ctx.version >= 13;
    let resolve = |name: &TopicName, id: &Uuid| -> Option<String> {
        if use_ids {
            image.topic_by_id(id).map(|t| t.name.clone())
        } else {
            Some(name.0.to_string())
        }
    };
    // Partitions named in this request, in order, with unknown topic ids kept aside.
    let mut requested: IndexMap<TopicPartition, SessionPartition> = IndexMap::new();
    let mut unknown_ids: Vec<(Uuid, Vec<i32>)> = Vec::new();
    for t in &req.topics {
        match resolve(&t.topic, &t.topic_id) {
            Some(name) => {
                for p in &t.partitions {
                    requested.insert(
                        TopicPartition {
                            topic: name.clone(),
                            partition: p.partition,
                        },
                        SessionPartition {
                            fetch_offset: p.fetch_offset,
                            partition_max_bytes: p.partition_max_bytes,
                            current_leader_epoch: p.current_leader_epoch,
                            last_sent: None,
                        },
                    );
                }
            }
            None => unknown_ids.push((
                t.topic_id,
                t.partitions.iter().map(|p| p.partition).collect(),
            )),
        }
    }

    // KIP-227 session handling: epoch -1 is sessionless, 0 starts a session, >0 continues one.
    let mut session_id = 0;
    let mut incremental = false;
    let fetch_set: IndexMap<TopicPartition, SessionPartition> = {
        let mut sessions = ctx.shard.fetch_sessions.borrow_mut();
        match req.session_epoch {
            -1 => {
                if req.session_id != 0 {
                    sessions.remove(req.session_id);
                }
                requested.clone()
            }
            0 => {
                if req.session_id != 0 {
                    sessions.remove(req.session_id);
                }
                if requested.len() <= SESSION_PARTITIONS_MAX {
                    session_id = sessions.create(requested.clone());
                }
                requested.clone()
            }
            epoch => {
                let Some(session) = sessions.get_mut(req.session_id) else {
                    return error_response(ResponseError::FetchSessionIdNotFound.code());
                };
                if session.next_epoch != epoch {
                    return error_response(ResponseError::InvalidFetchSessionEpoch.code());
                }
                if session.partitions.len() + requested.len() > SESSION_PARTITIONS_MAX {
                    sessions.remove(req.session_id);
                    return error_response(ResponseError::FetchSessionIdNotFound.code());
                }
                for (tp, sp) in &requested {
                    let entry = session
                        .partitions
                        .entry(tp.clone())
                        .or_insert_with(|| sp.clone());
                    entry.fetch_offset = sp.fetch_offset;
                    entry.partition_max_bytes = sp.partition_max_bytes;
                    entry.current_leader_epoch = sp.current_leader_epoch;
                }
                for f in &req.forgotten_topics_data {
                    if let Some(name) = resolve(&f.topic, &f.topic_id) {
                        for p in &f.partitions {
                            session.partitions.shift_remove(&TopicPartition {
                                topic: name.clone(),
                                partition: *p,
                            });
                        }
                    }
                }
                session.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
                session_id = req.session_id;
                incremental = true;
                session.partitions.clone()
            }
        }
    };

    let max_bytes = if req.max_bytes <= 0 {
        FETCH_MAX_BYTES
    } else {
        (req.max_bytes as usize).min(FETCH_MAX_BYTES)
    };
    let min_bytes = req.min_bytes.max(0) as usize;
    let deadline = Instant::now()
        + Duration::from_millis((req.max_wait_ms.max(0) as u64).min(MAX_WAIT_MS_MAX));
    let targets: Vec<Target> = fetch_set
        .iter()
        .map(|(tp, sp)| Target {
            tp: tp.clone(),
            offset: sp.fetch_offset,
            limit: sp.partition_max_bytes.max(0) as usize,
            leader_epoch: sp.current_leader_epoch,
        })
        .collect();
    let mut reads = read_all(&ctx, &image, &targets, max_bytes).await;
    loop {
        let total: usize = reads.iter().map(|r| r.records.len()).sum();
        let any_error = reads.iter().any(|r| r.error.is_some());
        let now = Instant::now();
        // As Kafka: answer at once when min_bytes is met (min_bytes=0 never waits).
        if total >= min_bytes || any_error || now >= deadline || targets.is_empty() {
            break;
        }
        // Wake only when a HW moves past what this request already read: a partition that
        // has some data but less than min_bytes must not make the loop spin.
        let seen: Vec<(TopicPartition, i64)> = targets
            .iter()
            .zip(&reads)
            .map(|(t, r)| (t.tp.clone(), r.high_watermark.max(t.offset)))
            .collect();
        if !wait_for_data(&ctx, &image, seen, deadline - now).await {
            break;
        }
        reads = read_all(&ctx, &image, &targets, max_bytes).await;
    }

    // Build the response; an incremental one carries only partitions with news.
    let mut by_topic: BTreeMap<String, Vec<PartitionData>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    {
        let mut sessions = ctx.shard.fetch_sessions.borrow_mut();
        let mut session = if session_id != 0 {
            sessions.get_mut(session_id)
        } else {
            None
        };
        for (Target { tp, .. }, read) in targets.iter().zip(reads) {
            let now_state = (read.high_watermark, read.log_start_offset);
            let mut include = !incremental || read.error.is_some() || !read.records.is_empty();
            if let Some(s) = session.as_deref_mut() {
                if let Some(sp) = s.partitions.get_mut(tp) {
                    if sp.last_sent != Some(now_state) {
                        include = true;
                    }
                    if include {
                        sp.last_sent = Some(now_state);
                    }
                }
            }
            if !include {
                continue;
            }
            let pd = partition_data(tp.partition, read, req.isolation_level);
            if !by_topic.contains_key(&tp.topic) {
                order.push(tp.topic.clone());
            }
            by_topic.entry(tp.topic.clone()).or_default().push(pd);
        }
    }
    let mut responses: Vec<FetchableTopicResponse> = order
        .into_iter()
        .map(|name| {
            let id = image.topic(&name).map(|t| t.id).unwrap_or_default();
            let partitions = by_topic.remove(&name).unwrap_or_default();
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_string(name)))
                .with_topic_id(id)
                .with_partitions(partitions)
        })
        .collect();
    for (id, parts) in unknown_ids {
        responses.push(
            FetchableTopicResponse::default()
                .with_topic_id(id)
                .with_partitions(
                    parts
                        .into_iter()
                        .map(|p| error_partition(p, BrokerError::UnknownTopicId.code()))
                        .collect(),
                ),
        );
    }
    FetchResponse::default()
        .with_session_id(session_id)
        .with_responses(responses)
}

fn error_response(code: i16) -> FetchResponse {
    FetchResponse::default()
        .with_error_code(code)
        .with_session_id(0)
}

fn error_partition(partition: i32, code: i16) -> PartitionData {
    PartitionData::default()
        .with_partition_index(partition)
        .with_error_code(code)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(Bytes::new()))
}

fn partition_data(partition: i32, read: Read, isolation_level: i8) -> PartitionData {
    if let Some(e) = read.error {
        return error_partition(partition, e.code());
    }
    PartitionData::default()
        .with_partition_index(partition)
        .with_high_watermark(read.high_watermark)
        // No transactions yet: the LSO is the HW.
        .with_last_stable_offset(read.high_watermark)
        .with_log_start_offset(read.log_start_offset)
        .with_aborted_transactions(if isolation_level == 1 {
            Some(Vec::new())
        } else {
            None
        })
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(read.records))
}

/// One partition a fetch reads: from `offset`, at most `limit` bytes, if the client's
/// `leader_epoch` (-1: unsaid) is current.
#[derive(Clone)]
struct Target {
    tp: TopicPartition,
    offset: i64,
    limit: usize,
    leader_epoch: i32,
}

/// Reads every target, visiting shards one after another so the `max_bytes` budget is shared.
async fn read_all(
    ctx: &Rc<RequestContext>,
    image: &MetadataImage,
    targets: &[Target],
    max_bytes: usize,
) -> Vec<Read> {
    let mut results: Vec<Option<Read>> = vec![None; targets.len()];
    let mut by_shard: BTreeMap<ShardId, Vec<(usize, Target)>> = BTreeMap::new();
    for (i, t) in targets.iter().enumerate() {
        match ctx.shard.owner_of(image, &t.tp) {
            Ok(owner) => by_shard.entry(owner).or_default().push((i, t.clone())),
            Err(e) => results[i] = Some(failed(e)),
        }
    }
    let mut budget = max_bytes;
    let max_bytes_total = max_bytes;
    for (owner, work) in by_shard {
        let (reads, left) = ctx
            .shard
            .invoke_on(owner, move |shard| {
                let shard = shard.clone();
                async move {
                    let mut budget = budget;
                    let mut out = Vec::with_capacity(work.len());
                    for (
                        i,
                        Target {
                            tp,
                            offset,
                            limit,
                            leader_epoch,
                        },
                    ) in work
                    {
                        let read = match shard.partition(&tp) {
                            None => failed(BrokerError::UnknownTopicOrPartition),
                            Some(p) => {
                                let want = limit.min(budget);
                                let r = if let Err(e) = p.check_read(leader_epoch).await {
                                    Err(e)
                                } else if want == 0 {
                                    // Budget spent: report positions without reading.
                                    Ok(crate::partition::ReadResult {
                                        records: Bytes::new(),
                                        high_watermark: p.high_watermark(),
                                        log_start_offset: p.log_start(),
                                    })
                                } else {
                                    // KIP-74: only the response's first batch may exceed the limits.
                                    p.read(offset, want, budget == max_bytes_total).await
                                };
                                match r {
                                    Ok(r) => {
                                        budget = budget.saturating_sub(r.records.len());
                                        Read {
                                            error: None,
                                            records: r.records,
                                            high_watermark: r.high_watermark,
                                            log_start_offset: r.log_start_offset,
                                        }
                                    }
                                    Err(e) => failed(e),
                                }
                            }
                        };
                        out.push((i, read));
                    }
                    (out, budget)
                }
                .boxed_local()
            })
            .await;
        budget = left;
        for (i, r) in reads {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every target read"))
        .collect()
}

fn failed(e: BrokerError) -> Read {
    Read {
        error: Some(e),
        records: Bytes::new(),
        high_watermark: -1,
        log_start_offset: -1,
    }
}

/// Waits until some partition's HW passes the given one, or `timeout`. False on timeout.
async fn wait_for_data(
    ctx: &Rc<RequestContext>,
    image: &MetadataImage,
    seen: Vec<(TopicPartition, i64)>,
    timeout: Duration,
) -> bool {
    let mut by_shard: BTreeMap<ShardId, Vec<(TopicPartition, i64)>> = BTreeMap::new();
    for (tp, hw) in seen {
        if let Ok(owner) = ctx.shard.owner_of(image, &tp) {
            by_shard.entry(owner).or_default().push((tp, hw));
        }
    }
    if by_shard.is_empty() {
        glommio::timer::sleep(timeout).await;
        return false;
    }
    let waits = by_shard.into_iter().map(|(owner, parts)| {
        ctx.shard
            .invoke_on(owner, move |shard| {
                let shard = shard.clone();
                async move {
                    let mut changes = Vec::new();
                    for (tp, hw) in &parts {
                        if let Some(p) = shard.partition(tp) {
                            changes.push(p.hw_changed());
                            if p.high_watermark() > *hw {
                                return true;
                            }
                        }
                    }
                    if changes.is_empty() {
                        glommio::timer::sleep(timeout).await;
                        return false;
                    }
                    let timer = glommio::timer::sleep(timeout).boxed_local();
                    matches!(select(select_all(changes), timer).await, Either::Left(_))
                }
                .boxed_local()
            })
            .boxed_local()
    });
    let (woke, _, _) = select_all(waits).await;
    woke
}
