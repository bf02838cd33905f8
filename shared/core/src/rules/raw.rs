//! The rules file as YAML has it, before validation: serde shapes, and the JSON Schema made from them.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml_ng::Value;

/// What `parse_duration` accepts: whole numbers of `ms`, `s`, `m`, `h` or `d`, summed (`1h30m`).
/// Months, weeks, years and fractions are refused by both.
const DURATION: &str = r"^\s*([0-9]+\s*(ms|s|m|h|d)\s*)+$";
/// A duration, or `off`.
const DURATION_OR_OFF: &str = r"^\s*(off|([0-9]+\s*(ms|s|m|h|d)\s*)+)$";

/// A key or cost template: text with `{data.<path>}` or `{attributes.<name>}` placeholders.
const TEMPLATE: &str = r"^([^{}]|\{(data(\.[^{}.]+)+|attributes\.[^{}]+)\})+$";
/// A rule's name or id.
const NAME: &str = r"^[A-Za-z0-9_-]{1,64}$";
/// A Pub/Sub topic id, or a full name `projects/<project>/topics/<id>` (an id starting with
/// `goog` is refused by the loader alone).
const TOPIC: &str = r"^(projects/[^/]+/topics/)?[A-Za-z][A-Za-z0-9._~+%-]{2,254}$";
/// An http(s) URL.
const URL: &str = r"^https?://[^/]";

/// `cost`: a whole number of at least 1, or a template.
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum CostShape {
    Count(#[schemars(range(min = 1))] u64),
    Template(#[schemars(regex(pattern = TEMPLATE))] String),
}

/// `on_missing_key`: `dlq`, or `{ fallback_key: KEY }`.
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum OnMissingKeyShape {
    Dlq(DlqWord),
    Fallback(FallbackKey),
}

#[derive(schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum DlqWord {
    Dlq,
}

#[derive(schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct FallbackKey {
    #[schemars(length(min = 1))]
    fallback_key: String,
}

/// `window` of a limit.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum WindowName {
    Fixed,
    Sliding,
    Gcra,
}

/// `placement` of a fixed limit.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum PlacementName {
    Start,
    Spread,
}

/// `mode` of a rule.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum ModeName {
    Enforce,
    Shadow,
}

/// `late_events` of a rule.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum LateEventsName {
    Wait,
    Deliver,
}

/// `overflow_format` of a rule.
#[derive(schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum OverflowFormatName {
    Original,
    Enriched,
}

/// A Drip rules file (YAML or JSON): its rules, the shared budgets they draw from, and where
/// dead letters go by default. `drip schema rules` prints this schema; `drip check-config` checks
/// what a schema cannot (templates, topic names, one limit per period and kind, budgets named).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Drip rules file")]
pub(super) struct RawTop {
    /// The rules, tried in order: the first whose `match` fits an event schedules it.
    #[schemars(with = "Vec<RawRule>", length(min = 1))]
    pub(super) rules: Vec<Value>,
    /// Where dead letters go when their rule names no `dlq_topic` (and for events no rule matched).
    #[schemars(regex(pattern = TOPIC))]
    pub(super) default_dlq_topic: Option<String>,
    /// Budgets several rules draw from, by name: limits shared by every key of those rules.
    #[schemars(with = "Option<BTreeMap<String, RawBudget>>")]
    pub(super) budgets: Option<BTreeMap<String, Value>>,
}

// The schema's shape only, never built: the loader reads each form as itself (validate.rs's
// `validate_budgets`), so that an error names its field.
/// A budget: its limits, or `{ limits, max_share, adaptive, floors, leases, fair, weights }`.
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum RawBudget {
    Limits(Vec<RawLimit>),
    Full(Box<RawBudgetFields>),
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudgetFields {
    #[schemars(length(min = 1))]
    pub(super) limits: Vec<RawLimit>,
    /// The largest share of each window one key may take (e.g. 0.2): above 0, at most 1.
    #[schemars(range(min = 0.000001, max = 1))]
    pub(super) max_share: Option<f64>,
    pub(super) adaptive: Option<RawAdaptive>,
    /// By rule name: the share of each window that rule can always book while it has demand
    /// (e.g. 0.1), or by key of that rule (`{ merchant_7: 0.05 }`: each named key its own floor);
    /// each above 0, together at most 1. What no floor holds is anyone's.
    pub(super) floors: Option<BTreeMap<String, RawFloor>>,
    /// Spread the keys of the rules drawing from it over partitions (Redis Cluster hash tags), each
    /// booking against capacity its home leases it: a budget past one shard.
    pub(super) leases: Option<RawLeases>,
    /// While the budget binds, share each window among the keys with events waiting, in
    /// proportion to their weights, instead of first come, first served (docs/rules.md, "Fair
    /// budgets"). Every rule drawing from it parks (its `park_horizon` cannot be off).
    pub(super) fair: Option<bool>,
    /// With `fair: true`, by key: its weight, a whole number from 1 to 1000 (default 1). A key of
    /// weight 3 gets three units of a window for each unit a key of weight 1 gets, while both wait.
    #[schemars(extend("additionalProperties" = { "type": "integer", "minimum": 1, "maximum": 1000 }))]
    pub(super) weights: Option<BTreeMap<String, u64>>,
}

/// A budget's floor for one rule: a share of each window for the rule, or one for each named key of
/// the rule.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(
    untagged,
    expecting = "expected a share of each window (above 0, at most 1), or a map of the rule's keys to their shares"
)]
pub(super) enum RawFloor {
    #[schemars(extend("exclusiveMinimum" = 0, "maximum" = 1))]
    Rule(f64),
    #[schemars(extend("additionalProperties" = { "type": "number", "exclusiveMinimum": 0, "maximum": 1 }, "minProperties" = 1))]
    Keys(BTreeMap<String, f64>),
}

