//! ConsumerGroupHeartbeat (API 68): the KIP-848 consumer protocol. A member joins with epoch
//! 0, heartbeats with its epoch and the partitions it owns, and leaves with epoch -1 (or -2
//! for a static member); the coordinator answers with its epoch and, when it changed, its
//! assignment (see `group::consumer`).

use std::collections::BTreeSet;
use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::protocol::StrBytes;

use crate::config::GroupConfig;
use crate::errors::BrokerError;
use crate::group::consumer::{self, HeartbeatRequest, HeartbeatResult, LEAVE_STATIC_EPOCH};
use crate::group::{self, GroupKind};
use crate::kafka::RequestContext;
use crate::types::now_ms;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let interval = ctx.shard.config.group.consumer_heartbeat_interval_ms;
    match heartbeat(&ctx, req).await {
        Ok(r) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(StrBytes::from_string(r.member_id)))
            .with_member_epoch(r.member_epoch)
            .with_heartbeat_interval_ms(interval)
            .with_assignment(r.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(id, ps)| {
                            TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(ps.into_iter().collect())
                        })
                        .collect(),
                )
            })),
        Err(e) => {
            tracing::debug!(error = %e, "ConsumerGroupHeartbeat refused");
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(e.code())
                .with_error_message(Some(StrBytes::from_string(e.to_string())))
        }
    }
}

/// Kafka's request checks (`throwIfConsumerGroupHeartbeatRequestIsInvalid`).
fn validate(
    req: &ConsumerGroupHeartbeatRequest,
    version: i16,
    cfg: &GroupConfig,
) -> Result<(), BrokerError> {
    let invalid = |m: &str| Err(BrokerError::InvalidRequest(m.to_string()));
    if req.group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if group::check_string(&req.group_id).is_err() {
        return Err(BrokerError::InvalidGroupId);
    }
    if req.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        return invalid("InstanceId can't be empty.");
    }
    if req.rack_id.as_ref().is_some_and(|r| r.is_empty()) {
        return invalid("RackId can't be empty.");
    }
    if (version >= 1 || req.member_epoch > 0) && req.member_id.is_empty() {
        return invalid("MemberId can't be empty.");
    }
    if req.member_epoch == 0 {
        if req.rebalance_timeout_ms == -1 {
            return invalid("RebalanceTimeoutMs must be provided in first request.");
        }
        if req.topic_partitions.as_ref().is_none_or(|t| !t.is_empty()) {
            return invalid("TopicPartitions must be empty when (re-)joining.");
        }
        if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
            return invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.");
        }
    } else if req.member_epoch == LEAVE_STATIC_EPOCH {
        if req.instance_id.is_none() {
            return invalid("InstanceId can't be null.");
        }
    } else if req.member_epoch < LEAVE_STATIC_EPOCH {
        return invalid("MemberEpoch is invalid.");
    }
    if let Some(regex) = req
        .subscribed_topic_regex
        .as_ref()
        .filter(|r| !r.is_empty())
    {
        compile(regex)?;
    }
    if let Some(a) = &req.server_assignor {
        if !cfg.consumer_assignors.iter().any(|n| n == a.as_str()) {
            return Err(BrokerError::UnsupportedAssignor(format!(
                "ServerAssignor {a} is not supported. Supported assignors: {}.",
                cfg.consumer_assignors.join(", ")
            )));
        }
    }
    Ok(())
}

async fn heartbeat(
    ctx: &RequestContext,
    req: ConsumerGroupHeartbeatRequest,
) -> Result<HeartbeatResult, BrokerError> {
    let cfg = ctx.shard.config.group.clone();
    validate(&req, ctx.version, &cfg)?;
    let group_id = req.group_id.0.to_string();
    let member_id = if req.member_id.is_empty() {
        // v0: the coordinator names the member.
        uuid::Uuid::new_v4().to_string()
    } else {
        req.member_id.to_string()
    };
    let hb = HeartbeatRequest {
        member_id,
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|i| i.to_string()),
        rack_id: req.rack_id.map(|r| r.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topics: req
            .subscribed_topic_names
            .map(|ts| ts.into_iter().map(|t| t.0.to_string()).collect()),
        subscribed_regex: req.subscribed_topic_regex.map(|r| r.to_string()),
        server_assignor: req.server_assignor.map(|a| a.to_string()),
        owned: req.topic_partitions.map(|ts| {
            let mut owned = consumer::Assignment::new();
            for t in ts {
                owned.entry(t.topic_id).or_default().extend(t.partitions);
            }
            owned
        }),
        client_id: ctx.client_id(),
        client_host: ctx.client_host.clone(),
    };
    let id = group_id.clone();
    group::on_group(&ctx.shard, &group_id, move |s, partition| {
        async move {
            let now = now_ms();
            let image = s.image();
            let resolve = |names: &BTreeSet<String>| -> consumer::TopicsMeta {
                names
                    .iter()
                    .filter_map(|n| image.topic(n).map(|t| (n.clone(), (t.id, t.partitions))))
                    .collect()
            };
            // A regular expression matches whole topic names, never the internal topic.
            let resolve_regex = |regex: &str| -> BTreeSet<String> {
                let Ok(re) = compile(regex) else {
                    return BTreeSet::new();
                };
                image
                    .topics
                    .keys()
                    .filter(|t| !group::is_internal_topic(t) && re.is_match(t))
                    .cloned()
                    .collect()
            };
            let (result, record) = {
                let mut c = s.groups.borrow_mut();
                let create = hb.member_epoch == 0;
                let g = group::consumer_group(&mut c, &id, partition.index, create, &cfg, now)?;
                let GroupKind::Consumer(cg) = &mut g.kind else {
                    unreachable!("consumer_group returns consumer groups")
                };
                let member_id = hb.member_id.clone();
                let before = (cg.epoch, cg.member_state(&member_id));
                let r = cg.heartbeat(
                    hb,
                    resolve,
                    resolve_regex,
                    cfg.consumer_session_timeout_ms,
                    cfg.consumer_max_size,
                    now,
                )?;
                let member_changed = cg.member_state(&member_id) != before.1;
                let member_records = cg.member_records(&id, &member_id);
                let mut records = Vec::new();
                if cg.epoch != before.0 {
                    records.extend(g.metadata_record(&id));
                }
                if member_changed {
                    records.extend(member_records);
                }
                (r, records)
            };
            // The group's epoch and the member's state are durable before the member hears of
            // them, so a restarted coordinator carries on from there.
            group::append(&partition, &record, now).await?;
            Ok(result)
        }
        .boxed_local()
    })
    .await
}

/// Compiles a subscription's regular expression, anchored to whole topic names as Kafka's
/// RE2J `matches` is.
fn compile(regex: &str) -> Result<regex::Regex, BrokerError> {
    regex::Regex::new(&format!("^(?:{regex})$")).map_err(|e| {
        BrokerError::InvalidRegularExpression(format!(
            "SubscribedTopicRegex `{regex}` is not a valid regular expression: {e}."
        ))
    })
}
