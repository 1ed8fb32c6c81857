//! The byte format of Raft traffic between nodes: length-prefixed frames, each carrying one
//! RPC of one group, so many groups share one connection.
//!
//! ```text
//! frame   := length:u32 kind:u8 correlation:u64 group:u64 payload   (big-endian)
//! entry   := index:u64 length:u32 batch     (the entry as stored, term in its leader epoch)
//! log_id  := present:u8 [term:u64 index:u64]
//! vote    := term:u64 voted_for:u64 committed:u8
//! beat    := leader:u64 count:u32 (group:u64 term:u64)*   (reply: count:u32 group:u64*)
//! ```
//!
//! Entries travel in their on-disk form (record batches), so a follower stores exactly the
//! bytes the leader stored; data batches are CRC-checked on receipt. Decoding trusts no
//! length: frames are bounded by [`FRAME_BYTES_MAX`] and every field by the bytes at hand.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ferrolog_io::batch;
use openraft::impls::leader_id_std::LeaderId;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderError,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{SnapshotMeta, StoredMembership};

use crate::entry::{self, Entry, EntryLogId};
use crate::state_machine::SnapshotData;
use crate::store::Vote;
use crate::{CommittedLeaderId, PartitionRaft};

/// Largest frame accepted or sent. Groups bound their appends with openraft's
/// `max_payload_entries`; an append that still does not fit fails to send (openraft backs
/// off and retries) rather than going out.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Bytes of the frame header after the length: kind, correlation id, group id.
pub const FRAME_HEADER_BYTES: usize = 1 + 8 + 8;

/// A partition group's id on the wire, the same on every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

impl GroupId {
    /// The shard that hosts this group on a node of `shards` shards: a function of the id
    /// alone, so a peer knows where to send a group's traffic from the node's shard count.
    /// Group 0 (the controller) is always on shard 0.
    pub fn shard(self, shards: usize) -> usize {
        (self.0 % shards.max(1) as u64) as usize
    }
}

/// The snapshot metadata of a partition group.
pub type Meta = SnapshotMeta<CommittedLeaderId, u64, openraft::BasicNode>;

/// One RPC or its reply.
#[derive(Debug)]
pub enum Message {
    Append(AppendEntriesRequest<PartitionRaft>),
    AppendReply(AppendEntriesResponse<PartitionRaft>),
    Vote(VoteRequest<PartitionRaft>),
    VoteReply(VoteResponse<PartitionRaft>),
    /// Would the receiver grant this vote (Raft's Pre-Vote)? Answered with a `VoteReply`;
    /// nothing changes on the receiver.
    PreVote(VoteRequest<PartitionRaft>),
    /// A snapshot (see `state_machine`): the leader's vote, the snapshot's meta and the
    /// Kafka offset after its last entry, where the receiver's log goes on.
    Snapshot {
        vote: Vote,
        meta: Meta,
        data: SnapshotData,
    },
    SnapshotReply(SnapshotResponse<PartitionRaft>),
    /// The receiver could not serve the request (no such group, group shutting down, ...).
    Failed(String),
    /// An opaque request for the receiving node itself (a broker asking the controller to
    /// apply a change); the group id is unused.
    Forward(Bytes),
    /// The answer to a `Forward`: a payload or why it failed.
    ForwardReply(Result<Bytes, String>),
    /// Node liveness: one per peer per interval, whatever the number of groups.
    Ping,
    Pong,
    /// The coalesced heartbeat of node `leader`'s quiet groups that the receiver follows:
    /// one per peer per interval, each group with the term it leads in (the group id of the
    /// frame is unused).
    Beat {
        leader: u64,
        groups: Vec<(GroupId, u64)>,
    },
    /// The groups of a `Beat` the receiver does not follow that leader in, at that term: the
    /// leader wakes them, so their Raft heartbeats settle who leads.
    BeatReply(Vec<GroupId>),
    /// Where the receiver's replica of the frame's group starts its log (a leader waiting
    /// for a log start to reach every replica, as Kafka's DeleteRecords does).
    LogStart,
    LogStartReply(i64),
    /// openraft's leadership handover, broadcast by a leader that hands its group to
    /// another replica (`Raft::trigger().transfer_leader`).
    TransferLeader(TransferLeaderRequest<PartitionRaft>),
    TransferLeaderReply(TransferLeaderResponse<PartitionRaft>),
    /// Asks the receiver's replica of the frame's group, if it leads, to hand leadership to
    /// node `to` (a preferred-leader election, Kafka's ElectLeaders).
    Elect {
        to: u64,
    },
    /// What came of an `Elect`.
    ElectReply(Handover),
}

