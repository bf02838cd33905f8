//! A fair budget's ring of waiting keys (crate::fair; named by [`crate::budgets::FairRing::name`]):
//! who joins it, who leaves it, where its next drain starts and when it wakes. The drain itself is the ordinary unpark of each key's
//! head, in the order [`crate::fair::Round`] gives.

use super::*;
use crate::fair::{Member, Ring};

#[derive(Debug, Clone, Default)]
pub(super) struct RingState {
    ring: Ring,
    /// When each member joined: the ring is in that order, members that joined at the same time
    /// by `<rule>\n<key>` (as Redis orders a sorted set's ties).
    joined: HashMap<Member, Millis>,
    /// When the ring's drain is armed to wake (a task made for it).
    wake: Option<Millis>,
}

/// A key of a rule drawing from a fair budget parked a message: it joins its ring of waiting keys
/// (`ring`: [`crate::budgets::FairRing::name`]), at its end, unless it is in it
/// ([`Scheduler::decide`] parks and joins in one step).
pub(super) fn join(rings: &mut HashMap<String, RingState>, ring: &str, member: &Member, now: Millis) {
    let state = rings.entry(ring.to_owned()).or_default();
    if !state.ring.members.contains(member) {
        state.ring.members.push(member.clone());
        state.joined.insert(member.clone(), now);
    }
}

/// A key parked in the ring at `now`, in the same step as it joined, and its drain should wake at
/// `wanted`: the wake armed (recorded: the caller makes its task), or `None` when one is armed
/// already and not lost ([`WAKE_LOST_AFTER`]).
pub(super) fn arm(rings: &mut HashMap<String, RingState>, ring: &str, now: Millis, wanted: Millis) -> Option<Millis> {
    let state = rings.entry(ring.to_owned()).or_default();
    if state.wake.is_some_and(|wake| wake + WAKE_LOST_AFTER >= now) {
        return None;
    }
    let wake = wanted.clamp(now, now + MAX_WAKE_GAP);
    state.wake = Some(wake);
    Some(wake)
}

impl Scheduler {
    /// The budget's ring: its waiting keys, oldest first, and where its next drain starts.
    pub fn fair_ring(&self, budget: &str) -> Ring {
        let Some(state) = self.rings.get(budget) else { return Ring::default() };
        let mut ring = state.ring.clone();
        let order = |m: &Member| (state.joined.get(m).copied(), format!("{}\n{}", m.rule, m.key));
        ring.members.sort_by_cached_key(order);
        ring
    }

    /// The drain found the member's queue empty (`gone`: its rule no longer exists): it leaves
    /// the ring, unless a message of it parked since (then it stays, and `false`).
    pub fn fair_leave(&mut self, budget: &str, member: &Member, gone: bool) -> bool {
        let parked = self.entity_state(&member.rule, &member.key).map_or(0, |s| s.parked);
        if parked > 0 && !gone {
            return false;
        }
        if let Some(state) = self.rings.get_mut(budget) {
            state.ring.members.retain(|m| m != member);
            state.joined.remove(member);
        }
        true
    }

    /// A drain of the ring ended at `now`: its next one starts at `cursor`, and wakes at `wake`;
    /// with none while keys still wait (one joined during the drain, and its wake found this one
    /// armed), at `now`. Returns the wake to make a task for (`None`: nobody waits; the next key
    /// to park arms one).
    pub fn fair_turned(&mut self, budget: &str, now: Millis, cursor: u64, wake: Option<Millis>) -> Option<Millis> {
        let state = self.rings.entry(budget.to_owned()).or_default();
        state.ring.cursor = cursor;
        state.wake = wake.or((!state.ring.members.is_empty()).then_some(now));
        state.wake
    }
}
