//! What an entity's state says: the use of each limit, the last reserved slot, and the backlog
//! (reservations still ahead) with when it drains. The state is O(limits), not one entry per
//! reservation, so the backlog is estimated from the limit that holds the most.

use std::collections::{BTreeMap, HashMap};

use std::sync::Arc;

use drip_core::budgets::{Budget, PPM, adapted_count, adaptive_window};
use drip_core::rules::{Limit, Rule, Window};
use drip_core::schedule::{BudgetState, EntityState, LimitState, effective_limit, override_id, state_id};
use drip_core::time::{Millis, format_rfc3339};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::keys::field;
use crate::{EntityKeys, RuleRef, StoreError};

/// Pub/Sub keeps a message at most 31 days: none published earlier can still be delivered.
const PUBSUB_RETENTION: Millis = 31 * drip_core::time::DAY;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntityReport {
    pub rule: String,
    pub key: String,
    pub now: String,
    /// The latest slot reserved for this entity, if any is remembered.
    pub last_slot: Option<String>,
    /// Events that hold a slot after now: exact, from their answers.
    pub backlog: u64,
    /// When the last reserved event goes (None: nothing is waiting).
    pub drains_at: Option<String>,
    pub limits: Vec<LimitReport>,
    /// This entity's overrides (`drip limits set`), in force or ended.
    pub overrides: Vec<OverrideReport>,
    /// The downstream asked to wait (429/503 with Retry-After): no slot before this.
    pub paused_until: Option<String>,
    /// The rule's adaptive level now (a fraction of each count), if it has one.
    pub adaptive_level: Option<f64>,
    /// The shared budgets the rule draws from, as everyone sees them.
    pub budgets: Vec<BudgetReport>,
    /// Why a new event would wait now: each pause, full limit (of the key or of a budget) and
    /// lowered adaptive level, with until when where the state says.
    pub waiting_on: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetReport {
    pub name: String,
    /// Each limit: cost in the current window, the count in force, cost reserved in later windows.
    pub limits: Vec<LimitReport>,
    pub max_share: Option<f64>,
    pub paused_until: Option<String>,
    pub adaptive_level: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OverrideReport {
    /// The rule's limit it overrides, e.g. `100 per 1m (fixed)`.
    pub limit: String,
    /// The count that replaces the rule's.
    pub count: u64,
    pub until: Option<String>,
    pub in_force: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitReport {
    /// e.g. `100 per 1m (fixed)`.
    pub limit: String,
    /// Cost reserved in the current window (fixed: the epoch-aligned one holding now; sliding:
    /// the last `per`; gcra: what the bucket holds now).
    pub used_now: u64,
    /// The count in force now: the rule's, or this entity's override.
    pub capacity: u64,
    /// Cost this limit holds in its windows after now: an estimate from its state (exact for a
    /// fixed limit whose windows FIFO filled; the entity's `backlog` is the exact event count).
    pub ahead: u64,
}

impl<C: ConnectionLike + Clone + Send + Sync> crate::RedisStore<C> {
    /// What the entity's state says now (Redis `TIME`).
    pub async fn inspect(&self, rule: &Rule, key: &str) -> Result<EntityReport, StoreError> {
        let mut connection = self.connection();
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut connection).await?;
        let now = seconds * 1_000 + micros / 1_000;
        let state = self.entity_state(RuleRef::of(rule), key, &rule.limits).await?;
        let mut budgets = Vec::new();
        for budget in &rule.budgets {
            budgets.push((budget.clone(), self.budget_state(budget).await?));
        }
        let booked = self.booked_after(rule, key, now).await?;
        Ok(report(rule, key, now, &state, &budgets, booked))
    }

    /// How many of the entity's events hold a slot after `now`, exactly: the reserved answers
    /// whose slot is ahead, in every publication minute a waiting event can be filed under and
    /// the undated ones. A waiting event was decided within `max_delay` of now and published at
    /// most Pub/Sub's longest retention (31 days) before that. About 45,000 `HVALS` pipelined,
    /// most of them of no hash: only `inspect` does it, never a reservation.
    pub async fn booked_after(&self, rule: &Rule, key: &str, now: Millis) -> Result<u64, StoreError> {
        let keys = EntityKeys::new(self.namespace(), RuleRef::of(rule), key, "-", None, &[]);
        let first = (now - rule.max_delay - PUBSUB_RETENTION).div_euclid(crate::ANSWER_BUCKET);
        let last = now.div_euclid(crate::ANSWER_BUCKET) + 1;
        let files: Vec<(String, Millis)> =
            std::iter::once(None).chain((first..=last).map(Some)).map(|m| keys.answers_of(m)).collect();
        let mut booked = 0;
        for chunk in files.chunks(500) {
            let mut pipe = redis::pipe();
            for (answers, _) in chunk {
                pipe.cmd("HVALS").arg(answers);
            }
            let values: Vec<Vec<String>> = pipe.query_async(&mut self.connection()).await?;
            for ((_, base), answers) in chunk.iter().zip(values) {
                let ahead = answers.iter().filter_map(|a| field::reserved_slot(a, *base)).filter(|&slot| slot > now);
                booked += ahead.count() as u64;
            }
        }
        Ok(booked)
    }

    /// The entity's last slot (its FIFO frontier), if it remembers one.
    pub async fn frontier(&self, rule: RuleRef<'_>, key: &str) -> Result<Option<Millis>, StoreError> {
        let keys = EntityKeys::new(self.namespace(), rule, key, "-", None, &[]);
        Ok(redis::cmd("HGET").arg(&keys.state).arg("last").query_async(&mut self.connection()).await?)
    }

    /// The entity's state as the reference model holds it (`drip_core::schedule::EntityState`):
    /// the one place that reads reserve.lua's layout back.
    pub async fn entity_state(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        limits: &[Limit],
    ) -> Result<EntityState, StoreError> {
        let keys = EntityKeys::new(self.namespace(), rule, key, "-", None, limits);
        let mut connection = self.connection();
        let fields: HashMap<String, i64> = redis::cmd("HGETALL").arg(&keys.state).query_async(&mut connection).await?;
        let held = |limit: &Limit| field::limit_state(limit).map(|name| fields.get(&name).copied());
        let overrides: BTreeMap<String, String> =
            redis::cmd("HGETALL").arg(&keys.overrides).query_async(&mut connection).await?;
        let mut state = EntityState {
            last_slot: fields.get(field::LAST).copied(),
            limits: BTreeMap::new(),
            overrides: crate::overrides::parse_overrides(&overrides),
            paused_until: overrides.get(field::PAUSE).and_then(|p| p.parse().ok()),
            adaptive: overrides.get(field::ADAPT).and_then(|a| field::parse_adaptive(a)),
        };
        // Fair shares of budgets: fixed windows named `share:<budget>:<per>`.
        for (name, &window) in &fields {
            if let Some(id) = name.strip_prefix("share:").and_then(|_| name.strip_suffix(":w"))
                && let Some(&used) = fields.get(&field::fixed_state(id)[1])
            {
                state.limits.insert(id.to_owned(), LimitState::Fixed { window, used: used as u64 });
            }
        }
        let mut sliding_keys = keys.sliding.iter();
        for limit in limits {
            let id = state_id(limit);
            let limit_state = match (limit.window(), held(limit)) {
                (Window::Fixed(_), [Some(window), Some(used)]) => Some(LimitState::Fixed { window, used: used as u64 }),
                (Window::Gcra { .. }, [Some(tat), Some(rem)]) => Some(LimitState::Gcra { tat, tat_rem: rem as u64 }),
                (Window::Fixed(_) | Window::Gcra { .. }, _) => None,
                (Window::Sliding, [base, _]) => {
                    let zset = sliding_keys.next().cloned().unwrap_or_default();
                    let entries: Vec<(String, i64)> = redis::cmd("ZRANGE")
                        .arg(&zset)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut connection)
                        .await?;
                    base.map(|base| LimitState::Sliding {
                        base: base as u64,
                        entries: entries
                            .into_iter()
                            .map(|(time, cum)| (time.parse().unwrap_or(0), cum as u64))
                            .collect(),
                    })
                }
            };
            if let Some(limit_state) = limit_state {
                state.limits.insert(id, limit_state);
            }
        }
        Ok(state)
    }
}

/// One key of a rule with overrides: what `drip limits list` prints and the limiter's
/// `GET /v1/rules/{rule}/limits` answers, one per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyOverrides {
    pub key: String,
    pub overrides: Vec<OverrideReport>,
}

