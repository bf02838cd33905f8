//! Budget calendars: shared budgets and classes calendars, a count per window booked out of
//! order by many entities, with their floors, shares, adaptive levels, full runs and give-backs.

use super::*;

/// The state of one shared budget: what each window of each limit holds, a pause and the
/// adaptive level, shared by every entity that draws from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetState {
    /// By (per, window start): the cost reserved in that window.
    pub windows: BTreeMap<(Millis, Millis), u64>,
    /// By (per, window start, rule) for each rule holding a floor: its part of that window's cost.
    pub floor_used: BTreeMap<(Millis, Millis, String), u64>,
    /// By per: the run of full windows the last searches of that limit walked.
    pub runs: BTreeMap<Millis, FullRun>,
    pub paused_until: Option<Millis>,
    pub adaptive: Option<AdaptiveState>,
    pub latency: Option<LatencyState>,
    /// A classes calendar's per-key overrides of the rule's limits, by [`override_id`] (`drip
    /// limits set` on a key of a rule with classes): every class of the key books against them.
    pub overrides: BTreeMap<String, LimitOverride>,
    /// A classes calendar: the last slot of what its key booked before the rule had classes (0:
    /// nothing), once the calendar took that backlog over ([`Scheduler::carry_over`]); `None`
    /// before. Every class of the key books after it.
    pub carried: Option<Millis>,
    /// A leased budget's partition pool: by (per, window start), the units its home leased it
    /// (`windows` then holds what the partition booked of them).
    pub leased: BTreeMap<(Millis, Millis), u64>,
    /// A pool: by per, the last window its home had no room in when it last asked (a lease's
    /// `full_through`); the pool asks again only past it.
    pub known_full: BTreeMap<Millis, Millis>,
    /// A leased budget's home: by (per, window start, partition), the units leased to that
    /// partition (`windows` then holds what the home leased in all, less what came back).
    pub granted: BTreeMap<(Millis, Millis, u32), u64>,
    /// A pool: by (per, window start), the units of its lease it gave back to its home (events
    /// that left a window that had not closed), in all: what it may book is `leased − returned`.
    /// Totals, so that telling the home twice, or out of order, changes nothing.
    pub returned: BTreeMap<(Millis, Millis), u64>,
    /// A home: by (per, window start, partition), the units that partition gave back, in all.
    pub taken_back: BTreeMap<(Millis, Millis, u32), u64>,
    /// A home: by (per, partition), the units that partition last asked for and when: its
    /// demand, which sizes its part of the windows it is leased ahead ([`BudgetState::grant`]).
    pub demands: BTreeMap<(Millis, u32), (u64, Millis)>,
    /// A home: by per, the earliest window a partition gave units back in since a grant last
    /// looked there ([`BudgetState::lease_reopened`]).
    pub reopened: BTreeMap<Millis, Millis>,
    /// A pool: by the per of a longer limit, the last of its windows it gave up its shorter
    /// limits' leases inside ([`BudgetState::give_up_short_leases`]).
    pub given_up: BTreeMap<Millis, Millis>,
    /// A pool in Redis: by per, the units of passed windows it was leased and did not book,
    /// counted as it drops them (the model keeps every window: what it stranded is read off them).
    pub stranded: BTreeMap<Millis, u64>,
}

