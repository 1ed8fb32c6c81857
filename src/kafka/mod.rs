//! The Kafka wire protocol: connections, the dispatcher and one handler per API.
//!
//! Request flow, end to end:
//! 1. `server` accepts on every shard (SO_REUSEPORT). A connection reads a 4-byte size and
//!    closes if it exceeds `socket.request.max.bytes`; otherwise it reserves that many bytes
//!    from the shard's request-memory semaphore *before* reading the frame.
//! 2. `dispatch` decodes the header, checks the API and version against `HANDLERS` (the table
//!    ApiVersions is generated from), decodes the body with kafka-protocol and calls the
//!    API's handler. A request for an API or version not in the table closes the connection,
//!    as Kafka does; ApiVersions at a too-new version gets UNSUPPORTED_VERSION in v0 format.
//! 3. A handler's *start* runs in request order on the connection; what it returns is a
//!    future that completes the response. Produce appends during start (hopping to each
//!    partition's owning shard with `Shard::invoke_on`), so appends keep request order, and
//!    waits for durability in the returned future; other handlers do all their work there.
//! 4. The connection's writer task awaits those futures in order and writes each response
//!    (none for acks=0), so responses leave in correlation-id order. At most
//!    `IN_FLIGHT_MAX` requests per connection are between read and write.

pub mod dispatch;
pub mod frame;
pub mod handlers;
pub mod server;

use std::rc::Rc;

use kafka_protocol::messages::RequestHeader;

use crate::shard::Shard;

/// What a handler knows about the request it serves.
pub struct RequestContext {
    pub shard: Rc<Shard>,
    pub header: RequestHeader,
    pub version: i16,
    /// The client's address as Kafka shows it in group descriptions ("/127.0.0.1").
    pub client_host: String,
}

impl RequestContext {
    /// The request header's client id ("" when absent).
    pub fn client_id(&self) -> String {
        self.header
            .client_id
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default()
    }
}
