//! The handler table, version checks, and request/response framing.

use std::rc::Rc;

use bytes::{Buf, Bytes, BytesMut};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::errors::BrokerError;
use crate::kafka::handlers;
use crate::kafka::RequestContext;
use crate::shard::Shard;

/// One served API: the versions advertised in ApiVersions and the versions decoded.
pub struct Handler {
    pub key: ApiKey,
    /// Lowest version advertised. Equal to `min` except for Produce, which Kafka 4.x
    /// advertises from 0 (older librdkafka refuses a broker whose Produce starts above 0) while
    /// closing the connection on v0-2 (KIP-896).
    pub advertised_min: i16,
    pub min: i16,
    pub max: i16,
}

const fn h(key: ApiKey, min: i16, max: i16) -> Handler {
    Handler {
        key,
        advertised_min: min,
        min,
        max,
    }
}

/// Every API ferrolog serves, with Apache Kafka 4.1's version ranges. ApiVersions is built
/// from this table; an API absent here is neither advertised nor answered.
pub const HANDLERS: &[Handler] = &[
    Handler {
        key: ApiKey::Produce,
        advertised_min: 0,
        min: 3,
        max: 13,
    },
    h(ApiKey::Fetch, 4, 18),
    h(ApiKey::ListOffsets, 1, 10),
    h(ApiKey::Metadata, 0, 13),
    h(ApiKey::ApiVersions, 0, 4),
    h(ApiKey::CreateTopics, 2, 7),
    h(ApiKey::DeleteTopics, 1, 6),
    h(ApiKey::DeleteRecords, 0, 2),
    h(ApiKey::InitProducerId, 0, 5),
    // The client's forms of transaction protocol v1: v4+ of AddPartitionsToTxn and v5 of
    // EndTxn and TxnOffsetCommit belong to KIP-890 (transaction.version 2), which ferrolog
    // does not serve.
    h(ApiKey::AddPartitionsToTxn, 0, 3),
    h(ApiKey::AddOffsetsToTxn, 0, 4),
    h(ApiKey::EndTxn, 0, 4),
    h(ApiKey::TxnOffsetCommit, 0, 4),
    h(ApiKey::WriteTxnMarkers, 1, 1),
    h(ApiKey::DescribeProducers, 0, 0),
    h(ApiKey::DescribeTransactions, 0, 0),
    h(ApiKey::ListTransactions, 0, 2),
    h(ApiKey::OffsetForLeaderEpoch, 2, 4),
    h(ApiKey::DescribeConfigs, 1, 4),
    h(ApiKey::AlterConfigs, 0, 2),
    h(ApiKey::CreatePartitions, 0, 3),
    h(ApiKey::IncrementalAlterConfigs, 0, 1),
    h(ApiKey::DescribeCluster, 0, 2),
    h(ApiKey::ElectLeaders, 0, 2),
    h(ApiKey::FindCoordinator, 0, 6),
    h(ApiKey::JoinGroup, 0, 9),
    h(ApiKey::SyncGroup, 0, 5),
    h(ApiKey::Heartbeat, 0, 4),
    h(ApiKey::LeaveGroup, 0, 5),
    h(ApiKey::OffsetCommit, 2, 9),
    h(ApiKey::OffsetFetch, 1, 9),
    h(ApiKey::DescribeGroups, 0, 6),
    h(ApiKey::ListGroups, 0, 5),
    h(ApiKey::DeleteGroups, 0, 2),
    h(ApiKey::OffsetDelete, 0, 0),
    h(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    h(ApiKey::ConsumerGroupDescribe, 0, 1),
];

pub fn handler(key: ApiKey) -> Option<&'static Handler> {
    HANDLERS.iter().find(|h| h.key == key)
}

/// What the connection does once a request is served.
pub enum Reply<T> {
    /// Write this response.
    Send(T),
    /// Write nothing (Produce with acks=0).
    Nothing,
    /// Close the connection: an acks=0 Produce failed, and closing is the only way to tell
    /// the producer (Kafka does the same).
    Close,
}

impl<T> Reply<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Reply<U> {
        match self {
            Reply::Send(t) => Reply::Send(f(t)),
            Reply::Nothing => Reply::Nothing,
            Reply::Close => Reply::Close,
        }
    }
}

/// A response ready to encode.
pub struct Response {
    pub correlation_id: i32,
    pub key: ApiKey,
    pub version: i16,
    pub body: ResponseKind,
}

