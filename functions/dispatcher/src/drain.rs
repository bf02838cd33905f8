//! A wake task: the drain of one key's parked messages (docs/design.md: "Parking a throttled key's
//! backlog"). It first hands over what a drain that died left half done, then takes the queue's
//! head one message after another, each booked at the rate in force now if its slot comes within
//! the rule's park horizon, and gives each a task at its slot (created together, batched, as the
//! limiter's are); the first that does not fit yet sets the next wake. A failure answers 503:
//! Cloud Tasks runs the wake again, and the messages it had taken are in the handing list.

use axum::http::StatusCode;
use drip_core::attributes::Refused;
use drip_core::outcome::{DlqReason, Outcome};
use std::collections::VecDeque;

use drip_core::budgets::FairRing;
use drip_core::fair::{Member, Round};
use drip_core::overflow::{FairWakeTask, TaskBody, WakeTask};
use drip_core::rules::{DEFAULT_PARK_HORIZON, Rule, RuleSet};
use drip_core::schedule::{Attempt, Status, Unpark};
use drip_core::time::{Millis, SECOND, format_rfc3339, wall_clock_millis};
use drip_service::answer::Answer;
use drip_service::parking;
use drip_service::reschedule::{Failure, create_task};
use drip_store::{ParkedBody, Reserved, SlotRequest};

use crate::AppState;
use crate::task::{Delivery, dead_letter, filing_of, new_task, request_of};

/// The most messages one wake takes (the next wake, at once, takes the rest).
const MAX_PER_WAKE: usize = 1_000;
/// How many queue entries are read at a time.
const READ_AHEAD: usize = 64;
/// The most messages a fair drain unparks in one script call.
const PLAN_MAX: usize = 128;

/// A message the drain took from the queue, and what it got.
struct Taken {
    task: TaskBody,
    identity: String,
    published: Option<Millis>,
    reserved: Reserved,
    /// Its body as its queue held it: its hand-over names its entry by it.
    parked: ParkedBody,
}

pub(crate) async fn wake(state: &AppState, wake: &WakeTask, delivery: &Delivery<'_>) -> Answer {
    let rules = state.rules.current();
    let Some(rule) = rules.rule_by_id(&wake.wake.rule_id) else {
        tracing::warn!(rule = %wake.wake.rule_id, key = %wake.wake.key, "a drain's wake for a rule that no longer exists: nothing to drain");
        return Answer::new(StatusCode::OK, None, Outcome::Drained);
    };
    match drain(state, rule, &wake.wake.key, delivery).await {
        Ok(taken) => {
            tracing::info!(rule = %rule.name, key = %wake.wake.key, taken, "drained parked events");
            Answer::new(StatusCode::OK, Some(&rule.name), Outcome::Drained)
        }
        Err(error) => {
            tracing::warn!(rule = %rule.name, key = %wake.wake.key, error = format!("{error:#}"), "drain failed; Cloud Tasks will retry its wake");
            Answer::new(StatusCode::SERVICE_UNAVAILABLE, Some(&rule.name), Outcome::Retry)
        }
    }
}

