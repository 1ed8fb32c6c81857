//! DescribeCluster (API 60): this node, as broker and controller.

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::protocol::StrBytes;

use crate::kafka::RequestContext;

pub fn handle(ctx: Rc<RequestContext>, req: DescribeClusterRequest) -> DescribeClusterResponse {
    let config = &ctx.shard.config;
    // endpoint_type 1 = brokers, 2 = controllers (KIP-919); this node is both.
    let endpoint_type = if req.endpoint_type == 0 {
        1
    } else {
        req.endpoint_type
    };
    DescribeClusterResponse::default()
        .with_endpoint_type(endpoint_type)
        .with_cluster_id(StrBytes::from_string(ctx.shard.image().cluster_id.clone()))
        .with_controller_id(BrokerId(config.node_id))
        .with_cluster_authorized_operations(i32::MIN)
        .with_brokers(vec![DescribeClusterBroker::default()
            .with_broker_id(BrokerId(config.node_id))
            .with_host(StrBytes::from_string(config.advertised_host.clone()))
            .with_port(i32::from(config.advertised_port))])
}
