//! ApiVersions (API 18): the served APIs and versions, generated from `dispatch::HANDLERS`.

use std::rc::Rc;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

use crate::kafka::dispatch::HANDLERS;
use crate::kafka::RequestContext;

pub fn handle(_ctx: Rc<RequestContext>, _req: ApiVersionsRequest) -> ApiVersionsResponse {
    let api_keys = HANDLERS
        .iter()
        .map(|h| {
            ApiVersion::default()
                .with_api_key(h.key as i16)
                .with_min_version(h.advertised_min)
                .with_max_version(h.max)
        })
        .collect();
    ApiVersionsResponse::default().with_api_keys(api_keys)
}