/// What a leader asked to hand its group over did (`Transport::elect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The handover runs: the new leader stands for election with the whole log.
    Started,
    /// The receiver does not lead the group (any more).
    NotLeader,
    /// The replica to take over did not catch up with the leader's log in time, or its
    /// node does not answer; the leader leads on.
    Behind,
}

/// A message with its routing: the group it is for and the request it answers.
#[derive(Debug)]
pub struct Frame {
    pub correlation: u64,
    pub group: GroupId,
    pub message: Message,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame is shorter than its fields say.
    #[error("frame cut short")]
    Short,
    /// The length prefix is larger than [`FRAME_BYTES_MAX`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// An unknown message kind or enum tag.
    #[error("unknown {what} tag {tag}")]
    UnknownTag { what: &'static str, tag: u8 },
    /// An entry's batch is damaged or is not a Raft entry.
    #[error("bad entry: {0}")]
    Entry(String),
    /// Bytes left over after the message.
    #[error("{0} trailing bytes in frame")]
    Trailing(usize),
}

const APPEND: u8 = 1;
const APPEND_REPLY: u8 = 2;
const VOTE: u8 = 3;
const VOTE_REPLY: u8 = 4;
const SNAPSHOT: u8 = 5;
const SNAPSHOT_REPLY: u8 = 6;
const FAILED: u8 = 7;
const FORWARD: u8 = 8;
const FORWARD_REPLY: u8 = 9;
const PING: u8 = 10;
const PONG: u8 = 11;
const BEAT: u8 = 12;
const BEAT_REPLY: u8 = 13;
const PRE_VOTE: u8 = 14;
const LOG_START: u8 = 15;
const LOG_START_REPLY: u8 = 16;
const TRANSFER_LEADER: u8 = 17;
const TRANSFER_LEADER_REPLY: u8 = 18;
const ELECT: u8 = 19;
const ELECT_REPLY: u8 = 20;

/// Appends `frame`, length prefix included, to `out`; a frame over [`FRAME_BYTES_MAX`] is
/// not appended.
pub fn encode(frame: &Frame, out: &mut BytesMut) -> Result<(), WireError> {
    let start = out.len();
    out.put_u32(0);
    let kind = match &frame.message {
        Message::Append(_) => APPEND,
        Message::AppendReply(_) => APPEND_REPLY,
        Message::Vote(_) => VOTE,
        Message::VoteReply(_) => VOTE_REPLY,
        Message::PreVote(_) => PRE_VOTE,
        Message::Snapshot { .. } => SNAPSHOT,
        Message::SnapshotReply(_) => SNAPSHOT_REPLY,
        Message::Failed(_) => FAILED,
        Message::Forward(_) => FORWARD,
        Message::ForwardReply(_) => FORWARD_REPLY,
        Message::Ping => PING,
        Message::Pong => PONG,
        Message::Beat { .. } => BEAT,
        Message::BeatReply(_) => BEAT_REPLY,
        Message::LogStart => LOG_START,
        Message::LogStartReply(_) => LOG_START_REPLY,
        Message::TransferLeader(_) => TRANSFER_LEADER,
        Message::TransferLeaderReply(_) => TRANSFER_LEADER_REPLY,
        Message::Elect { .. } => ELECT,
        Message::ElectReply(_) => ELECT_REPLY,
    };
    out.put_u8(kind);
    out.put_u64(frame.correlation);
    out.put_u64(frame.group.0);
    match &frame.message {
        Message::Append(rpc) => {
            put_vote(out, &rpc.vote);
            put_log_id(out, rpc.prev_log_id.as_ref());
            put_log_id(out, rpc.leader_commit.as_ref());
            out.put_u32(u32::try_from(rpc.entries.len()).expect("entry count fits u32"));
            for e in &rpc.entries {
                put_entry(out, e);
            }
        }
        Message::AppendReply(reply) => match reply {
            AppendEntriesResponse::Success => out.put_u8(0),
            AppendEntriesResponse::PartialSuccess(upto) => {
                out.put_u8(1);
                put_log_id(out, upto.as_ref());
            }
            AppendEntriesResponse::Conflict => out.put_u8(2),
            AppendEntriesResponse::HigherVote(v) => {
                out.put_u8(3);
                put_vote(out, v);
            }
        },
        Message::Vote(rpc) | Message::PreVote(rpc) => {
            put_vote(out, &rpc.vote);
            put_log_id(out, rpc.last_log_id.as_ref());
            out.put_u8(u8::from(rpc.leadership_transfer));
        }
        Message::VoteReply(reply) => {
            put_vote(out, &reply.vote);
            out.put_u8(u8::from(reply.vote_granted));
            put_log_id(out, reply.last_log_id.as_ref());
        }
        Message::Snapshot { vote, meta, data } => {
            put_vote(out, vote);
            put_snapshot(out, meta, data);
        }
        Message::SnapshotReply(reply) => put_vote(out, &reply.vote),
        Message::Failed(why) => put_bytes(out, why.as_bytes()),
        Message::Forward(payload) => put_bytes(out, payload),
        Message::ForwardReply(Ok(payload)) => {
            out.put_u8(0);
            put_bytes(out, payload);
        }
        Message::ForwardReply(Err(why)) => {
            out.put_u8(1);
            put_bytes(out, why.as_bytes());
        }
        Message::Ping | Message::Pong | Message::LogStart => {}
        Message::LogStartReply(offset) => out.put_i64(*offset),
        Message::TransferLeader(rpc) => {
            put_vote(out, rpc.from_leader());
            out.put_u64(*rpc.to_node_id());
            put_log_id(out, rpc.last_log_id());
        }
        Message::TransferLeaderReply(reply) => match reply {
            Ok(()) => out.put_u8(0),
            Err(TransferLeaderError::VoteChanged { expected, actual }) => {
                out.put_u8(1);
                put_vote(out, expected);
                put_vote(out, actual);
            }
            Err(TransferLeaderError::LogNotFlushed { expected, actual }) => {
                out.put_u8(2);
                put_log_id(out, expected.as_ref());
                put_log_id(out, actual.as_ref());
            }
        },
        Message::Elect { to } => out.put_u64(*to),
        Message::ElectReply(handover) => out.put_u8(match handover {
            Handover::Started => 0,
            Handover::NotLeader => 1,
            Handover::Behind => 2,
        }),
        Message::Beat { leader, groups } => {
            out.put_u64(*leader);
            out.put_u32(u32::try_from(groups.len()).expect("group count fits u32"));
            for (group, term) in groups {
                out.put_u64(group.0);
                out.put_u64(*term);
            }
        }
        Message::BeatReply(groups) => {
            out.put_u32(u32::try_from(groups.len()).expect("group count fits u32"));
            for group in groups {
                out.put_u64(group.0);
            }
        }
    }
    let length = out.len() - start - 4;
    if length > FRAME_BYTES_MAX {
        out.truncate(start);
        return Err(WireError::TooLarge(length));
    }
    out[start..start + 4].copy_from_slice(&(length as u32).to_be_bytes());
    Ok(())
}

/// The length of the frame at the start of `buf` (prefix included) once its prefix is there.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let length = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if length > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge(length));
    }
    if length < FRAME_HEADER_BYTES {
        return Err(WireError::Short);
    }
    Ok(Some(4 + length))
}

