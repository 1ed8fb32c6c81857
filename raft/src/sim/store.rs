//! What the simulation adds to a node's Raft group: the batches its clients write, and the
//! hook through which the node's state machine reports what it applies to the checker.
//!
//! The log store and the state machine are the broker's own (`crate::store::LogStore` over
//! io/'s `Log`, and `crate::state_machine::PartitionStateMachine`), on the node's simulated
//! disk ([`super::fs::SimFs`]).

use std::collections::BTreeMap;
use std::rc::Rc;

use ferrolog_io::batch::{make_batch, BatchHeader};
use openraft::RaftTypeConfig;

use super::fs::SimFs;
use super::runtime::NodeId;
use super::{Checker, SimRaft};
use crate::entry::Batch;
use crate::state_machine::{Applied as Apply, ApplyHook};
use crate::store::StoreView;

pub type Entry = <SimRaft as RaftTypeConfig>::Entry;
pub type LogId = openraft::LogId<crate::CommittedLeaderId>;

/// The batch a client writes for `record`: one to three records (so Kafka offsets and Raft
/// indexes part ways), the record's identity in the batch timestamp.
pub fn batch_of(record: super::Record) -> Batch {
    let timestamp = (i64::from(record.client) << 32) | i64::from(record.seq);
    let count = 1 + (record.seq % 3) as i32;
    Batch(make_batch(0, count, timestamp, 20).into())
}

/// The record a client wrote in this entry, if it is one.
pub fn record_of(e: &Entry) -> Option<super::Record> {
    match &e.payload {
        openraft::EntryPayload::Normal(b) => Some(record_in(&BatchHeader::parse(&b.0).ok()?)),
        _ => None,
    }
}

/// The record whose batch has this header (`batch_of`).
pub fn record_in(h: &BatchHeader) -> super::Record {
    super::Record {
        client: (h.base_timestamp >> 32) as u32,
        seq: h.base_timestamp as u32,
    }
}

/// What a node's state machine (the broker's, `PartitionStateMachine`, which also asserts
/// that entries apply in order) calls with each entry it applies: the checker hears of it,
/// with the Kafka offset its batch has in the node's log.
pub fn reporter(node: NodeId, checker: Rc<Checker>, view: StoreView<SimFs>) -> ApplyHook {
    Box::new(move |applied| {
        // A snapshot installed stands for entries applied elsewhere.
        let Apply::Entry(e) = applied else { return };
        let index = e.log_id.index;
        let Some(offset) = view.base_offset(index) else {
            checker.violation(format!("node {node} applied entry {index}, not in its log"));
            return;
        };
        checker.applied(node, e.log_id, record_of(e), offset);
    })
}

/// The first entry each index was applied with anywhere, to compare every later one with.
pub type Applied = BTreeMap<u64, (LogId, Option<super::Record>, i64, NodeId)>;
