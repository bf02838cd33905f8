//! The rules file as YAML has it, before validation: serde shapes, and the JSON Schema made from them.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::Value;

/// A Drip rules file (YAML or JSON): its rules, the shared budgets they draw from, and where
/// dead letters go by default. `drip schema rules` prints this schema; `drip check-config` checks
/// what a schema cannot (templates, topic names, one limit per period and kind, budgets named).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Drip rules file")]
pub(super) struct RawTop {
    /// The rules, tried in order: the first whose `match` fits an event schedules it.
    #[schemars(with = "Vec<RawRule>")]
    pub(super) rules: Vec<Value>,
    /// Where dead letters go when their rule names no `dlq_topic` (and for events no rule matched).
    pub(super) default_dlq_topic: Option<String>,
    /// Budgets several rules draw from, by name: limits shared by every key of those rules.
    #[schemars(with = "Option<BTreeMap<String, RawBudget>>")]
    pub(super) budgets: Option<BTreeMap<String, Value>>,
}

/// A budget: its limits, or `{ limits, max_share, adaptive }`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub(super) enum RawBudget {
    Limits(Vec<RawLimit>),
    Full(RawBudgetFields),
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudgetFields {
    pub(super) limits: Vec<RawLimit>,
    /// The largest share of each window one key may take (e.g. 0.2).
    pub(super) max_share: Option<f64>,
    pub(super) adaptive: Option<RawAdaptive>,
}

/// AIMD: a 429, 5xx or timeout from the downstream lowers the counts to a level, which climbs
/// back while answers are good.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdaptive {
    /// Headroom: the level never rises above `1 - margin` (default 0.1).
    pub(super) margin: Option<f64>,
    /// What a bad answer multiplies the level by (default 0.9).
    pub(super) decrease: Option<f64>,
    /// The lowest level (default 0.2).
    pub(super) min: Option<f64>,
    /// What each whole window without a bad answer adds back to the level (default 0.1).
    pub(super) step: Option<f64>,
}

/// One rule: which events it takes, how it keys them, the limits of each key, and where events go.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    /// Unique; used in metrics, logs and `drip inspect`.
    pub(super) name: String,
    /// What state, tasks and overrides hang on (default: the name): keep it to rename a rule.
    pub(super) id: Option<String>,
    /// The events it takes: all of these attributes equal (no match: every event).
    #[serde(rename = "match")]
    pub(super) matcher: Option<RawMatch>,
    /// The key template, e.g. `merchant_{data.merchant_id}` or `{attributes.tenant}`.
    pub(super) key: String,
    /// The key template before an edit: each event's old key's frontier carries over.
    pub(super) previous_key: Option<String>,
    /// Every limit a key must keep, all at once (one per period and kind).
    pub(super) limits: Vec<RawLimit>,
    /// What one event costs against each limit: an integer, or a template such as `{data.parts}`.
    #[schemars(with = "Option<serde_json::Value>")]
    pub(super) cost: Option<Value>,
    /// The longest an event may wait for its slot (e.g. `2h`, at most `30d`); later: dead-lettered.
    pub(super) max_delay: String,
    /// The longest one downstream answer may pause a key (default: half of `max_delay`).
    pub(super) max_pause: Option<String>,
    /// A slot this close is waited for in-process instead of through a task (default `1s`, at most `10s`).
    pub(super) inline_wait: Option<String>,
    /// Where an event goes at its slot when it is now.
    pub(super) forward: RawForward,
    /// Where delayed events are published when their slot comes.
    pub(super) overflow_topic: String,
    /// Delayed events are POSTed to a URL (instead of published).
    pub(super) overflow: Option<RawOverflow>,
    /// Where this rule's dead letters go (default: `default_dlq_topic`).
    pub(super) dlq_topic: Option<String>,
    /// What an event without the key's fields does: `dlq` (default) or `{ fallback_key: KEY }`.
    #[schemars(with = "Option<serde_json::Value>")]
    pub(super) on_missing_key: Option<Value>,
    /// `original` (the data as it came) or `enriched` (the overflow body with Drip's metadata).
    pub(super) overflow_format: Option<String>,
    /// `enforce` (default) or `shadow` (decide and record, but forward at once).
    pub(super) mode: Option<String>,
    /// The shared budgets (by name) its events also draw from.
    pub(super) budgets: Option<Vec<String>>,
    /// Where a downstream's 429s and `Retry-After` go: `key` (default) or one of its budgets.
    pub(super) feedback: Option<String>,
    pub(super) adaptive: Option<RawAdaptive>,
    /// The limits hold at every delivery up to this late (e.g. `100ms`): slots leave room for it.
    pub(super) delivery_margin: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    pub(super) attributes: BTreeMap<String, String>,
}

/// At most `limit` cost per `per`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub(super) limit: i64,
    /// A duration: `1s`, `1m`, `1h`, `1d` or any such period.
    pub(super) per: String,
    /// `fixed` (default, epoch-aligned windows), `sliding` or `gcra`.
    pub(super) window: Option<String>,
    /// GCRA only: how many may go at once.
    pub(super) burst: Option<i64>,
    /// Fixed windows only: `start` (default, from the window's start) or `spread` (evenly across it).
    pub(super) placement: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverflow {
    pub(super) url: String,
}

/// Exactly one of `topic` and `url`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawForward {
    pub(super) topic: Option<String>,
    pub(super) url: Option<String>,
}

/// The JSON Schema of the rules file (`drip schema rules`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RawTop)).unwrap_or_default()
}

/// Deserializes with the path of the offending field, e.g. `limits[1].limit`.
pub(super) fn deserialize<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let message = e.into_inner().to_string().replace("expected i64", "expected an integer");
        // serde names a missing field in its message, at the path of the struct that lacks it.
        match message.strip_prefix("missing field `").and_then(|rest| rest.strip_suffix('`')) {
            Some(missing) if path.is_empty() => (missing.to_owned(), "is required".to_owned()),
            Some(missing) => (format!("{path}.{missing}"), "is required".to_owned()),
            None => (path, message),
        }
    })
}
