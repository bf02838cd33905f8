//! What a schedule used: cost per fixed window, the fullest sliding interval, GCRA conformance.
//! The simulator's summary and the tests' invariants both read schedules through these.

use std::collections::BTreeMap;

use crate::time::Millis;

/// Cost reserved in each epoch-aligned window of length `per` (only windows with any cost).
pub fn fixed_window_usage(slots: &[(Millis, u64)], per: Millis) -> BTreeMap<Millis, u64> {
    let mut usage = BTreeMap::new();
    for &(slot, cost) in slots {
        *usage.entry(slot.div_euclid(per) * per).or_default() += cost;
    }
    usage
}

/// The largest cost inside any half-open interval `[a, a + per)`.
pub fn max_sliding_usage(slots: &[(Millis, u64)], per: Millis) -> u64 {
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    let (mut best, mut inside, mut first) = (0, 0, 0);
    for &(slot, cost) in &sorted {
        inside += cost;
        while sorted[first].0 <= slot - per {
            inside -= sorted[first].1;
            first += 1;
        }
        best = best.max(inside);
    }
    best
}

/// GCRA's promise in exact integers, as a token bucket that takes a quantity checks it: for events
/// i ≤ j of one entity, the cost of events i..=j fits in `slot_j - slot_i` at one unit per
/// `per / limit` plus the burst (and under 1 ms of rounding), so no instant sees more than `burst`
/// units and the rate holds with costs. Returns the first violating pair.
pub fn gcra_violation(slots: &[(Millis, u64)], limit: u64, per: Millis, burst: u64) -> Option<(usize, usize)> {
    for i in 0..slots.len() {
        let mut cost = 0u128;
        for j in i..slots.len() {
            cost += u128::from(slots[j].1);
            let span = (slots[j].0 - slots[i].0 + 1) as u128;
            if cost * per as u128 > span * u128::from(limit) + u128::from(burst) * per as u128 {
                return Some((i, j));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_per_window_and_interval() {
        let slots = [(0, 1), (999, 2), (1_000, 1), (1_500, 4)];
        assert_eq!(fixed_window_usage(&slots, 1_000), BTreeMap::from([(0, 3), (1_000, 5)]));
        assert_eq!(max_sliding_usage(&slots, 1_000), 7);
        assert_eq!(max_sliding_usage(&slots, 502), 7);
        assert_eq!(max_sliding_usage(&slots, 501), 5);
        assert_eq!(max_sliding_usage(&slots, 500), 4);
    }

    #[test]
    fn gcra_violation_finds_a_too_dense_pair() {
        assert_eq!(gcra_violation(&[(0, 1), (1_000, 1), (2_000, 1)], 1, 1_000, 1), None);
        assert_eq!(gcra_violation(&[(0, 1), (500, 1)], 1, 1_000, 1), Some((0, 1)));
        assert_eq!(gcra_violation(&[(0, 1), (0, 1)], 1, 1_000, 2), None);
        // Three units at one instant against a burst of two (the pay-later reading allowed it).
        assert_eq!(gcra_violation(&[(0, 1), (0, 2)], 2, 1_000, 2), Some((0, 1)));
        assert_eq!(gcra_violation(&[(0, 1), (500, 2)], 2, 1_000, 2), None);
    }
}