/// Why a connection must close instead of answering.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("request header does not decode: {0}")]
    Header(String),
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("{key:?} v{version} is not served")]
    UnsupportedVersion { key: ApiKey, version: i16 },
    #[error("{key:?} v{version} body does not decode: {error}")]
    Body {
        key: ApiKey,
        version: i16,
        error: String,
    },
}

fn api_versions_error_response(correlation_id: i32) -> Response {
    // KIP-511: a client asking ApiVersions at a version we do not know gets v0 with
    // UNSUPPORTED_VERSION and our ApiVersions range, so it can retry at one we serve.
    let api = handler(ApiKey::ApiVersions).expect("ApiVersions is served");
    Response {
        correlation_id,
        key: ApiKey::ApiVersions,
        version: 0,
        body: ResponseKind::ApiVersions(
            ApiVersionsResponse::default()
                .with_error_code(BrokerError::UnsupportedVersion.code())
                .with_api_keys(vec![ApiVersion::default()
                    .with_api_key(ApiKey::ApiVersions as i16)
                    .with_min_version(api.min)
                    .with_max_version(api.max)]),
        ),
    }
}

/// A decoded request frame.
pub enum Decoded {
    /// ApiVersions at a version newer than ours: answered in v0 without decoding the body.
    ApiVersionsTooNew { correlation_id: i32 },
    Request {
        key: ApiKey,
        version: i16,
        header: RequestHeader,
        body: Box<RequestKind>,
    },
}

/// Decodes a frame (without its size prefix). Sans-IO, so the fuzz target drives it directly.
/// `Err` means the connection must close.
pub fn decode(mut frame: Bytes) -> Result<Decoded, FrameError> {
    if frame.len() < 8 {
        return Err(FrameError::Header(format!(
            "frame of {} bytes",
            frame.len()
        )));
    }
    let raw_key = (&frame[0..2]).get_i16();
    let version = (&frame[2..4]).get_i16();
    let correlation_id = (&frame[4..8]).get_i32();
    let key = ApiKey::try_from(raw_key).map_err(|_| FrameError::UnknownApi(raw_key))?;
    let Some(api) = handler(key) else {
        return Err(FrameError::UnknownApi(raw_key));
    };
    if key == ApiKey::ApiVersions && version > api.max {
        return Ok(Decoded::ApiVersionsTooNew { correlation_id });
    }
    if version < api.min || version > api.max {
        return Err(FrameError::UnsupportedVersion { key, version });
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| FrameError::Header(e.to_string()))?;
    let body = RequestKind::decode(key, &mut frame, version).map_err(|e| FrameError::Body {
        key,
        version,
        error: e.to_string(),
    })?;
    Ok(Decoded::Request {
        key,
        version,
        header,
        body: Box::new(body),
    })
}