impl BudgetState {
    /// The home's grant (`lua/lease.lua`) of one limit to `partition`, asking for `want` units
    /// from window `from` for a `cost`, at `now`. The first window from `from` up to `horizon`
    /// with room for the cost leases it `want` units, or more: its share of the window's count by
    /// demand (`count × want ÷ the partitions' demands`, rounded up) less what it holds there, so
    /// that a partition booking a flood asks about once a window, not once per call; a long
    /// limit's window (its term that window alone) only what it asks for, since a share of it
    /// would strand at a flood's tail. A partition's demand is what it last asked for; one that
    /// has not asked within [`LEASE_TERM`] counts as asking as much as this one, so a partition
    /// alone takes its part of a window, not all of it.
    ///
    /// The same call leases it part of each of the term's next windows (`term` windows in all:
    /// [`lease_term`]), as far as their room goes: as much as it now holds of that first window
    /// (about its rate), at most its share of the count by demand, less what it holds there. A partition booking at its rate
    /// then asks about once a term.
    ///
    /// The walk stops at a full window past `from` that the partition holds a lease of (its pool
    /// may have room there): the answer then only tells it the windows before are full.
    pub fn grant(
        &mut self,
        (partition, partitions, now): (u32, u32, Millis),
        (per, from, horizon): (Millis, Millis, Millis),
        count: u64,
        (cost, want): (u64, u64),
        term: i64,
    ) -> Vec<Lease> {
        self.demands.insert((per, partition), (want, now));
        // A partition that has not asked within the term counts as asking as much as this one.
        let demands: u64 = (0..partitions)
            .map(|q| {
                self.demands.get(&(per, q)).filter(|(_, at)| at + LEASE_TERM > now).map_or(want, |&(units, _)| units)
            })
            .sum::<u64>()
            .max(1);
        // What is left of a window's count, and what the partition holds of it.
        let room_and_held = |home: &Self, window| {
            let total = home.windows.get(&(per, window)).copied().unwrap_or(0);
            (count.saturating_sub(total), home.granted.get(&(per, window, partition)).copied().unwrap_or(0))
        };
        let (window, room, held) = match self.first_open((per, from, horizon), cost, room_and_held) {
            Ok(found) => found,
            Err(full_through) => return vec![Lease { window: None, total: 0, full_through }],
        };
        let share = (count * want).div_ceil(demands);
        // A long window's share is too much to strand when the partition's events stop: it gets
        // what it asks for.
        let topped = if term > 1 { share.saturating_sub(held) } else { 0 };
        let units = want.max(topped).min(room);
        let first = self.lease_units(partition, (per, window), units, window - per);
        let part = first.total.min(share);
        let mut leases = vec![first];
        let ahead = (1..term).map(|k| window + k * per).take_while(|&w| w <= horizon);
        for ahead in ahead {
            let (room, held) = room_and_held(self, ahead);
            let units = part.saturating_sub(held).min(room);
            if units > 0 {
                leases.push(self.lease_units(partition, (per, ahead), units, window - per));
            }
        }
        leases
    }

    /// The walk of both grants: the first window from `from` up to `horizon` where what
    /// `open(home, window)` says the home may lease the partition (with what it holds there) leaves
    /// room for `cost`: that window, what is open and what it holds; else the last window before
    /// it with no room. It stops at a full window past `from` that the partition holds a lease of
    /// (its pool may have room there).
    fn first_open(
        &self,
        (per, from, horizon): (Millis, Millis, Millis),
        cost: u64,
        open: impl Fn(&Self, Millis) -> (u64, u64),
    ) -> Result<(Millis, u64, u64), Millis> {
        let mut window = from;
        while window <= horizon {
            let (room, held) = open(self, window);
            if room >= cost {
                return Ok((window, room, held));
            }
            if window > from && held > 0 {
                break;
            }
            window += per;
        }
        Err(window - per)
    }

