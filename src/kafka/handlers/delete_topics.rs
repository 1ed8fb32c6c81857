//! DeleteTopics (API 20): by name, or by topic id from v6.

use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::kafka::handlers::admin;
use crate::kafka::RequestContext;

pub async fn handle(ctx: Rc<RequestContext>, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let image = ctx.shard.image();
    // (name as given, id as given, resolved name)
    let mut wanted: Vec<(Option<String>, uuid::Uuid, Option<String>)> = Vec::new();
    if ctx.version >= 6 {
        for t in &req.topics {
            let name = t.name.as_ref().map(|n| n.0.to_string());
            let resolved = match &name {
                Some(n) => Some(n.clone()),
                None => image.topic_by_id(&t.topic_id).map(|m| m.name.clone()),
            };
            wanted.push((name, t.topic_id, resolved));
        }
    } else {
        for n in &req.topic_names {
            wanted.push((
                Some(n.0.to_string()),
                uuid::Uuid::nil(),
                Some(n.0.to_string()),
            ));
        }
    }
    let names: Vec<String> = wanted.iter().filter_map(|(_, _, r)| r.clone()).collect();
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut results = admin::delete_topics_anywhere(&ctx.shard, names, deadline)
        .await
        .into_iter();
    let responses = wanted
        .into_iter()
        .map(|(name, id, resolved)| {
            let r = match resolved {
                Some(_) => results.next().expect("one result per name"),
                None => Err(BrokerError::UnknownTopicId),
            };
            let shown_name = name.map(|n| TopicName(StrBytes::from_string(n)));
            match r {
                Ok(deleted_id) => DeletableTopicResult::default()
                    .with_name(shown_name)
                    .with_topic_id(deleted_id),
                Err(e) => DeletableTopicResult::default()
                    .with_name(shown_name)
                    .with_topic_id(id)
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(e.to_string()))),
            }
        })
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}