/// `leases: { partitions, chunk }`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLeases {
    /// How many partitions the keys spread over (at least 2; about the cluster's shard count).
    #[schemars(range(min = 2, max = 1024))]
    pub(super) partitions: u32,
    /// How much of a window a partition leases at once (e.g. 0.01): the most it can leave unused in
    /// a window. Default: 0.05 ÷ partitions.
    #[schemars(range(min = 0.000001, max = 1))]
    pub(super) chunk: Option<f64>,
}

/// AIMD: a 429, 5xx or timeout from the downstream lowers the counts to a level, which climbs
/// back while answers are good.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdaptive {
    /// Headroom: the level never rises above `1 - margin` (default 0.1; from 0, below 1).
    #[schemars(range(min = 0, max = 0.999999))]
    pub(super) margin: Option<f64>,
    /// What a bad answer multiplies the level by (default 0.9; above 0, below 1).
    #[schemars(range(min = 0.000001, max = 0.999999))]
    pub(super) decrease: Option<f64>,
    /// The lowest level (default 0.2; above 0, at most 1).
    #[schemars(range(min = 0.000001, max = 1))]
    pub(super) min: Option<f64>,
    /// What each whole window without a bad answer adds back to the level (default 0.1; above 0,
    /// at most 1).
    #[schemars(range(min = 0.000001, max = 1))]
    pub(super) step: Option<f64>,
    /// The downstream's latency moves the level before it refuses anything.
    pub(super) latency: Option<RawLatency>,
}

/// Latency as the leading signal: each window's high percentile against a slow baseline of it.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLatency {
    /// A window is slow when its percentile exceeds this × the baseline (default 2; above 1, at
    /// most 10).
    #[schemars(range(min = 1.000001, max = 10))]
    pub(super) tolerance: Option<f64>,
    /// How far one slow window moves the level toward level × tolerance × baseline / percentile
    /// (default 0.5; above 0, at most 1).
    #[schemars(range(min = 0.000001, max = 1))]
    pub(super) smoothing: Option<f64>,
    /// How far a slower window's percentile moves the baseline; a faster one sets it (default 0.05; above 0, at most 1).
    #[schemars(range(min = 0.000001, max = 1))]
    pub(super) baseline: Option<f64>,
    /// Healthy, busy windows to climb back to the level that last hurt (default 8; 1 to 100).
    #[schemars(range(min = 1, max = 100))]
    pub(super) recover: Option<u64>,
    /// Log and count what the controller would do, change no level (default false).
    pub(super) shadow: Option<bool>,
}