    /// A fair budget's grant (`lua/lease.lua` with `fair` 1): max-min fair across the partitions
    /// that asked within [`FAIR_DEMAND_LIFE`] windows. Each such partition is owed the max-min
    /// fair part of a window's count by their demands (what each last asked for, a drain's heads,
    /// and what it held then of the window it asked from), less what it holds there; the first
    /// window from `from` up to `horizon` in which what is not owed to the others leaves room for
    /// `cost` leases the partition up to `want` of it. A partition whose keys ask little gets all it asks while one holding a flood takes
    /// the rest (work conserving), and the flood's partition never takes what a quiet partition's
    /// drain is about to book. Only the window asked for: a fair budget books near.
    pub fn grant_fair(
        &mut self,
        (partition, partitions, now): (u32, u32, Millis),
        (per, from, horizon): (Millis, Millis, Millis),
        count: u64,
        (cost, want): (u64, u64),
    ) -> Lease {
        // All it wants of the window it asks from: what it asks for and what it holds there.
        let held = self.granted.get(&(per, from, partition)).copied().unwrap_or(0);
        self.demands.insert((per, partition), (want + held, now));
        let live = (0..partitions).filter_map(|q| {
            let &(units, at) = self.demands.get(&(per, q))?;
            (at + FAIR_DEMAND_LIFE * per > now).then_some((q, units))
        });
        let parts = max_min_parts(count, live.collect());
        let open = |home: &Self, window| {
            let total = home.windows.get(&(per, window)).copied().unwrap_or(0);
            let held_by = |q: u32| home.granted.get(&(per, window, q)).copied().unwrap_or(0);
            let owed: u64 =
                parts.iter().filter(|(q, _)| *q != partition).map(|&(q, part)| part.saturating_sub(held_by(q))).sum();
            (count.saturating_sub(total).saturating_sub(owed), held_by(partition))
        };
        match self.first_open((per, from, horizon), cost, open) {
            Ok((window, open, _)) => self.lease_units(partition, (per, window), want.min(open), window - per),
            Err(full_through) => Lease { window: None, total: 0, full_through },
        }
    }

    /// Units given back before the window a partition asks from (`reopened`): a partition told
    /// those windows were full asks only past them, so a grant also leases the asker up to `want`
    /// of the first window from the mark with room for `cost`, if it lies at or past `reach` (the
    /// first window the asker's pool can still book: it gave up the longer limits' windows before,
    /// [`BudgetState::give_up_short_leases`]). The mark moves to that window, or goes when a grant
    /// from it found none before its own window; a grant whose reach lies past the mark leaves it
    /// for the others. `lua/lease.lua` does the same in the same call as the grant.
    pub fn lease_reopened(
        &mut self,
        (partition, now): (u32, Millis),
        (per, from, reach): (Millis, Millis, Millis),
        count: u64,
        (cost, want): (u64, u64),
    ) -> Option<Lease> {
        let mark = self.reopened.get(&per).copied()?;
        if mark + per <= now {
            self.reopened.remove(&per);
            return None;
        }
        let start = mark.max(reach);
        let room = |home: &Self, w| count.saturating_sub(home.windows.get(&(per, w)).copied().unwrap_or(0));
        let found = (start..from).step_by(per as usize).find(|&w| room(self, w) >= cost);
        if start == mark {
            match found {
                Some(window) => _ = self.reopened.insert(per, window),
                None => _ = self.reopened.remove(&per),
            }
        }
        let window = found?;
        let units = want.min(room(self, window));
        Some(self.lease_units(partition, (per, window), units, window - per))
    }

    /// Leases `units` of a window to `partition`: its lease, a total.
    fn lease_units(
        &mut self,
        partition: u32,
        (per, window): (Millis, Millis),
        units: u64,
        full_through: Millis,
    ) -> Lease {
        *self.windows.entry((per, window)).or_default() += units;
        let held = self.granted.entry((per, window, partition)).or_default();
        *held += units;
        Lease { window: Some(window), total: *held, full_through }
    }

    /// A partition pool takes a lease of one limit (idempotent: a lease is the partition's total).
    pub fn credit(&mut self, per: Millis, lease: Lease) {
        if let Some(window) = lease.window {
            let leased = self.leased.entry((per, window)).or_default();
            *leased = (*leased).max(lease.total);
        }
        let full = self.known_full.entry(per).or_insert(lease.full_through);
        *full = (*full).max(lease.full_through);
    }

    /// What a pool may book of a window: its lease less what it gave back.
    pub fn pool_holds(&self, per: Millis, window: Millis) -> u64 {
        let leased = self.leased.get(&(per, window)).copied().unwrap_or(0);
        leased.saturating_sub(self.returned.get(&(per, window)).copied().unwrap_or(0))
    }

    /// A pool gives back up to `units` of a window it no longer needs (events left it): what its
    /// lease holds beyond what it booked, at most. Returns its total given back of the window, for
    /// its home ([`BudgetState::take_back`]), when it gave any.
    pub fn give_back_lease(&mut self, per: Millis, window: Millis, units: u64) -> Option<u64> {
        let booked = self.windows.get(&(per, window)).copied().unwrap_or(0);
        let units = units.min(self.pool_holds(per, window).saturating_sub(booked));
        (units > 0).then(|| {
            let total = self.returned.entry((per, window)).or_default();
            *total += units;
            *total
        })
    }