/// Decodes one whole frame without its length prefix.
pub fn decode(mut b: Bytes) -> Result<Frame, WireError> {
    need(&b, FRAME_HEADER_BYTES)?;
    let kind = b.get_u8();
    let correlation = b.get_u64();
    let group = GroupId(b.get_u64());
    let message = match kind {
        APPEND => {
            let vote = get_vote(&mut b)?;
            let prev_log_id = get_log_id(&mut b)?;
            let leader_commit = get_log_id(&mut b)?;
            need(&b, 4)?;
            let count = b.get_u32() as usize;
            // Each entry takes at least 12 bytes, so the count is bounded by the frame.
            if count > b.len() / 12 {
                return Err(WireError::Short);
            }
            let mut entries = Vec::with_capacity(count);
            for _ in 0..count {
                entries.push(get_entry(&mut b)?);
            }
            Message::Append(AppendEntriesRequest {
                vote,
                prev_log_id,
                entries,
                leader_commit,
            })
        }
        APPEND_REPLY => {
            need(&b, 1)?;
            Message::AppendReply(match b.get_u8() {
                0 => AppendEntriesResponse::Success,
                1 => AppendEntriesResponse::PartialSuccess(get_log_id(&mut b)?),
                2 => AppendEntriesResponse::Conflict,
                3 => AppendEntriesResponse::HigherVote(get_vote(&mut b)?),
                tag => {
                    return Err(WireError::UnknownTag {
                        what: "append reply",
                        tag,
                    })
                }
            })
        }
        VOTE | PRE_VOTE => {
            let vote = get_vote(&mut b)?;
            let last_log_id = get_log_id(&mut b)?;
            need(&b, 1)?;
            let mut rpc = VoteRequest::new(vote, last_log_id);
            rpc.leadership_transfer = b.get_u8() != 0;
            if kind == PRE_VOTE {
                Message::PreVote(rpc)
            } else {
                Message::Vote(rpc)
            }
        }
        VOTE_REPLY => {
            let vote = get_vote(&mut b)?;
            need(&b, 1)?;
            let granted = b.get_u8() != 0;
            let last_log_id = get_log_id(&mut b)?;
            Message::VoteReply(VoteResponse::new(vote, last_log_id, granted))
        }
        SNAPSHOT => {
            let vote = get_vote(&mut b)?;
            let (meta, data) = get_snapshot(&mut b)?;
            Message::Snapshot { vote, meta, data }
        }
        SNAPSHOT_REPLY => Message::SnapshotReply(SnapshotResponse::new(get_vote(&mut b)?)),
        FAILED => {
            let raw = get_bytes(&mut b)?;
            Message::Failed(String::from_utf8_lossy(&raw).into_owned())
        }
        FORWARD => Message::Forward(get_bytes(&mut b)?),
        FORWARD_REPLY => {
            need(&b, 1)?;
            match b.get_u8() {
                0 => Message::ForwardReply(Ok(get_bytes(&mut b)?)),
                1 => {
                    let raw = get_bytes(&mut b)?;
                    Message::ForwardReply(Err(String::from_utf8_lossy(&raw).into_owned()))
                }
                tag => {
                    return Err(WireError::UnknownTag {
                        what: "forward reply",
                        tag,
                    })
                }
            }
        }
        PING => Message::Ping,
        PONG => Message::Pong,
        LOG_START => Message::LogStart,
        LOG_START_REPLY => {
            need(&b, 8)?;
            Message::LogStartReply(b.get_i64())
        }
        TRANSFER_LEADER => {
            let from = get_vote(&mut b)?;
            need(&b, 8)?;
            let to = b.get_u64();
            let last_log_id = get_log_id(&mut b)?;
            Message::TransferLeader(TransferLeaderRequest::new(from, to, last_log_id))
        }
        TRANSFER_LEADER_REPLY => {
            need(&b, 1)?;
            Message::TransferLeaderReply(match b.get_u8() {
                0 => Ok(()),
                1 => Err(TransferLeaderError::VoteChanged {
                    expected: get_vote(&mut b)?,
                    actual: get_vote(&mut b)?,
                }),
                2 => Err(TransferLeaderError::LogNotFlushed {
                    expected: get_log_id(&mut b)?,
                    actual: get_log_id(&mut b)?,
                }),
                tag => {
                    return Err(WireError::UnknownTag {
                        what: "transfer leader reply",
                        tag,
                    })
                }
            })
        }
        ELECT => {
            need(&b, 8)?;
            Message::Elect { to: b.get_u64() }
        }
        ELECT_REPLY => {
            need(&b, 1)?;
            Message::ElectReply(match b.get_u8() {
                0 => Handover::Started,
                1 => Handover::NotLeader,
                2 => Handover::Behind,
                tag => {
                    return Err(WireError::UnknownTag {
                        what: "elect reply",
                        tag,
                    })
                }
            })
        }
        BEAT => {
            need(&b, 8 + 4)?;
            let leader = b.get_u64();
            let count = b.get_u32() as usize;
            need(&b, count.saturating_mul(16))?;
            let groups = (0..count)
                .map(|_| (GroupId(b.get_u64()), b.get_u64()))
                .collect();
            Message::Beat { leader, groups }
        }
        BEAT_REPLY => {
            need(&b, 4)?;
            let count = b.get_u32() as usize;
            need(&b, count.saturating_mul(8))?;
            Message::BeatReply((0..count).map(|_| GroupId(b.get_u64())).collect())
        }
        tag => return Err(WireError::UnknownTag { what: "frame", tag }),
    };
    if !b.is_empty() {
        return Err(WireError::Trailing(b.len()));
    }
    Ok(Frame {
        correlation,
        group,
        message,
    })
}

