//! AlterConfigs (API 33): replace a topic's config overrides as a whole (legacy API; prefer
//! IncrementalAlterConfigs). Broker configs are static in ferrolog.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::kafka::handlers::admin::{self, TopicChange, CONTROLLER_CHANGE_TIMEOUT};
use crate::kafka::handlers::describe_configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use crate::kafka::RequestContext;

pub async fn handle(ctx: Rc<RequestContext>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let deadline = Instant::now() + CONTROLLER_CHANGE_TIMEOUT;
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in req.resources {
        let result = match r.resource_type {
            RESOURCE_TOPIC => {
                let mut configs = BTreeMap::new();
                let mut error = None;
                for c in &r.configs {
                    match &c.value {
                        Some(v) => {
                            configs.insert(c.name.to_string(), v.to_string());
                        }
                        None => {
                            error = Some(BrokerError::InvalidConfig(format!(
                                "Null value not supported for {}",
                                c.name.as_str()
                            )))
                        }
                    }
                }
                match error {
                    Some(e) => Err(e),
                    None => {
                        admin::change_topic_anywhere(
                            &ctx.shard,
                            r.resource_name.to_string(),
                            TopicChange::SetConfigs(configs),
                            req.validate_only,
                            deadline,
                        )
                        .await
                    }
                }
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
    AlterConfigsResponse::default().with_responses(responses)
}