/// Hands over what an earlier drain left, then drains; returns how many messages it took.
async fn drain(state: &AppState, rule: &Rule, key: &str, delivery: &Delivery<'_>) -> anyhow::Result<usize> {
    let Some(batcher) = &state.tasks else {
        anyhow::bail!("DRIP_TASKS_QUEUES and DRIP_DISPATCHER_URL are not set: this dispatcher cannot drain");
    };
    let mut taken = take_handing(state, rule, key).await?;
    let now = wall_clock_millis();
    let deadline = now + rule.park().unwrap_or(DEFAULT_PARK_HORIZON);
    let mut next = None;
    'queue: while taken.len() < MAX_PER_WAKE {
        let bodies = state.store.parked_bodies(rule, key, READ_AHEAD).await?;
        if bodies.is_empty() {
            break;
        }
        for body in bodies {
            // Its push is still being parked (or its body is gone): look again in a second.
            let Some(body) = body else {
                next = Some(now + SECOND);
                break 'queue;
            };
            let task: TaskBody = serde_json::from_slice(&body.body)?;
            let (identity, published) = filing_of(&task);
            let request = SlotRequest { unpark: Some(deadline), ..request_of(rule, &task, &identity, published) };
            match state.store.unpark(&request).await? {
                (Unpark::Decided(reservation), at) => {
                    taken.push(Taken {
                        task,
                        identity,
                        published,
                        reserved: Reserved { reservation, now: at, armed: false },
                        parked: body,
                    });
                }
                (Unpark::Later { wake, .. }, _) => {
                    next = Some(wake);
                    break 'queue;
                }
                // Another drain is at this queue: it arms the next wake.
                (Unpark::NotHead | Unpark::NotParked, _) => break 'queue,
            }
        }
    }
    if taken.len() >= MAX_PER_WAKE {
        next = Some(now);
    }
    // Handed over before the next wake is armed: a wake armed at once, run while these were still
    // being handed over, would take them from the handing list again (their answers hold no lease).
    let handed = taken.iter().map(|taken| hand_over(state, rule, taken, delivery));
    futures_util::future::try_join_all(handed).await?;
    if let Some(at) = next {
        parking::wake_at((batcher.tasks(), &state.metrics), (rule, key), at).await?;
        tracing::debug!(rule = %rule.name, key, wake = %format_rfc3339(at), "drain: next wake armed");
    }
    Ok(taken.len())
}

/// What a drain that died took from the key's queue and did not hand over: taken again (its
/// answer's lease taken again), unless it was handed over after all or another attempt holds it.
async fn take_handing(state: &AppState, rule: &Rule, key: &str) -> anyhow::Result<Vec<Taken>> {
    let mut taken = Vec::new();
    for body in state.store.handing(rule, key).await?.into_iter().flatten() {
        let task: TaskBody = serde_json::from_slice(&body.body)?;
        let (identity, published) = filing_of(&task);
        let request = request_of(rule, &task, &identity, published);
        let reserved = state.store.reserve(&request).await?;
        match reserved.reservation.attempt {
            Attempt::Done => state.store.handed_over(&body.handed_over(request)).await?,
            Attempt::Busy => {}
            Attempt::Decided | Attempt::Resumed => {
                taken.push(Taken { task, identity, published, reserved, parked: body })
            }
        }
    }
    Ok(taken)
}

/// A fair budget's wake: the drain of its ring of waiting keys (docs/rules.md: "Fair budgets").
pub(crate) async fn fair_wake(state: &AppState, wake: &FairWakeTask, delivery: &Delivery<'_>) -> Answer {
    let rules = state.rules.current();
    let Some(budget) = rules.budgets.get(&wake.fair_wake.budget) else {
        return hand_over_ring(state, &rules, wake, "a fair budget that no longer exists").await;
    };
    let Some(ring) = wake.ring_of(budget) else {
        return hand_over_ring(state, &rules, wake, "a ring of partitions the budget no longer has").await;
    };
    match drain_ring(state, &rules, ring, delivery).await {
        Ok(taken) => {
            tracing::info!(ring = %ring.name(), taken, "drained a fair budget's waiting keys");
            Answer::new(StatusCode::OK, None, Outcome::Drained)
        }
        Err(error) => {
            tracing::warn!(budget = %budget.name, error = format!("{error:#}"), "fair drain failed; Cloud Tasks will retry its wake");
            Answer::new(StatusCode::SERVICE_UNAVAILABLE, None, Outcome::Retry)
        }
    }
}

/// The wake of a ring that is `gone` (its budget, or its partition): its keys handed to their own
/// drains ([`hand_ring_to_keys`]), or a retry when they could not be.
async fn hand_over_ring(state: &AppState, rules: &RuleSet, wake: &FairWakeTask, gone: &str) -> Answer {
    let budget = &wake.fair_wake.budget;
    match hand_ring_to_keys(state, rules, wake).await {
        Ok((handed, 0)) => {
            tracing::warn!(
                budget,
                ring = gone,
                handed,
                "a fair wake for a ring that is gone: its waiting keys drain on their own"
            );
        }
        Ok((handed, stranded)) => {
            tracing::error!(
                budget,
                ring = gone,
                handed,
                stranded,
                "a ring that is gone still holds waiting keys whose rules moved to another hash tag or partition: their parked events stay until it is back (put the budget back with fair: false and let its ring drain before removing it)"
            );
        }
        Err(error) => {
            tracing::warn!(
                budget,
                ring = gone,
                error = format!("{error:#}"),
                "could not hand a gone ring's waiting keys to their drains; Cloud Tasks will retry its wake"
            );
            return Answer::new(StatusCode::SERVICE_UNAVAILABLE, None, Outcome::Retry);
        }
    }
    Answer::new(StatusCode::OK, None, Outcome::Drained)
}

