//! OffsetFetch (API 9): a group's committed offsets, for some partitions or all of them;
//! v8+ asks for several groups at once. An unknown group or partition has offset -1. With
//! `require_stable` (v7+, what read_committed consumers send), a partition with offsets of
//! an open transaction pending (KIP-447) answers UNSTABLE_OFFSET_COMMIT, and the client asks
//! again.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group::codec::OffsetValue;
use crate::group::{self, GroupKind};
use crate::kafka::RequestContext;

/// Requested partitions by topic (None: every committed offset).
type Wanted = Option<Vec<(String, Vec<i32>)>>;
/// Per topic, per partition: the committed offset, if any, or the partition's error code.
type Fetched = Vec<(String, Vec<(i32, Result<Option<OffsetValue>, i16>)>)>;

/// Kafka's UNSTABLE_OFFSET_COMMIT.
const UNSTABLE_OFFSET_COMMIT: i16 = 88;

/// v0-7 and v8+ use distinct, same-shaped structs for topics and partitions: these build
/// either from the same values.
macro_rules! wanted {
    ($topics:expr) => {
        $topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes))
                .collect()
        })
    };
}

macro_rules! response_topics {
    ($topic:ident, $partition:ident, $fetched:expr) => {
        $fetched
            .into_iter()
            .map(|(name, parts)| {
                $topic::default()
                    .with_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(
                        parts
                            .into_iter()
                            .map(|(p, v)| {
                                let error = v.as_ref().err().copied().unwrap_or(0);
                                let (offset, epoch, metadata) = fields(v.ok().flatten());
                                $partition::default()
                                    .with_partition_index(p)
                                    .with_error_code(error)
                                    .with_committed_offset(offset)
                                    .with_committed_leader_epoch(epoch)
                                    .with_metadata(Some(metadata))
                            })
                            .collect(),
                    )
            })
            .collect()
    };
}

pub async fn handle(ctx: Rc<RequestContext>, req: OffsetFetchRequest) -> OffsetFetchResponse {
    if ctx.version < 8 {
        let group = req.group_id.0.to_string();
        let stable = ctx.version >= 7 && req.require_stable;
        let (topics, error) =
            split(fetch(&ctx, group, None, -1, stable, wanted!(req.topics)).await);
        return OffsetFetchResponse::default()
            .with_error_code(error)
            .with_topics(response_topics!(
                OffsetFetchResponseTopic,
                OffsetFetchResponsePartition,
                topics
            ));
    }
    let mut groups = Vec::with_capacity(req.groups.len());
    for g in req.groups {
        let member = g.member_id.map(|m| m.to_string());
        let group = g.group_id.0.to_string();
        let stable = req.require_stable;
        let fetched = fetch(
            &ctx,
            group,
            member,
            g.member_epoch,
            stable,
            wanted!(g.topics),
        )
        .await;
        let (topics, error) = split(fetched);
        groups.push(
            OffsetFetchResponseGroup::default()
                .with_group_id(g.group_id)
                .with_error_code(error)
                .with_topics(response_topics!(
                    OffsetFetchResponseTopics,
                    OffsetFetchResponsePartitions,
                    topics
                )),
        );
    }
    OffsetFetchResponse::default().with_groups(groups)
}

/// A group's offsets and error code (no offsets when the whole group failed).
fn split(r: Result<Fetched, BrokerError>) -> (Fetched, i16) {
    match r {
        Ok(t) => (t, 0),
        Err(e) => (Vec::new(), e.code()),
    }
}

fn fields(v: Option<OffsetValue>) -> (i64, i32, StrBytes) {
    match v {
        Some(v) => (v.offset, v.leader_epoch, StrBytes::from_string(v.metadata)),
        None => (-1, -1, StrBytes::default()),
    }
}

async fn fetch(
    ctx: &RequestContext,
    group_id: String,
    member_id: Option<String>,
    member_epoch: i32,
    require_stable: bool,
    wanted: Wanted,
) -> Result<Fetched, BrokerError> {
    let id = group_id.clone();
    group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let c = s.groups.borrow();
            let g = c.groups.get(&id);
            // KIP-848 members name themselves so a fenced member cannot read stale offsets.
            if let (Some(g), Some(member)) = (g, member_id.as_deref()) {
                if let GroupKind::Consumer(cg) = &g.kind {
                    if !member.is_empty() || member_epoch >= 0 {
                        cg.check_member_epoch(member, member_epoch)?;
                    }
                }
            }
            let unstable =
                |key: &(String, i32)| require_stable && c.has_txn_offset(partition.index, &id, key);
            let lookup = |t: &str, p: i32| {
                let key = (t.to_string(), p);
                match unstable(&key) {
                    true => Err(UNSTABLE_OFFSET_COMMIT),
                    false => Ok(g.and_then(|g| g.offsets.get(&key).cloned())),
                }
            };
            Ok(match wanted {
                Some(topics) => topics
                    .into_iter()
                    .map(|(t, ps)| {
                        let parts = ps.into_iter().map(|p| (p, lookup(&t, p))).collect();
                        (t, parts)
                    })
                    .collect(),
                None => {
                    let mut out: Fetched = Vec::new();
                    for ((t, p), v) in g.map(|g| g.offsets.iter()).into_iter().flatten() {
                        let v = match unstable(&(t.clone(), *p)) {
                            true => Err(UNSTABLE_OFFSET_COMMIT),
                            false => Ok(Some(v.clone())),
                        };
                        match out.last_mut() {
                            Some((last, parts)) if last == t => parts.push((*p, v)),
                            _ => out.push((t.clone(), vec![(*p, v)])),
                        }
                    }
                    out
                }
            })
        }
        .boxed_local()
    })
    .await
}
