//! What an entity's state says: the use of each limit, the last reserved slot, and the backlog
//! (reservations still ahead) with when it drains. The state is O(limits), not one entry per
//! reservation, so the backlog is estimated from the limit that holds the most.

use std::collections::{BTreeMap, HashMap};

use std::sync::Arc;

use drip_core::budgets::{Adaptive, Budget, FairRing, LatencyState, PPM, adapted_count, adaptive_window};
use drip_core::fair::Member;
use drip_core::rules::{Limit, Rule, Window};
use drip_core::schedule::{BudgetState, EntityState, LimitState, effective_limit, override_id, state_id};
use drip_core::time::{Millis, format_rfc3339};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::keys::field;
use crate::{keys::EntityKeys, keys::RuleRef, request::StoreError};

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
    /// Events parked while the key is throttled (no slot yet): the key's drain books them at the
    /// rate in force.
    #[serde(default)]
    pub parked: u64,
    /// When the last reserved event goes (None: nothing is waiting, or a pause holds the backlog:
    /// then `drains_after`).
    pub drains_at: Option<String>,
    /// A pause (the key's or a budget's) ends after slots the backlog holds: those events are given
    /// new slots when their tasks find the pause, so the backlog drains only after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drains_after: Option<String>,
    pub limits: Vec<LimitReport>,
    /// This entity's overrides (`drip limits set`), in force or ended.
    pub overrides: Vec<OverrideReport>,
    /// The downstream asked to wait (429/503 with Retry-After): no slot before this.
    pub paused_until: Option<String>,
    /// The rule's adaptive level now (a fraction of each count), if it has one.
    pub adaptive_level: Option<f64>,
    /// What the latency controller knows of the key, when its adaptive limit follows latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyView>,
    /// The shared budgets the rule draws from, as everyone sees them.
    pub budgets: Vec<BudgetReport>,
    /// Why a new event would wait now: each pause, full limit (of the key or of a budget) and
    /// lowered adaptive level, with until when where the state says.
    pub waiting_on: Vec<String>,
    /// For a rule with classes asked about a key (not one class of it): each class's backlog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassReport>,
}

/// One class of a key of a rule with classes: its own FIFO's backlog.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassReport {
    pub class: String,
    /// Its events that hold a slot after now.
    pub backlog: u64,
    pub last_slot: Option<String>,
    pub drains_at: Option<String>,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyView>,
    /// Each rule's floor and what that rule holds of it (docs/rules.md: "Floors in a shared budget");
    /// for a key's classes calendar, each class's reserve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<FloorReport>,
    /// A key's classes calendar, not a shared budget: its floors are classes' reserves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub classes: bool,
    /// A leased budget (docs/rules.md: "A budget past one shard"): its limits' `usedNow` and
    /// `ahead` are what its home leased to every partition; this is the key's partition's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseReport>,
    /// A fair budget (docs/rules.md: "Fair budgets"): its waiting keys and this key's place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair: Option<FairReport>,
}

/// A fair budget's ring as `drip inspect` shows it beside one key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FairReport {
    /// How far ahead it books; what lies past it parks.
    pub near_horizon_ms: Millis,
    /// How many keys wait in its ring.
    pub waiting_keys: usize,
    /// The waiting keys with the most parked, most first (at most [`FAIR_KEYS_SHOWN`]).
    pub busiest: Vec<FairKey>,
    /// This key's weight, and its share of each window while the keys waiting now (and it) wait.
    pub weight: u64,
    pub share: f64,
    /// About when this key's parked events are through at that share (none parked: `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_wait_ms: Option<Millis>,
}

/// One waiting key of a fair budget.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FairKey {
    pub rule: String,
    pub key: String,
    pub weight: u64,
    pub share: f64,
    pub parked: u64,
}

/// The most waiting keys `drip inspect` lists for a fair budget.
pub const FAIR_KEYS_SHOWN: usize = 10;

