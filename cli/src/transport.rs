//! What `inspect`, `limits` and `feedback` ask of the limiter, over either transport: its API
//! (`--api`), or its Redis and rules file. Both give the same answers, in the API's shapes.

use std::path::Path;

use anyhow::Context;
use drip_core::rules::{Rule, RuleSet};
use drip_core::schedule::{LimitOverride, override_id};
use drip_core::template::cap_key;
use drip_core::time::{Millis, format_rfc3339, wall_clock_millis};
use drip_store::inspect::{EntityReport, KeyOverrides, OverrideReport, override_reports};
use drip_store::{AnyConnection, AuditEntry, Author, OverrideChange, Paused, RedisStore, Resumed, Store};
use reqwest::Method;

use crate::api::{Api, ApiArgs};
use crate::connect::StoreArgs;

/// Where the limiter is: its API, or its Redis and rules file.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub enum Transport {
    Api(Api),
    Redis { store: RedisStore<AnyConnection>, rules: RuleSet, path: std::path::PathBuf },
}

/// A new override of one limit of a rule, for one key.
pub struct SetOverride<'a> {
    /// `COUNT/PERIOD`.
    pub limit: &'a str,
    pub window: Option<&'a str>,
    pub until: Option<Millis>,
    pub forever: bool,
    pub reason: Option<&'a str>,
}

/// Which override to remove, and why.
pub struct DeleteOverride<'a> {
    pub per: &'a str,
    pub window: Option<&'a str>,
    pub reason: Option<&'a str>,
}

impl Target {
    /// The API when `--api` (or DRIP_API) is given, else Redis.
    pub async fn connect(&self) -> anyhow::Result<Transport> {
        if let Some(url) = &self.api.api {
            return Ok(Transport::Api(Api::connect(&self.api, url).await?));
        }
        let path = self.store.rules.clone().context(crate::connect::WHERE)?;
        let rules = RuleSet::load(&path).map_err(|errors| anyhow::anyhow!("{errors}"))?;
        Ok(Transport::Redis { store: self.store.store().await?, rules, path })
    }
}

fn rule<'r>(rules: &'r RuleSet, path: &Path, name: &str) -> anyhow::Result<&'r Rule> {
    rules.rule(name).with_context(|| format!("no rule named '{name}' in {}", path.display()))
}

/// Who is making a change through Redis, for the audit list (through the API, the limiter
/// records the token's account).
fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    format!("{user}@{host} (drip limits)")
}

/// The API's version, the first segment of each path.
const V1: &str = "v1";

impl Transport {
    pub async fn inspect(&self, name: &str, key: &str) -> anyhow::Result<EntityReport> {
        match self {
            Transport::Api(api) => api.get(&[V1, "rules", name, "keys", key], &[]).await,
            Transport::Redis { store, rules, path } => {
                let rule = rule(rules, path, name)?;
                let report = drip_store::inspect_key(store, rule, &cap_key(key.into())).await?;
                Ok(drip_store::with_provenance(store, rule, report).await?)
            }
        }
    }

    pub async fn overrides(&self, name: &str, key: &str) -> anyhow::Result<Vec<OverrideReport>> {
        match self {
            Transport::Api(api) => api.get(&[V1, "rules", name, "keys", key, "limits"], &[]).await,
            Transport::Redis { store, rules, path } => {
                let rule = rule(rules, path, name)?;
                let overrides = store.overrides(rule, &cap_key(key.into())).await?;
                Ok(override_reports(rule, &overrides, wall_clock_millis()))
            }
        }
    }

    pub async fn set_override(&self, name: &str, key: &str, set: &SetOverride<'_>) -> anyhow::Result<OverrideChange> {
        match self {
            Transport::Api(api) => {
                let body = serde_json::json!({
                    "limit": set.limit,
                    "window": set.window,
                    "until": set.until.map(format_rfc3339),
                    "forever": set.forever,
                    "reason": set.reason,
                });
                api.call(Method::PUT, &[V1, "rules", name, "keys", key, "limits"], &[], Some(body)).await
            }
            Transport::Redis { store, rules, path } => {
                let rule = rule(rules, path, name)?;
                let (limit, count) = rule.override_target(set.limit, set.window).map_err(anyhow::Error::msg)?;
                let key = cap_key(key.into());
                let current = store.overrides(rule, &key).await?.get(&override_id(limit)).copied();
                let now = wall_clock_millis();
                let new = LimitOverride::replacing(current, count, (set.until, set.forever), now)
                    .map_err(|e| anyhow::anyhow!("--expires: {e}"))?;
                let author = Author { by: &operator(), reason: set.reason };
                Ok(store.change_override(rule, &key, limit, Some(new), author).await?)
            }
        }
    }

