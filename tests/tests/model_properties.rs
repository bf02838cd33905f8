//! Properties of the reference model over random rules, costs, arrival times and redeliveries.

use drip_core::schedule::{ReserveRequest, Scheduler, Status};
use drip_tests::scenario::{
    Kinds, Scenario, check_budget_bounds, check_delivery_bounds, check_schedule, scenario, scenario_with_budgets,
    scenario_with_margin,
};
use proptest::prelude::*;

/// Runs a scenario through the model, also checking what only the model can show: a dead-lettered
/// event and a redelivery leave the entity's state exactly as it was.
fn run_model(scenario: &Scenario) -> Result<Vec<drip_core::schedule::Reservation>, String> {
    let mut scheduler = Scheduler::new();
    let mut answers = Vec::new();
    let shared = &scenario.shared;
    for (i, arrival) in scenario.events.iter().enumerate() {
        for &(_, budget, until) in shared.budget_pauses.iter().filter(|p| p.0 == i) {
            scheduler.pause_budget(&shared.budgets[budget].name, until);
        }
        for &(_, entity) in shared.signals.iter().filter(|s| s.0 == i) {
            match (entity, &shared.adaptive, shared.budgets.first()) {
                (Some(entity), Some(adaptive), _) => {
                    scheduler.signal("rule", &format!("entity_{entity}"), adaptive, &scenario.limits, arrival.now);
                }
                (None, _, Some(budget)) => {
                    scheduler.signal_budget(budget, arrival.now);
                }
                _ => {}
            }
        }
        let key = arrival.key();
        let before = scheduler.entity_state("rule", &key).cloned();
        let request = ReserveRequest {
            message_id: &arrival.id,
            published: Some(arrival.published),
            cost: arrival.cost,
            limits: &scenario.limits,
            max_delay: scenario.max_delay,
            now: arrival.now,
            lease: 0,
            floor: None,
            budgets: &shared.budgets,
            adaptive: shared.adaptive,
            margin: shared.margin,
            class: None,
            park: None,
            queued: &[],
        };
        let answer = scheduler.reserve("rule", &key, &request);
        let unchanged =
            scheduler.entity_state("rule", &key).cloned().unwrap_or_default() == before.clone().unwrap_or_default();
        if (answer.replayed() || answer.status == Status::MaxDelayExceeded) && !unchanged {
            return Err(format!("{arrival:?} changed the state though it reserved nothing: {answer:?}"));
        }
        answers.push(answer);
    }
    Ok(answers)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_kind_of_limit_holds_and_redeliveries_change_nothing(scenario in scenario(Kinds::All, 80)) {
        let answers = run_model(&scenario).map_err(TestCaseError::fail)?;
        check_schedule(&scenario, &answers).map_err(TestCaseError::fail)?;
    }

    /// Shared budgets, fair shares, adaptive limits, 429s and budget pauses: no budget window over
    /// its count across every key, no key over its share, nothing in a budget's pause, FIFO.
    #[test]
    fn budgets_hold_across_keys_and_shares_hold_per_key(scenario in scenario_with_budgets(80)) {
        let answers = run_model(&scenario).map_err(TestCaseError::fail)?;
        check_budget_bounds(&scenario, &answers).map_err(TestCaseError::fail)?;
    }

    /// With a delivery margin, every window and interval holds at the delivery times.
    #[test]
    fn a_delivery_margin_keeps_the_limit_where_it_is_observed(scenario in scenario_with_margin(80)) {
        let answers = run_model(&scenario).map_err(TestCaseError::fail)?;
        check_delivery_bounds(&scenario, &answers).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fixed_and_sliding_slots_are_the_earliest_feasible(scenario in scenario(Kinds::EarliestFeasible, 80)) {
        let answers = run_model(&scenario).map_err(TestCaseError::fail)?;
        check_schedule(&scenario, &answers).map_err(TestCaseError::fail)?;
    }
}
