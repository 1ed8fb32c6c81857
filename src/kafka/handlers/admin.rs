//! Topic changes made by the controller (shard 0) on behalf of CreateTopics, DeleteTopics,
//! CreatePartitions, the AlterConfigs APIs and Metadata auto-creation.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use uuid::Uuid;

use crate::config::{topic_config_def, validate_value};
use crate::errors::BrokerError;
use crate::kafka::handlers::incremental_alter_configs::apply_ops;
use crate::metadata::{assign_replicas, validate_topic_name, BrokerRecord, TopicRecord};
use crate::quorum::{forward_to_controller, Forwarded};
use crate::shard::Shard;

/// How long AlterConfigs and IncrementalAlterConfigs, whose requests carry no timeout, wait
/// for a controller leader.
pub const CONTROLLER_CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request for the controller waits before asking again while its leader moves.
const CONTROLLER_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// How long one forwarded request waits for the controller leader's answer: a leader that
/// died may leave a connection nobody answers on, and the next try may find its successor.
const FORWARD_TTL_MIN: Duration = Duration::from_millis(500);
const FORWARD_TTL_MAX: Duration = Duration::from_secs(3);

/// Most partitions one topic may have.
pub const PARTITIONS_MAX: i32 = 100_000;

/// A topic to create.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TopicSpec {
    pub name: String,
    /// -1: `num.partitions`.
    pub partitions: i32,
    /// -1: `default.replication.factor`.
    pub replication_factor: i16,
    /// A manual assignment (CreateTopics `assignments`): each partition's replicas.
    #[serde(default)]
    pub assignment: Option<Vec<Vec<i32>>>,
    pub configs: BTreeMap<String, String>,
}

/// Checks topic config overrides against the table of Kafka's topic configs.
pub fn validate_configs(configs: &BTreeMap<String, String>) -> Result<(), BrokerError> {
    for (k, v) in configs {
        let def = topic_config_def(k)
            .ok_or_else(|| BrokerError::InvalidConfig(format!("Unknown topic config name: {k}")))?;
        validate_value(def, v).map_err(BrokerError::InvalidConfig)?;
        if !def.honoured {
            tracing::warn!(config = %k, value = %v, "topic config is stored and described but has no effect in ferrolog yet");
        }
    }
    Ok(())
}

/// Creates topics (or only validates them); returns per topic its id and partition count.
pub async fn create_topics(
    shard: &Rc<Shard>,
    specs: Vec<TopicSpec>,
    validate_only: bool,
) -> Vec<Result<(Uuid, i32), BrokerError>> {
    shard
        .on_controller(move |shard| {
            async move {
                let num_partitions = shard.config.num_partitions;
                let default_rf = shard.config.default_replication_factor;
                let mut results = Vec::with_capacity(specs.len());
                let mut created = Vec::new();
                for spec in specs {
                    let r = shard.with_controller(|c| {
                        validate_topic_name(&spec.name).map_err(|m| BrokerError::InvalidTopic(format!("Topic name is invalid: {m}")))?;
                        if c.topic_mut(&spec.name).is_some() {
                            return Err(BrokerError::TopicAlreadyExists(spec.name.clone()));
                        }
                        if let Some(other) = c.collides(&spec.name) {
                            return Err(BrokerError::InvalidTopic(format!(
                                "Topic '{}' collides with existing topic: {other}",
                                spec.name
                            )));
                        }
                        let partitions = if spec.partitions == -1 { num_partitions } else { spec.partitions };
                        if partitions <= 0 || partitions > PARTITIONS_MAX {
                            return Err(BrokerError::InvalidPartitions(format!(
                                "Number of partitions must be between 1 and {PARTITIONS_MAX}, got {partitions}."
                            )));
                        }
                        if spec.replication_factor == 0 || spec.replication_factor < -1 {
                            return Err(BrokerError::InvalidReplicationFactor(
                                "Replication factor must be larger than 0, or -1 to use the default value.".into(),
                            ));
                        }
                        let rf = if spec.replication_factor == -1 {
                            default_rf
                        } else {
                            spec.replication_factor
                        };
                        let salt = c.state.topics.len();
                        let replicas = match &spec.assignment {
                            Some(manual) => {
                                // Kafka: every named broker must be registered, no partition
                                // may name one twice.
                                let known = manual.iter().flatten().all(|b| c.state.brokers.contains_key(b));
                                let distinct = manual.iter().all(|r| {
                                    let mut sorted = r.clone();
                                    sorted.sort_unstable();
                                    sorted.dedup();
                                    sorted.len() == r.len() && !r.is_empty()
                                });
                                if !known || !distinct {
                                    return Err(BrokerError::InvalidReplicationFactor(
                                        "Replica assignment names unknown brokers.".into(),
                                    ));
                                }
                                manual.clone()
                            }
                            None => assign_replicas(&c.state.brokers, 0, partitions, rf, salt)
                                .map_err(BrokerError::InvalidReplicationFactor)?,
                        };
                        validate_configs(&spec.configs)?;
                        let id = Uuid::new_v4();
                        if !validate_only {
                            let number = c.state.next_raft_number;
                            if number >= 1 << 30 {
                                return Err(BrokerError::InvalidRequest(
                                    "the cluster has run out of topic numbers".into(),
                                ));
                            }
                            c.state.next_raft_number = number + 1;
                            c.state.topics.push(TopicRecord {
                                name: spec.name.clone(),
                                id,
                                partitions,
                                configs: spec.configs.clone(),
                                replicas,
                                raft_number: Some(number),
                            });
                        }
                        Ok((id, partitions))
                    });
                    if r.is_ok() && !validate_only {
                        created.push(spec.name);
                    }
                    results.push(r);
                }
                if !created.is_empty() {
                    // A node that does not lead the controller fails here (NOT_CONTROLLER),
                    // and the caller forwards.
                    if let Err(e) = shard.commit_metadata().await {
                        return results.into_iter().map(|_| Err(e.clone())).collect();
                    }
                    for topic in created {
                        tracing::info!(%topic, "created topic");
                    }
                }
                results
            }
            .boxed_local()
        })
        .await
}