/// A fair budget's view beside key `key` of rule `rule` (its id; `scope_of`: the key an entity of
/// the rule belongs to, `Rule::scope_of`, so that a key's classes share the key's weight): `waiting` are the
/// ring's members with how many of their messages are parked. A key's share is its weight, shared
/// among its waiting classes ([`drip_core::fair::shared_weights`]), over the weights of every
/// waiting key (this one counted, waiting or not); its expected wait is its parked events at that
/// share of the rate of the budget's tightest limit: an estimate (keys join and leave, what one
/// cannot use goes to the others, and windows are whole; another rule's classes count as keys).
/// On a leased budget `waiting` is the key's partition's ring, and the estimate a lower bound
/// while other partitions' keys wait.
pub fn fair_report<'a>(
    budget: &Budget,
    waiting: &'a [(Member, u64)],
    (rule, key): (&str, &'a str),
    scope_of: impl Fn(&'a str) -> &'a str,
) -> Option<FairReport> {
    let fair = budget.fair.as_ref()?;
    // The key a member of this rule belongs to (`Rule::scope_of`: a class's entity is its key's).
    let scope = |r: &str, k: &'a str| -> &'a str { if r == rule { scope_of(k) } else { k } };
    let me = |m: &Member| m.rule == rule && m.key == key;
    let mut members: Vec<(&str, &str)> = waiting.iter().map(|(m, _)| (m.rule.as_str(), m.key.as_str())).collect();
    let mine = waiting.iter().position(|(m, _)| me(m)).unwrap_or_else(|| {
        members.push((rule, key));
        members.len() - 1
    });
    let groups: Vec<((&str, &str), u64)> = members
        .iter()
        .map(|&(r, k)| {
            let scope = scope(r, k);
            ((r, scope), fair.weight_of(scope))
        })
        .collect();
    let shared = drip_core::fair::shared_weights(&groups);
    let total = shared.iter().sum::<u64>() as f64;
    let mut busiest: Vec<FairKey> = waiting
        .iter()
        .zip(&groups)
        .zip(&shared)
        .map(|(((m, parked), (_, weight)), w)| FairKey {
            rule: m.rule.clone(),
            key: m.key.clone(),
            weight: *weight,
            share: *w as f64 / total,
            parked: *parked,
        })
        .collect();
    busiest.sort_by(|a, b| b.parked.cmp(&a.parked).then_with(|| a.key.cmp(&b.key)));
    busiest.truncate(FAIR_KEYS_SHOWN);
    let weight = groups[mine].1;
    let share = shared[mine] as f64 / total;
    let parked = waiting.iter().find(|(m, _)| me(m)).map_or(0, |(_, n)| *n);
    let expected_wait_ms = (parked > 0).then(|| {
        let each = |l: &drip_core::limit::Limit| {
            let per_window = ((l.limit() as f64 * share).floor() as u64).max(1);
            (parked as Millis * l.per()) / per_window as Millis
        };
        budget.limits.iter().map(each).max().unwrap_or(0)
    });
    Some(FairReport {
        near_horizon_ms: budget.near().unwrap_or(0),
        waiting_keys: waiting.len(),
        busiest,
        weight,
        share,
        expected_wait_ms,
    })
}

/// The key's partition of a leased budget: per limit, what its home leased it and what it booked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseReport {
    pub partitions: u32,
    pub partition: u32,
    /// Per limit of the budget, in its order.
    pub limits: Vec<LeaseUse>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseUse {
    /// The partition's lease of the current window, and what it booked of it.
    pub leased_now: u64,
    pub booked_now: u64,
    /// Its leases of later windows, and what it booked of them.
    pub leased_ahead: u64,
    pub booked_ahead: u64,
    /// The last window the home was full in when the partition last asked.
    pub home_full_through: Option<String>,
    /// What it was leased of passed windows and did not book, so far (counted in Redis as the
    /// pool drops passed windows).
    pub stranded: u64,
    /// What it gave back to the home of its leases of the current window and ahead (events that
    /// left them); `leasedNow`/`leasedAhead` count them still.
    #[serde(default)]
    pub returned: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FloorReport {
    /// The rule (its id) the floor is held for, or a class of a classes calendar.
    pub rule: String,
    /// The key of the rule the floor is held for, when it is one key's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The share of each window held for the rule (or key) until the window starts.
    pub floor: f64,
    /// Per limit of the budget, in its order.
    pub limits: Vec<FloorUse>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FloorUse {
    /// The units of each window held for the rule at the count in force now.
    pub units: u64,
    /// The rule's cost in the current window, and in the windows after it.
    pub used_now: u64,
    pub ahead: u64,
}

/// The latency controller's state of a key or budget (docs/rules.md: "Latency as the leading signal").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LatencyView {
    /// The slow average of the windows' high percentiles (ms).
    pub baseline_ms: f64,
    /// The level when latency last rose past tolerance, and the level right after that cut (none
    /// since the level last reached its ceiling).
    pub level_that_hurt: Option<f64>,
    pub cut_to: Option<f64>,
    /// Busy, healthy windows since that cut.
    pub climbing_for: u64,
    /// When the window of the last judged report began.
    pub last_judged: String,
    /// In shadow mode: the level the controller would have set (the limits do not follow it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_level: Option<f64>,
}

fn latency_view(adaptive: Option<Adaptive>, state: Option<LatencyState>, window: Millis) -> Option<LatencyView> {
    let control = adaptive?.latency?;
    let state = state?;
    let fraction = |ppm: u64| ppm as f64 / PPM as f64;
    Some(LatencyView {
        baseline_ms: state.baseline as f64 / 1_000.0,
        level_that_hurt: (state.hurt > 0).then(|| fraction(state.hurt)),
        cut_to: (state.hurt > 0).then(|| fraction(state.cut)),
        climbing_for: state.grown,
        last_judged: format_rfc3339(state.window * window),
        shadow_level: control.shadow.then(|| fraction(state.level)),
    })
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
    /// Who set it and when, from the rule's audit list when it still holds the change:
    /// `learned from the partner's headers at T`, or `set by NAME at T`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitReport {
    /// e.g. `100 per 1m (fixed)`.
    pub limit: String,
    /// Cost reserved in the current window (fixed: the epoch-aligned one holding now; sliding:
    /// the last `per`; gcra: what the bucket holds now). Exact unless `used_now_at_most` is given:
    /// then it is the least it can be.
    pub used_now: u64,
    /// The count in force now: the rule's, or this entity's override.
    pub capacity: u64,
    /// Cost this limit holds in its windows after now. Exact unless `ahead_at_most` is given: then
    /// it is the least it can be. (The entity's `backlog` is the exact event count.)
    pub ahead: u64,
    /// When `used_now` is an estimate, the most it can be: a fixed limit's state keeps only its
    /// last window, so once that window is ahead the current one's use is not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_now_at_most: Option<u64>,
    /// When `ahead` is an estimate, the most it can be: the events reserved after the current
    /// window times the largest cost an event of a cost template may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ahead_at_most: Option<u64>,
}

impl<C: ConnectionLike + Clone + Send + Sync> crate::redis_store::RedisStore<C> {
    /// What the entity's state says now (Redis `TIME`, or the store's manual clock).
    pub(crate) async fn entity_report(&self, rule: &Rule, key: &str) -> Result<EntityReport, StoreError> {
        let now = self.store_now().await?;
        let state = self.entity_state(RuleRef::of_entity(rule, key), key, &rule.limits).await?;
        let mut budgets = Vec::new();
        if let Some((calendar, scope)) = class_calendar(rule, key) {
            budgets.push((calendar.clone(), self.class_calendar_state(RuleRef::of(rule), scope).await?));
        }
        let mut pools = vec![None; budgets.len()];
        let scope = class_calendar(rule, key).map_or(key, |(_, scope)| scope);
        for budget in &rule.budgets {
            budgets.push((budget.clone(), self.budget_state(budget).await?));
            pools.push(match budget.partition_of(scope) {
                Some(partition) => Some((partition, self.pool_state(budget, partition).await?)),
                None => None,
            });
        }
        let slots = self.reserved_slots(rule, key, (slots_since(rule, now), now)).await?;
        let mut report = report(rule, key, now, &state, &budgets, &pools, &slots);
        if let Some(budget) = rule.fair_budget() {
            let waiting = self.fair_waiting(FairRing::of_key(budget, scope)).await?;
            let shown = report.budgets.iter_mut().find(|b| b.name == budget.name);
            if let Some(shown) = shown {
                shown.fair = fair_report(budget, &waiting, (&rule.id, key), |k| rule.scope_of(k));
            }
        }
        Ok(report)
    }

    /// A fair budget's ring's waiting keys, each with how many of its messages are parked.
    async fn fair_waiting(&self, fair: FairRing<'_>) -> Result<Vec<(Member, u64)>, StoreError> {
        let budget = fair.budget;
        let [ring, _] = crate::keys::fair_keys(self.namespace(), fair);
        let members: Vec<String> =
            redis::cmd("ZRANGE").arg(&ring).arg(0).arg(-1).query_async(&mut self.connection()).await?;
        let members: Vec<Member> = members.iter().filter_map(|m| crate::keys::member_of(m)).collect();
        let mut pipe = redis::pipe();
        for member in &members {
            let rule = RuleRef { id: &member.rule, tag: Some(&budget.tag), leases: budget.leases, classed: false };
            pipe.hget(EntityKeys::of_entity(self.namespace(), rule, &member.key, &[]).state, field::PARKED);
        }
        let parked: Vec<Option<u64>> = pipe.query_async(&mut self.connection()).await?;
        Ok(members.into_iter().zip(parked).map(|(m, n)| (m, n.unwrap_or(0))).collect())
    }

    /// The slots of the entity's reserved events at or after `since` whose answers Redis still
    /// keeps: every event waiting after now (exactly: its answer outlives its slot), in every
    /// publication minute a waiting event can be filed under and the undated ones. A waiting event
    /// was decided within `max_delay` of now and published at most Pub/Sub's longest retention
    /// (31 days) before that. About 45,000 `HVALS` pipelined, most of them of no hash: only
    /// `inspect` does it, never a reservation.
    pub async fn reserved_slots(
        &self,
        rule: &Rule,
        key: &str,
        (since, now): (Millis, Millis),
    ) -> Result<Vec<Millis>, StoreError> {
        let keys = EntityKeys::of_entity(self.namespace(), RuleRef::of_entity(rule, key), key, &[]);
        let first = (now - rule.max_delay - PUBSUB_RETENTION).div_euclid(crate::keys::ANSWER_BUCKET);
        let last = now.div_euclid(crate::keys::ANSWER_BUCKET) + 1;
        let files: Vec<(String, Millis)> =
            std::iter::once(None).chain((first..=last).map(Some)).map(|m| keys.answers_of(m)).collect();
        let mut slots = Vec::new();
        for chunk in files.chunks(500) {
            let mut pipe = redis::pipe();
            for (answers, _) in chunk {
                pipe.cmd("HVALS").arg(answers);
            }
            let values: Vec<Vec<String>> = pipe.query_async(&mut self.connection()).await?;
            for ((_, base), answers) in chunk.iter().zip(values) {
                slots.extend(
                    answers.iter().filter_map(|a| field::reserved_slot(a, *base)).filter(|&slot| slot >= since),
                );
            }
        }
        Ok(slots)
    }

    /// The entity's last slot (its FIFO frontier), if it remembers one.
    pub(crate) async fn entity_frontier(&self, rule: RuleRef<'_>, key: &str) -> Result<Option<Millis>, StoreError> {
        let keys = EntityKeys::of_entity(self.namespace(), rule, key, &[]);
        let (frontier, legacy): (Option<Millis>, Option<Millis>) = redis::cmd("HMGET")
            .arg(&keys.state)
            .arg(field::FRONTIER)
            .arg(field::LEGACY_FRONTIER)
            .query_async(&mut self.connection())
            .await?;
        Ok(frontier.or(legacy))
    }

    /// The entity's state as the reference model holds it (`drip_core::schedule::EntityState`):
    /// the one place that reads reserve.lua's layout back.
    pub async fn entity_state(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        limits: &[Limit],
    ) -> Result<EntityState, StoreError> {
        let keys = EntityKeys::of_entity(self.namespace(), rule, key, limits);
        let mut connection = self.connection();
        let fields: HashMap<String, String> =
            redis::cmd("HGETALL").arg(&keys.state).query_async(&mut connection).await?;
        let charges = fields.get(field::CHARGES).and_then(|held| field::parse_charges(held));
        let fields: HashMap<String, i64> =
            fields.into_iter().filter_map(|(name, value)| Some((name, value.parse().ok()?))).collect();
        let held = |limit: &Limit| field::limit_state(limit).map(|name| fields.get(&name).copied());
        let overrides = self.override_entries(&keys).await?;
        let mut state = EntityState {
            last_slot: fields.get(field::FRONTIER).or(fields.get(field::LEGACY_FRONTIER)).copied(),
            limits: BTreeMap::new(),
            overrides: crate::overrides::parse_overrides(&overrides),
            paused_until: overrides.get(field::PAUSE).and_then(|p| p.parse().ok()),
            adaptive: overrides.get(field::ADAPT).and_then(|a| field::parse_adaptive(a)),
            latency: overrides.get(field::LATENCY).and_then(|l| field::parse_latency(l)),
            parked: fields.get(field::PARKED).map_or(0, |&n| n as u64),
            wake: fields.get(field::WAKE).copied(),
            charges,
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
            set: None,
        })
    });
    each.collect()
}