fn need(b: &Bytes, n: usize) -> Result<(), WireError> {
    if b.len() < n {
        Err(WireError::Short)
    } else {
        Ok(())
    }
}

fn put_vote(out: &mut BytesMut, v: &Vote) {
    out.put_u64(v.leader_id.term);
    out.put_u64(v.leader_id.voted_for);
    out.put_u8(u8::from(v.committed));
}

fn get_vote(b: &mut Bytes) -> Result<Vote, WireError> {
    need(b, 17)?;
    let term = b.get_u64();
    let voted_for = b.get_u64();
    let committed = b.get_u8() != 0;
    Ok(Vote {
        leader_id: LeaderId { term, voted_for },
        committed,
    })
}

fn put_log_id(out: &mut BytesMut, id: Option<&EntryLogId>) {
    match id {
        Some(id) => {
            out.put_u8(1);
            out.put_u64(id.leader_id.term);
            out.put_u64(id.index);
        }
        None => out.put_u8(0),
    }
}

fn get_log_id(b: &mut Bytes) -> Result<Option<EntryLogId>, WireError> {
    need(b, 1)?;
    match b.get_u8() {
        0 => Ok(None),
        1 => {
            need(b, 16)?;
            let term = b.get_u64();
            Ok(Some(EntryLogId::new(
                CommittedLeaderId::new(term),
                b.get_u64(),
            )))
        }
        tag => Err(WireError::UnknownTag {
            what: "log id",
            tag,
        }),
    }
}

