//! The differential tests: reserve.lua and the reference model give every random sequence the
//! same answers, feature by feature, alone and in batches.

use super::*;

#[test]
fn reserve_lua_gives_the_model_s_answer_for_every_random_sequence() {
    differential(scenario(Kinds::All, 60), 192, check_schedule);
}

/// Overrides set, ended and deleted between events: the model and the Lua still agree, events whose
/// cost exceeds a lowered limit are refused (and so on redelivery), and no window of a fixed or
/// sliding limit holds more than the largest count that limit had.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_overrides() {
    differential(scenario_with_overrides(60), 160, check_overridden_bounds);
}

/// The rule edited once mid-sequence (limits added, removed, or changed in count, period or kind):
/// the model and the Lua agree, FIFO holds across the edit, and no window of a limit after the edit
/// that holds a new slot holds more than the larger of its old and new count.
#[test]
fn reserve_lua_gives_the_model_s_answer_across_a_rule_edit() {
    differential(scenario_with_an_edit(60), 160, check_edit_bounds);
}

/// The rule gains its budgets at a random event, loses them at a later one and sometimes gains
/// them again, with costs corrected after the call at random: its events go the script's lean way
/// outside the spans, the general way inside, and the model and the Lua agree on every answer and
/// on the state left behind (every window of the key and of the budgets as the model keeps it),
/// with the key's limits exact throughout and no budget window over its count. A message reserved
/// before the rule had its budgets (or in a gap between spans) and given a new slot or a
/// corrected cost inside a span gives the budgets back nothing and charges them nothing: its slot
/// never took from them.
#[test]
fn reserve_lua_gives_the_model_s_answer_across_edits_between_its_paths() {
    use proptest::sample::Index;
    let cuts = proptest::collection::vec(any::<Index>(), 2..=4);
    let corrections = proptest::collection::vec((any::<Index>(), any::<Index>(), 0u64..=4), 0..6);
    let strategy = (scenario_with_budgets(60), cuts, corrections).prop_map(|(mut scenario, cuts, corrections)| {
        let n = scenario.events.len();
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(n + 1)).collect();
        cuts.sort_unstable();
        scenario.shared.budgeted =
            cuts.chunks_exact(2).map(|span| span[0]..span[1]).filter(|s| !s.is_empty()).collect();
        if scenario.shared.budgeted.is_empty() {
            scenario.shared.budgeted.push(0..0);
        }
        scenario.shared.corrections = corrections
            .into_iter()
            .filter_map(|(at, of, actual)| {
                let at = at.index(n);
                (at > 0).then(|| (at, of.index(at), actual))
            })
            .collect();
        scenario.shared.corrections.sort_by_key(|c| c.0);
        scenario
    });
    differential(strategy, 128, |scenario, answers| {
        let scenario = &Scenario { events: corrected_events(scenario, answers), ..scenario.clone() };
        check_pause_bounds(scenario, answers)?;
        // The budgets' windows over the events that drew from them.
        let (events, answers): (Vec<Arrival>, Vec<Reservation>) = scenario
            .shared
            .budgeted
            .iter()
            .flat_map(|span| span.clone())
            .map(|j| (scenario.events[j].clone(), answers[j]))
            .unzip();
        check_budget_bounds(&Scenario { events, ..scenario.clone() }, &answers)
    });
}

/// Costs reported after the call, lowering or raising what messages booked (budgets too): the model
/// and the Lua agree on each correction, every answer and the state left behind, and the limits
/// hold over the slots in use at the lowered costs.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_costs_corrected_after_the_call() {
    differential(scenario_with_corrections(60), 160, check_corrected_bounds);
}

/// Pauses and new slots for redelivered messages: the model and the Lua agree, nothing lands inside a
/// pause, FIFO holds, and the limits hold over everything reserved.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_pauses_and_new_slots() {
    differential(scenario_with_pauses(60), 160, check_pause_bounds);
}

/// Shared budgets (calendars filled out of order by three entities, fair shares, spread
/// placement), adaptive limits lowered by 429s and climbing back, and budget pauses: the model and
/// the Lua agree on every answer and on the state left behind, no budget window holds more than its
/// count, no entity more than its share, nothing lands inside a budget's pause, FIFO holds.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_budgets_and_adaptive_limits() {
    differential(scenario_with_budgets(60), 192, check_budget_bounds);
}

