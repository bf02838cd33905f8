//! Leased budgets past one shard: a partition's pool books what the budget's home leased it,
//! asks for more when a window runs out, and gives back what leaves its windows.

use super::*;

/// What a leased budget's home answers a partition that asks for units of one limit from a window
/// on: the window it leased in and the partition's whole lease of it (a total, so crediting it
/// twice or out of order changes nothing), or `None` when no window up to the horizon had room;
/// and the last window before it that had none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub window: Option<Millis>,
    pub total: u64,
    pub full_through: Millis,
}

/// How many windows of a limit of period `per` one lease covers: the window asked for and its
/// share of the next ones, about [`LEASE_TERM`] in all (at most sixteen). A limit of a longer
/// period leases one window at a time: a partition whose events stop holds what it was leased
/// ahead until the window passes, and a minute of its part is too much to strand. So does a
/// limit whose window lies in a nearly full window of a longer limit ([`nearly_full_around`]).
pub fn lease_term(per: Millis) -> i64 {
    (LEASE_TERM / per.max(1)).clamp(1, 16)
}

/// Whether a window of a longer limit (`longer`: each one's period and count in force) that
/// holds `window` of period `per` has less left at its home than `need`: two terms of the shorter
/// limit's count, about what the partitions can hold of it at once (the window asked for, topped
/// up to their shares, and the term's windows ahead). Its lease is then as asked, one window at a
/// time. The longer window's room is all its shorter windows can still take, so shares of them
/// held by a partition whose events stop are room the others lose there, and where a flood's tail
/// nearly fills it (300 a second beside 2,000 a minute) they book the next one instead. A longer
/// window with room to spare (a daily cap far off) leaves the term as it is. Measured with one
/// term instead of two, the contract's tail still stranded 0.4–5.3 % (docs/capacity.md).
pub fn nearly_full_around(
    home: &BudgetState,
    (per, window): (Millis, Millis),
    longer: impl IntoIterator<Item = (Millis, u64)>,
    need: u64,
) -> bool {
    longer.into_iter().any(|(long, count)| {
        debug_assert!(nests_in(per, long));
        let leased = home.windows.get(&(long, window - window.rem_euclid(long))).copied().unwrap_or(0);
        count.saturating_sub(leased) < need
    })
}

/// About how far ahead a lease reaches: a partition booking at its rate asks its home about once
/// in this. What a partition whose events stop strands is up to this much of its rate, and
/// where a flood ends the others take later windows meanwhile: 2 s rather than 5 s cut the
/// contract's 1 s stranding about threefold and its p99 extra delay to one window, at about the
/// same calls per event (docs/capacity.md).
pub const LEASE_TERM: Millis = 2 * crate::time::SECOND;

/// A leased budget limit (by its place among a request's budget limits) has no units for the cost
/// from this window on: its home is asked before the search goes on.
pub(super) struct LeaseWanted {
    pub(super) limit: usize,
    pub(super) window: Millis,
}

/// The earliest time ≥ `t` at which a partition's pool of a leased budget limit accepts the
/// request's cost more: the first window from `t`'s whose lease has room for it (one past the
/// horizon ends the search). A window without room that the home was not known to be full in is
/// `Err`: the home is asked for a lease from it first. Windows the pool holds no lease in past its
/// last leased one are jumped (`lua/reserve.lua` walks them the same way).
pub(super) fn pool_accepts(
    held: Option<&BudgetState>,
    limit: &BudgetLimit<'_>,
    request: &ReserveRequest<'_>,
    t: Millis,
) -> Result<Millis, Millis> {
    let (per, cost) = (limit.limit.per(), request.cost);
    let horizon = request.now + request.max_delay;
    let (mut window, t) = outside_margin(t, per, request.margin);
    let full = held.and_then(|s| s.known_full.get(&per).copied()).unwrap_or(Millis::MIN);
    let top =
        held.and_then(|s| s.leased.keys().filter(|(p, _)| *p == per).map(|&(_, w)| w).max()).unwrap_or(Millis::MIN);
    loop {
        if window > horizon {
            return Ok(t.max(window));
        }
        let used = held.and_then(|s| s.windows.get(&(per, window)).copied()).unwrap_or(0);
        let leased = held.map_or(0, |s| s.pool_holds(per, window));
        if used + cost <= leased {
            return Ok(t.max(window));
        }
        if window > full {
            return Err(window);
        }
        window = if window >= top { full + per } else { window + per };
    }
}

