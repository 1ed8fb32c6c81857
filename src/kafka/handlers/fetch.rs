//! Fetch (API 1): reads from each partition up to its HW (read_committed: its LSO, with the
//! aborted transactions of what it read), long-polls on `max_wait_ms` /
//! `min_bytes`, bounds the answer by `max_bytes` (the first batch always whole, KIP-74), and
//! keeps incremental fetch sessions (KIP-227).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrolog_io::AbortedTxn;
use futures::future::{join_all, select, select_all, Either};
use futures::{stream, FutureExt, StreamExt};
use indexmap::IndexMap;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::errors::BrokerError;
use crate::fetch_session::{SessionPartition, SESSION_PARTITIONS_MAX};
use crate::kafka::RequestContext;
use crate::metadata::MetadataImage;
use crate::records;
use crate::shard::Shard;
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
    last_stable_offset: i64,
    log_start_offset: i64,
    /// read_committed: the aborted transactions among `records`.
    aborted: Option<Vec<AbortedTxn>>,
}

impl Read {
    /// Where this read had to stop: the LSO for read_committed, else the HW.
    fn upper(&self) -> i64 {
        match self.aborted {
            Some(_) => self.last_stable_offset,
            None => self.high_watermark,
        }
    }
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
            read_committed: req.isolation_level == 1,
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
            let pd = partition_data(tp.partition, read);
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

fn partition_data(partition: i32, read: Read) -> PartitionData {
    if let Some(e) = read.error {
        return error_partition(partition, e.code());
    }
    // Kafka: a list for read_committed (empty when none), null otherwise.
    let aborted = read.aborted.map(|txns| {
        txns.iter()
            .map(|t| {
                AbortedTransaction::default()
                    .with_producer_id(ProducerId(t.producer_id))
                    .with_first_offset(t.first_offset)
            })
            .collect()
    });
    PartitionData::default()
        .with_partition_index(partition)
        .with_high_watermark(read.high_watermark)
        .with_last_stable_offset(read.last_stable_offset)
        .with_log_start_offset(read.log_start_offset)
        .with_aborted_transactions(aborted)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(read.records))
}

/// One partition a fetch reads: from `offset`, at most `limit` bytes, if the client's
/// `leader_epoch` (-1: unsaid) is current; up to the LSO if `read_committed`.
#[derive(Clone)]
struct Target {
    tp: TopicPartition,
    offset: i64,
    limit: usize,
    leader_epoch: i32,
    read_committed: bool,
}

/// Most partition reads one fetch keeps in flight on a shard.
const READS_IN_FLIGHT_MAX: usize = 16;
/// Most rounds of reading again that one `read_all` makes (see `settle`).
const REREAD_ROUNDS_MAX: usize = 3;

/// One read to make: target `i` of the request, at most `want` bytes, or one whole batch
/// over that with `oversized_first` (KIP-74).
#[derive(Clone, Copy)]
struct Ask {
    i: usize,
    want: usize,
    oversized_first: bool,
}

/// Reads every target, answering as reading one partition after another would, but with
/// all shards and several partitions on each reading at once. First every partition reads
/// the share of `max_bytes` it gets if each partition before it in the request fills its
/// own share (only the first with a share may return an oversized batch); then `settle`
/// cuts the answers to what a sequential read leaves each, and the partitions that stopped
/// short of that with records left read again, together, up to `REREAD_ROUNDS_MAX` times.
async fn read_all(
    ctx: &Rc<RequestContext>,
    image: &MetadataImage,
    targets: &[Target],
    max_bytes: usize,
) -> Vec<Read> {
    let mut results = Vec::with_capacity(targets.len());
    let mut owners = Vec::with_capacity(targets.len());
    let mut asked = Vec::with_capacity(targets.len());
    let mut reads = Vec::with_capacity(targets.len());
    let mut left = max_bytes;
    for (i, t) in targets.iter().enumerate() {
        let mut ask = Ask {
            i,
            want: 0,
            oversized_first: false,
        };
        match ctx.shard.owner_of(image, &t.tp) {
            Ok(owner) => {
                ask.want = t.limit.min(left);
                ask.oversized_first = left == max_bytes && ask.want > 0;
                left -= ask.want;
                reads.push(ask);
                owners.push(Some(owner));
                // Replaced by its read below.
                results.push(failed(BrokerError::UnknownTopicOrPartition));
            }
            Err(e) => {
                owners.push(None);
                results.push(failed(e));
            }
        }
        asked.push(ask);
    }
    for _ in 0..=REREAD_ROUNDS_MAX {
        if reads.is_empty() {
            break;
        }
        for (i, r) in read_concurrently(ctx, &owners, targets, &reads).await {
            results[i] = r;
        }
        for a in &reads {
            asked[a.i] = *a;
        }
        reads = settle(targets, &asked, max_bytes, &mut results);
    }
    results
}