/// One rule: which events it takes, how it keys them, the limits of each key, and where events go.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    /// Unique; used in metrics, logs and `drip inspect` (letters, digits, `_` and `-`).
    #[schemars(regex(pattern = NAME))]
    pub(super) name: String,
    /// What state, tasks and overrides hang on (default: the name): keep it to rename a rule.
    #[schemars(regex(pattern = NAME))]
    pub(super) id: Option<String>,
    /// The events it takes: all of these attributes equal (no match: every event).
    #[serde(rename = "match")]
    pub(super) matcher: Option<RawMatch>,
    /// The key template, e.g. `merchant_{data.merchant_id}` or `{attributes.tenant}`.
    #[schemars(regex(pattern = TEMPLATE))]
    pub(super) key: String,
    /// The key template before an edit: each event's old key's frontier carries over.
    #[schemars(regex(pattern = TEMPLATE))]
    pub(super) previous_key: Option<String>,
    /// Every limit a key must keep, all at once (one per period and kind).
    #[schemars(length(min = 1))]
    pub(super) limits: Vec<RawLimit>,
    /// What one event costs against each limit: an integer, or a template such as `{data.parts}`.
    #[schemars(with = "Option<CostShape>")]
    pub(super) cost: Option<Value>,
    /// The longest an event may wait for its slot (e.g. `2h`, at most `30d`); later: dead-lettered.
    #[schemars(regex(pattern = DURATION))]
    pub(super) max_delay: String,
    /// The longest one downstream answer may pause a key (default: half of `max_delay`).
    #[schemars(regex(pattern = DURATION))]
    pub(super) max_pause: Option<String>,
    /// A slot this close is waited for in-process instead of through a task (default `1s`, at most `10s`).
    #[schemars(regex(pattern = DURATION))]
    pub(super) inline_wait: Option<String>,
    /// Where an event goes at its slot when it is now.
    pub(super) forward: RawForward,
    /// Where delayed events are published when their slot comes.
    #[schemars(regex(pattern = TOPIC))]
    pub(super) overflow_topic: String,
    /// Delayed events are POSTed to a URL (instead of published).
    pub(super) overflow: Option<RawOverflow>,
    /// Where this rule's dead letters go (default: `default_dlq_topic`).
    #[schemars(regex(pattern = TOPIC))]
    pub(super) dlq_topic: Option<String>,
    /// What an event without the key's fields does: `dlq` (default) or `{ fallback_key: KEY }`.
    #[schemars(with = "Option<OnMissingKeyShape>")]
    pub(super) on_missing_key: Option<Value>,
    /// `original` (the data as it came) or `enriched` (the overflow body with Drip's metadata).
    #[schemars(with = "Option<OverflowFormatName>")]
    pub(super) overflow_format: Option<String>,
    /// `enforce` (default) or `shadow` (decide and record, but forward at once).
    #[schemars(with = "Option<ModeName>")]
    pub(super) mode: Option<String>,
    /// The shared budgets (by name) its events also draw from.
    pub(super) budgets: Option<Vec<String>>,
    /// Where a downstream's 429s and `Retry-After` go: `key` (default) or one of its budgets.
    pub(super) feedback: Option<String>,
    pub(super) adaptive: Option<RawAdaptive>,
    /// The limits hold at every delivery up to this late (e.g. `100ms`): slots leave room for it.
    #[schemars(regex(pattern = DURATION))]
    pub(super) delivery_margin: Option<String>,
    /// What an event that comes after its slot plus `delivery_margin` does (a redelivery after a
    /// crash, a retried task): `wait` (default: it takes the earliest slot that fits now) or
    /// `deliver` (it goes at once, latency over the limit).
    #[schemars(with = "Option<LateEventsName>")]
    pub(super) late_events: Option<String>,
    /// While a key is throttled (paused, or its adaptive level below its ceiling), an event whose
    /// slot lies further ahead than this books nothing and waits in the key's queue for the rate
    /// in force when the key's drain reaches it (default `2s`; `off`: every slot booked at once).
    #[schemars(regex(pattern = DURATION_OR_OFF))]
    pub(super) park_horizon: Option<String>,
    /// Whether a call the downstream refused (429/503) counts against the limits (default false:
    /// its units go back when it is rescheduled).
    pub(super) count_refused: Option<bool>,
    /// Classes under the rule's limits: each class its own FIFO, some holding a reserve of each window.
    pub(super) classes: Option<RawClasses>,
    /// Follow what the partner says of its limits on its answers (`RateLimit-Policy`, `RateLimit`,
    /// `X-RateLimit-*`): `headers`, or `{ from: headers, policies: { NAME: PERIOD }, above_rules }`.
    #[schemars(with = "Option<LearnShape>")]
    pub(super) learn: Option<Value>,
}

/// `learn: headers`, or the long form.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
#[serde(untagged, deny_unknown_fields)]
enum LearnShape {
    /// `headers`: every policy whose window is the period of one of the rule's limits.
    Source(LearnSource),
    Full {
        from: LearnSource,
        /// A partner policy (its name in `RateLimit-Policy`) held to the rule's limit of this period.
        policies: Option<BTreeMap<String, String>>,
        /// Whether a learned limit may be above the file's (default false: only lower).
        above_rules: Option<bool>,
    },
}

#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
#[serde(rename_all = "lowercase")]
enum LearnSource {
    Headers,
}

