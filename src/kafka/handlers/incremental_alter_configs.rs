//! IncrementalAlterConfigs (API 44, KIP-339): SET (0), DELETE (1), APPEND (2) and SUBTRACT (3)
//! on a topic's config overrides; APPEND/SUBTRACT apply to list configs (`cleanup.policy`).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::config::{topic_config_def, ConfigKind};
use crate::errors::BrokerError;
use crate::kafka::handlers::admin::{self, TopicChange, CONTROLLER_CHANGE_TIMEOUT};
use crate::kafka::handlers::describe_configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use crate::kafka::RequestContext;

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let deadline = Instant::now() + CONTROLLER_CHANGE_TIMEOUT;
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in req.resources {
        let result = match r.resource_type {
            RESOURCE_TOPIC => {
                let ops: Vec<(String, i8, Option<String>)> = r
                    .configs
                    .iter()
                    .map(|c| {
                        (
                            c.name.to_string(),
                            c.config_operation,
                            c.value.as_ref().map(|v| v.to_string()),
                        )
                    })
                    .collect();
                admin::change_topic_anywhere(
                    &ctx.shard,
                    r.resource_name.to_string(),
                    TopicChange::EditConfigs(ops),
                    req.validate_only,
                    deadline,
                )
                .await
            }
            RESOURCE_BROKER => Err(BrokerError::InvalidRequest(
                "Broker configs are static in ferrolog; set them in server.properties".into(),
            )),
            other => Err(BrokerError::InvalidRequest(format!(
                "Unsupported resource type {other}"
            ))),
        };
        let base = AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        responses.push(match result {
            Ok(()) => base.with_error_message(None),
            Err(e) => base
                .with_error_code(e.code())
                .with_error_message(Some(StrBytes::from_string(e.to_string()))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

pub(crate) fn apply_ops(
    current: &mut BTreeMap<String, String>,
    ops: Vec<(String, i8, Option<String>)>,
    defaults: &BTreeMap<&'static str, String>,
) -> Result<(), BrokerError> {
    for (name, op, value) in ops {
        let def = topic_config_def(&name).ok_or_else(|| {
            BrokerError::InvalidConfig(format!("Unknown topic config name: {name}"))
        })?;
        let is_list = matches!(def.kind, ConfigKind::List(_));
        match op {
            0 => {
                let v = value.ok_or_else(|| {
                    BrokerError::InvalidRequest(format!(
                        "Null value not supported for SET of {name}"
                    ))
                })?;
                current.insert(name, v);
            }
            1 => {
                current.remove(&name);
            }
            2 | 3 if !is_list => {
                return Err(BrokerError::InvalidRequest(format!(
                    "Config {name} is not a list; APPEND/SUBTRACT do not apply"
                )));
            }
            2 | 3 => {
                let existing = current
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| defaults.get(def.name).cloned().unwrap_or_default());
                let mut items: Vec<String> = existing
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                for v in value
                    .unwrap_or_default()
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                {
                    if op == 2 {
                        if !items.iter().any(|i| i == v) {
                            items.push(v.to_string());
                        }
                    } else {
                        items.retain(|i| i != v);
                    }
                }
                current.insert(name, items.join(","));
            }
            other => {
                return Err(BrokerError::InvalidRequest(format!(
                    "Unknown config operation {other}"
                )))
            }
        }
    }
    Ok(())
}