/// From when `inspect` wants the reserved slots: the start of the current window of the rule's
/// longest limit.
pub(crate) fn slots_since(rule: &Rule, now: Millis) -> Millis {
    rule.limits.iter().map(|l| now.div_euclid(l.per()) * l.per()).min().unwrap_or(now)
}

/// The reserved slots of an entity, and what its events cost: enough to count a window exactly.
struct Slots<'a> {
    slots: &'a [Millis],
    /// Each event's cost: the least and the most it can be (equal for a constant cost).
    cost: (u64, u64),
}

impl Slots<'_> {
    /// The events with a slot in `[from, to)`, and the least and most they cost.
    fn cost_in(&self, from: Millis, to: Millis) -> (u64, u64) {
        let events = self.slots.iter().filter(|&&s| s >= from && s < to).count() as u64;
        (events * self.cost.0, events * self.cost.1)
    }
}

/// Reads use, backlog and drain time off the state and the reserved slots.
/// The calendar a classed rule's entity `<key>#<class>` shares with its key's other classes, and
/// that key.
pub(crate) fn class_calendar<'a>(rule: &'a Rule, key: &'a str) -> Option<(&'a Arc<Budget>, &'a str)> {
    let classes = rule.classes.as_ref()?;
    classes.class_entity(key).map(|(scope, _)| (&classes.calendar, scope))
}

