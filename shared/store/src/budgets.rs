//! Shared budgets in Redis: one hash per budget under its group's hash tag (see reserve.lua for
//! its fields), paused and adapted by `lua/budget.lua`.

use std::collections::HashMap;

use drip_core::budgets::{Budget, LatencyChange, LatencyReport, adaptive_window};
use drip_core::rules::Rule;
use drip_core::schedule::BudgetState;
use drip_core::time::Millis;
use redis::aio::ConnectionLike;

use crate::args::LeaseTarget;
use crate::keys::STATE_MARGIN;
use crate::keys::{budget_key, class_calendar_key, field, pool_key};
use crate::overrides::{adapt_args, latency_args, latency_change};
use crate::scripts::BUDGET;
use crate::{keys::EntityKeys, keys::RuleRef, redis_store::RedisStore, request::StoreError};

/// A calendar `lua/budget.lua` keeps a pause, an adaptive level and a latency state in: a shared
/// budget's hash (with a leased budget's pools), or the hash a classed rule's key's classes share.
#[derive(Debug, Clone, Copy)]
pub enum Calendar<'a> {
    Budget(&'a Budget),
    /// The classes of `key` (a classed key's scope) of `rule`, under `calendar` (`Classes::calendar`).
    Classes {
        rule: RuleRef<'a>,
        key: &'a str,
        calendar: &'a Budget,
    },
}

impl<'a> Calendar<'a> {
    /// The calendar of `key`'s classes, when `rule` has classes and `key` is one of their entities
    /// (`<key>#<class>`): what a pause, a signal or a latency report of it goes to.
    pub(crate) fn of_classes(rule: &'a Rule, key: &'a str) -> Option<Self> {
        crate::inspect::class_calendar(rule, key).map(|(calendar, scope)| Calendar::Classes {
            rule: RuleRef::of(rule),
            key: scope,
            calendar,
        })
    }