    pub async fn delete_override(
        &self,
        name: &str,
        key: &str,
        which: &DeleteOverride<'_>,
    ) -> anyhow::Result<OverrideChange> {
        match self {
            Transport::Api(api) => {
                let mut query = vec![("per", which.per.to_owned())];
                query.extend(which.window.map(|w| ("window", w.to_owned())));
                query.extend(which.reason.map(|r| ("reason", r.to_owned())));
                api.call(Method::DELETE, &[V1, "rules", name, "keys", key, "limits"], &query, None).await
            }
            Transport::Redis { store, rules, path } => {
                let rule = rule(rules, path, name)?;
                let (limit, _) =
                    rule.override_target(&format!("1/{}", which.per), which.window).map_err(anyhow::Error::msg)?;
                let author = Author { by: &operator(), reason: which.reason };
                Ok(store.change_override(rule, &cap_key(key.into()), limit, None, author).await?)
            }
        }
    }

    pub async fn list_overrides(&self, name: &str) -> anyhow::Result<Vec<KeyOverrides>> {
        match self {
            Transport::Api(api) => api.get(&[V1, "rules", name, "limits"], &[]).await,
            Transport::Redis { store, rules, path } => {
                let rule = rule(rules, path, name)?;
                let now = wall_clock_millis();
                let all = store.list_overrides(rule).await?;
                Ok(all
                    .into_iter()
                    .map(|(key, o)| KeyOverrides { overrides: override_reports(rule, &o, now), key })
                    .collect())
            }
        }
    }

    pub async fn history(&self, name: &str, count: usize) -> anyhow::Result<Vec<AuditEntry>> {
        match self {
            Transport::Api(api) => api.get(&[V1, "rules", name, "history"], &[("count", count.to_string())]).await,
            Transport::Redis { store, rules, path } => {
                let rule = rule(rules, path, name)?;
                Ok(store.audit_history(rule, count).await?)
            }
        }
    }

    /// Lifts the pause of `key`, or of `budget` when given (`DELETE .../pause`).
    pub async fn resume(
        &self,
        (name, key, budget): (&str, &str, Option<&str>),
        reason: Option<&str>,
    ) -> anyhow::Result<Resumed> {
        match self {
            Transport::Api(api) => {
                let query: Vec<_> = reason.map(|r| ("reason", r.to_owned())).into_iter().collect();
                api.call(Method::DELETE, &pause_path(name, key, budget), &query, None).await
            }
            Transport::Redis { store, rules, path } => {
                let (rule, key, budget) = pause_target(rules, path, (name, key, budget))?;
                let author = Author { by: &operator(), reason };
                Ok(drip_store::resume(store, rule, &key, budget, author).await?)
            }
        }
    }

    /// Pauses `key`, or `budget` when given, for `length` from now (`PUT .../pause`).
    pub async fn pause(
        &self,
        (name, key, budget): (&str, &str, Option<&str>),
        length: &str,
        reason: Option<&str>,
    ) -> anyhow::Result<Paused> {
        match self {
            Transport::Api(api) => {
                let body = serde_json::json!({ "for": length, "reason": reason });
                api.call(Method::PUT, &pause_path(name, key, budget), &[], Some(body)).await
            }
            Transport::Redis { store, rules, path } => {
                let (rule, key, budget) = pause_target(rules, path, (name, key, budget))?;
                let length = match drip_core::time::parse_duration(length) {
                    Ok(length) if length > 0 && length <= drip_store::MAX_OPERATOR_PAUSE => length,
                    Ok(_) => anyhow::bail!("--for: a pause lasts more than 0 s and at most 7d"),
                    Err(message) => anyhow::bail!("--for: {message}"),
                };
                let author = Author { by: &operator(), reason };
                Ok(drip_store::pause(store, (rule, &key, budget), length, author).await?)
            }
        }
    }
}

fn pause_path<'a>(name: &'a str, key: &'a str, budget: Option<&'a str>) -> [&'a str; 6] {
    match budget {
        Some(budget) => [V1, "rules", name, "budgets", budget, "pause"],
        None => [V1, "rules", name, "keys", key, "pause"],
    }
}

/// The rule, the key (capped; empty for a budget) and the budget a pause or resume names.
fn pause_target<'r>(
    rules: &'r RuleSet,
    path: &Path,
    (name, key, budget): (&str, &str, Option<&str>),
) -> anyhow::Result<(&'r Rule, String, Option<&'r drip_core::budgets::Budget>)> {
    let rule = rule(rules, path, name)?;
    let budget = match budget {
        None => None,
        Some(budget) => Some(
            rule.budget(budget)
                .with_context(|| format!("rule '{name}' draws from no budget '{budget}' in {}", path.display()))?,
        ),
    };
    let key = if budget.is_some() { String::new() } else { cap_key(key.into()) };
    Ok((rule, key, budget))
}