    /// A pool whose budget's level fell gives back what it holds and has not booked of every
    /// window of its leases that has not closed at `now`, and forgets that its home was full from
    /// now's window on (its home has room again at the lowered count: the next event asks).
    /// Returns each window's total given back, for the home.
    pub fn give_back_open_leases(&mut self, now: Millis) -> Vec<(Millis, Millis, u64)> {
        let open: Vec<(Millis, Millis)> =
            self.leased.keys().copied().filter(|&(per, window)| window + per > now).collect();
        let returns =
            open.into_iter().filter_map(|(per, w)| Some((per, w, self.give_back_lease(per, w, u64::MAX)?))).collect();
        for (&per, full) in self.known_full.iter_mut() {
            *full = (*full).min(now.div_euclid(per) * per - per);
        }
        returns
    }

    /// A pool that has booked all it holds of a window of a longer limit (`pers`: the periods of
    /// its budget's limits), where its home was full when it last asked, can book nothing more in
    /// that window, so nothing in the windows of its shorter limits that lie inside it: it gives
    /// back what it holds and has not booked of each of those that has not closed, for a partition
    /// with units of the longer window left to lease. Without it a partition that took less of a
    /// minute than its even share of the minute's seconds strands their units while another books
    /// later seconds. It looks from now's window of the longer limit up to `slot`'s (the pool books
    /// there now), and stops at the first it can still book in: `given_up` keeps the last one
    /// given up, so each is given up once. Returns each window's total given back, for the home.
    pub fn give_up_short_leases(
        &mut self,
        pers: &[Millis],
        (now, slot): (Millis, Millis),
    ) -> Vec<(Millis, Millis, u64)> {
        let mut returns = Vec::new();
        for &long in pers {
            let shorter: Vec<Millis> = pers.iter().copied().filter(|&per| nests_in(per, long)).collect();
            let Some(&full) = self.known_full.get(&long).filter(|_| !shorter.is_empty()) else { continue };
            let current = now.div_euclid(long) * long;
            let mut window = self.given_up.get(&long).map_or(current, |&given| (given + long).max(current));
            while window <= full.min(slot.div_euclid(long) * long)
                && self.windows.get(&(long, window)).copied().unwrap_or(0) >= self.pool_holds(long, window)
            {
                let inside: Vec<(Millis, Millis)> = shorter
                    .iter()
                    .flat_map(|&per| {
                        let first = window.max(now.div_euclid(per) * per);
                        self.leased.range((per, first)..(per, window + long)).map(|(&key, _)| key)
                    })
                    .collect();
                for (per, short) in inside {
                    returns.extend(self.give_back_lease(per, short, u64::MAX).map(|total| (per, short, total)));
                }
                self.given_up.insert(long, window);
                window += long;
            }
        }
        returns
    }

    /// The home takes back what `partition` gave back of a window (`lua/returns.lua`): `total` is
    /// the partition's whole return of it, so only what is new comes off the window's leases.
    /// Returns the units taken back now.
    pub fn take_back(&mut self, partition: u32, (per, window): (Millis, Millis), total: u64) -> u64 {
        let Some(leased) = self.windows.get_mut(&(per, window)) else { return 0 };
        let taken = self.taken_back.entry((per, window, partition)).or_default();
        let new = total.saturating_sub(*taken).min(*leased);
        *taken = (*taken).max(total);
        *leased -= new;
        if new > 0 {
            let reopened = self.reopened.entry(per).or_insert(window);
            *reopened = (*reopened).min(window);
        }
        new
    }
}

/// Whether every window of period `short` lies inside one window of period `long` (a shorter
/// period that divides it): a pool that can book no more of a `long` window can book none of the
/// `short` windows inside it.
pub fn nests_in(short: Millis, long: Millis) -> bool {
    short < long && long % short == 0
}