    /// The limits and adaptive limit it counts.
    fn budget(&self) -> &Budget {
        match *self {
            Calendar::Budget(budget) | Calendar::Classes { calendar: budget, .. } => budget,
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    /// The calendar's hash, then a leased budget's partitions' pools (which is all their
    /// reservations read of its pause).
    fn calendar_hashes(&self, calendar: Calendar<'_>) -> (String, Vec<String>) {
        match calendar {
            Calendar::Budget(budget) => {
                let partitions = budget.leases.map_or(0, |l| l.partitions);
                let pools = (0..partitions).map(|p| pool_key(self.namespace(), budget, p)).collect();
                (budget_key(self.namespace(), budget), pools)
            }
            Calendar::Classes { rule, key, .. } => (class_calendar_key(self.namespace(), rule, key), Vec::new()),
        }
    }

    /// No slot of any entity drawing from the calendar before `until` (a later pause is kept);
    /// a leased budget's pools first, its home last.
    pub(crate) async fn pause_calendar(&self, calendar: Calendar<'_>, until: Millis) -> Result<(), StoreError> {
        let (home, pools) = self.calendar_hashes(calendar);
        let args = ["pause".to_owned(), until.to_string()];
        for hash in pools.into_iter().chain([home]) {
            self.hash_invocation::<i64>(hash, &args).await?;
        }
        Ok(())
    }

    /// Lifts the calendar's pause (a leased budget's home's and its pools'); returns when it
    /// would have ended.
    pub(crate) async fn resume_calendar(&self, calendar: Calendar<'_>) -> Result<Option<Millis>, StoreError> {
        let (home, pools) = self.calendar_hashes(calendar);
        let args = ["resume".to_owned()];
        let ended: i64 = self.hash_invocation(home, &args).await?;
        for pool in pools {
            self.hash_invocation::<i64>(pool, &args).await?;
        }
        Ok((ended >= 0).then_some(ended))
    }

    /// The calendar's downstream answered 429, 5xx or timed out: its adaptive level drops (once
    /// per window). Returns the level after it (ppm); nothing without an adaptive limit.
    pub(crate) async fn signal_calendar(&self, calendar: Calendar<'_>) -> Result<Option<u64>, StoreError> {
        let budget = calendar.budget();
        let Some(adaptive) = &budget.adaptive else { return Ok(None) };
        let mut args = vec!["adapt".to_owned()];
        args.extend(adapt_args(adaptive, &budget.limits));
        let level: i64 = self.hash_invocation(self.calendar_hashes(calendar).0, &args).await?;
        self.hand_level_to_pools(calendar).await?;
        Ok(Some(level as u64))
    }

    /// A leased budget's pools take its home's adaptive state (schedule/leases.rs's `adopt_level`):
    /// where the level fell, each gives back what it leased and had not booked of the windows
    /// still open, and the store sends that to the home. Between the home's change and a pool's,
    /// the pool books at the level before, as if the signal had come a moment later; a pool that
    /// is not reached (an error, returned) keeps its leases until they pass (at most a lease's
    /// term) and takes the level at the next signal.
    async fn hand_level_to_pools(&self, calendar: Calendar<'_>) -> Result<(), StoreError> {
        let Calendar::Budget(budget) = calendar else { return Ok(()) };
        let (Some(leases), Some(adaptive)) = (budget.leases, budget.adaptive) else { return Ok(()) };
        let home = budget_key(self.namespace(), budget);
        let state: Option<String> =
            redis::cmd("HGET").arg(&home).arg(field::ADAPT).query_async(&mut self.connection()).await?;
        let (ceiling, step, window) = (adaptive.ceiling(), adaptive.step, adaptive_window(&budget.limits));
        let args =
            ["adopt".to_owned(), state.unwrap_or_default(), ceiling.to_string(), step.to_string(), window.to_string()];
        let pools: Vec<LeaseTarget> =
            (0..leases.partitions).filter_map(|p| LeaseTarget::of_pool(self.namespace(), budget, p)).collect();
        for pool in &pools {
            self.hash_invocation::<i64>(pool.pool.clone(), &args).await?;
        }
        self.send_returns(pools.iter().collect()).await;
        Ok(())
    }

    /// A window's latency of the calendar's downstream; `None` when its adaptive limit does not
    /// follow latency.
    pub(crate) async fn report_calendar_latency(
        &self,
        calendar: Calendar<'_>,
        report: LatencyReport,
    ) -> Result<Option<LatencyChange>, StoreError> {
        let budget = calendar.budget();
        let Some(parameters) =
            budget.adaptive.as_ref().and_then(|adaptive| latency_args(adaptive, &budget.limits, report))
        else {
            return Ok(None);
        };
        let args = ["latency".to_owned(), parameters];
        let reply: Vec<i64> = self.hash_invocation(self.calendar_hashes(calendar).0, &args).await?;
        let change = latency_change(&reply)?;
        self.hand_level_to_pools(calendar).await?;
        Ok(Some(change))
    }

    /// budget.lua on the calendar hash `hash` (a budget's or a key's classes'), at the store's clock.
    async fn hash_invocation<T: redis::FromRedisValue>(&self, hash: String, args: &[String]) -> Result<T, StoreError> {
        let mut invocation = BUDGET.call();
        invocation.key(hash).arg(self.clock_arg()).arg(STATE_MARGIN);
        for arg in args {
            invocation.arg(arg);
        }
        Ok(invocation.invoke_async(&mut self.connection()).await?)
    }

    /// The latest end of a pause of the rule's key (a classed key's calendar) or of any budget it
    /// draws from, if any.
    pub(crate) async fn pause_end(&self, rule: &Rule, key: &str) -> Result<Option<Millis>, StoreError> {
        let keys = EntityKeys::of_entity(self.namespace(), RuleRef::of_entity(rule, key), key, &[]);
        // The key's and its budgets' pauses in one round trip (the dispatcher asks before each publish).
        let (entries, budgets) = self
            .override_entries_with(&keys, |pipe| {
                if let Some((_, scope)) = crate::inspect::class_calendar(rule, key) {
                    pipe.hget(class_calendar_key(self.namespace(), RuleRef::of(rule), scope), field::PAUSE);
                }
                for budget in &rule.budgets {
                    pipe.hget(budget_key(self.namespace(), budget), field::PAUSE);
                }
            })
            .await?;
        let own = entries.get(field::PAUSE).and_then(|p| p.parse().ok());
        let mut ends = Vec::with_capacity(budgets.len());
        for reply in budgets {
            let end: Option<Millis> =
                redis::from_redis_value(reply).map_err(|e| StoreError::UnexpectedReply(e.to_string()))?;
            ends.extend(end);
        }
        Ok(ends.into_iter().chain(own).max())
    }

    /// The budget's state as the reference model holds it.
    pub async fn budget_state(&self, budget: &Budget) -> Result<BudgetState, StoreError> {
        self.calendar_state(&budget_key(self.namespace(), budget)).await
    }

    /// A leased budget's pool in one partition, as the reference model holds it (`Budget::pool_name`).
    pub async fn pool_state(&self, budget: &Budget, partition: u32) -> Result<BudgetState, StoreError> {
        self.calendar_state(&pool_key(self.namespace(), budget, partition)).await
    }

    /// The calendar `key`'s classes share (`Classes::calendar`), as the model holds it.
    pub async fn class_calendar_state(&self, rule: RuleRef<'_>, key: &str) -> Result<BudgetState, StoreError> {
        self.calendar_state(&class_calendar_key(self.namespace(), rule, key)).await
    }

    async fn calendar_state(&self, hash: &str) -> Result<BudgetState, StoreError> {
        let fields: HashMap<String, String> =
            redis::cmd("HGETALL").arg(hash).query_async(&mut self.connection()).await?;
        let mut state = BudgetState {
            paused_until: fields.get(field::PAUSE).and_then(|p| p.parse().ok()),
            adaptive: fields.get(field::ADAPT).and_then(|a| field::parse_adaptive(a)),
            latency: fields.get(field::LATENCY).and_then(|l| field::parse_latency(l)),
            overrides: crate::overrides::parse_overrides(&field::parse_overrides_field(
                fields.get(field::OVERRIDES).map_or("", String::as_str),
            )),
            carried: fields.get(field::CARRIED).and_then(|c| c.parse().ok()),
            ..BudgetState::default()
        };
        for (name, value) in &fields {
            // A window by per: a pool's 'F:<per>' and 'G:<per>', a home's 'o:<per>'.
            let by_per = [("F:", &mut state.known_full), ("G:", &mut state.given_up), ("o:", &mut state.reopened)]
                .into_iter()
                .find_map(|(prefix, map)| Some((name.strip_prefix(prefix)?.parse().ok()?, map)));
            if let Some((per, map)) = by_per
                && let Ok(window) = value.parse()
            {
                map.insert(per, window);
            } else if let Some((per, partition)) = name.strip_prefix("d:").and_then(|d| d.split_once(":p"))
                && let (Ok(per), Ok(partition)) = (per.parse(), partition.parse())
                && let Some((Ok(units), Ok(at))) = value.split_once(':').map(|(u, a)| (u.parse(), a.parse()))
            {
                state.demands.insert((per, partition), (units, at));
            } else if let Some(per) = name.strip_prefix("S:").and_then(|p| p.parse().ok())
                && let Ok(units) = value.parse()
            {
                state.stranded.insert(per, units);
            } else if let Some((per, window, what)) = field::parse_lease_field(name)
                && let Ok(units) = value.parse()
                && (what == "l" || what == "r" || what.starts_with('p'))
            {
                let partition = what.strip_prefix('p').map(|p| p.trim_end_matches(":r").parse());
                match (partition, what.ends_with(":r") || what == "r") {
                    (Some(Ok(partition)), false) => _ = state.granted.insert((per, window, partition), units),
                    (Some(Ok(partition)), true) => _ = state.taken_back.insert((per, window, partition), units),
                    (_, false) => _ = state.leased.insert((per, window), units),
                    (_, true) => _ = state.returned.insert((per, window), units),
                }
            } else if let Some((per, run)) = field::parse_budget_run(name, value) {
                state.runs.insert(per, run);
            } else if let Some((per, window, rule)) = field::parse_budget_floor(name)
                && let Ok(used) = value.parse()
            {
                state.floor_used.insert((per, window, rule.to_owned()), used);
            } else if let Some(window) = field::parse_budget_window(name)
                && let Ok(used) = value.parse()
            {
                state.windows.insert(window, used);
            }
        }
        Ok(state)
    }
}