/// `classes: { from, default, reserve }`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClasses {
    /// Where an event's class is read: a template over attributes or the body (`{attributes.priority}`).
    pub(super) from: String,
    /// The class of an event whose template gives nothing, or a class not listed.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub(super) default: String,
    /// By class: the share of each window of the rule's limits held for it until the window starts
    /// (e.g. `{ live: 0.05 }`), each above 0, together at most 1; the class borrows the rest too.
    #[schemars(extend("additionalProperties" = { "type": "number", "exclusiveMinimum": 0, "maximum": 1 }))]
    pub(super) reserve: Option<BTreeMap<String, f64>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    /// At least one attribute (a rule for every event has no `match`).
    #[schemars(extend("minProperties" = 1))]
    pub(super) attributes: BTreeMap<String, String>,
}

/// At most `limit` cost per `per`. `burst` belongs to gcra limits, `placement` to the others.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("allOf" = [
    { "if": { "required": ["burst"], "properties": { "burst": { "type": "integer" } } },
      "then": { "required": ["window"], "properties": { "window": { "const": "gcra" } } } },
    { "if": { "required": ["window"], "properties": { "window": { "const": "gcra" } } },
      "then": { "not": { "required": ["placement"] } } }
]))]
pub(super) struct RawLimit {
    /// The most cost per `per` (at least 1).
    #[schemars(range(min = 1))]
    pub(super) limit: i64,
    /// A duration: `1s`, `1m`, `1h`, `1d` or any such period.
    #[schemars(regex(pattern = DURATION))]
    pub(super) per: String,
    /// `fixed` (default, epoch-aligned windows), `sliding` or `gcra`.
    #[schemars(with = "Option<WindowName>")]
    pub(super) window: Option<String>,
    /// GCRA only: how many units may go at once (default 1; an event whose cost is above it is
    /// dead-lettered).
    #[schemars(range(min = 1))]
    pub(super) burst: Option<i64>,
    /// Fixed windows only: `start` (default, from the window's start) or `spread` (evenly across it).
    #[schemars(with = "Option<PlacementName>")]
    pub(super) placement: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverflow {
    #[schemars(regex(pattern = URL))]
    pub(super) url: String,
}

/// Exactly one of `topic` and `url`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{ "required": ["topic"] }, { "required": ["url"] }]))]
pub(super) struct RawForward {
    #[schemars(regex(pattern = TOPIC))]
    pub(super) topic: Option<String>,
    #[schemars(regex(pattern = URL))]
    pub(super) url: Option<String>,
}

/// The JSON Schema of the rules file (`drip schema rules`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RawTop)).unwrap_or_default()
}

/// Deserializes with the path of the offending field, e.g. `limits[1].limit`. Unknown fields at
/// the top of `value` are all named (each taken out and the rest read again), each with the field
/// it most likely meant; any other error is the first one.
pub(super) fn deserialize<T: serde::de::DeserializeOwned>(mut value: Value) -> Result<T, Vec<(String, String)>> {
    let mut unknown = Vec::new();
    loop {
        let error = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(parsed) if unknown.is_empty() => return Ok(parsed),
            Ok(_) => return Err(unknown),
            Err(error) => error,
        };
        let (path, message) = describe(error);
        let top_level_unknown = message.starts_with("unknown field `") && !path.contains(['.', '[']);
        let removed =
            top_level_unknown && value.as_mapping_mut().is_some_and(|fields| fields.remove(path.as_str()).is_some());
        unknown.push((path, message));
        if !removed {
            return Err(unknown);
        }
    }
}

fn describe(error: serde_path_to_error::Error<serde_yaml_ng::Error>) -> (String, String) {
    let path = error.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = error.into_inner().to_string().replace("expected i64", "expected an integer");
    if let Some(message) = did_you_mean(&message) {
        return (path, message);
    }
    // serde names a missing field in its message, at the path of the struct that lacks it.
    match message.strip_prefix("missing field `").and_then(|rest| rest.strip_suffix('`')) {
        Some(missing) if path.is_empty() => (missing.to_owned(), "is required".to_owned()),
        Some(missing) => (format!("{path}.{missing}"), "is required".to_owned()),
        None => (path, message),
    }
}

/// serde's "unknown field `limts`, expected one of `name`, …" as "unknown field `limts`: did you
/// mean `limits`?" when one known field is close, else the list as serde gave it.
fn did_you_mean(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, expected) = rest.split_once("`, expected ")?;
    let known = expected.split('`').skip(1).step_by(2);
    let closest = known
        .map(|candidate| (strsim::jaro_winkler(field, candidate), candidate))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(score, _)| *score >= 0.8)?;
    Some(format!("unknown field `{field}`: did you mean `{}`?", closest.1))
}
