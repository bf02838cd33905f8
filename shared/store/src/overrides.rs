//! Per-entity limit overrides (`drip limits set`, `PUT /v1/rules/{rule}/keys/{key}/limits`) and
//! pauses (a downstream's Retry-After, `POST /v1/feedback`): kept in one field of the entity's state
//! hash (`field::OVERRIDES`, read by reserve.lua's one HMGET of the state), each override change
//! recorded in an audit list of the rule.

use std::collections::BTreeMap;

use drip_core::budgets::{
    Adaptive, LatencyChange, LatencyReport, LatencyVerdict, adaptive_window, adaptive_window_count,
};
use drip_core::rules::Limit;
use drip_core::schedule::{LimitOverride, override_id};
use drip_core::time::Millis;
use redis::AsyncCommands;
use redis::aio::ConnectionLike;
use serde::Serialize;

use crate::keys::{class_calendar_key, field, overridden_keys, overrides_log};
use crate::scripts::OVERRIDE;
use crate::{keys::EntityKeys, keys::RuleRef, redis_store::RedisStore, request::StoreError};

/// How many changes each rule's audit list keeps.
const AUDIT_LENGTH: isize = 1_000;

/// One change of an override, as the audit list keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct OverrideChange {
    #[serde(with = "drip_core::time::rfc3339")]
    pub at: Millis,
    /// Who made it: the caller's verified email (API) or the operator's user name (CLI).
    pub by: String,
    pub rule: String,
    pub key: String,
    /// The limit, as the rule names it (`100 per 1m (fixed)`).
    pub limit: String,
    pub before: Option<OverrideView>,
    pub after: Option<OverrideView>,
    /// Why, as its author said (`drip limits --reason`, the API's `reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Who changes an override, and why (for the audit list).
#[derive(Debug, Clone, Copy)]
pub struct Author<'a> {
    pub by: &'a str,
    pub reason: Option<&'a str>,
}

impl<'a> From<&'a str> for Author<'a> {
    fn from(by: &'a str) -> Self {
        Self { by, reason: None }
    }
}

impl OverrideChange {
    pub fn new(
        at: Millis,
        author: Author<'_>,
        (rule, key, limit): (&str, &str, &Limit),
        before: Option<LimitOverride>,
        after: Option<LimitOverride>,
    ) -> Self {
        Self {
            at,
            by: author.by.to_owned(),
            reason: author.reason.map(str::to_owned),
            rule: rule.to_owned(),
            key: key.to_owned(),
            limit: limit.to_string(),
            before: before.map(Into::into),
            after: after.map(Into::into),
        }
    }
}

/// One `/v1/feedback` call, as the rule's audit list keeps it beside the override changes: who
/// paused or lowered what, from what to what.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct FeedbackChange {
    #[serde(with = "drip_core::time::rfc3339")]
    pub at: Millis,
    /// The caller's verified email (or `anonymous` without OIDC).
    pub by: String,
    pub rule: String,
    /// The key it named (empty for a budget).
    pub key: String,
    /// What it changed: `key` or `budget:<name>`.
    pub target: String,
    /// The downstream's answer it reported (0: a timeout) and its Retry-After, in seconds.
    pub status: u16,
    pub retry_after: Option<u64>,
    #[serde(default, with = "drip_core::time::rfc3339::option")]
    pub paused_before: Option<Millis>,
    #[serde(default, with = "drip_core::time::rfc3339::option")]
    pub paused_after: Option<Millis>,
    /// The target's adaptive level after it, when it has one.
    pub adaptive_level: Option<f64>,
}

/// A lifted pause (`drip resume`, `DELETE .../pause`), as the rule's audit list keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ResumeChange {
    #[serde(with = "drip_core::time::rfc3339")]
    pub at: Millis,
    /// The caller's verified email (API) or the operator's user name (CLI).
    pub by: String,
    pub rule: String,
    /// The key it named (empty for a budget).
    pub key: String,
    /// What it resumed: `key` or `budget:<name>`.
    pub target: String,
    /// When the lifted pause would have ended (none: there was no pause to lift).
    #[serde(default, with = "drip_core::time::rfc3339::option")]
    pub resumed_pause: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A pause an operator set (`drip pause`, `PUT .../pause`, the console), as the rule's audit list
/// keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PauseChange {
    #[serde(with = "drip_core::time::rfc3339")]
    pub at: Millis,
    pub by: String,
    pub rule: String,
    /// The key it named (empty for a budget).
    pub key: String,
    /// What it paused: `key` or `budget:<name>`.
    pub target: String,
    /// No slot of it before this.
    #[serde(with = "drip_core::time::rfc3339")]
    pub paused_until: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A cost reported after the call through `POST /v1/feedback`, as the rule's audit list keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct CostChange {
    #[serde(with = "drip_core::time::rfc3339")]
    pub at: Millis,
    pub by: String,
    pub rule: String,
    pub key: String,
    /// The message's `drip-message-id`.
    pub message_id: String,
    /// What it booked, when a reservation of it was known.
    pub booked: Option<u64>,
    pub actual: u64,
    /// `applied`, `already` (a retried report: nothing changed) or `unknown`.
    pub outcome: String,
}

/// An entry of a rule's audit list.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum AuditEntry {
    Override(OverrideChange),
    Feedback(FeedbackChange),
    // Before `Resume`: a pause's entry has every field a resume's has, and `paused_until` too.
    Pause(PauseChange),
    Resume(ResumeChange),
    Cost(CostChange),
}

impl AuditEntry {
    /// The rule it changed (its id).
    pub fn rule(&self) -> &str {
        match self {
            AuditEntry::Override(change) => &change.rule,
            AuditEntry::Feedback(call) => &call.rule,
            AuditEntry::Pause(pause) => &pause.rule,
            AuditEntry::Resume(resume) => &resume.rule,
            AuditEntry::Cost(cost) => &cost.rule,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct OverrideView {
    pub limit: u64,
    #[serde(default, with = "drip_core::time::rfc3339::option")]
    pub until: Option<Millis>,
}

impl From<LimitOverride> for OverrideView {
    fn from(o: LimitOverride) -> Self {
        Self { limit: o.limit, until: o.until }
    }
}

/// Reads an overrides hash as the model holds it.
pub(crate) fn parse_overrides(fields: &BTreeMap<String, String>) -> BTreeMap<String, LimitOverride> {
    fields
        .iter()
        .filter(|(name, _)| {
            !name.ends_with(":u") && ![field::PAUSE, field::ADAPT, field::LATENCY].contains(&name.as_str())
        })
        .filter_map(|(id, limit)| {
            let until = fields.get(&format!("{id}:u")).and_then(|u| u.parse().ok());
            Some((id.clone(), LimitOverride { limit: limit.parse().ok()?, until }))
        })
        .collect()
}

/// An adaptive limit's parameters as override.lua's and budget.lua's 'adapt' read them.
pub(crate) fn adapt_args(adaptive: &Adaptive, limits: &[Limit]) -> [String; 5] {
    [adaptive.ceiling(), adaptive.decrease, adaptive.min, adaptive.step, adaptive_window(limits) as u64]
        .map(|n| n.to_string())
}

/// A latency report as override.lua's and budget.lua's 'latency' read it (latency.lua's
/// `parse_latency_args`); `None` when the adaptive limit does not follow latency.
pub(crate) fn latency_args(adaptive: &Adaptive, limits: &[Limit], report: LatencyReport) -> Option<String> {
    let control = adaptive.latency?;
    let mut parts: Vec<String> = adapt_args(adaptive, limits).into();
    parts.extend(
        [control.tolerance, control.smoothing, control.baseline, control.recover, u64::from(control.shadow)]
            .into_iter()
            .chain([adaptive_window_count(limits), report.percentile, report.calls])
            .map(|n| n.to_string()),
    );
    Some(parts.join(":"))
}

/// What a latency report did, from the scripts' reply `{verdict, before, after, gradient}`.
pub(crate) fn latency_change(reply: &[i64]) -> Result<LatencyChange, StoreError> {
    let &[verdict, before, after, gradient] = reply else {
        return Err(StoreError::UnexpectedReply(format!("{reply:?}")));
    };
    let verdict = match verdict {
        0 => LatencyVerdict::Repeat,
        1 => LatencyVerdict::Slow { gradient: gradient as u64 },
        2 => LatencyVerdict::Grew,
        3 => LatencyVerdict::Held,
        4 => LatencyVerdict::Lagging { gradient: gradient as u64 },
        _ => return Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
    };
    Ok(LatencyChange { verdict, before: before as u64, after: after as u64 })
}

// The Store trait's override, pause, signal and audit operations on Redis (redis_store.rs) are
// built from these: override.lua on one entity, at the store's clock, and the rule's audit list.
impl<C: ConnectionLike + Clone + Send + Sync> RedisStore<C> {
    fn override_keys(&self, rule: RuleRef<'_>, key: &str) -> EntityKeys {
        EntityKeys::of_entity(self.namespace(), rule, key, &[])
    }

    /// Where `key`'s limit overrides live: its state hash, or for a rule with classes the calendar
    /// its classes share (`key` or any `<key>#<class>`: an override is the whole key's). A
    /// calendar has no legacy hash: an `:o` beside it that nothing writes stands in.
    fn limit_override_keys(&self, rule: RuleRef<'_>, key: &str) -> EntityKeys {
        let keys = self.override_keys(rule, key);
        if !rule.classed {
            return keys;
        }
        let state = class_calendar_key(self.namespace(), rule, rule.scope(key));
        EntityKeys { legacy_overrides: format!("{state}:o"), state, ..keys }
    }

    /// Sets (`Some`) or deletes (`None`) the entity's override of `limit` from the next
    /// reservation on, and records the change.
    pub(crate) async fn write_override(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        limit: &Limit,
        set: Option<LimitOverride>,
        by: Author<'_>,
    ) -> Result<OverrideChange, StoreError> {
        let key = rule.scope(key);
        let index = overridden_keys(self.namespace(), rule.id);
        let before = match set {
            Some(set) => {
                let until = set.until.map(|u| u.to_string()).unwrap_or_default();
                let before = self.override_op(rule, key, limit, ("set", set.limit.to_string(), until)).await?;
                let _: () = self.connection().sadd(&index, key).await?;
                before
            }
            None => {
                let before = self.override_op(rule, key, limit, ("delete", String::new(), String::new())).await?;
                if self.entity_overrides(rule, key).await?.is_empty() {
                    let _: () = self.connection().srem(&index, key).await?;
                }
                before
            }
        };
        self.record(rule.id, key, limit, before, set, by).await
    }

    async fn override_op(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        limit: &Limit,
        (op, count, until): (&str, String, String),
    ) -> Result<Option<LimitOverride>, StoreError> {
        let keys = self.limit_override_keys(rule, key);
        let previous = self.run_override_on(&keys, [op, &override_id(limit), &count, &until]).await?;
        Ok(match previous.as_slice() {
            [limit, until] => Some(LimitOverride { limit: *limit as u64, until: (*until >= 0).then_some(*until) }),
            _ => None,
        })
    }

    /// One override.lua operation (`op`, the override id, the value, until) on the entity, at the
    /// store's clock.
    pub(crate) async fn run_override(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        operation: [&str; 4],
    ) -> Result<Vec<i64>, StoreError> {
        self.run_override_on(&self.override_keys(rule, key), operation).await
    }

    async fn run_override_on(&self, keys: &EntityKeys, operation: [&str; 4]) -> Result<Vec<i64>, StoreError> {
        let mut invocation = OVERRIDE.call();
        invocation.key(&keys.state).key(&keys.legacy_overrides).arg(self.clock_arg());
        for arg in operation {
            invocation.arg(arg);
        }
        Ok(invocation.invoke_async(&mut self.connection()).await?)
    }

    async fn record(
        &self,
        rule: &str,
        key: &str,
        limit: &Limit,
        before: Option<LimitOverride>,
        after: Option<LimitOverride>,
        by: Author<'_>,
    ) -> Result<OverrideChange, StoreError> {
        let change = OverrideChange::new(self.store_now().await?, by, (rule, key, limit), before, after);
        self.audit(rule, &AuditEntry::Override(change.clone())).await?;
        Ok(change)
    }

    /// Keeps an entry in its rule's audit list.
    pub(crate) async fn audit(&self, rule: &str, entry: &AuditEntry) -> Result<(), StoreError> {
        let log = overrides_log(self.namespace(), rule);
        let entry = serde_json::to_string(entry).map_err(|e| StoreError::UnexpectedReply(e.to_string()))?;
        let mut pipe = redis::pipe();
        pipe.lpush(&log, entry).ignore().ltrim(&log, 0, AUDIT_LENGTH - 1).ignore();
        let _: () = pipe.query_async(&mut self.connection()).await?;
        Ok(())
    }

    /// A 429, 5xx or timeout from the entity's downstream, for a rule with an adaptive limit
    /// (`adaptive`, over the rule's `limits`): its level drops (once per window); returns it (ppm).
    pub(crate) async fn signal_entity(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        (adaptive, limits): (&Adaptive, &[Limit]),
    ) -> Result<u64, StoreError> {
        let parameters = adapt_args(adaptive, limits).join(":");
        let level = self.run_override(rule, key, [field::ADAPT, "", &parameters, ""]).await?;
        level.first().map(|&l| l as u64).ok_or_else(|| StoreError::UnexpectedReply(format!("{level:?}")))
    }

    /// A window's latency of the entity's downstream (see `Adaptive::after_latency`); `None` when
    /// its adaptive limit does not follow latency.
    pub(crate) async fn entity_latency(
        &self,
        rule: RuleRef<'_>,
        key: &str,
        (adaptive, limits): (&Adaptive, &[Limit]),
        report: LatencyReport,
    ) -> Result<Option<LatencyChange>, StoreError> {
        let Some(parameters) = latency_args(adaptive, limits, report) else { return Ok(None) };
        let reply = self.run_override(rule, key, ["latency", "", &parameters, ""]).await?;
        latency_change(&reply).map(Some)
    }

    /// The entity's overrides by override id (those whose `until` has passed included, until the
    /// hash expires).
    pub(crate) async fn entity_overrides(
        &self,
        rule: RuleRef<'_>,
        key: &str,
    ) -> Result<BTreeMap<String, LimitOverride>, StoreError> {
        Ok(parse_overrides(&self.override_entries(&self.limit_override_keys(rule, key)).await?))
    }

    /// The entries of the entity's overrides field, with what an earlier version left in a hash
    /// of its own that no script has folded in yet.
    pub(crate) async fn override_entries(&self, keys: &EntityKeys) -> Result<BTreeMap<String, String>, StoreError> {
        Ok(self.override_entries_with(keys, |_| {}).await?.0)
    }

    /// The same, in one round trip with the commands `more` adds; their replies follow.
    pub(crate) async fn override_entries_with(
        &self,
        keys: &EntityKeys,
        more: impl FnOnce(&mut redis::Pipeline),
    ) -> Result<(BTreeMap<String, String>, Vec<redis::Value>), StoreError> {
        let mut pipe = redis::pipe();
        pipe.hget(&keys.state, field::OVERRIDES).hgetall(&keys.legacy_overrides);
        more(&mut pipe);
        let mut replies: Vec<redis::Value> = pipe.query_async(&mut self.connection()).await?;
        let rest = replies.split_off(replies.len().min(2));
        let unexpected = |e: redis::ParsingError| StoreError::UnexpectedReply(e.to_string());
        let mut replies = replies.into_iter();
        let blob: Option<String> =
            replies.next().map(redis::from_redis_value).transpose().map_err(unexpected)?.flatten();
        let mut entries: BTreeMap<String, String> =
            replies.next().map(redis::from_redis_value).transpose().map_err(unexpected)?.unwrap_or_default();
        entries.extend(field::parse_overrides_field(blob.as_deref().unwrap_or_default()));
        Ok((entries, rest))
    }

    /// Every entity of the rule with overrides, and its overrides.
    pub(crate) async fn rule_overrides(
        &self,
        rule: RuleRef<'_>,
    ) -> Result<BTreeMap<String, BTreeMap<String, LimitOverride>>, StoreError> {
        let index = overridden_keys(self.namespace(), rule.id);
        let mut keys: Vec<String> = self.connection().smembers(&index).await?;
        keys.sort();
        let mut all = BTreeMap::new();
        for key in keys {
            let overrides = self.entity_overrides(rule, &key).await?;
            if overrides.is_empty() {
                // Expired with its hash: drop it from the index too.
                let _: () = self.connection().srem(&index, &key).await?;
            } else {
                all.insert(key, overrides);
            }
        }
        Ok(all)
    }

    /// The rule's most recent override changes and feedback calls, newest first.
    pub(crate) async fn audit_entries(&self, rule: &str, count: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let entries: Vec<String> =
            self.connection().lrange(overrides_log(self.namespace(), rule), 0, count as isize - 1).await?;
        Ok(entries.iter().filter_map(|entry| serde_json::from_str(entry).ok()).collect())
    }
}