pub(crate) fn report(
    rule: &Rule,
    key: &str,
    now: Millis,
    state: &EntityState,
    budgets_in: &[(Arc<Budget>, BudgetState)],
    pools: &[Option<(u32, BudgetState)>],
    slots: &[Millis],
) -> EntityReport {
    let booked = slots.iter().filter(|&&slot| slot > now).count() as u64;
    let cost = match &rule.cost {
        drip_core::rules::Cost::Fixed(cost) => (*cost, *cost),
        drip_core::rules::Cost::Template(_) => (1, rule.max_cost().max(1)),
    };
    let slots = Slots { slots, cost };
    let mut limits = Vec::new();
    // A class's entity's overrides are its key's, on the calendar its classes share.
    let calendar_overrides =
        class_calendar(rule, key).and_then(|_| budgets_in.first()).map(|(_, held)| &held.overrides);
    let overrides = override_reports(rule, calendar_overrides.unwrap_or(&state.overrides), now);
    // A class's entity has no level of its own: its key's calendar (a budget below) has it.
    let level = rule
        .adaptive
        .filter(|_| class_calendar(rule, key).is_none())
        .map(|a| a.level(state.adaptive, adaptive_window(&rule.limits), now));
    // A class's entity holds none of the rule's limits: the key's calendar (a budget below) does.
    let own = if class_calendar(rule, key).is_some() { &[][..] } else { &rule.limits[..] };
    for limit in own {
        let capacity = adapted_count(limit, effective_limit(limit, &state.overrides, now), level, 1);
        limits.push(limit_report(limit, capacity, state.limits.get(&state_id(limit)), now, &slots));
    }
    let last_slot = state.last_slot;
    let mut budgets: Vec<BudgetReport> =
        budgets_in.iter().map(|(budget, held)| budget_report(budget, held, now)).collect();
    for ((report, pool), (budget, _)) in budgets.iter_mut().zip(pools).zip(budgets_in) {
        report.lease = pool.as_ref().map(|(partition, pool)| lease_report(budget, (*partition, pool), now));
    }
    if let (Some((_, scope)), Some(calendar)) = (class_calendar(rule, key), budgets.first_mut()) {
        calendar.name = format!("classes of {scope}");
        calendar.classes = true;
    }
    let paused_until = state.paused_until.filter(|&until| until > now).map(format_rfc3339);
    // The latest pause holding the key (its own or a budget's).
    let pause_ends = budgets_in
        .iter()
        .filter_map(|(_, held)| held.paused_until)
        .chain(state.paused_until)
        .filter(|&until| until > now)
        .max();
    let waiting = last_slot.filter(|&slot| slot > now && booked > 0);
    let (drains_at, drains_after) = match (waiting, pause_ends) {
        (Some(last), Some(pause)) if pause >= last => (None, Some(format_rfc3339(pause))),
        (waiting, _) => (waiting.map(format_rfc3339), None),
    };
    let mut waiting_on = Vec::new();
    if let Some(until) = &paused_until {
        waiting_on.push(format!("paused until {until}: the partner said to wait, or an operator paused it"));
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
    if state.parked > 0 {
        waiting_on.push(format!(
            "{} parked: the key's drain books them at the rate in force, oldest first",
            drip_core::counted(state.parked, "event")
        ));
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
        parked: state.parked,
        drains_at,
        drains_after,
        limits,
        overrides,
        paused_until,
        adaptive_level: level.map(|level| level as f64 / PPM as f64),
        latency: latency_view(rule.adaptive, state.latency, adaptive_window(&rule.limits)),
        budgets,
        waiting_on,
        classes: Vec::new(),
    }
}

/// One limit's row: exact where the state or the reserved slots say it, else the least and the
/// most it can be.
fn limit_report(
    limit: &Limit,
    capacity: u64,
    state: Option<&LimitState>,
    now: Millis,
    slots: &Slots<'_>,
) -> LimitReport {
    let per = limit.per();
    // A range: exact when both ends agree.
    let row = |used: (u64, u64), ahead: (u64, u64)| LimitReport {
        limit: limit.to_string(),
        used_now: used.0,
        capacity,
        ahead: ahead.0,
        used_now_at_most: (used.1 > used.0).then_some(used.1),
        ahead_at_most: (ahead.1 > ahead.0).then_some(ahead.1),
    };
    match state {
        Some(LimitState::Fixed { window, used }) => {
            let current = now.div_euclid(per) * per;
            if *window == current {
                row((*used, *used), (0, 0))
            } else if *window > current {
                // The state keeps only its last window: count the windows from the slots. Every
                // slot after now is kept (an answer outlives its slot); one earlier in the current
                // window may have expired, so the current window's use is at least what is kept.
                let in_current = slots.cost_in(current, current + per);
                let ahead = slots.cost_in(current + per, Millis::MAX);
                row((in_current.0, in_current.1.max(capacity)), ahead)
            } else {
                row((0, 0), (0, 0))
            }
        }
        Some(LimitState::Sliding { base, entries }) => {
            // Every slot of the last `per` and after is kept: exact.
            let mut previous = *base;
            let (mut used, mut ahead) = (0, 0);
            for &(time, cum) in entries {
                let cost = cum.saturating_sub(previous);
                previous = cum;
                if time > now {
                    ahead += cost;
                } else if time > now - per {
                    used += cost;
                }
            }
            row((used, used), (ahead, ahead))
        }
        Some(LimitState::Gcra { tat, tat_rem }) => {
            let (n, burst) = match limit.window() {
                Window::Gcra { burst } => (capacity as i64, burst as i64),
                _ => (capacity as i64, 1),
            };
            // Units the bucket holds: (TAT - now) / T, T = per / limit (exact); what lies in slots
            // after now is what those events cost.
            let held = ((((tat - now) * n + *tat_rem as i64) / per.max(1)).max(0)).min(n.max(burst)) as u64;
            row((held, held), slots.cost_in(now + 1, Millis::MAX))
        }
        None => row((0, 0), slots.cost_in(now + 1, Millis::MAX)),
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
                    capacity: adapted_count(limit, effective_limit(limit, &state.overrides, now), level, 1),
                    ahead: held(current + per),
                    // A budget's calendar keeps every window: exact.
                    used_now_at_most: None,
                    ahead_at_most: None,
                }
            })
            .collect(),
        max_share: budget.max_share.map(|share| share as f64 / PPM as f64),
        paused_until: state.paused_until.filter(|&until| until > now).map(format_rfc3339),
        adaptive_level: level.map(|level| level as f64 / PPM as f64),
        latency: latency_view(budget.adaptive, state.latency, adaptive_window(&budget.limits)),
        floors: floor_reports(budget, state, level, now),
        classes: false,
        lease: None,
        fair: None,
    }
}