/// Creates topics at the controller leader: here when this node leads the controller
/// quorum, otherwise forwarded to the leader (`at_controller`). Waits (briefly) until the
/// local image has the topics created.
pub async fn create_topics_anywhere(
    shard: &Rc<Shard>,
    specs: Vec<TopicSpec>,
    validate_only: bool,
    deadline: Instant,
) -> Vec<Result<(Uuid, i32), BrokerError>> {
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let here = create_topics(shard, specs.clone(), validate_only).await;
    let forward = |specs: Vec<TopicSpec>, ttl| {
        let n = specs.len();
        forward_to_controller(shard, Forwarded::CreateTopics(specs), n, ttl)
    };
    let results = at_controller(specs, here, forward, deadline).await;
    for _ in 0..40 {
        let image = shard.image();
        let missing = names
            .iter()
            .zip(&results)
            .any(|(n, r)| r.is_ok() && !validate_only && image.topic(n).is_none());
        if !missing {
            break;
        }
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    results
}

/// Deletes topics at the controller leader (see `create_topics_anywhere`).
pub async fn delete_topics_anywhere(
    shard: &Rc<Shard>,
    names: Vec<String>,
    deadline: Instant,
) -> Vec<Result<Uuid, BrokerError>> {
    let here = delete_topics(shard, names.clone()).await;
    let forward = |names: Vec<String>, ttl| {
        let n = names.len();
        forward_to_controller(shard, Forwarded::DeleteTopics(names), n, ttl)
    };
    at_controller(names, here, forward, deadline).await
}

/// Changes one topic at the controller leader (see `create_topics_anywhere`).
pub async fn change_topic_anywhere(
    shard: &Rc<Shard>,
    name: String,
    change: TopicChange,
    validate_only: bool,
    deadline: Instant,
) -> Result<(), BrokerError> {
    let here = change_topic(shard, name.clone(), change.clone(), validate_only).await;
    let forward = |_: Vec<()>, ttl| {
        let request = Forwarded::ChangeTopic {
            name: name.clone(),
            change: change.clone(),
            validate_only,
        };
        forward_to_controller(shard, request, 1, ttl)
    };
    let mut results = at_controller(vec![()], vec![here], forward, deadline).await;
    results.remove(0)
}

/// Finishes a controller change that this node tried first (`here`, one result per item,
/// NOT_CONTROLLER where it does not lead the controller quorum): those items go to the
/// leader through `forward`, as Kafka's brokers forward such requests to the active
/// controller, and go again while the leader moves or a new one is elected (the leader
/// answers NOT_CONTROLLER, or nobody answers), until `deadline` but at least once. Items
/// still without an answer then fail with REQUEST_TIMED_OUT.
async fn at_controller<S, T, F, Fut>(
    items: Vec<S>,
    mut results: Vec<Result<T, BrokerError>>,
    forward: F,
    deadline: Instant,
) -> Vec<Result<T, BrokerError>>
where
    S: Clone,
    F: Fn(Vec<S>, Duration) -> Fut,
    Fut: std::future::Future<Output = Vec<Result<T, BrokerError>>>,
{
    let retry = |r: &Result<T, BrokerError>| {
        matches!(
            r,
            Err(BrokerError::NotController | BrokerError::RequestTimedOut(_))
        )
    };
    let mut again: Vec<usize> = (0..results.len())
        .filter(|i| matches!(results[*i], Err(BrokerError::NotController)))
        .collect();
    while !again.is_empty() {
        let ttl = deadline
            .saturating_duration_since(Instant::now())
            .clamp(FORWARD_TTL_MIN, FORWARD_TTL_MAX);
        let asked = again.iter().map(|i| items[*i].clone()).collect();
        for (i, r) in again.iter().zip(forward(asked, ttl).await) {
            results[*i] = r;
        }
        again.retain(|i| retry(&results[*i]));
        if again.is_empty() || Instant::now() >= deadline {
            break;
        }
        glommio::timer::sleep(CONTROLLER_RETRY_BACKOFF).await;
    }
    for i in again {
        if let Err(BrokerError::NotController) = results[i] {
            results[i] = Err(BrokerError::RequestTimedOut(
                "the controller leader moved and did not settle in time".into(),
            ));
        }
    }
    results
}

/// Deletes topics by name; returns per topic its id.
pub async fn delete_topics(
    shard: &Rc<Shard>,
    names: Vec<String>,
) -> Vec<Result<Uuid, BrokerError>> {
    shard
        .on_controller(move |shard| {
            async move {
                if !shard.config.delete_topic_enable {
                    return names
                        .iter()
                        .map(|_| Err(BrokerError::TopicDeletionDisabled))
                        .collect();
                }
                let mut results = Vec::with_capacity(names.len());
                for name in &names {
                    let r = shard.with_controller(|c| {
                        let pos = c
                            .state
                            .topics
                            .iter()
                            .position(|t| &t.name == name)
                            .ok_or(BrokerError::UnknownTopicOrPartition)?;
                        Ok(c.state.topics.remove(pos).id)
                    });
                    results.push(r);
                }
                if results.iter().any(Result::is_ok) {
                    if let Err(e) = shard.commit_metadata().await {
                        return names.iter().map(|_| Err(e.clone())).collect();
                    }
                }
                results
            }
            .boxed_local()
        })
        .await
}

/// A change to one topic that the controller leader makes; serialisable, so a node that
/// does not lead the controller forwards it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum TopicChange {
    /// CreatePartitions: raise the partition count to this.
    Partitions(i32),
    /// AlterConfigs: replace the config overrides as a whole.
    SetConfigs(BTreeMap<String, String>),
    /// IncrementalAlterConfigs: (name, operation, value), in request order.
    EditConfigs(Vec<(String, i8, Option<String>)>),
}

