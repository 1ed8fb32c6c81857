//! Check quorum (issue 17, defect h): a leader that no majority acknowledged for a while
//! stops sending its followers anything, so that they, no longer hearing it, elect another.
//!
//! Followers that hear their leader but whose answers are lost (a one-way partition, a deaf
//! leader) would otherwise refuse every vote for as long as the cut lasts: each append
//! renews the lease they grant it, while that leader can commit nothing. The partition would
//! stay unwritable until the network healed.
//!
//! [`CheckQuorum`] is the decision alone, over openraft's `Instant`, so that the broker's
//! replicas (`ferrolog::replication::raft::Replica::tend`, on real time) and the simulator
//! ([`crate::sim`], on simulated time) run the same code. Whoever holds it mutes the group's
//! appends, heartbeats and beats while [`CheckQuorum::tend`] says so
//! ([`crate::network::Transport::mute`] in the broker); votes still go out and are answered.

use std::time::Duration;

use openraft::async_runtime::Instant;

/// A leader that no majority acknowledged for this long mutes itself.
pub const CHECK_QUORUM: Duration = Duration::from_secs(6);

/// How long a leader stays muted before it probes: longer than its followers take to stand
/// once they stop hearing it (a quiet follower 4 s, then an election timeout of up to
/// 3.5 s; a busy one openraft's 3.5 s lease and the timeout), with the others' 3 s vote
/// guard run out by then.
pub const MUTED_FOR: Duration = Duration::from_secs(10);

/// How long a muted leader sends again before it may mute anew: one heartbeat round and
/// catching a follower up take much less.
pub const PROBE_FOR: Duration = Duration::from_secs(2);

/// A leader's term, since when it leads in it, and when it last muted or probed.
#[derive(Debug, Clone, Copy)]
struct Led<I> {
    term: u64,
    since: I,
    muted_at: Option<I>,
    probed_at: Option<I>,
}

/// One replica's check-quorum state.
#[derive(Debug)]
pub struct CheckQuorum<I> {
    led: Option<Led<I>>,
}

impl<I: Instant> Default for CheckQuorum<I> {
    fn default() -> Self {
        CheckQuorum { led: None }
    }
}

impl<I: Instant> CheckQuorum<I> {
    /// Looks at the replica again at `now`, and returns whether its group is to be muted.
    ///
    /// `leading` is the term this replica leads in, if it leads. A leader that no majority
    /// acknowledged (by heartbeat or beat; `silent` says how long ago one last did, `None`
    /// if none did in this term) for [`CHECK_QUORUM`] mutes for [`MUTED_FOR`], then sends
    /// again for [`PROBE_FOR`], and so on until a majority answers again or it leads no
    /// more. Muted, it grants votes (it has no lease), and a vote or append of a later term
    /// deposes it; probing, it lets a follower that needs its log (one it alone holds) catch
    /// up. Nothing changes while `settling` (what this node heard is stale after it
    /// stalled), but a new term always starts unmuted. `group` only names the group in logs.
    pub fn tend(
        &mut self,
        group: u64,
        leading: Option<u64>,
        now: I,
        silent: impl FnOnce() -> Option<Duration>,
        settling: bool,
    ) -> bool {
        let mut led = match (self.led, leading) {
            (Some(led), Some(term)) if led.term == term => led,
            _ => {
                self.led = leading.map(|term| Led {
                    term,
                    since: now,
                    muted_at: None,
                    probed_at: None,
                });
                return false;
            }
        };
        if settling {
            return led.muted_at.is_some();
        }
        let led_for = now - led.since;
        let silent = silent().map_or(led_for, |d| d.min(led_for));
        match led.muted_at {
            Some(at) if now - at >= MUTED_FOR => {
                tracing::info!(group, "a muted leader probes its followers");
                led.muted_at = None;
                led.probed_at = Some(now);
            }
            Some(_) => {}
            None => {
                let probing = led.probed_at.is_some_and(|at| now - at < PROBE_FOR);
                if silent >= CHECK_QUORUM && !probing {
                    tracing::warn!(
                        group,
                        term = led.term,
                        ?silent,
                        "no majority acknowledged this leader lately: it stops sending to \
                         its followers for a while, so that they can elect another"
                    );
                    led.muted_at = Some(now);
                }
            }
        }
        self.led = Some(led);
        led.muted_at.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant as StdInstant;

    #[test]
    fn a_leader_nobody_answers_mutes_probes_and_mutes_again() {
        let t0 = StdInstant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut cq = CheckQuorum::default();
        assert!(
            !cq.tend(1, Some(3), at(0), || None, false),
            "a new term starts unmuted"
        );
        assert!(!cq.tend(1, Some(3), at(5), || None, false));
        assert!(
            cq.tend(1, Some(3), at(6), || None, false),
            "6 s unanswered: muted"
        );
        assert!(cq.tend(1, Some(3), at(15), || None, false));
        assert!(
            !cq.tend(1, Some(3), at(16), || None, false),
            "10 s muted: probes"
        );
        assert!(
            !cq.tend(1, Some(3), at(17), || None, false),
            "probing for 2 s"
        );
        assert!(
            cq.tend(1, Some(3), at(18), || None, false),
            "then mutes again"
        );
    }

    #[test]
    fn an_answered_leader_stays_unmuted_and_a_new_term_unmutes() {
        let t0 = StdInstant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut cq = CheckQuorum::default();
        cq.tend(1, Some(3), at(0), || None, false);
        let recent = || Some(Duration::from_secs(1));
        assert!(!cq.tend(1, Some(3), at(60), recent, false));
        assert!(cq.tend(1, Some(3), at(70), || Some(Duration::from_secs(7)), false));
        assert!(
            cq.tend(1, Some(3), at(71), || None, true),
            "settling keeps the mute"
        );
        assert!(
            !cq.tend(1, None, at(72), || None, false),
            "a follower is never muted"
        );
        assert!(
            !cq.tend(1, Some(5), at(73), || None, false),
            "a new term starts unmuted"
        );
        assert!(
            !cq.tend(1, Some(5), at(78), || None, true),
            "settling does not mute"
        );
    }
}
