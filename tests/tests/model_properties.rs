//! Properties of the reference model over random rules, costs, arrival times and redeliveries.

use drip_core::schedule::{ReserveRequest, Scheduler, Status};
use drip_tests::scenario::{Kinds, Scenario, check_schedule, scenario};
use proptest::prelude::*;

/// Runs a scenario through the model, also checking what only the model can show: a dead-lettered
/// event and a redelivery leave the entity's state exactly as it was.
fn run_model(scenario: &Scenario) -> Result<Vec<drip_core::schedule::Reservation>, String> {
    let mut scheduler = Scheduler::new();
    let mut answers = Vec::new();
    for arrival in &scenario.events {
        let key = arrival.key();
        let before = scheduler.entity_state("rule", &key).cloned();
        let request = ReserveRequest {
            message_id: &arrival.id,
            cost: arrival.cost,
            limits: &scenario.limits,
            max_delay: scenario.max_delay,
            now: arrival.now,
            lease: 0,
            floor: None,
            budgets: &[],
            adaptive: None,
            margin: 0,
        };
        let answer = scheduler.reserve("rule", &key, &request);
        let unchanged =
            scheduler.entity_state("rule", &key).cloned().unwrap_or_default() == before.clone().unwrap_or_default();
        if (answer.replayed || answer.status == Status::MaxDelayExceeded) && !unchanged {
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

    #[test]
    fn fixed_and_sliding_slots_are_the_earliest_feasible(scenario in scenario(Kinds::EarliestFeasible, 80)) {
        let answers = run_model(&scenario).map_err(TestCaseError::fail)?;
        check_schedule(&scenario, &answers).map_err(TestCaseError::fail)?;
    }
}
