//! Preferred-leader elections: moving a partition's Raft leadership to its preferred replica
//! (the first of its assignment), for ElectLeaders (`kafka::handlers::elect_leaders`) and for
//! Kafka's automatic leader balancing (`auto.leader.rebalance.enable`, on by default).
//!
//! A move is asked of the node that leads the partition (this one, or a peer over the Raft
//! transport: `Transport::elect_on`), whose replica then hands its group over
//! (`Replica::hand_over`, openraft's leadership transfer). Whether the move happened shows
//! in the metadata once the new leader reported itself.

use std::rc::{Rc, Weak};
use std::time::Duration;

use ferrolog_raft::wire::{GroupId, Handover};
use futures::{FutureExt, StreamExt};

use crate::metadata::{LeaderRecord, MetadataImage, TopicMeta};
use crate::shard::Shard;
use crate::types::TopicPartition;

/// How long a peer gets to answer an ask to hand over.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Partitions one balancing pass moves at most, as Kafka's controller does.
const BALANCE_PASS_MAX: usize = 1000;
/// Asks of one balancing pass in flight at once.
const BALANCE_PARALLEL: usize = 16;

/// Whether `topic`'s partition led as `l` may be handed to its preferred replica: it is in
/// sync and its broker is live.
pub fn preferred_eligible(
    topic: &TopicMeta,
    partition: i32,
    l: &LeaderRecord,
    image: &MetadataImage,
) -> Option<i32> {
    let preferred = *topic
        .replicas
        .get(usize::try_from(partition).ok()?)?
        .first()?;
    let live = image.brokers.get(&preferred).is_some_and(|b| !b.fenced);
    (l.isr.contains(&preferred) && live).then_some(preferred)
}

/// Asks node `leader` to hand `tp`'s group to node `to`. An ask that went unanswered counts
/// as `NotLeader`: the caller may ask again.
pub async fn ask_to_hand_over(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    group: GroupId,
    leader: i32,
    to: i32,
) -> Handover {
    let handover = if leader == shard.config.node_id {
        let ask = shard.on_partition(tp.clone(), move |part| {
            async move { Ok(part.replication.hand_over(to).await) }.boxed_local()
        });
        ask.await.unwrap_or(Handover::NotLeader)
    } else {
        match shard.config.voters.get(&leader) {
            Some(addr) => shard
                .raft_transport
                .elect_on(
                    leader as u64,
                    &addr.to_string(),
                    group,
                    to as u64,
                    ASK_TIMEOUT,
                )
                .await
                .unwrap_or(Handover::NotLeader),
            None => Handover::NotLeader,
        }
    };
    tracing::info!(%tp, leader, to, ?handover, "preferred leader election");
    handover
}

/// Kafka's automatic leader balancing, on shard 0: every `interval`, while this node leads
/// the controller quorum, each replicated partition led by another replica than its
/// preferred one, that replica being live and in sync, is asked to move (up to
/// `BALANCE_PASS_MAX` per pass). A move that does not happen is asked again next pass.
pub async fn balance_leaders(shard: Weak<Shard>, interval: Duration) {
    loop {
        glommio::timer::sleep(interval).await;
        let Some(shard) = shard.upgrade() else {
            return;
        };
        let leads = shard
            .quorum()
            .is_some_and(|q| q.leader() == Some(shard.config.node_id));
        if !leads {
            continue;
        }
        let image = shard.image();
        let mut moves = Vec::new();
        for topic in image.topics.values() {
            for partition in 0..topic.partitions {
                let Some(l) = topic.leadership(partition, &image) else {
                    continue;
                };
                match preferred_eligible(topic, partition, &l, &image) {
                    Some(preferred) if preferred != l.leader => {
                        let tp = TopicPartition {
                            topic: topic.name.clone(),
                            partition,
                        };
                        moves.push((tp, topic.raft_group(partition), l.leader, preferred));
                    }
                    _ => {}
                }
            }
        }
        moves.truncate(BALANCE_PASS_MAX);
        if moves.is_empty() {
            continue;
        }
        tracing::info!(
            partitions = moves.len(),
            "leader balancing: moving partitions back to their preferred replicas"
        );
        futures::stream::iter(moves)
            .for_each_concurrent(BALANCE_PARALLEL, |(tp, group, leader, to)| {
                let shard = shard.clone();
                async move {
                    ask_to_hand_over(&shard, &tp, group, leader, to).await;
                }
            })
            .await;
    }
}
