//! Shared budgets in Redis: one hash per budget under its group's hash tag (see reserve.lua for
//! its fields), paused and adapted by `lua/budget.lua`.

use std::collections::HashMap;

use drip_core::budgets::{Budget, LatencyChange, LatencyReport};
use drip_core::rules::Rule;
use drip_core::schedule::BudgetState;
use drip_core::time::Millis;
use redis::aio::ConnectionLike;

use crate::keys::STATE_MARGIN;
use crate::keys::{budget_key, class_calendar_key, field, pool_key};
use crate::overrides::{adapt_args, latency_args, latency_change};
use crate::scripts::BUDGET;
use crate::{EntityKeys, RedisStore, RuleRef, StoreError};

impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    /// No slot of any entity drawing from the budget before `until` (a later pause is kept).
    /// A leased budget's pause is its home's, copied to each partition's pool (which is all its
    /// reservations read), pools first.
    pub async fn pause_budget(&self, budget: &Budget, until: Millis, now: Option<Millis>) -> Result<(), StoreError> {
        for pool in self.pool_keys(budget) {
            self.pause_at(pool, until, now).await?;
        }
        self.pause_at(budget_key(self.namespace(), budget), until, now).await
    }

    /// Lifts the budget's pause (its home's and its pools'); returns when it would have ended.
    pub async fn resume_budget(&self, budget: &Budget, now: Option<Millis>) -> Result<Option<Millis>, StoreError> {
        let lifted = self.resume_at(budget_key(self.namespace(), budget), now).await?;
        for pool in self.pool_keys(budget) {
            self.resume_at(pool, now).await?;
        }
        Ok(lifted)
    }

    /// A leased budget's partitions' pools (none for a budget without leases).
    fn pool_keys(&self, budget: &Budget) -> Vec<String> {
        let partitions = budget.leases.map_or(0, |l| l.partitions);
        (0..partitions).map(|p| pool_key(self.namespace(), budget, p)).collect()
    }

    async fn pause_at(&self, hash: String, until: Millis, now: Option<Millis>) -> Result<(), StoreError> {
        self.hash_invocation::<i64>(hash, now, &["pause".into(), until.to_string()]).await.map(drop)
    }

    async fn resume_at(&self, hash: String, now: Option<Millis>) -> Result<Option<Millis>, StoreError> {
        let ended: i64 = self.hash_invocation(hash, now, &["resume".into()]).await?;
        Ok((ended >= 0).then_some(ended))
    }

    /// The budget's downstream answered 429, 5xx or timed out: its adaptive level drops (once per
    /// window). Returns the level after it (ppm); nothing for a budget without an adaptive limit.
    pub async fn signal_budget(&self, budget: &Budget, now: Option<Millis>) -> Result<Option<u64>, StoreError> {
        self.signal_at(budget_key(self.namespace(), budget), budget, now).await
    }

    /// The same for the calendar of a key of a rule with classes (`Classes::calendar`): its
    /// classes share one adaptive level.
    pub async fn signal_class_calendar(
        &self,
        (rule, key): (RuleRef<'_>, &str),
        calendar: &Budget,
        now: Option<Millis>,
    ) -> Result<Option<u64>, StoreError> {
        self.signal_at(class_calendar_key(self.namespace(), rule, key), calendar, now).await
    }

    async fn signal_at(&self, hash: String, budget: &Budget, now: Option<Millis>) -> Result<Option<u64>, StoreError> {
        let Some(adaptive) = &budget.adaptive else { return Ok(None) };
        let mut args = vec!["adapt".to_owned()];
        args.extend(adapt_args(adaptive, &budget.limits));
        self.hash_invocation::<i64>(hash, now, &args).await.map(|level| Some(level as u64))
    }

    /// A window's latency of the budget's downstream; `None` when its adaptive limit does not
    /// follow latency.
    pub async fn report_budget_latency(
        &self,
        budget: &Budget,
        report: LatencyReport,
        now: Option<Millis>,
    ) -> Result<Option<LatencyChange>, StoreError> {
        self.latency_at(budget_key(self.namespace(), budget), budget, report, now).await
    }

    /// The same for the calendar of a key of a rule with classes.
    pub async fn report_class_calendar_latency(
        &self,
        (rule, key): (RuleRef<'_>, &str),
        calendar: &Budget,
        report: LatencyReport,
        now: Option<Millis>,
    ) -> Result<Option<LatencyChange>, StoreError> {
        self.latency_at(class_calendar_key(self.namespace(), rule, key), calendar, report, now).await
    }

    async fn latency_at(
        &self,
        hash: String,
        budget: &Budget,
        report: LatencyReport,
        now: Option<Millis>,
    ) -> Result<Option<LatencyChange>, StoreError> {
        let Some(parameters) =
            budget.adaptive.as_ref().and_then(|adaptive| latency_args(adaptive, &budget.limits, report))
        else {
            return Ok(None);
        };
        let reply: Vec<i64> = self.hash_invocation(hash, now, &["latency".into(), parameters]).await?;
        latency_change(&reply).map(Some)
    }

    /// A pause of a classed rule's entity `<key>#<class>` holds every class of the key: it is the
    /// key's calendar's (a downstream that refuses one class refuses the key).
    pub async fn pause_class_calendar(
        &self,
        (rule, key): (RuleRef<'_>, &str),
        until: Millis,
        now: Option<Millis>,
    ) -> Result<(), StoreError> {
        self.pause_at(class_calendar_key(self.namespace(), rule, key), until, now).await
    }

    /// Lifts the pause of a key's calendar; returns when it would have ended.
    pub async fn resume_class_calendar(
        &self,
        (rule, key): (RuleRef<'_>, &str),
        now: Option<Millis>,
    ) -> Result<Option<Millis>, StoreError> {
        self.resume_at(class_calendar_key(self.namespace(), rule, key), now).await
    }

    /// budget.lua on the calendar hash `hash` (a budget's or a key's classes').
    async fn hash_invocation<T: redis::FromRedisValue>(
        &self,
        hash: String,
        now: Option<Millis>,
        args: &[String],
    ) -> Result<T, StoreError> {
        let mut invocation = BUDGET.prepare_invoke();
        invocation.key(hash).arg(now.map(|n| n.to_string()).unwrap_or_default()).arg(STATE_MARGIN);
        for arg in args {
            invocation.arg(arg);
        }
        Ok(invocation.invoke_async(&mut self.connection()).await?)
    }

    /// The latest end of a pause of the rule's key (a classed key's calendar) or of any budget it
    /// draws from, if any.
    pub async fn paused_until(&self, rule: &Rule, key: &str) -> Result<Option<Millis>, StoreError> {
        let keys = EntityKeys::new(self.namespace(), RuleRef::of(rule), key, "-", None, &[]);
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
            ..BudgetState::default()
        };
        for (name, value) in &fields {
            if let Some(per) = name.strip_prefix("F:").and_then(|p| p.parse().ok())
                && let Ok(window) = value.parse()
            {
                state.known_full.insert(per, window);
            } else if let Some(per) = name.strip_prefix("S:").and_then(|p| p.parse().ok())
                && let Ok(units) = value.parse()
            {
                state.stranded.insert(per, units);
            } else if let Some((per, window, what)) = field::parse_lease_field(name)
                && let Ok(units) = value.parse()
                && (what == "l" || what.starts_with('p'))
            {
                match what.strip_prefix('p').map(str::parse) {
                    Some(Ok(partition)) => _ = state.granted.insert((per, window, partition), units),
                    _ => _ = state.leased.insert((per, window), units),
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