fn lease_report(budget: &Budget, (partition, pool): (u32, &BudgetState), now: Millis) -> LeaseReport {
    let partitions = budget.leases.map_or(0, |l| l.partitions);
    let limits = budget.limits.iter().map(|limit| {
        let per = limit.per();
        let current = now.div_euclid(per) * per;
        let sum = |map: &std::collections::BTreeMap<(Millis, Millis), u64>, from: Millis, to: Millis| -> u64 {
            map.range((per, from)..(per, to)).map(|(_, &n)| n).sum()
        };
        LeaseUse {
            leased_now: sum(&pool.leased, current, current + per),
            booked_now: sum(&pool.windows, current, current + per),
            leased_ahead: sum(&pool.leased, current + per, Millis::MAX),
            booked_ahead: sum(&pool.windows, current + per, Millis::MAX),
            home_full_through: pool.known_full.get(&per).map(|&w| format_rfc3339(w)),
            stranded: pool.stranded.get(&per).copied().unwrap_or(0),
            returned: sum(&pool.returned, current, Millis::MAX),
        }
    });
    LeaseReport { partitions, partition, limits: limits.collect() }
}

fn floor_reports(budget: &Budget, state: &BudgetState, level: Option<u64>, now: Millis) -> Vec<FloorReport> {
    let floors = budget.floors.iter().map(|(member, floor)| {
        let limits = budget.limits.iter().map(|limit| {
            let (per, count) =
                (limit.per(), adapted_count(limit, effective_limit(limit, &state.overrides, now), level, 1));
            let current = now.div_euclid(per) * per;
            let part = |w: Millis| state.floor_used.get(&(per, w, member.clone())).copied().unwrap_or(0);
            let ahead = state.floor_used.range((per, current + per, String::new())..(per, Millis::MAX, String::new()));
            FloorUse {
                units: count * floor / PPM,
                used_now: part(current),
                ahead: ahead.filter(|((_, _, m), _)| m == member).map(|(_, &used)| used).sum(),
            }
        });
        let (rule, key) = member.split_once('|').map_or((member.as_str(), None), |(r, k)| (r, Some(k.to_owned())));
        FloorReport { rule: rule.to_owned(), key, floor: *floor as f64 / PPM as f64, limits: limits.collect() }
    });
    floors.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use drip_core::fair::Fair;
    use drip_core::rules::Placement;

    fn member(key: &str) -> Member {
        Member { rule: "payouts".into(), key: key.into() }
    }

    /// A key's share is its weight over every waiting key's (itself counted), the busiest are
    /// listed most parked first, and the expected wait is its parked events at its share of the
    /// tightest limit, window after window.
    #[test]
    fn a_fair_budget_shows_each_waiting_key_s_weight_share_and_expected_wait() {
        let budget = Budget {
            name: "rail".into(),
            limits: vec![
                Limit::new(40, 1_000, Window::Fixed(Placement::Start)).unwrap(),
                Limit::new(600, 60_000, Window::Fixed(Placement::Start)).unwrap(),
            ],
            max_share: None,
            adaptive: None,
            floors: Vec::new(),
            per_key: false,
            fair: Some(Fair { weights: BTreeMap::from([("big".to_owned(), 3)]) }),
            leases: None,
            tag: "rail".into(),
        };
        let waiting = [(member("small"), 5), (member("big"), 120)];
        let big = fair_report(&budget, &waiting, ("payouts", "big"), |k| k).unwrap();
        assert_eq!((big.waiting_keys, big.weight, big.share), (2, 3, 0.75));
        assert_eq!(
            big.busiest.iter().map(|k| (k.key.as_str(), k.parked)).collect::<Vec<_>>(),
            [("big", 120), ("small", 5)]
        );
        // 30 a second of the 40 (4 s), but 450 a minute of the 600 (16 s): the minute binds.
        assert_eq!(big.expected_wait_ms, Some(16_000));
        let newcomer = fair_report(&budget, &waiting, ("payouts", "new"), |k| k).unwrap();
        assert_eq!((newcomer.share, newcomer.expected_wait_ms), (0.2, None));
        assert_eq!(budget.near(), Some(500));
        // A rule with classes: a key's waiting classes share its weight (3 for big).
        let classed = [(member("big#live"), 4), (member("big#bulk"), 40), (member("small#bulk"), 5)];
        let live = fair_report(&budget, &classed, ("payouts", "big#live"), |k| {
            drip_core::rules::Classes::split(k).map_or(k, |(key, _)| key)
        })
        .unwrap();
        assert_eq!((live.weight, live.share), (3, 0.375), "half of big's 3 of 4");
        let shares: Vec<(&str, f64)> = live.busiest.iter().map(|k| (k.key.as_str(), k.share)).collect();
        assert_eq!(shares, [("big#bulk", 0.375), ("small#bulk", 0.25), ("big#live", 0.375)]);
        let unfair = Budget { fair: None, ..budget };
        assert_eq!(fair_report(&unfair, &waiting, ("payouts", "big"), |k| k), None);
    }
}
