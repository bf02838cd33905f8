//! The model's `gcra` limit against an independent token bucket that takes a quantity: the
//! `governor` crate's `check_n` (GCRA, as redis-cell's quantity). Every slot the model gives an
//! event of cost c is one where governor, fed the same events at their slots, lets those c units
//! through, and a millisecond earlier it does not (the slot is the earliest conforming one); a cost
//! above the burst is refused by both.

use std::num::NonZeroU32;
use std::time::Duration;

use drip_core::rules::{Limit, Window};
use drip_core::schedule::{ReserveRequest, Scheduler, Status};
use drip_core::time::{Millis, SECOND};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use proptest::prelude::*;

/// Counts per period whose emission interval is a whole number of nanoseconds (governor's unit):
/// the model keeps the interval exact in parts of a millisecond, governor in nanoseconds.
const COUNTS: [u64; 6] = [1, 2, 4, 5, 8, 10];

fn reserve(scheduler: &mut Scheduler, limit: &Limit, id: &str, cost: u64, now: Millis) -> (Millis, Status) {
    let limits = std::slice::from_ref(limit);
    let request = ReserveRequest { cost, max_delay: 1_000 * SECOND, ..ReserveRequest::new(id, limits, now) };
    let reserved = scheduler.reserve("r", "k", &request);
    (reserved.slot, reserved.status)
}

/// Moves governor's clock from `at` to `t` (never back: slots are FIFO).
fn move_to(clock: &FakeRelativeClock, at: &mut Millis, t: Millis) -> Result<(), TestCaseError> {
    prop_assert!(t >= *at, "slots never go back: {} after {}", t, at);
    clock.advance(Duration::from_millis((t - *at) as u64));
    *at = t;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn gcra_slots_are_the_earliest_a_quantity_token_bucket_allows(
        count in proptest::sample::select(&COUNTS[..]),
        per_seconds in 1i64..4,
        burst in 1u64..6,
        events in proptest::collection::vec((0i64..1_500, 1u64..7), 1..40),
    ) {
        let per = per_seconds * SECOND;
        let limit = Limit::new(count, per, Window::Gcra { burst }).unwrap();
        let interval = Duration::from_millis(per as u64) / count as u32;
        let quota = Quota::with_period(interval).unwrap().allow_burst(NonZeroU32::new(burst as u32).unwrap());
        let clock = FakeRelativeClock::default();
        let bucket = RateLimiter::direct_with_clock(quota, clock.clone());
        let mut scheduler = Scheduler::new();
        let (mut now, mut at) = (0, 0);
        for (i, (step, cost)) in events.into_iter().enumerate() {
            now += step;
            let (slot, status) = reserve(&mut scheduler, &limit, &format!("m{i}"), cost, now);
            let units = NonZeroU32::new(cost as u32).unwrap();
            if cost > burst {
                prop_assert_eq!(status, Status::CostExceedsLimit, "event {}: cost {} over burst {}", i, cost, burst);
                prop_assert!(bucket.check_n(units).is_err(), "governor cannot let {} through either", cost);
                continue;
            }
            prop_assert_eq!(status, Status::Reserved, "event {}", i);
            if slot > now && slot > at {
                move_to(&clock, &mut at, slot - 1)?;
                prop_assert!(
                    matches!(bucket.check_n(units), Ok(Err(_))),
                    "event {} (cost {}) at slot {}: governor already allowed it 1 ms earlier", i, cost, slot
                );
            }
            move_to(&clock, &mut at, slot)?;
            prop_assert!(
                matches!(bucket.check_n(units), Ok(Ok(()))),
                "event {} (cost {}) arriving at {}: governor refuses it at its slot {}", i, cost, now, slot
            );
        }
    }
}