/// An entity's overrides, one for each of the rule's limits that has one: what `inspect` shows,
/// `drip limits get` prints and the limiter's `GET .../limits` answers.
pub fn override_reports(
    rule: &Rule,
    overrides: &BTreeMap<String, drip_core::schedule::LimitOverride>,
    now: Millis,
) -> Vec<OverrideReport> {
    let each = rule.limits.iter().filter_map(|limit| {
        overrides.get(&override_id(limit)).map(|o| OverrideReport {
            limit: limit.to_string(),
            count: o.limit,
            until: o.until.map(format_rfc3339),
            in_force: o.in_force(now),
        })
    });
    each.collect()
}

/// Reads use, backlog and drain time off the state.
pub(crate) fn report(
    rule: &Rule,
    key: &str,
    now: Millis,
    state: &EntityState,
    budgets_in: &[(Arc<Budget>, BudgetState)],
    booked: u64,
) -> EntityReport {
    let mut limits = Vec::new();
    let overrides = override_reports(rule, &state.overrides, now);
    let level = rule.adaptive.map(|a| a.level(state.adaptive, adaptive_window(&rule.limits), now));
    for limit in &rule.limits {
        let capacity = adapted_count(limit, effective_limit(limit, &state.overrides, now), level, 1);
        let (n, per) = (capacity as i64, limit.per());
        let (used_now, ahead) = match state.limits.get(&state_id(limit)) {
            Some(LimitState::Fixed { window, used }) => {
                let (window, used) = (*window, *used as i64);
                let current = now.div_euclid(per) * per;
                if window == current {
                    (used, 0)
                } else if window > current {
                    // FIFO filled every window between now's and the last one.
                    (n, used + n * ((window - current) / per - 1).max(0))
                } else {
                    (0, 0)
                }
            }
            Some(LimitState::Sliding { base, entries }) => {
                let mut previous = *base as i64;
                let (mut used, mut ahead) = (0, 0);
                for &(time, cum) in entries {
                    let cost = cum as i64 - previous;
                    previous = cum as i64;
                    if time > now {
                        ahead += cost;
                    } else if time > now - per {
                        used += cost;
                    }
                }
                (used, ahead)
            }
            Some(LimitState::Gcra { tat, tat_rem }) => {
                let burst = match limit.window() {
                    Window::Gcra { burst } => burst as i64,
                    _ => 1,
                };
                // Units the bucket holds: (TAT - now) / T, T = per / limit.
                let held = (((tat - now) * n + *tat_rem as i64) / per.max(1)).max(0);
                (held.min(n.max(burst)), (held - burst + 1).max(0))
            }
            None => (0, 0),
        };
        limits.push(LimitReport { limit: limit.to_string(), used_now: used_now as u64, capacity, ahead: ahead as u64 });
    }
    let last_slot = state.last_slot;
    let waiting = last_slot.filter(|&slot| slot > now);
    let budgets: Vec<BudgetReport> = budgets_in.iter().map(|(budget, held)| budget_report(budget, held, now)).collect();
    let paused_until = state.paused_until.filter(|&until| until > now).map(format_rfc3339);
    let mut waiting_on = Vec::new();
    if let Some(until) = &paused_until {
        waiting_on.push(format!("paused until {until}: the downstream said to wait"));
    }
    // When a limit's current window holds its count: ` until <its end>` (fixed), or "" (sliding,
    // gcra: full now); `None` when it has room.
    let full_until = |limit: &Limit, report: &LimitReport| {
        (report.capacity > 0 && report.used_now >= report.capacity).then(|| match limit.window() {
            Window::Fixed(_) => format!(" until {}", format_rfc3339((now.div_euclid(limit.per()) + 1) * limit.per())),
            _ => String::new(),
        })
    };
    for (limit, report) in rule.limits.iter().zip(&limits) {
        if let Some(until) = full_until(limit, report) {
            waiting_on.push(format!("{}: full ({} of {}){until}", report.limit, report.used_now, report.capacity));
        }
    }
    if let (Some(adaptive), Some(level)) = (rule.adaptive, level)
        && level < adaptive.ceiling()
    {
        waiting_on.push(format!(
            "adaptive level {:.3}: each count is lowered after the downstream's overload",
            level as f64 / PPM as f64
        ));
    }
    for ((budget, _), report) in budgets_in.iter().zip(&budgets) {
        if let Some(until) = &report.paused_until {
            waiting_on.push(format!("budget {}: paused until {until}", report.name));
        }
        for (limit, l) in budget.limits.iter().zip(&report.limits) {
            if let Some(until) = full_until(limit, l) {
                let name = &report.name;
                waiting_on.push(format!(
                    "budget {name}: {} full ({} of {}, everyone's){until}",
                    l.limit, l.used_now, l.capacity
                ));
            }
        }
    }
    if waiting_on.is_empty() && booked > 0 {
        waiting_on.push(format!("{booked} events booked ahead of a new one (FIFO)"));
    }
    EntityReport {
        rule: rule.name.clone(),
        key: key.to_owned(),
        now: format_rfc3339(now),
        last_slot: last_slot.map(format_rfc3339),
        backlog: booked,
        drains_at: waiting.map(format_rfc3339),
        limits,
        overrides,
        paused_until,
        adaptive_level: level.map(|level| level as f64 / PPM as f64),
        budgets,
        waiting_on,
    }
}

fn budget_report(budget: &Budget, state: &BudgetState, now: Millis) -> BudgetReport {
    let level = budget.adaptive.map(|a| a.level(state.adaptive, adaptive_window(&budget.limits), now));
    BudgetReport {
        name: budget.name.clone(),
        limits: budget
            .limits
            .iter()
            .map(|limit| {
                let per = limit.per();
                let current = now.div_euclid(per) * per;
                let held = |from: Millis| -> u64 {
                    state.windows.range((per, from)..(per, Millis::MAX)).map(|(_, &used)| used).sum()
                };
                LimitReport {
                    limit: limit.to_string(),
                    used_now: state.windows.get(&(per, current)).copied().unwrap_or(0),
                    capacity: adapted_count(limit, limit.limit(), level, 1),
                    ahead: held(current + per),
                }
            })
            .collect(),
        max_share: budget.max_share.map(|share| share as f64 / PPM as f64),
        paused_until: state.paused_until.filter(|&until| until > now).map(format_rfc3339),
        adaptive_level: level.map(|level| level as f64 / PPM as f64),
    }
}