/// Asks the home of a leased budget limit for units from `window` on and credits the partition's
/// pool with what it leased (what `RedisStore` does in two calls between two reservation calls).
/// A partition asks for what it is about to use: this event's cost and that of the events behind
/// it in its call from the same pool, at least a chunk ([`Leases::want`]); the home may lease it
/// more, its share of the window's count, and part of the term's next windows
/// ([`BudgetState::grant`]).
pub(super) fn lease(
    budgets: &mut HashMap<String, BudgetState>,
    limit: &BudgetLimit<'_>,
    request: &ReserveRequest<'_>,
    (window, lease_through): (Millis, Option<Millis>),
) {
    let (Some(partition), Some(leases)) = (limit.partition(), limit.budget.leases) else { return };
    let per = limit.limit.per();
    let queued = request.queued.iter().find(|(pool, _)| *pool == limit.state).map_or(0, |&(_, cost)| cost);
    // The count in force at the home's level (a leased budget's signals go to its home).
    let level = budget_level(limit.budget, budgets.get(&limit.budget.name), request.now);
    let count = adapted_count(&limit.limit, limit.base, level, request.cost);
    let want = leases.want(limit.base, request.cost).max(request.cost + queued);
    let horizon = request.now + request.max_delay;
    let span = (per, window, lease_through.map_or(horizon, |through| through.min(horizon)));
    // The first window its pool can still book: past the windows of longer limits it gave up.
    let reach = budgets.get(&limit.state).map_or(Millis::MIN, |pool| pool_reach(pool, limit.budget, per));
    let home = budgets.entry(limit.budget.name.clone()).or_default();
    let asker = (partition, leases.partitions, request.now);
    let leases = match limit.budget.fair {
        Some(_) => vec![home.grant_fair(asker, span, count, (request.cost, want))],
        None => {
            let mut term = lease_term(per);
            let longer = limit.budget.limits.iter().filter(|long| nests_in(per, long.per()));
            let longer = longer.map(|long| (long.per(), adapted_count(long, long.limit(), level, request.cost)));
            if term > 1 && nearly_full_around(home, (per, window), longer, 2 * term as u64 * count) {
                term = 1;
            }
            let mut leases = home.grant(asker, span, count, (request.cost, want), term);
            let reopened =
                home.lease_reopened((partition, request.now), (per, window, reach), count, (request.cost, want));
            let full_through = leases[0].full_through;
            leases.extend(reopened.map(|lease| Lease { full_through, ..lease }));
            leases
        }
    };
    let pool = budgets.entry(limit.state.clone()).or_default();
    for lease in leases {
        pool.credit(per, lease);
    }
}

/// The first window of a limit of period `per` a pool can still book: past every window of a
/// longer limit of its budget (one `per` divides) it gave up ([`BudgetState::give_up_short_leases`]).
fn pool_reach(pool: &BudgetState, budget: &Budget, per: Millis) -> Millis {
    let longer = budget.limits.iter().map(Limit::per).filter(|&long| nests_in(per, long));
    longer.filter_map(|long| Some(pool.given_up.get(&long)? + long)).fold(Millis::MIN, Millis::max)
}

/// After a booking, each leased budget's pool it booked gives up its shorter limits' leases inside
/// the windows of a longer limit it can book no more of ([`BudgetState::give_up_short_leases`]),
/// and its home takes them back (`RedisStore::send_returns` sends them after the call).
pub(super) fn give_up_short_leases(
    budgets: &mut HashMap<String, BudgetState>,
    shared: &[BudgetLimit<'_>],
    (now, slot): (Millis, Millis),
) {
    let mut pools: Vec<(&Budget, &str, u32)> = Vec::new();
    for l in shared {
        if let Some(partition) = l.partition()
            && !pools.iter().any(|(_, state, _)| *state == l.state)
        {
            pools.push((l.budget, &l.state, partition));
        }
    }
    for (budget, state, partition) in pools {
        let pers: Vec<Millis> = budget.limits.iter().map(Limit::per).collect();
        let returns = budgets.entry(state.to_owned()).or_default().give_up_short_leases(&pers, (now, slot));
        let home = budgets.entry(budget.name.clone()).or_default();
        for (per, window, total) in returns {
            home.take_back(partition, (per, window), total);
        }
    }
}

/// A leased budget's home hands its adaptive state to every partition's pool after a signal or a
/// latency report moved it (`RedisStore::signal_calendar` does the same, pool by pool): a pool's
/// reservations read their level there, so a key throttled by it parks. Where the level in force
/// fell, the pool gives back what it was leased and has not booked of every window that has not
/// closed, and its home takes it back: the home's next grants are at the lowered count, so the
/// lowered level binds from now on, as on one Redis, but for what was booked already.
pub(super) fn adopt_level(budgets: &mut HashMap<String, BudgetState>, budget: &Budget, now: Millis) {
    let (Some(leases), Some(adaptive)) = (budget.leases, budget.adaptive) else { return };
    let window = adaptive_window(&budget.limits);
    let state = budgets.get(&budget.name).and_then(|home| home.adaptive);
    for partition in 0..leases.partitions {
        let pool = budgets.entry(budget.pool_name(partition)).or_default();
        let before = adaptive.level(pool.adaptive, window, now);
        pool.adaptive = state;
        if adaptive.level(state, window, now) >= before {
            continue;
        }
        let returns = pool.give_back_open_leases(now);
        let home = budgets.entry(budget.name.clone()).or_default();
        for (per, window, total) in returns {
            home.take_back(partition, (per, window), total);
        }
    }
}

#[cfg(test)]
mod lease_tests {
    use super::tests::request;
    use super::*;
    use crate::time::SECOND;

    #[test]
    fn one_attempt_acts_at_a_time_and_a_failed_or_crashed_one_hands_over() {
        let limits = [Limit::new(10, SECOND, Window::Fixed(crate::rules::Placement::Start)).unwrap()];
        let req = |now| ReserveRequest { max_delay: SECOND, lease: 100, ..request("m", &limits, now) };
        let mut s = Scheduler::new();
        assert_eq!(s.reserve("r", "k", &req(0)).attempt, Attempt::Decided);
        let concurrent = s.reserve("r", "k", &req(50));
        assert_eq!(concurrent.attempt, Attempt::Busy);
        s.release("r", "k", ("m", None));
        let retry = s.reserve("r", "k", &req(60));
        assert_eq!(retry.attempt, Attempt::Resumed, "a released lease is taken by the retry");
        assert_eq!(s.reserve("r", "k", &req(100)).attempt, Attempt::Busy, "the retry holds it until 160");
        assert_eq!(
            s.reserve("r", "k", &req(160)).attempt,
            Attempt::Resumed,
            "an expired lease (a crashed attempt) is taken over"
        );
        s.complete("r", "k", ("m", None));
        let done = s.reserve("r", "k", &req(170));
        assert_eq!(done.attempt, Attempt::Done);
    }
}