/// The wake of a fair budget the rules no longer have: each key waiting in its ring whose rule
/// still keeps its state in the budget's hash tag (it draws from another budget of the group)
/// gets a wake of its own drain now (which drains its queue at its rule's horizon, as any parked
/// key's) and leaves the ring, so that nothing parked stays behind a budget that is gone. A key
/// whose rule's state moved to another hash tag (or other partitions) cannot be drained from
/// there: it stays in the ring, for the budget's return. The same for a ring of partitions the
/// budget no longer has. Returns how many keys it handed over and how many stay.
async fn hand_ring_to_keys(state: &AppState, rules: &RuleSet, wake: &FairWakeTask) -> anyhow::Result<(usize, usize)> {
    let Some(batcher) = &state.tasks else {
        anyhow::bail!("DRIP_TASKS_QUEUES and DRIP_DISPATCHER_URL are not set: this dispatcher cannot drain");
    };
    // Enough of the budget to name its ring: its name, hash tag and partitions.
    let gone = wake.budget_named();
    let gone = FairRing { budget: &gone, partition: wake.fair_wake.partition };
    let ring = state.store.fair_ring(gone).await?;
    let now = wall_clock_millis();
    let (mut handed, mut stranded) = (0, 0);
    for member in &ring.members {
        match rules.rule_by_id(&member.rule) {
            // Its state moved: another hash tag, or its budgets' partitions changed.
            Some(rule)
                if rule.budget_tag() != Some(wake.tag())
                    || rule.budgets.iter().find_map(|b| b.leases).map(|l| l.partitions)
                        != wake.fair_wake.partitions =>
            {
                stranded += 1;
                continue;
            }
            Some(rule) => {
                parking::wake_at((batcher.tasks(), &state.metrics), (rule, &member.key), now).await?;
                handed += 1;
            }
            // A rule that is gone has nothing left to drain with, as with a key's own wake.
            None => {}
        }
        // Leaves whatever is parked: its own drain has it now.
        state.store.fair_leave(gone, None, member).await?;
    }
    Ok((handed, stranded))
}

/// One waiting key of a fair budget's ring during a drain: its rule and the bodies read ahead of
/// its queue (its head first).
struct Waiting<'r> {
    rule: &'r Rule,
    member: Member,
    ahead: VecDeque<Option<ParkedBody>>,
}