/// Consecutive windows `from..=through` of one budget limit, each holding at least `least`: a
/// search for a cost that cannot fit beside `least` jumps over them. Windows only ever gain cost,
/// so a run stays true until its windows pass; it only speeds the search up, never changes a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullRun {
    pub from: Millis,
    pub through: Millis,
    pub least: u64,
}

/// One budget limit as it counts this reservation.
#[derive(Clone)]
pub(super) struct BudgetLimit<'a> {
    pub(super) budget: &'a Budget,
    pub(super) limit: Limit,
    /// The count before the adaptive level: the limit's, or a classes calendar's override of it.
    pub(super) base: u64,
    pub(super) count: u64,
    /// Whose floor the event books: its class in a classes calendar, else its key's or its rule's
    /// ([`Budget::floor_member`]).
    pub(super) member: &'a str,
    /// The [`BudgetState`] it counts in ([`Budget::state_name`], or a leased budget's partition pool).
    pub(super) state: String,
    pub(super) kind: BudgetLimitKind,
}

/// Which of the three kinds of budget limit a [`BudgetLimit`] is: each books, pauses and floors
/// differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BudgetLimitKind {
    /// A calendar's own limit: a shared budget's, or a classes calendar's (the rule's limits).
    Calendar,
    /// A leased budget's partition: `state` is its pool, booking what the budget's home leased it;
    /// the budget's own state is the home (which holds the pause).
    Pool { partition: u32 },
    /// A key's fair share of a budget, kept on the key's classes calendar (`budget`): the key's
    /// classes together take at most `count` of each window of the period. No floor applies.
    /// `counts`: it books the cost into its windows, unless a limit of the calendar of the same
    /// period counts them already (the same windows, the same events).
    Share { counts: bool },
}

impl BudgetLimit<'_> {
    /// The state that holds the budget's pause.
    pub(super) fn home(&self) -> &str {
        if self.partition().is_some() { &self.budget.name } else { &self.state }
    }

    /// The leased budget's partition whose pool this limit books, if it is a pool.
    pub(super) fn partition(&self) -> Option<u32> {
        match self.kind {
            BudgetLimitKind::Pool { partition } => Some(partition),
            _ => None,
        }
    }

    /// Whether it books the cost into its windows (every kind but a share a calendar limit counts).
    pub(super) fn counts(&self) -> bool {
        !matches!(self.kind, BudgetLimitKind::Share { counts: false })
    }

    pub(super) fn is_share(&self) -> bool {
        matches!(self.kind, BudgetLimitKind::Share { .. })
    }
}

/// The limits of `shared` that a slot decided at `decided` charged, so that giving it back or
/// correcting its cost moves units in those only: a classes calendar's always (it carried the
/// key's earlier bookings over), the shared budgets' only when the entity's reservations have
/// charged the same budgets since then (`EntityState::charges`): a slot reserved before its rule
/// had a budget took nothing from it.
pub(super) fn charged_by<'a>(
    state: &EntityState,
    request: &ReserveRequest<'_>,
    shared: &[BudgetLimit<'a>],
    decided: Millis,
) -> Vec<BudgetLimit<'a>> {
    let names = crate::budgets::charged_budgets(request.budgets);
    let charged = state.charges.as_ref().is_some_and(|(since, held)| *held == names && decided >= *since);
    shared.iter().filter(|l| charged || l.budget.per_key).cloned().collect()
}