/// A rule that parks a throttled key's backlog, with pauses of keys and budgets, adaptive limits
/// and their signals, budgets, new slots and drains at random moments: the model and reserve.lua
/// (and wake.lua) agree on every answer, every drain's wake and unpark, and the state; every
/// limit holds over what was reserved, the drains' slots included.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_parked_backlogs() {
    differential(scenario_with_parking(60), 192, check_budget_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A fair budget (book near, park far) with weights, pauses, adaptive limits, new slots and
/// drains at random moments: the model and the scripts (reserve.lua's parking, fair.lua's ring)
/// agree on every answer, every park's ring join and wake, every drain's unparks (a drain's call
/// holds the queues of every key waiting in the ring, round robin, as the dispatcher's does), the
/// ring it read, who left it and the next wake; every limit holds over what was reserved. Alone
/// and in batches (a call's events of several keys, each joining the ring as its own).
#[test]
fn reserve_lua_gives_the_model_s_answer_with_fair_budgets() {
    differential(scenario_with_fair_budgets(60), 160, check_budget_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_fair_budgets(60), sizes()), 64, check_budget_bounds);
}

/// A rule with classes (a reserve for one or two of them) over fixed limits, with and without
/// shared budgets, new slots and republished ids: the model and reserve.lua agree on every answer,
/// the entities' and the calendars' state; FIFO holds per key and class, and no window of a key
/// (all classes together) or of a budget holds more than its count.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_classes() {
    differential(scenario_with_classes(60), 160, check_class_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_classes(60), sizes()), 64, check_class_bounds);
}

/// Batches of 1 to 64 events per script call (mixed entities, redeliveries and republished ids
/// inside a batch, budgets, fair shares, adaptive limits; a batch ends before a pause or a signal):
/// reserve.lua gives each event the answer the model gives it reserving them one after another,
/// and leaves the same state.
#[test]
fn reserve_lua_gives_each_event_of_a_batch_the_model_s_answer() {
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario(Kinds::All, 60), sizes()), 96, check_schedule);
    differential_in_batches((scenario_with_budgets(60), sizes()), 96, check_budget_bounds);
}

/// Budgets leased over 2 to 4 partitions, with chunks from one unit to a whole window, alone and in
/// batches (a call stops at an event whose pool needs a lease and goes on after it): the model and
/// reserve.lua with lease.lua agree on every answer, on the entities' state, on each home's leases
/// and each pool's; no budget window holds more than its count, nothing lands in a pause, FIFO
/// holds.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_leased_budgets() {
    differential(scenario_with_leases(60), 160, check_budget_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_leases(60), sizes()), 64, check_budget_bounds);
}

/// Leased budgets under a rule that parks a throttled key's backlog (pauses of keys and budgets,
/// adaptive keys, drains at random moments): a drain's unpark whose partition's pool has no units
/// asks the home and goes on, as a reservation does; the model and the scripts agree on every
/// answer, every drain's unparks and wake, each home's leases and each pool's; no budget window
/// holds more than its count, nothing lands in a pause, FIFO holds.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_leased_budgets_that_park() {
    differential(scenario_with_leased_parking(60), 160, check_budget_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A fair budget leased over 2 to 4 partitions, with weights, pauses, adaptive keys and drains at
/// random moments: each key joins its partition's ring; a drain hands a ring's heads over in one
/// call that stops for a lease where the partition's pool has none (the heads behind it in its
/// demand, in the model as in the store). The model and the scripts agree on every answer, ring
/// op, unpark, lease and pool; every limit holds over what was reserved. Alone and in batches.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_fair_leased_budgets() {
    differential(scenario_with_fair_leased_budgets(60), 160, check_budget_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_fair_leased_budgets(60), sizes()), 64, check_budget_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A rule with classes that parks a throttled key's backlog (pauses of keys, each its calendar's
/// for every class; adaptive calendars and their signals; budgets and their pauses): each class
/// parks in its own queue and drains in its own order, keeping the classes' reserves. The model
/// and the scripts agree on every answer, every drain's wake and unparks, and the state; each
/// key's windows (all classes together) and each budget's hold their counts, FIFO per class.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_classes_that_park() {
    differential(scenario_with_parked_classes(60), 160, check_class_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_parked_classes(60), sizes()), 64, check_class_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A rule with classes drawing from a fair budget (weights for some keys), its keys paused and
/// signalled: each class of a key parks past the near horizon in its own queue and joins the ring
/// as its own member; a drain hands the ring's heads over in one call. The model and the scripts
/// agree on every answer, ring op, unpark and the state; each key's windows (all classes) and
/// each budget's hold their counts; FIFO per class. Alone and in batches.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_classes_in_a_fair_budget() {
    differential(scenario_with_fair_classes(60), 128, check_class_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_fair_classes(60), sizes()), 48, check_class_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A delivery margin: the model and the Lua agree, and every fixed window and sliding interval
/// holds its limit at the delivery times too, each delivery up to the margin late.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_a_delivery_margin() {
    differential(scenario_with_margin(60), 160, check_delivery_bounds);
}
