//! DescribeCluster (API 60): the cluster's brokers and its controller. Every node is both
//! (KRaft's combined mode), so both endpoint types list the same nodes.

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::protocol::StrBytes;

use crate::kafka::RequestContext;

pub fn handle(ctx: Rc<RequestContext>, req: DescribeClusterRequest) -> DescribeClusterResponse {
    // endpoint_type 1 = brokers, 2 = controllers (KIP-919).
    let endpoint_type = if req.endpoint_type == 0 {
        1
    } else {
        req.endpoint_type
    };
    let image = ctx.shard.image();
    let controller = ctx.shard.controller_for_clients(&image);
    let brokers = image
        .brokers
        .iter()
        .filter(|(_, b)| !b.fenced)
        .map(|(id, b)| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(*id))
                .with_host(StrBytes::from_string(b.host.clone()))
                .with_port(i32::from(b.port))
        })
        .collect();
    DescribeClusterResponse::default()
        .with_endpoint_type(endpoint_type)
        .with_cluster_id(StrBytes::from_string(image.cluster_id.clone()))
        .with_controller_id(BrokerId(controller))
        .with_cluster_authorized_operations(i32::MIN)
        .with_brokers(brokers)
}