/// A snapshot's meta, the offset after its last entry and the partition's state, as sent
/// and as kept on disk.
pub fn put_snapshot(out: &mut BytesMut, meta: &Meta, data: &SnapshotData) {
    put_log_id(out, meta.last_log_id.as_ref());
    put_log_id(out, meta.last_membership.log_id().as_ref());
    put_bytes(
        out,
        &entry::encode_membership(meta.last_membership.membership()),
    );
    out.put_i64(data.next_offset);
    put_bytes(out, &data.partition_state);
}

/// Reads what `put_snapshot` wrote. One that ends after the offset (written before
/// snapshots carried the partition's state) has none.
pub fn get_snapshot(b: &mut Bytes) -> Result<(Meta, SnapshotData), WireError> {
    let last_log_id = get_log_id(b)?;
    let membership_log_id = get_log_id(b)?;
    let raw = get_bytes(b)?;
    let membership = entry::decode_membership(&raw).map_err(|e| WireError::Entry(e.to_string()))?;
    need(b, 8)?;
    let next_offset = b.get_i64();
    if next_offset < 0 {
        return Err(WireError::Entry(format!(
            "snapshot at offset {next_offset}"
        )));
    }
    let partition_state = match b.has_remaining() {
        true => get_bytes(b)?,
        false => Bytes::new(),
    };
    let meta = Meta {
        last_log_id,
        last_membership: StoredMembership::new(membership_log_id, membership),
    };
    let data = SnapshotData {
        next_offset,
        partition_state,
    };
    Ok((meta, data))
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32(u32::try_from(bytes.len()).expect("field fits u32"));
    out.put_slice(bytes);
}

fn get_bytes(b: &mut Bytes) -> Result<Bytes, WireError> {
    need(b, 4)?;
    let n = b.get_u32() as usize;
    need(b, n)?;
    Ok(b.split_to(n))
}

