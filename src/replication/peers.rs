//! A shard's part in replication: its Raft listener and pings, what it knows of its peers'
//! shards, and the quiescence loop that lets its idle partition groups stop ticking and
//! sends their coalesced beats.
//!
//! Every shard runs its own Raft transport (`ferrolog_raft::network::Transport`) for the
//! replicated partitions it hosts; shard 0's also carries the controller quorum (group 0)
//! and the requests forwarded to the controller. Shard s listens at the node's entry in
//! `controller.quorum.voters` with the port plus s, so a node of N shards uses N consecutive
//! ports. A replicated partition lives on shard `GroupId::shard(N)` of every node that holds
//! it, and peers learn N from the broker registration (`BrokerRecord::shards`): between
//! nodes of equal shard counts, shard s talks only to shard s (one connection each way).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use ferrolog_raft::wire::GroupId;

use crate::metadata::MetadataImage;
use crate::replication::raft::BEAT_INTERVAL;
use crate::shard::Shard;

/// How often each shard pings each peer shard it talks to (liveness, for the ISR of idle
/// partitions).
const KEEPALIVE_INTERVAL: Duration = Duration::from_millis(250);
/// How often the quiescence loop looks at every partition group (`Replica::tend`).
const QUIESCENCE_INTERVAL: Duration = Duration::from_millis(500);

/// Starts this shard's side of replication: the Raft listener and pings when the node is in
/// a cluster, and the quiescence loop.
pub fn start(shard: &Rc<Shard>) -> anyhow::Result<()> {
    let config = &shard.config;
    if let Some(base) = config.voters.get(&config.node_id) {
        let addr = shard_addr(*base, shard.id.0).ok_or_else(|| {
            anyhow::anyhow!(
                "the Raft port {} plus shard {} is past 65535",
                base.port(),
                shard.id.0
            )
        })?;
        let listener = glommio::net::TcpListener::bind(addr).map_err(|e| {
            anyhow::anyhow!(
                "shard {} cannot listen for Raft traffic on {addr} (shard s of a node uses its \
                 controller.quorum.voters port + s): {e}",
                shard.id.0
            )
        })?;
        let transport = &shard.raft_transport;
        for (id, addr) in &config.voters {
            transport.set_address(*id as u64, addr.to_string());
        }
        transport.serve(listener);
        // Shard 0 pings every voter's shard 0 from the start (controller liveness); the
        // other peer shards are pinged from their first RPC on.
        let voters = match shard.id.0 {
            0 => config
                .voters
                .iter()
                .filter(|(id, _)| **id != config.node_id)
                .map(|(id, addr)| (*id as u64, addr.to_string()))
                .collect(),
            _ => Vec::new(),
        };
        transport.keepalive(voters, KEEPALIVE_INTERVAL);
    }
    glommio::spawn_local(quiescence_loop(Rc::downgrade(shard))).detach();
    Ok(())
}

/// Where shard `shard` of a node whose Raft address is `base` listens.
pub fn shard_addr(base: SocketAddr, shard: usize) -> Option<SocketAddr> {
    let port = base.port().checked_add(u16::try_from(shard).ok()?)?;
    Some(SocketAddr::new(base.ip(), port))
}

/// Tells this shard's transport how many shards each other broker of `image` runs, before
/// the partitions of the image open.
pub fn learn_peers(shard: &Shard, image: &MetadataImage) {
    for (id, broker) in &image.brokers {
        if *id != shard.config.node_id {
            shard
                .raft_transport
                .set_shards(*id as u64, broker.shards as usize);
        }
    }
}

/// Lets idle partition groups stop ticking and wakes them when something changes
/// (`Replica::tend`), every `QUIESCENCE_INTERVAL`; every `BEAT_INTERVAL` sends each peer
/// shard one coalesced beat naming the quiet groups this shard leads there, and wakes those
/// the peer does not follow it in. After this node stalled (a SIGSTOP, a starved CPU) what
/// it heard is stale, so for 3 s it changes nothing and only sends the beats.
async fn quiescence_loop(shard: Weak<Shard>) {
    let mut last = Instant::now();
    let mut settle_until = last;
    let mut next_beat = last;
    loop {
        glommio::timer::sleep(QUIESCENCE_INTERVAL).await;
        let Some(shard) = shard.upgrade() else {
            return;
        };
        let now = Instant::now();
        if now.duration_since(last) > QUIESCENCE_INTERVAL * 3 {
            settle_until = now + Duration::from_secs(3);
        }
        last = now;
        let beat_due = now >= next_beat;
        let transport = shard.raft_transport.clone();
        let mut beats: BTreeMap<(u64, usize), Vec<(GroupId, u64)>> = BTreeMap::new();
        for partition in shard.replicated_partitions() {
            let Some(lead) = partition
                .replication
                .raft()
                .and_then(|r| r.tend(now < settle_until))
                .filter(|_| beat_due)
            else {
                continue;
            };
            for follower in lead.followers {
                let peer = (follower, transport.peer_shard(follower, lead.group));
                beats.entry(peer).or_default().push((lead.group, lead.term));
            }
        }
        if !beat_due {
            continue;
        }
        next_beat = now + BEAT_INTERVAL;
        let me = shard.config.node_id as u64;
        for (peer, groups) in beats {
            let (transport, shard) = (transport.clone(), Rc::downgrade(&shard));
            glommio::spawn_local(async move {
                let Ok(stale) = transport.beat(peer, me, groups, BEAT_INTERVAL * 2).await else {
                    return; // the peer is silent: its liveness wakes the groups it follows
                };
                let Some(shard) = shard.upgrade().filter(|_| !stale.is_empty()) else {
                    return;
                };
                let stale: HashSet<GroupId> = stale.into_iter().collect();
                for partition in shard.replicated_partitions() {
                    if let Some(replica) = partition.replication.raft() {
                        if stale.contains(&replica.group()) {
                            replica.wake();
                        }
                    }
                }
            })
            .detach();
        }
    }
}
