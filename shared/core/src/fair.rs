//! Fair budgets (docs/rules.md: "Fair budgets"): book near, park far. While a `fair: true` budget
//! binds, an event whose slot lies past the budget's near horizon parks in its key's queue, and
//! the key joins the budget's ring of waiting keys. The budget's drain hands each coming window's
//! units to the ring's keys in weighted deficit round robin ([`Round`]), booking each key's head
//! at the frontier with the ordinary arithmetic, so every window stays exact; within a key, FIFO.

use std::collections::BTreeMap;

use crate::time::Millis;

/// The weight of a key that `weights` does not name.
pub const DEFAULT_WEIGHT: u64 = 1;

/// The largest weight a key may have: a key of weight `w` takes up to `w` units a turn.
pub const MAX_WEIGHT: u64 = 1_000;

/// A budget's `fair: true`, with its `weights`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fair {
    /// By key (as the rule's key template makes it): its weight, 1 to [`MAX_WEIGHT`].
    pub weights: BTreeMap<String, u64>,
}

impl Fair {
    pub fn weight_of(&self, key: &str) -> u64 {
        self.weights.get(key).copied().unwrap_or(DEFAULT_WEIGHT)
    }
}

/// The weights of a drain's members in its [`Round`], each given as its key's group (its rule and
/// key: a rule with classes waits as one member per class of a key) and its key's weight: each
/// key's weight shared equally among its members, as the smallest integers in those proportions
/// (scaled by the lcm of the groups' sizes, reduced by the weights' gcd). A key's classes together
/// take what one member of its weight would, so a merchant's share does not grow with the
/// classes it has waiting.
pub fn shared_weights<G: Ord>(members: &[(G, u64)]) -> Vec<u64> {
    use num_integer::Integer;
    let mut sizes: BTreeMap<&G, u64> = BTreeMap::new();
    for (group, _) in members {
        *sizes.entry(group).or_default() += 1;
    }
    let scale = sizes.values().fold(1u64, |l, &n| l.lcm(&n));
    let weights: Vec<u64> = members.iter().map(|(group, weight)| weight * scale / sizes[group]).collect();
    let common = weights.iter().fold(0u64, |g, w| g.gcd(w)).max(1);
    weights.into_iter().map(|w| w / common).collect()
}

/// How far ahead a fair budget whose shortest window is `shortest` books: half of it. An event
/// whose slot lies later parks; the drain books each window once it lies within this, so a key
/// that was quiet is in the next round of a window that nobody has booked yet.
pub fn near_horizon(shortest: Millis) -> Millis {
    (shortest / 2).max(1)
}

/// A key waiting in a fair budget's ring: its rule (id) and key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub rule: String,
    pub key: String,
}

/// The ring of a fair budget's waiting keys, in the order they joined, and where the next drain
/// starts (the member after the last one the previous drain served).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ring {
    pub members: Vec<Member>,
    pub cursor: u64,
}

/// One drain's deficit round robin over a ring: [`Round::visit`] gives the next member's turn
/// with its deficit topped up by its weight; the drain books its queue's heads while
/// [`Round::affords`] their cost, [`Round::spend`]s it, and [`Round::retire`]s a member whose
/// queue is empty or whose head does not fit before the drain's deadline. Each key gets units in
/// proportion to its weight while all wait; what a retired key cannot use goes to the others.
/// Pure: O(1) per turn, no I/O.
#[derive(Debug, Clone)]
pub struct Round {
    weights: Vec<u64>,
    deficits: Vec<u64>,
    active: Vec<bool>,
    /// The member whose turn it is or was last.
    at: usize,
    started: bool,
    /// The member after the last that spent anything: the next drain's start.
    next_start: usize,
}

impl Round {
    /// A round over members of these weights, starting at `cursor` (modulo their number).
    pub fn new(weights: Vec<u64>, cursor: u64) -> Self {
        let n = weights.len();
        let start = if n == 0 { 0 } else { (cursor % n as u64) as usize };
        Self { deficits: vec![0; n], active: vec![true; n], at: start, started: false, next_start: start, weights }
    }

    /// The next active member's turn, its deficit topped up by its weight; `None` once every
    /// member is retired.
    pub fn visit(&mut self) -> Option<usize> {
        let n = self.weights.len();
        if !self.active.iter().any(|&a| a) {
            return None;
        }
        let mut at = if self.started { (self.at + 1) % n } else { self.at };
        while !self.active[at] {
            at = (at + 1) % n;
        }
        self.started = true;
        self.at = at;
        self.deficits[at] += self.weights[at];
        Some(at)
    }

    /// Whether `member` may book an event of this cost in its turn.
    pub fn affords(&self, member: usize, cost: u64) -> bool {
        self.active[member] && self.deficits[member] >= cost
    }

    /// `member` booked an event of this cost.
    pub fn spend(&mut self, member: usize, cost: u64) {
        self.deficits[member] = self.deficits[member].saturating_sub(cost);
        self.next_start = (member + 1) % self.weights.len();
    }

    /// `member` takes no more turns in this drain (its queue is empty, or its head's slot is past
    /// the deadline); its deficit is dropped, as deficit round robin drops an idle queue's.
    pub fn retire(&mut self, member: usize) {
        self.active[member] = false;
        self.deficits[member] = 0;
    }

    /// Whether `member` still takes turns in this drain.
    pub fn active(&self, member: usize) -> bool {
        self.active[member]
    }

