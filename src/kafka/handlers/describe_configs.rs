//! DescribeConfigs (API 32): every topic config with its value and where it comes from
//! (topic override, broker setting, or Kafka's default), and the broker's own settings.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::config::{BrokerConfig, TOPIC_CONFIGS};
use crate::errors::BrokerError;
use crate::kafka::RequestContext;

pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
/// Kafka's `ConfigSource` values.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

/// One described config.
pub struct Entry {
    pub name: StrBytes,
    pub value: Option<StrBytes>,
    pub read_only: bool,
    pub config_source: i8,
    pub is_sensitive: bool,
    pub config_type: i8,
    pub synonyms: Vec<(String, String, i8)>,
}

/// All topic configs of a topic with these overrides.
pub fn topic_config_entries(
    config: &BrokerConfig,
    overrides: &BTreeMap<String, String>,
) -> Vec<Entry> {
    TOPIC_CONFIGS
        .iter()
        .map(|d| {
            let broker_value = config
                .topic_defaults
                .get(d.name)
                .cloned()
                .unwrap_or_else(|| d.default.to_string());
            let broker_set = broker_value != d.default;
            let mut synonyms = Vec::new();
            let (value, source) = match overrides.get(d.name) {
                Some(v) => {
                    synonyms.push((d.name.to_string(), v.clone(), SOURCE_TOPIC));
                    (v.clone(), SOURCE_TOPIC)
                }
                None if broker_set => (broker_value.clone(), SOURCE_STATIC_BROKER),
                None => (broker_value.clone(), SOURCE_DEFAULT),
            };
            if let Some(key) = d.broker_key {
                if broker_set {
                    synonyms.push((key.to_string(), broker_value.clone(), SOURCE_STATIC_BROKER));
                }
                synonyms.push((key.to_string(), d.default.to_string(), SOURCE_DEFAULT));
            }
            Entry {
                name: StrBytes::from_static_str(d.name),
                value: Some(StrBytes::from_string(value)),
                read_only: false,
                config_source: source,
                is_sensitive: false,
                config_type: d.kind.describe_type(),
                synonyms,
            }
        })
        .collect()
}

fn broker_entries(config: &BrokerConfig) -> Vec<Entry> {
    let mut out: Vec<(String, String, i8)> = vec![
        ("node.id".into(), config.node_id.to_string(), 3),
        (
            "listeners".into(),
            format!("PLAINTEXT://{}", config.listen_addr),
            2,
        ),
        (
            "advertised.listeners".into(),
            format!(
                "PLAINTEXT://{}:{}",
                config.advertised_host, config.advertised_port
            ),
            2,
        ),
        ("log.dirs".into(), config.log_dir.display().to_string(), 2),
        (
            "metadata.log.dir".into(),
            config.metadata_dir().display().to_string(),
            2,
        ),
        (
            "num.partitions".into(),
            config.num_partitions.to_string(),
            3,
        ),
        (
            "default.replication.factor".into(),
            config.default_replication_factor.to_string(),
            3,
        ),
        (
            "auto.create.topics.enable".into(),
            config.auto_create_topics.to_string(),
            1,
        ),
        (
            "delete.topic.enable".into(),
            config.delete_topic_enable.to_string(),
            1,
        ),
        (
            "socket.request.max.bytes".into(),
            config.socket_request_max_bytes.to_string(),
            3,
        ),
        (
            "log.retention.check.interval.ms".into(),
            config.retention_check_interval_ms.to_string(),
            5,
        ),
    ];
    for d in TOPIC_CONFIGS {
        if let Some(key) = d.broker_key {
            if !out.iter().any(|(k, _, _)| k == key) {
                let v = config
                    .topic_defaults
                    .get(d.name)
                    .cloned()
                    .unwrap_or_default();
                out.push((key.to_string(), v, d.kind.describe_type()));
            }
        }
    }
    out.into_iter()
        .map(|(k, v, t)| Entry {
            name: StrBytes::from_string(k),
            value: Some(StrBytes::from_string(v)),
            read_only: true,
            config_source: SOURCE_STATIC_BROKER,
            is_sensitive: false,
            config_type: t,
            synonyms: Vec::new(),
        })
        .collect()
}

pub fn handle(ctx: Rc<RequestContext>, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let image = ctx.shard.image();
    let config = &ctx.shard.config;
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let name = r.resource_name.to_string();
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let entries = match r.resource_type {
                RESOURCE_TOPIC => match image.topic(&name) {
                    Some(t) => Ok(topic_config_entries(config, &t.configs)),
                    None => Err((
                        ResponseError::UnknownTopicOrPartition.code(),
                        BrokerError::UnknownTopicOrPartition.to_string(),
                    )),
                },
                RESOURCE_BROKER if name == config.node_id.to_string() => Ok(broker_entries(config)),
                // Cluster-wide dynamic defaults: none are set.
                RESOURCE_BROKER if name.is_empty() => Ok(Vec::new()),
                RESOURCE_BROKER => Err((
                    ResponseError::InvalidRequest.code(),
                    format!("Unexpected broker id, expected {}", config.node_id),
                )),
                other => Err((
                    ResponseError::InvalidRequest.code(),
                    format!("Unsupported resource type {other}"),
                )),
            };
            match entries {
                Err((code, message)) => base
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(message))),
                Ok(entries) => {
                    let keys: Option<Vec<String>> = r
                        .configuration_keys
                        .map(|ks| ks.iter().map(|k| k.to_string()).collect());
                    let configs = entries
                        .into_iter()
                        .filter(|e| {
                            keys.as_ref()
                                .is_none_or(|ks| ks.iter().any(|k| k.as_str() == e.name.as_str()))
                        })
                        .map(|e| {
                            let synonyms = if req.include_synonyms {
                                e.synonyms
                                    .into_iter()
                                    .map(|(n, v, s)| {
                                        DescribeConfigsSynonym::default()
                                            .with_name(StrBytes::from_string(n))
                                            .with_value(Some(StrBytes::from_string(v)))
                                            .with_source(s)
                                    })
                                    .collect()
                            } else {
                                Vec::new()
                            };
                            DescribeConfigsResourceResult::default()
                                .with_name(e.name)
                                .with_value(e.value)
                                .with_read_only(e.read_only)
                                .with_config_source(e.config_source)
                                .with_is_sensitive(e.is_sensitive)
                                .with_config_type(e.config_type)
                                .with_synonyms(synonyms)
                        })
                        .collect();
                    base.with_configs(configs)
                }
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
