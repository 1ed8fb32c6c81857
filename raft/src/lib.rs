//! ferrolog-raft: replication for ferrolog. One Raft group per partition, driven by openraft
//! (pinned to one exact 0.10 alpha, `single-threaded`) on the glommio executor of the shard
//! that owns the partition.
//!
//! - [`runtime`]: `GlommioRuntime`, openraft's `AsyncRuntime` on glommio.
pub mod runtime;

pub use runtime::GlommioRuntime;