/// Makes `reads` (of targets whose `owners` are known), every shard at once and up to
/// `READS_IN_FLIGHT_MAX` on each.
async fn read_concurrently(
    ctx: &Rc<RequestContext>,
    owners: &[Option<ShardId>],
    targets: &[Target],
    reads: &[Ask],
) -> Vec<(usize, Read)> {
    let mut by_shard: BTreeMap<ShardId, Vec<(Ask, Target)>> = BTreeMap::new();
    for a in reads {
        let owner = owners[a.i].expect("only targets with an owner are read");
        by_shard
            .entry(owner)
            .or_default()
            .push((*a, targets[a.i].clone()));
    }
    let shard_reads = by_shard.into_iter().map(|(owner, work)| {
        ctx.shard.invoke_on(owner, move |shard| {
            let shard = shard.clone();
            stream::iter(work)
                .map(move |(a, t)| {
                    let shard = shard.clone();
                    async move { (a.i, read_one(&shard, &t, a.want, a.oversized_first).await) }
                })
                .buffered(READS_IN_FLIGHT_MAX)
                .collect::<Vec<_>>()
                .boxed_local()
        })
    });
    join_all(shard_reads).await.into_iter().flatten().collect()
}

/// Walks `results` (read as `asked`) in the request's order with the room a sequential read
/// leaves each, `min(limit, max_bytes - bytes before it)`, the first batch whole for the
/// first partition with records (KIP-74), and cuts each to the whole batches that fit.
/// Returns the reads to make again: partitions that stopped below their HW on less room
/// than they now have, given in order what the budget still holds, so that one round reads
/// at most `max_bytes` more than it had.
fn settle(targets: &[Target], asked: &[Ask], max_bytes: usize, results: &mut [Read]) -> Vec<Ask> {
    let mut used = 0;
    let mut short = Vec::new();
    for ((t, r), a) in targets.iter().zip(results.iter_mut()).zip(asked) {
        if r.error.is_some() {
            continue;
        }
        let room = t.limit.min(max_bytes.saturating_sub(used));
        let first = used == 0;
        r.records = records::leading_batches(&r.records, room, first);
        used += r.records.len();
        let end = records::next_offset(&r.records).unwrap_or(t.offset);
        let more_room = room > a.want || (first && !a.oversized_first && r.records.is_empty());
        if more_room && r.upper() > end {
            short.push((a.i, room, first, r.records.len()));
        }
    }
    let mut spare = max_bytes.saturating_sub(used);
    short
        .into_iter()
        .filter_map(|(i, room, first, had)| {
            let want = room.min(had + spare);
            if want == 0 || (want <= had && !(first && had == 0)) {
                return None;
            }
            spare -= want - had;
            Some(Ask {
                i,
                want,
                oversized_first: first,
            })
        })
        .collect()
}

/// Reads one partition on the shard that owns it: at most `want` bytes, or one whole batch
/// over that with `oversized_first` (KIP-74).
async fn read_one(shard: &Rc<Shard>, t: &Target, want: usize, oversized_first: bool) -> Read {
    let Some(p) = shard.partition(&t.tp) else {
        return failed(BrokerError::UnknownTopicOrPartition);
    };
    let r = if let Err(e) = p.check_read(t.leader_epoch).await {
        Err(e)
    } else if want == 0 {
        // No budget left: report positions without reading.
        Ok(crate::partition::ReadResult {
            records: Bytes::new(),
            high_watermark: p.high_watermark(),
            last_stable_offset: p.last_stable_offset(),
            log_start_offset: p.log_start(),
            aborted: t.read_committed.then(Vec::new),
        })
    } else {
        p.read(t.offset, want, oversized_first, t.read_committed)
            .await
    };
    match r {
        Ok(r) => Read {
            error: None,
            records: r.records,
            high_watermark: r.high_watermark,
            last_stable_offset: r.last_stable_offset,
            log_start_offset: r.log_start_offset,
            aborted: r.aborted,
        },
        Err(e) => failed(e),
    }
}