/// Gives the units of `old` (a slot of the request's message that was never used) back, wherever
/// the window that holds them has not closed at `now` and can take them back exactly: the
/// entity's fixed (start) windows and fair shares when `old` lies in the window the entity holds,
/// budgets' start-placed windows (a run of full windows it lies in keeps only what it now holds);
/// gcra and sliding limits only when `old` is the entity's latest slot (undoing an earlier one
/// would need the slots after it). Spread-placed windows keep them: the positions of their later
/// events count on them. What is kept is only capacity unused, never a window over its limit.
pub(super) fn give_back(
    state: &mut EntityState,
    budgets: &mut HashMap<String, BudgetState>,
    (now, old, cost): (Millis, Millis, u64),
    own: &[EntityLimit],
    shared: &[BudgetLimit<'_>],
) {
    let latest = state.last_slot == Some(old);
    for EntityLimit { id, limit, count } in own {
        let per = limit.per();
        match (limit.window(), state.limits.get_mut(id)) {
            (Window::Fixed(Placement::Start), Some(LimitState::Fixed { window, used }))
                if *window == old.div_euclid(per) * per && *window + per > now =>
            {
                *used = used.saturating_sub(cost);
            }
            (Window::Gcra { .. }, Some(LimitState::Gcra { tat, tat_rem })) if latest => {
                // TAT − cost·T, exactly: its remainder is in units of 1/count ms.
                let n = *count as i64;
                let d = *tat_rem as i64 - cost as i64 * per;
                *tat += d.div_euclid(n);
                *tat_rem = d.rem_euclid(n) as u64;
            }
            (Window::Sliding, Some(LimitState::Sliding { base, entries })) if latest => {
                let before = entries.len().checked_sub(2).map_or(*base, |i| entries[i].1);
                if let Some(newest) = entries.back_mut().filter(|(time, _)| *time == old) {
                    newest.1 = newest.1.saturating_sub(cost);
                    if newest.1 <= before {
                        entries.pop_back();
                    }
                }
            }
            _ => {}
        }
    }
    shift_budget_windows(budgets, shared, (now, old), -(cost as i64));
}

/// Charges `more` units to `slot`'s windows (a cost reported after the call above what was booked):
/// the entity's fixed windows and fair shares when `slot` lies in the window it holds, budgets'
/// windows that have not closed, a gcra limit's TAT (it moves later), a sliding limit's newest slot
/// (every interval a later slot can share with `slot` also holds the newest). A window may then
/// hold more than its count: later slots move out until it passes.
pub(super) fn charge(
    state: &mut EntityState,
    budgets: &mut HashMap<String, BudgetState>,
    (now, slot, more): (Millis, Millis, u64),
    own: &[EntityLimit],
    shared: &[BudgetLimit<'_>],
) {
    for EntityLimit { id, limit, count } in own {
        let per = limit.per();
        match state.limits.get_mut(id) {
            Some(LimitState::Fixed { window, used }) if *window == slot.div_euclid(per) * per => *used += more,
            Some(LimitState::Gcra { tat, tat_rem }) => {
                let rem = *tat_rem + more * per as u64;
                *tat += (rem / count) as i64;
                *tat_rem = rem % count;
            }
            Some(LimitState::Sliding { entries, .. }) => {
                if let Some(newest) = entries.back_mut() {
                    newest.1 += more;
                }
            }
            _ => {}
        }
    }
    shift_budget_windows(budgets, shared, (now, slot), more as i64);
}

/// Moves `delta` units into (positive) or out of (negative) the window of `slot` of each budget
/// limit in `shared`, where it has not closed at `now`: out only of start-placed windows (the
/// positions of a spread window's later events count on what it holds), never below zero, and a
/// run of full windows it lies in keeps only what the window now holds.
pub(super) fn shift_budget_windows(
    budgets: &mut HashMap<String, BudgetState>,
    shared: &[BudgetLimit<'_>],
    (now, slot): (Millis, Millis),
    delta: i64,
) {
    for l in shared.iter().filter(|l| l.counts()) {
        let BudgetLimit { budget, limit, member, state, .. } = l;
        let (per, window) = (limit.per(), slot.div_euclid(limit.per()) * limit.per());
        let spread = limit.window() != Window::Fixed(Placement::Start);
        if window + per <= now || (delta < 0 && spread) {
            continue;
        }
        let Some(held) = budgets.get_mut(state) else { continue };
        let Some(used) = held.windows.get_mut(&(per, window)) else { continue };
        let before = *used;
        *used = used.saturating_add_signed(delta);
        let least = *used;
        if let Some(part) = held.floor_used.get_mut(&(per, window, member.to_string())).filter(|_| !l.is_share()) {
            *part = part.saturating_add_signed(delta);
        }
        if delta < 0
            && let Some(run) = held.runs.get_mut(&per).filter(|r| (r.from..=r.through).contains(&window))
        {
            run.least = run.least.min(least);
        }
        // A pool gives what left its window back to its home (the store sends it after the call:
        // `RedisStore::send_returns`), so that other partitions can lease it.
        if let Some(partition) = l.partition().filter(|_| delta < 0)
            && let Some(total) = held.give_back_lease(per, window, before - least)
        {
            budgets.entry(budget.name.clone()).or_default().take_back(partition, (per, window), total);
        }
    }
}

pub(super) fn budget_level(budget: &Budget, state: Option<&BudgetState>, now: Millis) -> Option<u64> {
    budget.adaptive.map(|a| a.level(state.and_then(|s| s.adaptive), adaptive_window(&budget.limits), now))
}

/// Every limit of every budget the request (an event of `rule`) draws from, with its count in force now.
pub(super) fn budget_limits<'a>(
    budgets: &HashMap<String, BudgetState>,
    request: &ReserveRequest<'a>,
    (rule, key): (&'a str, &str),
) -> Vec<BudgetLimit<'a>> {
    let mut shared = Vec::new();
    let (scope, class) = request.class.unzip();
    for budget in request.budgets {
        let partition = budget.partition_of(scope.unwrap_or(key));
        let state = partition.map_or_else(|| budget.state_name(scope), |p| budget.pool_name(p));
        let held = budgets.get(&state);
        let level = budget_level(budget, held, request.now);
        let member =
            if budget.per_key { class.unwrap_or_default() } else { budget.floor_member(rule, scope.unwrap_or(key)) };
        for limit in &budget.limits {
            let base = held.map_or(limit.limit(), |held| effective_limit(limit, &held.overrides, request.now));
            let count = adapted_count(limit, base, level, request.cost);
            let (limit, state) = (*limit, state.clone());
            shared.push(BudgetLimit {
                budget,
                limit,
                base,
                count,
                member,
                state,
                kind: partition.map_or(BudgetLimitKind::Calendar, |partition| BudgetLimitKind::Pool { partition }),
            });
        }
    }
    // A class's key's fair share of each budget: one more limit of its calendar, counting the
    // key's classes together (in windows of the share's period; a calendar limit of that period
    // counts them already).
    if let Some(calendar) = request.budgets.iter().find(|b| b.per_key)
        && let Some(scope) = scope
    {
        let mut shares = Vec::new();
        for CalendarShare { budget, limit, per, counts, .. } in calendar_shares(calendar, request.budgets) {
            let from = &request.budgets[budget].limits[limit];
            let held = shared.iter().find(|l| std::ptr::eq(l.budget, &*request.budgets[budget]) && l.limit == *from);
            let Some(share) = held.and_then(|l| l.budget.share_of(l.count, request.cost)) else { continue };
            shares.push(BudgetLimit {
                budget: calendar,
                limit: Limit::new(share, per, Window::Fixed(Placement::Start)).expect("share >= 1"),
                base: share,
                count: share,
                member: class.unwrap_or_default(),
                state: calendar.state_name(Some(scope)),
                kind: BudgetLimitKind::Share { counts },
            });
        }
        shared.extend(shares);
    }
    shared
}

/// The earliest time ≥ `t` at which one budget limit accepts the request's cost more: the first
/// window from `t`'s with room ([`window_takes`]; a window past the horizon ends the search: the
/// event is late whatever it holds), and the limit's run of full windows after this search.
pub(super) fn budget_accepts(
    held: Option<&BudgetState>,
    run: Option<FullRun>,
    limit: &BudgetLimit<'_>,
    request: &ReserveRequest<'_>,
    t: Millis,
) -> (Millis, Option<FullRun>) {
    let (per, n, cost, margin) = (limit.limit.per(), limit.count, request.cost, request.margin);
    let horizon = request.now + request.max_delay;
    let (mut window, t) = outside_margin(t, per, margin);
    let jumpable = run.filter(|r| r.least + cost > n);
    let (mut walked, mut jumped): (Option<FullRun>, bool) = (None, false);
    let accepted = loop {
        if window > horizon {
            break t.max(window);
        }
        if let Some(r) = jumpable
            && (r.from..=r.through).contains(&window)
        {
            (window, jumped) = (r.through + per, true);
            continue;
        }
        let used = held.and_then(|s| s.windows.get(&(per, window)).copied()).unwrap_or(0);
        let used_by = |rule: &str| held.and_then(|s| s.floor_used.get(&(per, window, rule.to_owned())).copied());
        let started = window <= request.now;
        if window_takes(limit, (used, used_by), cost, started) {
            let spread = limit.limit.window() == Window::Fixed(Placement::Spread);
            break t.max(if spread { spread_position(window, used, per - margin, n) } else { window });
        }
        walked = Some(match walked {
            None => FullRun { from: window, through: window, least: used },
            Some(w) => FullRun { through: window, least: w.least.min(used), ..w },
        });
        window += per;
    };
    let Some(w) = walked else { return (accepted, run) };
    let Some(r) = run else { return (accepted, Some(w)) };
    let kept = if jumped {
        // The walk went around the run: one stretch, if what it walked holds as much.
        (w.least >= r.least).then(|| FullRun { from: w.from.min(r.from), through: w.through.max(r.through), ..r })
    } else if r.through < request.now.div_euclid(per) * per || r.least + cost <= n || w.from < r.from {
        // The run has passed, this cost fits beside it, or the walk lies nearer now.
        Some(w)
    } else {
        (w.from == r.through + per && w.least >= r.least).then_some(FullRun { through: w.through, ..r })
    };
    (accepted, Some(kept.unwrap_or(r)))
}

/// Whether a budget window with `n` in force, holding `used` (of which `used_by(rule)` by each
/// rule holding a floor), takes `cost` more of the limit's rule: never past `n`; and before the
/// window starts, what the cost takes beyond its own rule's unused floor must leave every other
/// floor's unused units free (the window's total plus every unused floor stays within `n`). Once
/// the window has started, unused floors are anyone's. A cost within its own floor needs only
/// room, so a floor holds even after the count in force fell.
pub(super) fn window_takes(
    limit: &BudgetLimit<'_>,
    (used, used_by): (u64, impl Fn(&str) -> Option<u64>),
    cost: u64,
    started: bool,
) -> bool {
    let n = limit.count;
    if used + cost > n {
        return false;
    }
    if started || limit.is_share() || limit.budget.floors.is_empty() {
        return true;
    }
    let (mut unused, mut own_unused) = (0, 0);
    for (member, units) in limit.budget.floor_units(n) {
        let left = units.saturating_sub(used_by(member).unwrap_or(0));
        unused += left;
        if member == limit.member {
            own_unused = left;
        }
    }
    let borrowed = cost.saturating_sub(own_unused);
    borrowed == 0 || used + unused + borrowed <= n
}

/// Where `spread` placement puts the next event of a window holding `used` of `n`: evenly over the
/// window's first `span` milliseconds.
pub(super) fn spread_position(window: Millis, used: u64, span: Millis, n: u64) -> Millis {
    window + (used as i64 * span).div_euclid(n as i64)
}

#[cfg(test)]
mod budget_tests;

/// How many windows a partition's demand on a fair budget's home lives after it asked: a drain
/// asks about once a window while its keys wait, so its part stays owed between two asks.
pub const FAIR_DEMAND_LIFE: i64 = 2;

/// The max-min fair parts of `count` among `demands` (partition, units): in order of demand, each
/// gets what it asks for, at most an equal part (rounded up) of what the smaller ones left.
pub fn max_min_parts(count: u64, mut demands: Vec<(u32, u64)>) -> Vec<(u32, u64)> {
    demands.sort_by_key(|&(q, units)| (units, q));
    let mut left = count;
    let n = demands.len() as u64;
    let mut parts = Vec::with_capacity(demands.len());
    for (i, (q, units)) in demands.into_iter().enumerate() {
        let part = units.min(left.div_ceil(n - i as u64));
        left = left.saturating_sub(part);
        parts.push((q, part));
    }
    parts
}