fn put_entry(out: &mut BytesMut, e: &Entry) {
    let mut stored = entry::encode(e, 0);
    // The base offset is the receiver's to set (its log is the leader's up to here); the
    // term travels as the leader epoch, as on disk.
    let base_offset = batch::BatchHeader::parse(&stored).map_or(0, |h| h.base_offset);
    batch::set_offset_and_epoch(
        &mut stored,
        base_offset,
        entry::epoch_of(e.log_id.leader_id.term),
    );
    out.put_u64(e.log_id.index);
    put_bytes(out, &stored);
}

fn get_entry(b: &mut Bytes) -> Result<Entry, WireError> {
    need(b, 8)?;
    let index = b.get_u64();
    let stored = get_bytes(b)?;
    let header = batch::verify(&stored).map_err(|e| WireError::Entry(e.to_string()))?;
    if header.total_bytes() != stored.len() {
        return Err(WireError::Entry("more than one batch".into()));
    }
    entry::decode(index, stored).map_err(|e| WireError::Entry(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{EntryPayload, Membership};
    use std::collections::BTreeSet;

    fn id(term: u64, index: u64) -> EntryLogId {
        EntryLogId::new(CommittedLeaderId::new(term), index)
    }

    fn vote(term: u64, node: u64) -> Vote {
        Vote {
            leader_id: LeaderId {
                term,
                voted_for: node,
            },
            committed: true,
        }
    }

    fn round_trip(message: Message) -> Frame {
        let mut out = BytesMut::new();
        encode(
            &Frame {
                correlation: 77,
                group: GroupId(9),
                message,
            },
            &mut out,
        )
        .unwrap();
        let len = frame_len(&out).unwrap().unwrap();
        assert_eq!(len, out.len());
        let frame = decode(out.freeze().slice(4..)).unwrap();
        assert_eq!((frame.correlation, frame.group), (77, GroupId(9)));
        frame
    }

    #[test]
    fn every_message_round_trips() {
        let members = Membership::new_with_defaults(vec![BTreeSet::from([1, 2, 3])], []);
        let entries = vec![
            Entry {
                log_id: id(2, 5),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: id(2, 6),
                payload: EntryPayload::Membership(members.clone()),
            },
        ];
        let Message::Append(rpc) = round_trip(Message::Append(AppendEntriesRequest {
            vote: vote(2, 1),
            prev_log_id: Some(id(1, 4)),
            entries: entries.clone(),
            leader_commit: Some(id(1, 3)),
        }))
        .message
        else {
            panic!("not an append")
        };
        assert_eq!(
            (rpc.vote, rpc.prev_log_id, rpc.leader_commit),
            (vote(2, 1), Some(id(1, 4)), Some(id(1, 3)))
        );
        assert_eq!(rpc.entries, entries);
        for reply in [
            AppendEntriesResponse::Success,
            AppendEntriesResponse::PartialSuccess(Some(id(3, 3))),
            AppendEntriesResponse::PartialSuccess(None),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(vote(4, 2)),
        ] {
            let Message::AppendReply(got) = round_trip(Message::AppendReply(reply.clone())).message
            else {
                panic!("not an append reply")
            };
            assert_eq!(got, reply);
        }
        let mut rpc = VoteRequest::new(vote(5, 3), Some(id(4, 10)));
        rpc.leadership_transfer = true;
        let Message::Vote(got) = round_trip(Message::Vote(rpc.clone())).message else {
            panic!("not a vote")
        };
        assert_eq!(got, rpc);
        let Message::PreVote(got) = round_trip(Message::PreVote(rpc.clone())).message else {
            panic!("not a pre-vote")
        };
        assert_eq!(got, rpc);
        let reply = VoteResponse::new(vote(5, 3), Some(id(4, 10)), true);
        let Message::VoteReply(got) = round_trip(Message::VoteReply(reply.clone())).message else {
            panic!("not a vote reply")
        };
        assert_eq!(got, reply);
        let meta = Meta {
            last_log_id: Some(id(3, 30)),
            last_membership: StoredMembership::new(Some(id(1, 2)), members),
        };
        let data = SnapshotData {
            next_offset: 4096,
            partition_state: Bytes::from_static(b"producers"),
        };
        let Message::Snapshot {
            vote: v,
            meta: m,
            data: d,
        } = round_trip(Message::Snapshot {
            vote: vote(3, 1),
            meta: meta.clone(),
            data: data.clone(),
        })
        .message
        else {
            panic!("not a snapshot")
        };
        assert_eq!((v, m, d), (vote(3, 1), meta, data));
        let Message::Failed(why) = round_trip(Message::Failed("no such group".into())).message
        else {
            panic!("not a failure")
        };
        assert_eq!(why, "no such group");
        let Message::Forward(p) = round_trip(Message::Forward(Bytes::from_static(b"req"))).message
        else {
            panic!("not a forward")
        };
        assert_eq!(&p[..], b"req");
        for reply in [
            Ok(Bytes::from_static(b"done")),
            Err("not the controller".to_string()),
        ] {
            let Message::ForwardReply(got) =
                round_trip(Message::ForwardReply(reply.clone())).message
            else {
                panic!("not a forward reply")
            };
            assert_eq!(got, reply);
        }
        assert!(matches!(round_trip(Message::Ping).message, Message::Ping));
        assert!(matches!(round_trip(Message::Pong).message, Message::Pong));
        assert!(matches!(
            round_trip(Message::LogStart).message,
            Message::LogStart
        ));
        assert!(matches!(
            round_trip(Message::LogStartReply(-7)).message,
            Message::LogStartReply(-7)
        ));
        let beat = vec![(GroupId(3), 7), (GroupId(u64::MAX), 1)];
        let Message::Beat { leader, groups } = round_trip(Message::Beat {
            leader: 2,
            groups: beat.clone(),
        })
        .message
        else {
            panic!("not a beat")
        };
        assert_eq!((leader, groups), (2, beat));
        let Message::BeatReply(groups) = round_trip(Message::BeatReply(vec![GroupId(5)])).message
        else {
            panic!("not a beat reply")
        };
        assert_eq!(groups, vec![GroupId(5)]);
        let rpc = TransferLeaderRequest::new(vote(6, 1), 3, Some(id(6, 40)));
        let Message::TransferLeader(got) = round_trip(Message::TransferLeader(rpc.clone())).message
        else {
            panic!("not a transfer")
        };
        assert_eq!(got, rpc);
        for reply in [
            Ok(()),
            Err(TransferLeaderError::VoteChanged {
                expected: vote(6, 1),
                actual: vote(7, 2),
            }),
            Err(TransferLeaderError::LogNotFlushed {
                expected: Some(id(6, 40)),
                actual: None,
            }),
        ] {
            let Message::TransferLeaderReply(got) =
                round_trip(Message::TransferLeaderReply(reply.clone())).message
            else {
                panic!("not a transfer reply")
            };
            assert_eq!(got, reply);
        }
        assert!(matches!(
            round_trip(Message::Elect { to: 2 }).message,
            Message::Elect { to: 2 }
        ));
        for handover in [Handover::Started, Handover::NotLeader, Handover::Behind] {
            let Message::ElectReply(got) = round_trip(Message::ElectReply(handover)).message else {
                panic!("not an elect reply")
            };
            assert_eq!(got, handover);
        }
    }

    #[test]
    fn damaged_frames_are_errors() {
        let mut out = BytesMut::new();
        encode(
            &Frame {
                correlation: 1,
                group: GroupId(1),
                message: Message::Append(AppendEntriesRequest {
                    vote: vote(1, 1),
                    prev_log_id: None,
                    entries: vec![Entry {
                        log_id: id(1, 1),
                        payload: EntryPayload::Blank,
                    }],
                    leader_commit: None,
                }),
            },
            &mut out,
        )
        .unwrap();
        let body = out.freeze().slice(4..);
        for cut in 0..body.len() {
            assert!(decode(body.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut flipped = BytesMut::from(&body[..]);
        let n = flipped.len();
        flipped[n - 5] ^= 0x40; // inside the entry's batch: the CRC catches it
        assert!(decode(flipped.freeze()).is_err());
        // A group count beyond the bytes at hand is an error, not an allocation.
        let mut huge = BytesMut::new();
        huge.put_u8(BEAT);
        huge.put_u64(1);
        huge.put_u64(0);
        huge.put_u64(2);
        huge.put_u32(u32::MAX);
        assert_eq!(decode(huge.freeze()).err(), Some(WireError::Short));
        assert_eq!(
            frame_len(&[0xff, 0xff, 0xff, 0xff]),
            Err(WireError::TooLarge(u32::MAX as usize))
        );
    }
}