/// Makes `change` to topic `name` on a copy of its record on the controller; unless
/// `validate_only`, the copy replaces the record and the new metadata is persisted and
/// published.
pub async fn change_topic(
    shard: &Rc<Shard>,
    name: String,
    change: TopicChange,
    validate_only: bool,
) -> Result<(), BrokerError> {
    let defaults = shard.config.topic_defaults.clone();
    shard
        .on_controller(move |shard| {
            async move {
                shard.with_controller(|c| {
                    let brokers = c.state.brokers.clone();
                    let t = c
                        .topic_mut(&name)
                        .ok_or(BrokerError::UnknownTopicOrPartition)?;
                    let mut changed = t.clone();
                    match change {
                        TopicChange::Partitions(count) => {
                            add_partitions(&mut changed, &brokers, count)?
                        }
                        TopicChange::SetConfigs(configs) => {
                            changed.configs = configs;
                            validate_configs(&changed.configs)?;
                        }
                        TopicChange::EditConfigs(ops) => {
                            apply_ops(&mut changed.configs, ops, &defaults)?;
                            validate_configs(&changed.configs)?;
                        }
                    }
                    if !validate_only {
                        *t = changed;
                    }
                    Ok(())
                })?;
                if !validate_only {
                    shard.commit_metadata().await?;
                }
                Ok(())
            }
            .boxed_local()
        })
        .await
}

/// CreatePartitions on a copy of a topic's record: raises its partition count to `count`.
fn add_partitions(
    t: &mut TopicRecord,
    brokers: &BTreeMap<i32, BrokerRecord>,
    count: i32,
) -> Result<(), BrokerError> {
    if count < t.partitions {
        return Err(BrokerError::InvalidPartitions(format!(
            "Topic currently has {} partitions, which is higher than the requested {count}.",
            t.partitions
        )));
    }
    if count == t.partitions {
        return Err(BrokerError::InvalidPartitions(format!(
            "Topic already has {} partitions.",
            t.partitions
        )));
    }
    if count > PARTITIONS_MAX {
        return Err(BrokerError::InvalidPartitions(format!(
            "Number of partitions must be at most {PARTITIONS_MAX}."
        )));
    }
    // New partitions get as many replicas as the first one has.
    let rf = t.replicas.first().map_or(1, |r| r.len()) as i16;
    let added = assign_replicas(brokers, t.partitions, count - t.partitions, rf, 0)
        .map_err(BrokerError::InvalidReplicationFactor)?;
    t.replicas.extend(added);
    t.partitions = count;
    Ok(())
}
