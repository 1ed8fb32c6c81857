//! TxnOffsetCommit (API 28), v0-4: a consumer group's offsets as part of a producer's
//! transaction (KIP-447), at the group's coordinator. The group checks the member and
//! generation as for OffsetCommit (v3+ send them); the transaction's coordinator confirms the
//! group's offsets partition is in the transaction (AddOffsetsToTxn); the offsets are written
//! as a transactional batch of the producer and show once its commit marker is written there
//! (`group::write_txn_offsets`). (v5 belongs to KIP-890's transaction.version 2.)

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};

use crate::errors::BrokerError;
use crate::group::{self, codec::OffsetValue, Group, OFFSETS_TOPIC};
use crate::kafka::RequestContext;
use crate::txn;
use crate::types::now_ms;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let image = ctx.shard.image();
    let known = |t: &str, p: i32| image.topic(t).is_some_and(|m| p >= 0 && p < m.partitions);
    // The record stores metadata as an int16-length string, as OffsetCommit checks it.
    let max_metadata = ctx
        .shard
        .config
        .group
        .offset_metadata_max_bytes
        .min(group::STRING_BYTES_MAX);
    let too_large = |m: &Option<kafka_protocol::protocol::StrBytes>| {
        m.as_ref().is_some_and(|m| m.len() > max_metadata)
    };
    let mut commits = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            if known(&t.name, p.partition_index) && !too_large(&p.committed_metadata) {
                let value = OffsetValue {
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    commit_timestamp_ms: now_ms(),
                };
                commits.push(((t.name.0.to_string(), p.partition_index), Some(value)));
            }
        }
    }
    let result = commit(&ctx, &req, commits).await;
    let code =
        |t: &str, p: i32, metadata: &Option<kafka_protocol::protocol::StrBytes>| match &result {
            _ if !known(t, p) => BrokerError::UnknownTopicOrPartition.code(),
            _ if too_large(metadata) => BrokerError::OffsetMetadataTooLarge.code(),
            Ok(()) => 0,
            // COORDINATOR_LOAD_IN_PROGRESS is new in v2 here.
            Err(BrokerError::CoordinatorLoadInProgress) if ctx.version < 2 => {
                BrokerError::CoordinatorNotAvailable(String::new()).code()
            }
            // PRODUCER_FENCED is new in v2.
            Err(e) => e.code_for(ctx.version, 2),
        };
    let topics = req
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code(
                                    &t.name,
                                    p.partition_index,
                                    &p.committed_metadata,
                                ))
                        })
                        .collect(),
                )
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

async fn commit(
    ctx: &Rc<RequestContext>,
    req: &TxnOffsetCommitRequest,
    changes: Vec<group::OffsetChange>,
) -> Result<(), BrokerError> {
    let group_id = req.group_id.0.to_string();
    if group::check_string(&group_id).is_err() {
        return Err(BrokerError::InvalidGroupId);
    }
    let (producer_id, epoch) = (req.producer_id.0, req.producer_epoch);
    let transactional_id = req.transactional_id.0.to_string();
    let member_id = req.member_id.to_string();
    let instance_id = req.group_instance_id.as_ref().map(|i| i.to_string());
    let generation = req.generation_id;
    let version = ctx.version;
    let cfg = ctx.shard.config.group.clone();
    let id = group_id.clone();
    group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            // The group's offsets partition must be in the transaction (AddOffsetsToTxn),
            // or the offsets would open a transaction there that nothing closes; the guard,
            // taken first, is revoked by any marker meanwhile (as for Produce).
            let guard = partition.verification_guard(producer_id)?;
            if guard.is_some() {
                let at = (OFFSETS_TOPIC.to_string(), partition.index);
                txn::verify(&s, transactional_id, producer_id, epoch, at).await?;
            }
            let now = now_ms();
            {
                let mut c = s.groups.borrow_mut();
                if !c.groups.contains_key(&id) {
                    if generation >= 0 {
                        return Err(BrokerError::IllegalGeneration);
                    }
                    c.groups
                        .insert(id.clone(), Group::offsets_only(partition.index, &cfg, now));
                }
                let g = c.groups.get_mut(&id).expect("present");
                // Before v3 the request names no member: nothing to check.
                if version >= 3 {
                    g.validate_offset_commit(
                        &member_id,
                        instance_id.as_deref(),
                        generation,
                        9,
                        now,
                    )?;
                }
            }
            group::write_txn_offsets(
                &s.groups,
                partition.index,
                &partition,
                &id,
                producer_id,
                epoch,
                guard,
                changes,
                now,
            )
            .await
        }
        .boxed_local()
    })
    .await
}
