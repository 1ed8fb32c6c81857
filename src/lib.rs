//! ferrolog, the broker: Kafka protocol, shards, partitions, the controller, configuration.
//!
//! Layering (DESIGN.md): this crate -> `ferrolog_raft` (replication: the controller quorum
//! in `quorum`; partitions write through `replication`'s one interface, local or Raft, and
//! each shard's Raft transport and quiescence are in `replication::peers`) -> `ferrolog_io`
//! (storage). Nothing here blocks a shard's executor on the data path; partition state is shard-local
//! (`Rc`/`RefCell`), shards talk only through `shard::Shard::invoke_on`.
//!
//! The binary (`src/main.rs`) only parses the command line; everything else is here so the
//! fuzz targets and tests can reach the parsers.

pub mod config;
pub mod errors;
pub mod fetch_session;
pub mod group;
pub mod kafka;
pub mod mesh;
pub mod metadata;
pub mod partition;
pub mod producer_state;
pub mod quorum;
pub mod read_ahead;
pub mod records;
pub mod replication;
pub mod shard;
pub mod sim;
pub mod txn;
pub mod types;