/// Hands over what earlier drains left of every waiting key, then gives the coming windows'
/// units to the waiting keys in weighted deficit round robin (`drip_core::fair::Round`), each
/// key's head booked with the ordinary unpark while its slot lies within the budget's near
/// horizon; then makes the tasks and arms the next wake. Returns how many messages it took.
async fn drain_ring(
    state: &AppState,
    rules: &RuleSet,
    fair: FairRing<'_>,
    delivery: &Delivery<'_>,
) -> anyhow::Result<usize> {
    let budget = fair.budget;
    let Some(batcher) = &state.tasks else {
        anyhow::bail!("DRIP_TASKS_QUEUES and DRIP_DISPATCHER_URL are not set: this dispatcher cannot drain");
    };
    let ring = state.store.fair_ring(fair).await?;
    let mut waiting = Vec::new();
    for member in ring.members {
        match rules.rule_by_id(&member.rule) {
            Some(rule) => waiting.push(Waiting { rule, member, ahead: VecDeque::new() }),
            None => {
                tracing::warn!(rule = %member.rule, key = %member.key, budget = %budget.name, "a waiting key of a rule that no longer exists leaves the fair ring");
                state.store.fair_leave(fair, None, &member).await?;
            }
        }
    }
    // Every key's handing list at once (pipelined on the connection), not one round trip each.
    let left = waiting.iter().map(|w| take_handing(state, w.rule, &w.member.key));
    let left = futures_util::future::try_join_all(left).await?;
    let mut taken: Vec<(&Rule, Taken)> =
        waiting.iter().zip(left).flat_map(|(w, taken)| taken.into_iter().map(move |t| (w.rule, t))).collect();
    let now = wall_clock_millis();
    // A budget no longer fair drains what waits at the horizon it had.
    let shortest = budget.limits.iter().map(|l| l.per()).min().unwrap_or(SECOND);
    let deadline = now + budget.near().unwrap_or_else(|| drip_core::fair::near_horizon(shortest));
    // A key's weight, shared among its classes waiting (a rule with classes waits as one member per
    // class of a key): a merchant's share does not grow with the classes it has waiting.
    let groups: Vec<((&str, &str), u64)> = waiting
        .iter()
        .map(|w| {
            let scope = w.rule.scope_of(&w.member.key);
            ((w.member.rule.as_str(), scope), budget.fair.as_ref().map_or(1, |f| f.weight_of(scope)))
        })
        .collect();
    let mut round = Round::new(drip_core::fair::shared_weights(&groups), ring.cursor);
    let mut next: Option<Millis> = None;
    let sooner = |at: Millis, next: &mut Option<Millis>| *next = Some(next.map_or(at, |n| n.min(at)));
    // Each turn plans, in the round's order, the heads each key's deficit covers (as if each were
    // booked), until PLAN_MAX; one script call then unparks them in that order: a key whose head
    // stays (its slot past the deadline) sits out, and what was planned behind it answers NotHead.
    while taken.len() < MAX_PER_WAKE {
        // The heads of every key whose read-ahead ran out, at once: about what its weight takes
        // in a few turns.
        let short: Vec<usize> =
            (0..waiting.len()).filter(|&m| round.active(m) && waiting[m].ahead.is_empty()).collect();
        let reads = short.iter().map(|&m| {
            let w = &waiting[m];
            let count = (4 * round.weight(m) as usize).clamp(4, READ_AHEAD);
            state.store.parked_bodies(w.rule, &w.member.key, count)
        });
        for (m, bodies) in short.iter().zip(futures_util::future::try_join_all(reads).await?) {
            waiting[*m].ahead = bodies.into();
        }
        let mut plan: Vec<(usize, TaskBody, ParkedBody)> = Vec::new();
        // What this turn planned of each key, and which keys' queues it planned to the end.
        let (mut planned, mut exhausted) = (vec![0; waiting.len()], vec![false; waiting.len()]);
        'plan: while plan.len() < PLAN_MAX {
            let Some(m) = round.visit() else { break };
            let w = &mut waiting[m];
            loop {
                if w.ahead.len() <= planned[m] {
                    let count = planned[m] + READ_AHEAD;
                    w.ahead = state.store.parked_bodies(w.rule, &w.member.key, count).await?.into();
                }
                let body = match w.ahead.get(planned[m]) {
                    None => {
                        exhausted[m] = true;
                        round.retire(m);
                        break;
                    }
                    // Its push is still being parked (or its body is gone): look again in a second.
                    Some(None) => {
                        sooner(now + SECOND, &mut next);
                        round.retire(m);
                        break;
                    }
                    Some(Some(body)) => body,
                };
                let task: TaskBody = serde_json::from_slice(&body.body)?;
                let cost = task.rate_limit_meta.cost.unwrap_or(1);
                if !round.affords(m, cost) {
                    break;
                }
                round.spend(m, cost);
                planned[m] += 1;
                plan.push((m, task, body.clone()));
                if plan.len() >= PLAN_MAX {
                    break 'plan;
                }
            }
        }
        if plan.is_empty() {
            break;
        }
        let filings: Vec<(String, Option<Millis>)> = plan.iter().map(|(_, task, _)| filing_of(task)).collect();
        let requests: Vec<SlotRequest> = plan
            .iter()
            .zip(&filings)
            .map(|((m, task, _), (identity, published))| {
                let request = request_of(waiting[*m].rule, task, identity, *published);
                SlotRequest { unpark: Some(deadline), ..request }
            })
            .collect();
        let results = state.store.unpark_all(&requests).await?;
        let full = drip_core::schedule::full_through_deadline(results.iter().map(|(unpark, _)| unpark));
        let mut decided = vec![0; waiting.len()];
        for (((m, task, parked), (identity, published)), (unpark, at)) in plan.into_iter().zip(filings).zip(results) {
            match unpark {
                Unpark::Decided(reservation) => {
                    decided[m] += 1;
                    let reserved = Reserved { reservation, now: at, armed: false };
                    taken.push((waiting[m].rule, Taken { task, identity, published, reserved, parked }));
                }
                Unpark::Later { wake, .. } => {
                    sooner(wake, &mut next);
                    round.retire(m);
                }
                // Behind a head that stayed, or another drain is at this queue.
                Unpark::NotHead | Unpark::NotParked => round.retire(m),
            }
        }
        for (m, w) in waiting.iter_mut().enumerate() {
            w.ahead.drain(..decided[m].min(w.ahead.len()));
            // Its queue ran dry: it leaves, unless a message parked since (the next drain, at
            // once, serves it).
            if exhausted[m]
                && decided[m] == planned[m]
                && !state.store.fair_leave(fair, Some(w.rule), &w.member).await?
            {
                sooner(now, &mut next);
            }
        }
        if full {
            break;
        }
    }
    if taken.len() >= MAX_PER_WAKE {
        sooner(now, &mut next);
    }
    let booked: Vec<(&Taken, Millis)> = taken
        .iter()
        .filter(|(_, t)| t.reserved.reservation.status == Status::Reserved)
        .map(|(_, t)| (t, t.reserved.reservation.slot))
        .collect();
    let waits: Vec<Millis> = booked.iter().filter_map(|(t, slot)| t.published.map(|p| slot - p)).collect();
    let units = booked.iter().map(|(t, _)| t.task.rate_limit_meta.cost.unwrap_or(1)).sum();
    state.metrics.shared.fair_drained(&fair.name(), waiting.len(), units, &waits);
    // Handed over before the ring turns and its next wake is armed, as a key's drain does.
    let handed = taken.iter().map(|(rule, taken)| hand_over(state, rule, taken, delivery));
    futures_util::future::try_join_all(handed).await?;
    if let Some(at) = state.store.fair_turned(fair, round.cursor(), next).await? {
        parking::fair_wake_at((batcher.tasks(), &state.metrics), fair, at).await?;
        tracing::debug!(ring = %fair.name(), wake = %format_rfc3339(at), "fair drain: next wake armed");
    }
    Ok(taken.len())
}

