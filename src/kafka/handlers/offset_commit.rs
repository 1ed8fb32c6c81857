//! OffsetCommit (API 8): stores a group's consumed positions in `__consumer_offsets`,
//! answered, and shown to OffsetFetch, once they are durable (`group::write_offsets`).
//! Commits without a generation come from admins or standalone consumers and create a group
//! that only has offsets, as in Kafka.

use std::collections::BTreeMap;
use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};

use crate::errors::BrokerError;
use crate::group::codec::OffsetValue;
use crate::group::{self, Group};
use crate::kafka::RequestContext;
use crate::types::now_ms;

/// (topic, partition, offset, leader epoch, metadata) per partition of the request.
type Commit = (String, i32, i64, i32, Option<String>);

pub async fn handle(ctx: Rc<RequestContext>, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let image = ctx.shard.image();
    let mut commits: Vec<Commit> = Vec::new();
    let mut unknown: Vec<(String, i32)> = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        let partitions = image.topic(&name).map_or(0, |m| m.partitions);
        for p in &t.partitions {
            if p.partition_index < 0 || p.partition_index >= partitions {
                unknown.push((name.clone(), p.partition_index));
            } else {
                commits.push((
                    name.clone(),
                    p.partition_index,
                    p.committed_offset,
                    p.committed_leader_epoch,
                    p.committed_metadata.as_ref().map(|m| m.to_string()),
                ));
            }
        }
    }
    let results = commit(&ctx, &req, commits.clone()).await;
    let mut by_topic: BTreeMap<String, Vec<OffsetCommitResponsePartition>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut push = |topic: &str, partition: i32, code: i16| {
        if !by_topic.contains_key(topic) {
            order.push(topic.to_string());
        }
        by_topic.entry(topic.to_string()).or_default().push(
            OffsetCommitResponsePartition::default()
                .with_partition_index(partition)
                .with_error_code(code),
        );
    };
    match results {
        Ok(codes) => {
            for ((topic, partition, ..), code) in commits.iter().zip(codes) {
                push(topic, *partition, code);
            }
        }
        Err(e) => {
            for (topic, partition, ..) in &commits {
                push(topic, *partition, e.code());
            }
        }
    }
    for (topic, partition) in &unknown {
        push(
            topic,
            *partition,
            BrokerError::UnknownTopicOrPartition.code(),
        );
    }
    OffsetCommitResponse::default().with_topics(
        order
            .into_iter()
            .map(|t| {
                let partitions = by_topic.remove(&t).unwrap_or_default();
                OffsetCommitResponseTopic::default()
                    .with_name(kafka_protocol::messages::TopicName(t.into()))
                    .with_partitions(partitions)
            })
            .collect(),
    )
}

/// Validates the commit on the coordinator and writes it; per partition an error code.
async fn commit(
    ctx: &RequestContext,
    req: &OffsetCommitRequest,
    commits: Vec<Commit>,
) -> Result<Vec<i16>, BrokerError> {
    let group_id = req.group_id.0.to_string();
    // Kafka accepts the empty group id for offsets.
    if group::check_string(&group_id).is_err() {
        return Err(BrokerError::InvalidGroupId);
    }
    let version = ctx.version;
    let member_id = req.member_id.to_string();
    let instance_id = req.group_instance_id.as_ref().map(|i| i.to_string());
    let generation = req.generation_id_or_member_epoch;
    let cfg = ctx.shard.config.group.clone();
    let id = group_id.clone();
    group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let now = now_ms();
            let mut changes = Vec::new();
            let mut codes = Vec::with_capacity(commits.len());
            {
                let mut c = s.groups.borrow_mut();
                if !c.groups.contains_key(&id) {
                    if generation >= 0 {
                        // OffsetCommit v9+ says so; older clients understand ILLEGAL_GENERATION.
                        return Err(if version >= 9 {
                            BrokerError::GroupIdNotFound(format!("Group {id} not found."))
                        } else {
                            BrokerError::IllegalGeneration
                        });
                    }
                    c.groups
                        .insert(id.clone(), Group::offsets_only(partition.index, &cfg, now));
                }
                let g = c.groups.get_mut(&id).expect("present");
                g.validate_offset_commit(
                    &member_id,
                    instance_id.as_deref(),
                    generation,
                    version,
                    now,
                )?;
                for (topic, p, offset, leader_epoch, metadata) in commits {
                    let metadata = metadata.unwrap_or_default();
                    // The record stores it as an int16-length string.
                    if metadata.len() > cfg.offset_metadata_max_bytes.min(group::STRING_BYTES_MAX) {
                        codes.push(BrokerError::OffsetMetadataTooLarge.code());
                        continue;
                    }
                    let value = OffsetValue {
                        offset,
                        leader_epoch,
                        metadata,
                        commit_timestamp_ms: now,
                    };
                    changes.push(((topic, p), Some(value)));
                    codes.push(0);
                }
            }
            group::write_offsets(&s.groups, partition.index, &partition, &id, changes, now).await?;
            Ok(codes)
        }
        .boxed_local()
    })
    .await
}
