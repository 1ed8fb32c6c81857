//! CreateTopics (API 19): any node takes it; the controller leader creates the topics.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::kafka::handlers::admin::{self, TopicSpec};
use crate::kafka::handlers::describe_configs::topic_config_entries;
use crate::kafka::RequestContext;

pub async fn handle(ctx: Rc<RequestContext>, req: CreateTopicsRequest) -> CreateTopicsResponse {
    // A node that does not lead the controller forwards to the leader, and asks again while
    // a new one is elected, up to the request's timeout (Kafka's brokers forward too).
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut specs = Vec::with_capacity(req.topics.len());
    let mut early: Vec<Option<BrokerError>> = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let mut configs = BTreeMap::new();
        let mut error = None;
        for c in &t.configs {
            match &c.value {
                Some(v) => {
                    configs.insert(c.name.to_string(), v.to_string());
                }
                None => {
                    error = Some(BrokerError::InvalidConfig(format!(
                        "Null value not supported for topic config {}",
                        c.name.as_str()
                    )))
                }
            }
        }
        // A manual assignment is checked against the registered brokers by the controller.
        let assignment = (!t.assignments.is_empty()).then(|| {
            t.assignments
                .iter()
                .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
                .collect()
        });
        let partitions = if t.assignments.is_empty() {
            t.num_partitions
        } else {
            t.assignments.len() as i32
        };
        early.push(error);
        specs.push(TopicSpec {
            name: t.name.0.to_string(),
            partitions,
            replication_factor: if t.assignments.is_empty() {
                t.replication_factor
            } else {
                1
            },
            assignment,
            configs,
        });
    }
    let to_create: Vec<TopicSpec> = specs
        .iter()
        .zip(&early)
        .filter(|(_, e)| e.is_none())
        .map(|(s, _)| s.clone())
        .collect();
    let mut created =
        admin::create_topics_anywhere(&ctx.shard, to_create, req.validate_only, deadline)
            .await
            .into_iter();
    let results = specs
        .into_iter()
        .zip(early)
        .map(|(spec, early)| {
            let r = match early {
                Some(e) => Err(e),
                None => created.next().expect("one result per topic"),
            };
            let base = CreatableTopicResult::default().with_name(
                kafka_protocol::messages::TopicName(StrBytes::from_string(spec.name.clone())),
            );
            match r {
                Ok((id, partitions)) => {
                    let settings_configs: Vec<CreatableTopicConfigs> = if ctx.version >= 5 {
                        topic_config_entries(&ctx.shard.config, &spec.configs)
                            .into_iter()
                            .map(|e| {
                                CreatableTopicConfigs::default()
                                    .with_name(e.name)
                                    .with_value(e.value)
                                    .with_read_only(e.read_only)
                                    .with_config_source(e.config_source)
                                    .with_is_sensitive(e.is_sensitive)
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    let replication_factor = match (&spec.assignment, spec.replication_factor) {
                        (Some(manual), _) => manual.first().map_or(0, |r| r.len() as i16),
                        (None, -1) => ctx.shard.config.default_replication_factor,
                        (None, rf) => rf,
                    };
                    base.with_topic_id(id)
                        .with_error_message(None)
                        .with_num_partitions(partitions)
                        .with_replication_factor(replication_factor)
                        .with_configs(Some(settings_configs))
                }
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(e.to_string())))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_configs(None),
            }
        })
        .collect();
    CreateTopicsResponse::default().with_topics(results)
}
