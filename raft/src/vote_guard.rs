//! The vote guard: a replica that heard from the rest of its group lately refuses Pre-Votes
//! and votes, so that a replica that merely missed some messages (a quiet follower that
//! missed beats, one back from a network cut or a restart) cannot take a live leader's
//! partition away, and no other leader is elected while a leader's lease for reads runs.
//!
//! openraft's own lease does this for a group that heartbeats; a quiet group sends none, so
//! the transport keeps when each group last heard from the rest of it and asks
//! [`refuses_vote`]. The simulator ([`crate::sim`]) asks the same function of what its
//! simulated network delivered.

use std::time::Duration;

use openraft::async_runtime::Instant;
use openraft::ServerState;

/// A replica that heard from the rest of its group this recently refuses Pre-Votes and votes,
/// and so does one that restarted this recently with a log. Beats come every second, and a
/// follower whose leader died waits 4 s before it stands, by when the others' guard has run
/// out too; a busy group's followers refuse votes for openraft's 3.5 s lease anyway. A
/// leader's lease for reads (the broker's `READ_LEASE`) is shorter, so no other leader is
/// elected while it serves them.
pub const PRE_VOTE_GUARD: Duration = Duration::from_secs(3);

/// Whether a replica refuses a Pre-Vote, or a vote other than a leadership transfer, at `now`:
/// it heard from the rest of its group within [`PRE_VOTE_GUARD`] (as a follower of a known
/// leader, from that leader: `leader_heard`; as a leader, from a follower that answered its
/// beat: `followers_heard`), or it restarted with a log that recently (`restarted`: it may
/// have acknowledged a leader just before it went down, whose lease for reads still runs,
/// while openraft's own vote lease starts empty after a restart). The real vote is guarded
/// too: a replica that granted a Pre-Vote and then heard its leader again must not elect
/// another while that leader's lease runs.
pub fn refuses_vote<I: Instant>(
    state: ServerState,
    has_leader: bool,
    leader_heard: Option<I>,
    followers_heard: Option<I>,
    restarted: Option<I>,
    now: I,
) -> bool {
    let last = match state {
        ServerState::Leader => followers_heard,
        ServerState::Follower if has_leader => leader_heard,
        _ => None,
    };
    last.max(restarted)
        .is_some_and(|t| now - t < PRE_VOTE_GUARD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant as StdInstant;

    #[test]
    fn a_follower_that_heard_its_leader_refuses_for_the_guard_only() {
        let t0 = StdInstant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let follower =
            |heard, now| refuses_vote(ServerState::Follower, true, heard, None, None, now);
        assert!(follower(Some(at(0)), at(2999)));
        assert!(!follower(Some(at(0)), at(3000)));
        assert!(!follower(None, at(0)), "never heard: grants");
        assert!(
            !refuses_vote(ServerState::Follower, false, Some(at(0)), None, None, at(1)),
            "a follower that knows no leader does not count what it heard"
        );
        assert!(!refuses_vote(
            ServerState::Candidate,
            true,
            Some(at(0)),
            None,
            None,
            at(1)
        ));
    }

    #[test]
    fn a_leader_counts_its_followers_and_a_restart_holds_votes() {
        let t0 = StdInstant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(refuses_vote(
            ServerState::Leader,
            true,
            None,
            Some(at(0)),
            None,
            at(1000)
        ));
        assert!(!refuses_vote(
            ServerState::Leader,
            true,
            Some(at(0)),
            None,
            None,
            at(1000)
        ));
        assert!(refuses_vote(
            ServerState::Candidate,
            false,
            None,
            None,
            Some(at(0)),
            at(2000)
        ));
        assert!(!refuses_vote(
            ServerState::Candidate,
            false,
            None,
            None,
            Some(at(0)),
            at(3000)
        ));
    }
}
