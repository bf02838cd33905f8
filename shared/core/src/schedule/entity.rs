//! An entity's own limits (one key of a rule): its state (windows, GCRA times, the last slot),
//! the limits in force for it, its frontier, and what a booking writes into it.

use super::*;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntityState {
    pub last_slot: Option<Millis>,
    pub limits: BTreeMap<String, LimitState>,
    /// By [`override_id`]; kept apart from the state in Redis (they outlive an idle entity).
    pub overrides: BTreeMap<String, LimitOverride>,
    /// The downstream asked to wait (a 429 or 503 with `Retry-After`): no slot before this.
    pub paused_until: Option<Millis>,
    /// The adaptive limit's level after the last 429, 5xx or timeout (kept with the overrides).
    pub adaptive: Option<AdaptiveState>,
    /// The latency controller's state, when the adaptive limit follows latency.
    pub latency: Option<LatencyState>,
    /// How many of its messages are parked ([`Status::Parked`]), waiting in its queue.
    pub parked: u64,
    /// When the latest wake of its drain was armed for, while messages are parked.
    pub wake: Option<Millis>,
    /// Since when its reservations have charged its rule's shared budgets, and which
    /// ([`crate::budgets::charged_budgets`]): a slot reserved before then took nothing from them,
    /// so its units go back to none of them ([`charged_by`]).
    pub charges: Option<(Millis, String)>,
}

/// One limit on the entity's own state as it counts this reservation: a rule's limit or a fair
/// share of a budget (a fixed window on the entity's slots), with the count in force.
pub(super) struct EntityLimit {
    pub(super) id: String,
    pub(super) limit: Limit,
    pub(super) count: u64,
}

/// The entity's last slot, or the floor the request carries over if later.
pub(super) fn frontier(state: &EntityState, request: &ReserveRequest<'_>) -> Option<Millis> {
    match (state.last_slot, request.floor) {
        (Some(last), Some(floor)) => Some(last.max(floor)),
        (last, floor) => last.or(floor),
    }
}

/// The entity's own limits with their counts in force now (the rule's, an override, the adaptive
/// level), and its fair share of each budget limit in `shared`; `true` when the cost is over a
/// count the entity cannot change (the rule's or an override: adaptive counts and shares never go
/// below the cost).
pub(super) fn entity_limits(
    state: &EntityState,
    request: &ReserveRequest<'_>,
    shared: &[BudgetLimit<'_>],
) -> (bool, Vec<EntityLimit>) {
    let level = request.adaptive.map(|a| a.level(state.adaptive, adaptive_window(request.limits), request.now));
    let mut exceeded = false;
    let mut own: Vec<EntityLimit> = request
        .limits
        .iter()
        .map(|limit| {
            let base = effective_limit(limit, &state.overrides, request.now);
            exceeded |= request.cost > limit.max_cost(base);
            EntityLimit { id: state_id(limit), limit: *limit, count: adapted_count(limit, base, level, request.cost) }
        })
        .collect();
    for BudgetLimit { budget, limit, base, count, .. } in shared {
        exceeded |= request.cost > *base;
        // A class's key takes its shares on its calendar (`budget_limits`), not on the class.
        if let Some(share) = budget.share_of(*count, request.cost).filter(|_| request.class.is_none()) {
            let fixed = Limit::new(share, limit.per(), Window::Fixed(Placement::Start)).expect("share >= 1");
            own.push(EntityLimit { id: budget.share_id(limit), limit: fixed, count: share });
        }
    }
    (exceeded, own)
}

pub(super) fn commit(state: &mut EntityState, request: &ReserveRequest<'_>, own: &[EntityLimit], slot: Millis) {
    let cost = request.cost;
    for EntityLimit { id, limit, count: n } in own {
        let (per, n) = (limit.per(), *n);
        let entry = state.limits.entry(id.clone());
        match limit.window() {
            Window::Fixed(_) => {
                let window = slot.div_euclid(per) * per;
                let fresh = LimitState::Fixed { window, used: 0 };
                let current = entry.or_insert(fresh.clone());
                if !matches!(current, LimitState::Fixed { window: w, .. } if *w == window) {
                    *current = fresh;
                }
                if let LimitState::Fixed { used, .. } = current {
                    *used += cost;
                }
            }
            Window::Gcra { .. } => {
                let current = entry.or_insert(LimitState::Gcra { tat: slot, tat_rem: 0 });
                if let LimitState::Gcra { tat, tat_rem } = current {
                    // A slot this limit set is TAT rounded up to the millisecond; counting from the
                    // rounded slot would make the rate drift, so only a later slot restarts TAT.
                    let tat_ceil = *tat + i64::from(*tat_rem > 0);
                    if slot > tat_ceil {
                        (*tat, *tat_rem) = (slot, 0);
                    }
                    let rem = *tat_rem + cost * per as u64;
                    *tat += (rem / n) as i64;
                    *tat_rem = rem % n;
                }
            }
            Window::Sliding => {
                let current = entry.or_insert(LimitState::Sliding { base: 0, entries: VecDeque::new() });
                if let LimitState::Sliding { base, entries } = current {
                    match entries.back_mut() {
                        Some((time, cum)) if *time == slot => *cum += cost,
                        last => {
                            let total = last.map_or(*base, |&mut (_, cum)| cum);
                            entries.push_back((slot, total + cost));
                        }
                    }
                    while let Some(&(time, cum)) = entries.front() {
                        if time > slot - per - request.margin {
                            break;
                        }
                        *base = cum;
                        entries.pop_front();
                    }
                }
            }
        }
    }
    state.last_slot = Some(slot);
    let names = crate::budgets::charged_budgets(request.budgets);
    state.charges = match state.charges.take() {
        _ if names.is_empty() => None,
        Some((since, held)) if held == names => Some((since, held)),
        _ => Some((request.now, names)),
    };
}
