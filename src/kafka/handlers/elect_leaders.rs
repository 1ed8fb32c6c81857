//! ElectLeaders (API 43): move partitions' leadership back to their preferred replica (the
//! first of the assignment), as `kafka-leader-election.sh` asks.
//!
//! A partition's leader is whoever its Raft group elected, so a preferred election is a
//! Raft leadership transfer (`replication::preferred`): the node that takes the request
//! asks the current leader (on itself, or on a peer over the Raft transport) to hand the
//! group to the preferred replica. That leader stops taking writes, waits up to 1 s for the
//! preferred replica to hold its whole log, then starts openraft's transfer, and the
//! preferred replica stands for election with a vote the others grant although the old
//! leader's lease runs; a replica that does not catch up in time is PREFERRED_LEADER_NOT_
//! AVAILABLE, and the leader leads on. The answer comes once the metadata shows the
//! preferred replica leading, or REQUEST_TIMED_OUT after `timeout_ms` (at most `WAIT_MAX`,
//! so it comes before the client gives up). Kafka's controller answers once it has
//! recorded the new leader, which its brokers then take up; here the leader moves first
//! and the metadata follows, so the wait covers both.
//!
//! Raft elects only a replica with every committed entry, so there is no unclean election:
//! a partition with a leader needs none, one without a leader has no eligible replica. As
//! in Kafka, a request for every partition (a null list) leaves out those that needed no
//! election, and an unknown election type is INVALID_REQUEST for all.

use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use ferrolog_raft::wire::Handover;

use crate::errors::BrokerError;
use crate::kafka::RequestContext;
use crate::replication::preferred::{ask_to_hand_over, preferred_eligible};
use crate::types::TopicPartition;

/// Kafka's `ElectionType`: 0 PREFERRED, 1 UNCLEAN.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;
/// The longest an election is waited for (kafka-leader-election.sh's requests time out after
/// 15 s).
const WAIT_MAX: Duration = Duration::from_secs(10);
/// How often the metadata is looked at while a handover runs.
const POLL: Duration = Duration::from_millis(50);
/// How soon a leader that did not take an ask (it does not lead, or did not answer) is
/// asked again.
const REASK_AFTER: Duration = Duration::from_millis(500);

pub async fn handle(ctx: Rc<RequestContext>, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let wait = Duration::from_millis(req.timeout_ms.max(0) as u64).min(WAIT_MAX);
    let deadline = Instant::now() + wait;
    let unclean = req.election_type == UNCLEAN;
    let unknown_type = !matches!(req.election_type, PREFERRED | UNCLEAN);
    let every_partition = req.topic_partitions.is_none();
    let image = ctx.shard.image();
    // No list means every partition of the cluster.
    let wanted: Vec<(TopicName, Vec<i32>)> = match req.topic_partitions {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.topic, t.partitions))
            .collect(),
        None => image
            .topics
            .values()
            .map(|t| {
                let name = TopicName(StrBytes::from_string(t.name.clone()));
                (name, (0..t.partitions).collect())
            })
            .collect(),
    };
    let everything = wanted.iter().map(|(topic, partitions)| {
        let ctx = ctx.clone();
        async move {
            let elections = partitions.iter().map(|&p| {
                let tp = TopicPartition {
                    topic: topic.0.to_string(),
                    partition: p,
                };
                let ctx = ctx.clone();
                async move {
                    let result = PartitionResult::default().with_partition_id(p);
                    let elected = if unknown_type {
                        Err(BrokerError::InvalidRequest(
                            "Unknown election type".to_string(),
                        ))
                    } else {
                        elect(&ctx, tp, unclean, deadline).await
                    };
                    match elected {
                        Ok(()) => Some(result),
                        Err(BrokerError::ElectionNotNeeded) if every_partition => None,
                        Err(e) => Some(
                            result
                                .with_error_code(e.code())
                                .with_error_message(Some(StrBytes::from_string(e.to_string()))),
                        ),
                    }
                }
            });
            let results = futures::future::join_all(elections).await;
            ReplicaElectionResult::default()
                .with_topic(topic.clone())
                .with_partition_result(results.into_iter().flatten().collect())
        }
    });
    let error_code = if unknown_type {
        BrokerError::InvalidRequest(String::new()).code()
    } else {
        0
    };
    ElectLeadersResponse::default()
        .with_error_code(error_code)
        .with_replica_election_results(futures::future::join_all(everything).await)
}

/// Elects `tp`'s preferred replica, as the module says. The leader is asked once; again
/// only if it answered that it does not lead (the metadata was behind) or did not answer.
async fn elect(
    ctx: &RequestContext,
    tp: TopicPartition,
    unclean: bool,
    deadline: Instant,
) -> Result<(), BrokerError> {
    let mut started = false;
    let mut asked_at: Option<Instant> = None;
    loop {
        let image = ctx.shard.image();
        let meta = image
            .topic(&tp.topic)
            .ok_or(BrokerError::UnknownTopicOrPartition)?;
        let replicas = usize::try_from(tp.partition)
            .ok()
            .and_then(|p| meta.replicas.get(p))
            .ok_or(BrokerError::UnknownTopicOrPartition)?;
        let leadership = meta.leadership(tp.partition, &image);
        if unclean {
            return match leadership {
                Some(_) => Err(BrokerError::ElectionNotNeeded),
                None => Err(BrokerError::EligibleLeadersNotAvailable(format!(
                    "{tp} has no leader, and Raft elects one only from a quorum of replicas \
                     with every committed record: there is no unclean election"
                ))),
            };
        }
        let preferred = replicas[0];
        match leadership {
            Some(l) if l.leader == preferred => {
                return match started {
                    true => Ok(()),
                    false => Err(BrokerError::ElectionNotNeeded),
                };
            }
            // Between two leaders, or a new leader yet to report: the handover runs.
            _ if started => {}
            None => {
                return Err(BrokerError::PreferredLeaderNotAvailable(format!(
                    "{tp} has no leader at the moment: its replicas are electing one"
                )))
            }
            Some(l) if preferred_eligible(meta, tp.partition, &l, &image).is_none() => {
                return Err(BrokerError::PreferredLeaderNotAvailable(format!(
                    "the preferred replica {preferred} of {tp} is not live and in sync"
                )))
            }
            Some(l) => {
                if asked_at.is_none_or(|t| t.elapsed() >= REASK_AFTER) {
                    asked_at = Some(Instant::now());
                    let group = meta.raft_group(tp.partition);
                    match ask_to_hand_over(&ctx.shard, &tp, group, l.leader, preferred).await {
                        Handover::Started => started = true,
                        Handover::NotLeader => {}
                        Handover::Behind => {
                            return Err(BrokerError::PreferredLeaderNotAvailable(format!(
                                "the preferred replica {preferred} of {tp} did not catch up \
                                 with its leader {} in time, or its node does not answer",
                                l.leader
                            )))
                        }
                    }
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(BrokerError::RequestTimedOut(format!(
                "the preferred replica {preferred} of {tp} did not take over in time"
            )));
        }
        glommio::timer::sleep(POLL).await;
    }
}