/// A taken message's task at its slot (or its dead letter, when it waited past its `max_delay`
/// or costs more than a limit in force), then its answer completed and its body dropped.
async fn hand_over(state: &AppState, rule: &Rule, taken: &Taken, delivery: &Delivery<'_>) -> anyhow::Result<()> {
    let Taken { task, identity, published, reserved, parked } = taken;
    let request = request_of(rule, task, identity, *published);
    let reason = match reserved.reservation.status {
        Status::Reserved | Status::Parked => None,
        Status::MaxDelayExceeded => Some(DlqReason::MaxDelayExceeded),
        Status::CostExceedsLimit => Some(DlqReason::CostExceedsLimit),
    };
    match reason {
        None => {
            let batcher = state.tasks.as_deref().expect("a drain runs only with tasks");
            let event = new_task(state, task, (rule, identity), reserved).await.map_err(failure)?;
            create_task((batcher, &state.metrics), (&rule.id, &task.rate_limit_meta.key), event)
                .await
                .map_err(failure)?;
        }
        Some(reason) => {
            let detail = format!("parked while its key was throttled; when its turn came: {reason}");
            dead_letter(state, (Some(task), Some(rule)), Refused { reason, detail }, None, delivery).await?;
        }
    }
    state.store.complete(&request, reserved).await?;
    state.store.handed_over(&parked.handed_over(request)).await?;
    Ok(())
}

fn failure(failure: Failure) -> anyhow::Error {
    match failure {
        Failure::Transient(error) => error,
        Failure::Permanent(refused) => anyhow::anyhow!("{}: {}", refused.reason, refused.detail),
        Failure::Wait(wait) => anyhow::anyhow!("{}", wait.detail),
    }
}