/// Decodes one frame and starts its handler. The returned future completes the response
/// (`None`: no response, acks=0). `Err` means the connection must close.
pub async fn start(
    shard: &Rc<Shard>,
    frame: Bytes,
    client_host: &str,
) -> Result<LocalBoxFuture<'static, Reply<Response>>, FrameError> {
    let (key, version, header, body) = match decode(frame)? {
        Decoded::ApiVersionsTooNew { correlation_id } => {
            let response = api_versions_error_response(correlation_id);
            return Ok(async move { Reply::Send(response) }.boxed_local());
        }
        Decoded::Request {
            key,
            version,
            header,
            body,
        } => (key, version, header, body),
    };
    let correlation_id = header.correlation_id;
    let ctx = Rc::new(RequestContext {
        shard: shard.clone(),
        header,
        version,
        client_host: client_host.to_string(),
    });
    let respond = move |body: ResponseKind| Response {
        correlation_id,
        key,
        version,
        body,
    };
    let pending: LocalBoxFuture<'static, Reply<Response>> = match *body {
        RequestKind::Produce(req) => {
            let done = handlers::produce::start(ctx, req).await;
            async move { done.await.map(|r| respond(ResponseKind::Produce(r))) }.boxed_local()
        }
        RequestKind::Fetch(req) => async move {
            Reply::Send(respond(ResponseKind::Fetch(
                handlers::fetch::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ListOffsets(req) => async move {
            Reply::Send(respond(ResponseKind::ListOffsets(
                handlers::list_offsets::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::Metadata(req) => async move {
            Reply::Send(respond(ResponseKind::Metadata(
                handlers::metadata::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ApiVersions(req) => async move {
            Reply::Send(respond(ResponseKind::ApiVersions(
                handlers::api_versions::handle(ctx, req),
            )))
        }
        .boxed_local(),
        RequestKind::CreateTopics(req) => async move {
            Reply::Send(respond(ResponseKind::CreateTopics(
                handlers::create_topics::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DeleteTopics(req) => async move {
            Reply::Send(respond(ResponseKind::DeleteTopics(
                handlers::delete_topics::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DeleteRecords(req) => async move {
            Reply::Send(respond(ResponseKind::DeleteRecords(
                handlers::delete_records::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::InitProducerId(req) => async move {
            Reply::Send(respond(ResponseKind::InitProducerId(
                handlers::init_producer_id::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::AddPartitionsToTxn(req) => async move {
            Reply::Send(respond(ResponseKind::AddPartitionsToTxn(
                handlers::add_partitions_to_txn::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::AddOffsetsToTxn(req) => async move {
            Reply::Send(respond(ResponseKind::AddOffsetsToTxn(
                handlers::add_offsets_to_txn::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::TxnOffsetCommit(req) => async move {
            Reply::Send(respond(ResponseKind::TxnOffsetCommit(
                handlers::txn_offset_commit::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::EndTxn(req) => async move {
            Reply::Send(respond(ResponseKind::EndTxn(
                handlers::end_txn::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::WriteTxnMarkers(req) => async move {
            Reply::Send(respond(ResponseKind::WriteTxnMarkers(
                handlers::write_txn_markers::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DescribeProducers(req) => async move {
            Reply::Send(respond(ResponseKind::DescribeProducers(
                handlers::describe_producers::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DescribeTransactions(req) => async move {
            Reply::Send(respond(ResponseKind::DescribeTransactions(
                handlers::describe_transactions::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ListTransactions(req) => async move {
            Reply::Send(respond(ResponseKind::ListTransactions(
                handlers::list_transactions::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::OffsetForLeaderEpoch(req) => async move {
            Reply::Send(respond(ResponseKind::OffsetForLeaderEpoch(
                handlers::offset_for_leader_epoch::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DescribeConfigs(req) => async move {
            Reply::Send(respond(ResponseKind::DescribeConfigs(
                handlers::describe_configs::handle(ctx, req),
            )))
        }
        .boxed_local(),
        RequestKind::AlterConfigs(req) => async move {
            Reply::Send(respond(ResponseKind::AlterConfigs(
                handlers::alter_configs::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::IncrementalAlterConfigs(req) => async move {
            Reply::Send(respond(ResponseKind::IncrementalAlterConfigs(
                handlers::incremental_alter_configs::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::CreatePartitions(req) => async move {
            Reply::Send(respond(ResponseKind::CreatePartitions(
                handlers::create_partitions::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ElectLeaders(req) => async move {
            Reply::Send(respond(ResponseKind::ElectLeaders(
                handlers::elect_leaders::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DescribeCluster(req) => async move {
            Reply::Send(respond(ResponseKind::DescribeCluster(
                handlers::describe_cluster::handle(ctx, req),
            )))
        }
        .boxed_local(),
        RequestKind::FindCoordinator(req) => async move {
            Reply::Send(respond(ResponseKind::FindCoordinator(
                handlers::find_coordinator::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::JoinGroup(req) => async move {
            Reply::Send(respond(ResponseKind::JoinGroup(
                handlers::join_group::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::SyncGroup(req) => async move {
            Reply::Send(respond(ResponseKind::SyncGroup(
                handlers::sync_group::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::Heartbeat(req) => async move {
            Reply::Send(respond(ResponseKind::Heartbeat(
                handlers::heartbeat::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::LeaveGroup(req) => async move {
            Reply::Send(respond(ResponseKind::LeaveGroup(
                handlers::leave_group::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::OffsetCommit(req) => async move {
            Reply::Send(respond(ResponseKind::OffsetCommit(
                handlers::offset_commit::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::OffsetFetch(req) => async move {
            Reply::Send(respond(ResponseKind::OffsetFetch(
                handlers::offset_fetch::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DescribeGroups(req) => async move {
            Reply::Send(respond(ResponseKind::DescribeGroups(
                handlers::describe_groups::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ListGroups(req) => async move {
            Reply::Send(respond(ResponseKind::ListGroups(
                handlers::list_groups::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::DeleteGroups(req) => async move {
            Reply::Send(respond(ResponseKind::DeleteGroups(
                handlers::delete_groups::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::OffsetDelete(req) => async move {
            Reply::Send(respond(ResponseKind::OffsetDelete(
                handlers::offset_delete::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ConsumerGroupHeartbeat(req) => async move {
            Reply::Send(respond(ResponseKind::ConsumerGroupHeartbeat(
                handlers::consumer_group_heartbeat::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        RequestKind::ConsumerGroupDescribe(req) => async move {
            Reply::Send(respond(ResponseKind::ConsumerGroupDescribe(
                handlers::consumer_group_describe::handle(ctx, req).await,
            )))
        }
        .boxed_local(),
        other => {
            // The table and this match list the same APIs; a test checks it.
            unreachable!("API {:?} is in HANDLERS but has no arm", other)
        }
    };
    Ok(pending)
}

/// Encodes the response header and body (without the size prefix).
pub fn encode_response(r: &Response, out: &mut BytesMut) -> anyhow::Result<()> {
    let header = ResponseHeader::default().with_correlation_id(r.correlation_id);
    header.encode(out, r.key.response_header_version(r.version))?;
    r.body.encode(out, r.version)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apache Kafka 4.1's advertised ranges (BROKER listener), from its message JSON files
    /// and `ApiKeys.toApiVersion`.
    const KAFKA_41: &[(ApiKey, i16, i16)] = &[
        (ApiKey::Produce, 0, 13),
        (ApiKey::Fetch, 4, 18),
        (ApiKey::ListOffsets, 1, 10),
        (ApiKey::Metadata, 0, 13),
        (ApiKey::ApiVersions, 0, 4),
        (ApiKey::CreateTopics, 2, 7),
        (ApiKey::DeleteTopics, 1, 6),
        (ApiKey::DeleteRecords, 0, 2),
        (ApiKey::InitProducerId, 0, 5),
        (ApiKey::AddPartitionsToTxn, 0, 5),
        (ApiKey::AddOffsetsToTxn, 0, 4),
        (ApiKey::EndTxn, 0, 5),
        (ApiKey::TxnOffsetCommit, 0, 5),
        (ApiKey::WriteTxnMarkers, 1, 1),
        (ApiKey::DescribeProducers, 0, 0),
        (ApiKey::DescribeTransactions, 0, 0),
        (ApiKey::ListTransactions, 0, 2),
        (ApiKey::OffsetForLeaderEpoch, 2, 4),
        (ApiKey::DescribeConfigs, 1, 4),
        (ApiKey::AlterConfigs, 0, 2),
        (ApiKey::CreatePartitions, 0, 3),
        (ApiKey::IncrementalAlterConfigs, 0, 1),
        (ApiKey::DescribeCluster, 0, 2),
        (ApiKey::ElectLeaders, 0, 2),
        (ApiKey::FindCoordinator, 0, 6),
        (ApiKey::JoinGroup, 0, 9),
        (ApiKey::SyncGroup, 0, 5),
        (ApiKey::Heartbeat, 0, 4),
        (ApiKey::LeaveGroup, 0, 5),
        (ApiKey::OffsetCommit, 2, 9),
        (ApiKey::OffsetFetch, 1, 9),
        (ApiKey::DescribeGroups, 0, 6),
        (ApiKey::ListGroups, 0, 5),
        (ApiKey::DeleteGroups, 0, 2),
        (ApiKey::OffsetDelete, 0, 0),
        (ApiKey::ConsumerGroupHeartbeat, 0, 1),
        (ApiKey::ConsumerGroupDescribe, 0, 1),
    ];

    /// Versions ferrolog does not serve yet, and so stops below Kafka's: KIP-890's
    /// (transaction.version 2) AddPartitionsToTxn v4-5, EndTxn v5 and TxnOffsetCommit v5.
    const CAPPED: &[(ApiKey, i16)] = &[
        (ApiKey::AddPartitionsToTxn, 3),
        (ApiKey::EndTxn, 4),
        (ApiKey::TxnOffsetCommit, 4),
    ];

    #[test]
    fn table_matches_kafka_41() {
        assert_eq!(HANDLERS.len(), KAFKA_41.len());
        for (key, min, max) in KAFKA_41 {
            let h = handler(*key).unwrap_or_else(|| panic!("{key:?} missing"));
            let max = CAPPED
                .iter()
                .find(|(k, _)| k == key)
                .map_or(*max, |(_, capped)| *capped);
            assert_eq!((h.advertised_min, h.max), (*min, max), "{key:?}");
            let decodable = key.valid_versions();
            assert!(
                h.min >= decodable.min && h.max <= decodable.max,
                "{key:?} decodable"
            );
        }
    }
}