fn failed(e: BrokerError) -> Read {
    Read {
        error: Some(e),
        records: Bytes::new(),
        high_watermark: -1,
        last_stable_offset: -1,
        log_start_offset: -1,
        aborted: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferrolog_io::batch::make_batch;

    /// Target `p` of topic "t", fetched from offset 0 with `limit`.
    fn target(p: i32, limit: usize) -> Target {
        Target {
            tp: TopicPartition {
                topic: "t".into(),
                partition: p,
            },
            offset: 0,
            limit,
            leader_epoch: -1,
            read_committed: false,
        }
    }

    /// `batches` batches of 10 records from offset 0, and a HW of `hw`.
    fn read(batches: i64, hw: i64) -> Read {
        let bytes: Vec<u8> = (0..batches)
            .flat_map(|b| make_batch(b * 10, 10, 0, 50))
            .collect();
        Read {
            error: None,
            records: Bytes::from(bytes),
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
            aborted: None,
        }
    }

    fn ask(i: usize, want: usize, oversized_first: bool) -> Ask {
        Ask {
            i,
            want,
            oversized_first,
        }
    }

    #[test]
    fn settle_cuts_to_what_a_sequential_read_leaves_and_reads_short_partitions_again() {
        let batch = make_batch(0, 10, 0, 50).len();
        let max_bytes = 5 * batch;
        let targets = [
            target(0, 3 * batch),
            target(1, 3 * batch),
            target(2, 3 * batch),
        ];
        // Shares: 3, 2 and 0 batches. Partition 0 is caught up with one batch; 1 filled
        // its share and has more; 2 read nothing on its share of 0.
        let asked = [
            ask(0, 3 * batch, true),
            ask(1, 2 * batch, false),
            ask(2, 0, false),
        ];
        let mut results = [read(1, 10), read(2, 100), read(0, 100)];
        let again = settle(&targets, &asked, max_bytes, &mut results);
        assert_eq!(
            results.iter().map(|r| r.records.len()).collect::<Vec<_>>(),
            [batch, 2 * batch, 0]
        );
        // 2 batches spare: partition 1 may now have 3, and partition 2 the one left.
        let again: Vec<_> = again
            .iter()
            .map(|a| (a.i, a.want, a.oversized_first))
            .collect();
        assert_eq!(again, [(1, 3 * batch, false), (2, batch, false)]);

        // Reads over the room a sequential read leaves are cut to whole batches, and an
        // oversized first batch is kept only for the first partition with records.
        let asked = [
            ask(0, 3 * batch, true),
            ask(1, 3 * batch, false),
            ask(2, 3 * batch, false),
        ];
        let mut results = [read(0, 0), read(3, 30), read(3, 30)];
        let again = settle(&targets, &asked, 2 * batch - 1, &mut results);
        assert_eq!(
            results.iter().map(|r| r.records.len()).collect::<Vec<_>>(),
            [0, batch, 0]
        );
        assert!(again.is_empty());
    }

    #[test]
    fn settle_gives_an_oversized_batch_to_the_first_partition_with_records() {
        let batch = make_batch(0, 10, 0, 50).len();
        let targets = [target(0, batch), target(1, batch / 2)];
        // Partition 0 is caught up; 1's first batch is over its limit and it was not
        // allowed an oversized one.
        let asked = [ask(0, batch, true), ask(1, batch / 2, false)];
        let mut results = [read(0, 0), read(0, 10)];
        let again = settle(&targets, &asked, 10 * batch, &mut results);
        let again: Vec<_> = again
            .iter()
            .map(|a| (a.i, a.want, a.oversized_first))
            .collect();
        assert_eq!(again, [(1, batch / 2, true)]);
    }
}