    /// `member`'s weight: the units its turn adds.
    pub fn weight(&self, member: usize) -> u64 {
        self.weights[member]
    }

    /// Where the next drain of the ring starts.
    pub fn cursor(&self) -> u64 {
        self.next_start as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Drains queues (each a list of costs) through a round until `capacity` units are booked
    /// or every queue is done: what each member booked.
    fn drain(weights: &[u64], queues: &[Vec<u64>], capacity: u64, cursor: u64) -> (Vec<u64>, u64) {
        let mut round = Round::new(weights.to_vec(), cursor);
        let mut heads = vec![0; queues.len()];
        let mut booked = vec![0; queues.len()];
        let mut left = capacity;
        while let Some(m) = round.visit() {
            loop {
                let Some(&cost) = queues[m].get(heads[m]) else {
                    round.retire(m);
                    break;
                };
                if cost > left {
                    round.retire(m);
                    break;
                }
                if !round.affords(m, cost) {
                    break;
                }
                round.spend(m, cost);
                heads[m] += 1;
                booked[m] += cost;
                left -= cost;
            }
        }
        (booked, round.cursor())
    }

    #[test]
    fn equal_weights_take_turns_and_a_quiet_key_is_served_in_the_first_pass() {
        let (booked, cursor) = drain(&[1, 1, 1, 1], &[vec![1; 800], vec![1; 4], vec![1; 4], vec![1; 4]], 40, 0);
        assert_eq!(booked, vec![28, 4, 4, 4]);
        assert_eq!(cursor, 1, "the noisy key spent last: the next drain starts after it");
        let (booked, _) = drain(&[1, 1], &[vec![1; 800], vec![1; 1]], 1, 1);
        assert_eq!(booked, vec![0, 1], "a drain starts at the cursor");
    }

    #[test]
    fn weights_share_the_units_in_proportion() {
        let (booked, _) = drain(&[3, 1], &[vec![1; 100], vec![1; 100]], 40, 0);
        assert_eq!(booked, vec![30, 10]);
    }

    #[test]
    fn a_costly_head_waits_until_its_deficit_covers_it() {
        let (booked, _) = drain(&[1, 1], &[vec![3; 10], vec![1; 10]], 8, 0);
        assert_eq!(booked, vec![3, 5], "three turns of one unit pay for the cost of three");
    }

    #[test]
    fn a_key_s_classes_share_its_weight() {
        let members = [(("payouts", "a"), 1), (("payouts", "a"), 1), (("payouts", "b"), 1), (("payouts", "c"), 3)];
        assert_eq!(shared_weights(&members), [1, 1, 2, 6], "a's two classes take one key's turn together");
        assert_eq!(shared_weights(&[("a", 2), ("b", 4)]), [1, 2], "the smallest integers in proportion");
        assert_eq!(shared_weights::<&str>(&[]), Vec::<u64>::new());
    }

    proptest! {
        /// Each key's members together weigh in proportion to its key's weight, its members alike,
        /// and the weights have no common divisor.
        #[test]
        fn shared_weights_keep_each_key_s_proportion(
            keys in proptest::collection::vec((1u64..=MAX_WEIGHT, 1usize..=4), 1..6),
        ) {
            let members: Vec<(usize, u64)> =
                keys.iter().enumerate().flat_map(|(k, &(w, n))| std::iter::repeat_n((k, w), n)).collect();
            let shared = shared_weights(&members);
            let total = |k: usize| members.iter().zip(&shared).filter(|((g, _), _)| *g == k).map(|(_, w)| *w).sum::<u64>();
            for (a, &(wa, _)) in keys.iter().enumerate() {
                for (b, &(wb, _)) in keys.iter().enumerate() {
                    prop_assert_eq!(total(a) * wb, total(b) * wa);
                }
                let mine: Vec<u64> = members.iter().zip(&shared).filter(|((g, _), _)| *g == a).map(|(_, w)| *w).collect();
                prop_assert!(mine.windows(2).all(|p| p[0] == p[1]));
            }
            prop_assert_eq!(shared.iter().fold(0u64, |g, w| num_integer::Integer::gcd(&g, w)), 1);
        }

        /// Max-min fair and work conserving: every unit that any queue could use is booked, and
        /// while two keys both still wait, neither is ahead of its weighted share by more than a
        /// turn (its weight plus the largest cost).
        #[test]
        fn shares_follow_the_weights_and_nothing_is_left_that_someone_could_use(
            weights in proptest::collection::vec(1u64..5, 1..6),
            lengths in proptest::collection::vec(0usize..40, 6),
            capacity in 0u64..120,
            cursor in 0u64..10,
        ) {
            let queues: Vec<Vec<u64>> = weights.iter().zip(&lengths).map(|(_, &n)| vec![1; n]).collect();
            let (booked, _) = drain(&weights, &queues, capacity, cursor);
            let demand: u64 = queues.iter().map(|q| q.len() as u64).sum();
            prop_assert_eq!(booked.iter().sum::<u64>(), demand.min(capacity));
            for a in 0..weights.len() {
                for b in 0..weights.len() {
                    let b_unserved = booked[b] < queues[b].len() as u64;
                    if b_unserved {
                        // b still waits: a got at most its share of what b got, plus one turn.
                        let fair = booked[b] * weights[a] / weights[b] + weights[a] + 1;
                        prop_assert!(booked[a] <= fair + weights[a], "{booked:?} by weights {weights:?}");
                    }
                }
            }
        }
    }
}
