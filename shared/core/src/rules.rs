//! The rules file: parsing and validation of the YAML contract (docs/rules.md: "Rules").
//!
//! Every problem is reported, not only the first, each naming the file, the rule, the field and why.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::budgets::{Adaptive, Budget, FeedbackTarget, fraction_ppm};
pub use crate::limit::{InvalidLimit, Limit, MAX_WINDOW, Placement, Window};
use crate::template::Template;
use crate::time::{DAY, Millis, SECOND, parse_duration};

/// Cloud Tasks holds a task for at most 30 days.
pub const MAX_DELAY_LIMIT: Millis = 30 * DAY;
/// An inline wait holds the push request open; Pub/Sub's deadline and Cloud Run's cost say keep it short.
pub const MAX_INLINE_WAIT: Millis = 10 * SECOND;
pub const DEFAULT_INLINE_WAIT: Millis = SECOND;

#[derive(Debug, Clone)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
    pub default_dlq_topic: Option<TopicName>,
    /// The `budgets:` section, by name.
    pub budgets: BTreeMap<String, Arc<Budget>>,
}

/// Rules a service can run: what no rule takes has a dead-letter topic too (the file's
/// `default_dlq_topic`, else the catch-all rule's), checked once when the file loads.
#[derive(Debug, Clone)]
pub struct ServiceRules {
    rules: RuleSet,
    fallback_dlq_topic: TopicName,
}

impl ServiceRules {
    pub fn new(rules: RuleSet, file: &str) -> Result<Self, ConfigError> {
        let Some(fallback) = rules.fallback_dlq_topic() else {
            return Err(ConfigError {
                file: file.to_owned(),
                rule: None,
                field: "default_dlq_topic".into(),
                message: "required when no catch-all rule (a rule without match) with a dlq_topic exists".into(),
            });
        };
        Ok(Self { fallback_dlq_topic: fallback.clone(), rules })
    }

    /// The rule's dead-letter topic, or the fallback for what no rule takes.
    pub fn dlq_topic_for<'a>(&'a self, rule: Option<&'a Rule>) -> &'a str {
        rule.map_or(&self.fallback_dlq_topic, |r| &r.dlq_topic)
    }
}

impl std::ops::Deref for ServiceRules {
    type Target = RuleSet;

    fn deref(&self) -> &RuleSet {
        &self.rules
    }
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    /// What its state, overrides, task names and claim-checks hang on: the `id` field, default the
    /// name, so a rename that keeps the id keeps every entity's state and backlog.
    pub id: String,
    /// Attribute values that must all match; `None` makes this a catch-all rule.
    pub matcher: Option<BTreeMap<String, String>>,
    pub key: Template,
    /// The key template before an edit: an entity's frontier under it carries over to the same
    /// event's new key, so a key change keeps FIFO and the window bound (docs/rules.md: "Changing limits").
    pub previous_key: Option<Template>,
    pub limits: Vec<Limit>,
    pub cost: Cost,
    pub max_delay: Millis,
    /// The longest pause one downstream answer (a `Retry-After`, a `/v1/feedback` call) may set:
    /// `max_pause`, by default half of `max_delay`. A longer wait is capped and read as overload.
    pub max_pause: Millis,
    pub inline_wait: Millis,
    pub forward: Forward,
    pub overflow_topic: TopicName,
    /// `overflow: { url }`: the dispatcher POSTs each delayed event to this URL at its slot
    /// instead of publishing it on `overflow_topic` (which still names the rule's tasks), sees the
    /// answer, and reschedules the event itself when told to wait.
    pub overflow_url: Option<String>,
    /// Its own `dlq_topic`, else the file's `default_dlq_topic` (resolved when the file loads).
    pub dlq_topic: TopicName,
    pub on_missing_key: OnMissingKey,
    pub overflow_format: OverflowFormat,
    pub mode: Mode,
    /// The shared budgets its events also draw from (docs/rules.md: "Shared budgets").
    pub budgets: Vec<Arc<Budget>>,
    /// Where the downstream's 429s and `Retry-After`s go: the key, or one of its budgets.
    pub feedback: FeedbackTarget,
    /// The entity's limits follow the downstream (AIMD) when set.
    pub adaptive: Option<Adaptive>,
    /// How late a delivery may be and still count in its slot's window (`ReserveRequest::margin`).
    pub delivery_margin: Millis,
}

/// `enforce` (the default) acts on each decision; `shadow` reserves and records exactly as
/// `enforce` does but forwards every event at once, saying what it would have done
/// (`drip-shadow-decision`): a new limit tried on live traffic before it is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    Shadow,
}

/// A Pub/Sub topic: an id (`payouts-ready`, in the service's project) or a full
/// `projects/<project>/topics/<id>`, valid by Pub/Sub's naming rules. Only [`TopicName::new`] makes
/// one, so a rule's topics are checked once, when the file loads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(String);

impl TopicName {
    pub fn new(topic: impl Into<String>) -> Result<Self, String> {
        let topic = topic.into();
        check_topic(&topic)?;
        Ok(Self(topic))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for TopicName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for TopicName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for TopicName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    Template(Template),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    Topic(TopicName),
    Url(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnMissingKey {
    Dlq,
    FallbackKey(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowFormat {
    Enriched,
    Original,
}

fn per_text(per: Millis) -> String {
    humantime::format_duration(std::time::Duration::from_millis(per.unsigned_abs())).to_string()
}

impl Rule {
    pub fn matches(&self, attributes: &BTreeMap<String, String>) -> bool {
        self.matcher
            .as_ref()
            .is_none_or(|wanted| wanted.iter().all(|(name, value)| attributes.get(name) == Some(value)))
    }

    /// Which of this rule's limits `spec` overrides, and with what count: `500/1m` names the limit
    /// whose period is 1m (`window` picks one when two share it: `fixed`, `sliding`, `gcra`).
    pub fn override_target(&self, spec: &str, window: Option<&str>) -> Result<(&Limit, u64), String> {
        let (count, per) = spec.split_once('/').ok_or_else(|| format!("'{spec}' is not COUNT/PERIOD, e.g. 500/1m"))?;
        let count: u64 = match count.trim().parse() {
            Ok(n) if n >= 1 => n,
            _ => return Err(format!("'{count}' is not a count of at least 1")),
        };
        let per = parse_duration(per.trim())?;
        let candidates: Vec<&Limit> =
            self.limits.iter().filter(|l| l.per() == per && window.is_none_or(|w| l.window().kind() == w)).collect();
        match candidates.as_slice() {
            [limit] => Ok((limit, count)),
            [] => Err(format!(
                "rule '{}' has no limit per {} to override (its limits: {})",
                self.name,
                per_text(per),
                self.limits.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            )),
            _ => Err(format!("rule '{}' has several limits per {}: name one with --window", self.name, per_text(per))),
        }
    }

    /// When a pause the downstream asked for until `until` ends, at most `max_pause` after `now`;
    /// `true` when it was capped (the downstream asked for longer: an overload signal).
    pub fn capped_pause(&self, until: Millis, now: Millis) -> (Millis, bool) {
        let cap = now.saturating_add(self.max_pause);
        if until > cap { (cap, true) } else { (until, false) }
    }

    /// The largest cost an event may have: the smallest count of its own limits and of its
    /// budgets' limits, and of its gcra limits' bursts.
    pub fn max_cost(&self) -> u64 {
        let limits = self.limits.iter().chain(self.budgets.iter().flat_map(|b| &b.limits));
        limits.map(|l| l.max_cost(l.limit())).min().unwrap_or(0)
    }

    /// The Redis Cluster hash tag its entities live under when it draws from a budget.
    pub fn budget_tag(&self) -> Option<&str> {
        self.budgets.first().map(|b| b.tag.as_str())
    }

    /// The budget its feedback goes to, when not the key.
    pub fn feedback_budget(&self) -> Option<&Budget> {
        match &self.feedback {
            FeedbackTarget::Key => None,
            FeedbackTarget::Budget(name) => self.budgets.iter().find(|b| &b.name == name).map(|b| &**b),
        }
    }
}

impl RuleSet {
    /// The rule that governs a message: the first whose `match` holds, in file order.
    pub fn find(&self, attributes: &BTreeMap<String, String>) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(attributes))
    }

    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }

    pub fn rule_by_id(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.id == id)
    }

    /// Where an event goes that no rule can take: `default_dlq_topic`, else the catch-all rule's.
    pub fn fallback_dlq_topic(&self) -> Option<&TopicName> {
        self.default_dlq_topic
            .as_ref()
            .or_else(|| self.rules.iter().find(|r| r.matcher.is_none()).map(|r| &r.dlq_topic))
    }

    pub fn has_catch_all(&self) -> bool {
        self.rules.iter().any(|r| r.matcher.is_none())
    }

    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: file.clone(),
                rule: None,
                field: String::new(),
                message: format!("cannot read: {e}"),
            }])
        })?;
        Self::parse(&file, &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigErrors> {
        let mut errors = Errors { file, list: Vec::new() };
        let top: RawTop = match serde_yaml_ng::from_str::<Value>(text) {
            Err(e) => {
                errors.top("", format!("invalid YAML: {e}"));
                return Err(errors.finish());
            }
            Ok(value) => match deserialize::<RawTop>(value) {
                Ok(top) => top,
                Err((field, message)) => {
                    errors.top(&field, message);
                    return Err(errors.finish());
                }
            },
        };
        let default_dlq_topic = match top.default_dlq_topic.map(TopicName::new).transpose() {
            Ok(topic) => topic,
            Err(message) => {
                errors.top("default_dlq_topic", message);
                None
            }
        };
        if top.rules.is_empty() {
            errors.top("rules", "at least one rule is required".into());
        }
        let declared: Vec<String> = top.budgets.iter().flat_map(|b| b.keys().cloned()).collect();
        let specs = validate_budgets(top.budgets.unwrap_or_default(), &mut errors);
        let mut rules: Vec<Rule> = Vec::new();
        let mut drawn: Vec<Vec<String>> = Vec::new();
        let mut first_index_of: HashMap<String, usize> = HashMap::new();
        let mut first_with_id: HashMap<String, usize> = HashMap::new();
        let mut catch_all: Option<String> = None;
        for (index, raw) in top.rules.into_iter().enumerate() {
            let label = rule_label(&raw, index);
            let mut rule_errors = RuleErrors { errors: &mut errors, label: &label };
            let Some((rule, budget_names)) =
                validate_rule(raw, &mut rule_errors, default_dlq_topic.as_ref(), &declared)
            else {
                continue;
            };
            if let Some(first) = first_index_of.get(&rule.name) {
                rule_errors.push("name", format!("duplicate rule name (first used by rules[{first}])"));
            } else if let Some(first) = first_with_id.get(&rule.id) {
                rule_errors.push("id", format!("duplicate rule id '{}' (first used by rules[{first}])", rule.id));
            }
            first_with_id.entry(rule.id.clone()).or_insert(index);
            if let Some(earlier) = &catch_all {
                rule_errors.push("match", format!("unreachable: the catch-all rule '{earlier}' comes before it"));
            }
            if rule.matcher.is_none() && catch_all.is_none() {
                catch_all = Some(rule.name.clone());
            }
            first_index_of.entry(rule.name.clone()).or_insert(index);
            rules.push(rule);
            drawn.push(budget_names);
        }
        let budgets = link_budgets(specs, &drawn);
        for (rule, names) in rules.iter_mut().zip(&drawn) {
            // A budget that did not validate is reported already (and the file refused).
            rule.budgets = names.iter().filter_map(|name| budgets.get(name).cloned()).collect();
            if let Some(limit) =
                rule.budgets.iter().flat_map(|b| &b.limits).find(|l| 2 * rule.delivery_margin > l.per())
            {
                let label = format!("rule '{}'", rule.name);
                RuleErrors { errors: &mut errors, label: &label }
                    .push("delivery_margin", format!("must be at most half of every window of its budgets ({limit})"));
            }
            if let Cost::Fixed(cost) = rule.cost
                && let Some(budget) = rule.budgets.iter().find(|b| b.limits.iter().any(|l| l.limit() < cost))
            {
                let label = format!("rule '{}'", rule.name);
                RuleErrors { errors: &mut errors, label: &label }.push(
                    "cost",
                    format!("{cost} exceeds a limit of budget '{}', so no event could ever be scheduled", budget.name),
                );
            }
        }
        if errors.list.is_empty() { Ok(RuleSet { rules, default_dlq_topic, budgets }) } else { Err(errors.finish()) }
    }
}

/// One problem in a rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// `rule 'payouts'`, or `rule #3` when the rule has no usable name; `None` for top-level fields.
    pub rule: Option<String>,
    /// `limits[1].per`; empty when the problem is the whole file.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        if let Some(rule) = &self.rule {
            write!(f, "{rule}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a rules file, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

struct Errors<'a> {
    file: &'a str,
    list: Vec<ConfigError>,
}

impl Errors<'_> {
    fn top(&mut self, field: &str, message: String) {
        self.list.push(ConfigError { file: self.file.to_owned(), rule: None, field: field.to_owned(), message });
    }

    fn finish(self) -> ConfigErrors {
        ConfigErrors(self.list)
    }
}

struct RuleErrors<'a, 'b> {
    errors: &'a mut Errors<'b>,
    label: &'a str,
}

impl RuleErrors<'_, '_> {
    fn push(&mut self, field: &str, message: String) {
        self.errors.list.push(ConfigError {
            file: self.errors.file.to_owned(),
            rule: Some(self.label.to_owned()),
            field: field.to_owned(),
            message,
        });
    }

    /// Records the error, if any, and hands back the value.
    fn check<T>(&mut self, field: &str, result: Result<T, String>) -> Option<T> {
        result.map_err(|message| self.push(field, message)).ok()
    }
}

/// A Drip rules file (YAML or JSON): its rules, the shared budgets they draw from, and where
/// dead letters go by default. `drip schema rules` prints this schema; `drip check-config` checks
/// what a schema cannot (templates, topic names, one limit per period and kind, budgets named).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Drip rules file")]
struct RawTop {
    /// The rules, tried in order: the first whose `match` fits an event schedules it.
    #[schemars(with = "Vec<RawRule>")]
    rules: Vec<Value>,
    /// Where dead letters go when their rule names no `dlq_topic` (and for events no rule matched).
    default_dlq_topic: Option<String>,
    /// Budgets several rules draw from, by name: limits shared by every key of those rules.
    #[schemars(with = "Option<BTreeMap<String, RawBudget>>")]
    budgets: Option<BTreeMap<String, Value>>,
}

/// A budget: its limits, or `{ limits, max_share, adaptive }`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum RawBudget {
    Limits(Vec<RawLimit>),
    Full(RawBudgetFields),
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawBudgetFields {
    limits: Vec<RawLimit>,
    /// The largest share of each window one key may take (e.g. 0.2).
    max_share: Option<f64>,
    adaptive: Option<RawAdaptive>,
}

/// AIMD: a 429, 5xx or timeout from the downstream lowers the counts to a level, which climbs
/// back while answers are good.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawAdaptive {
    /// Headroom: the level never rises above `1 - margin` (default 0.1).
    margin: Option<f64>,
    /// What a bad answer multiplies the level by (default 0.9).
    decrease: Option<f64>,
    /// The lowest level (default 0.2).
    min: Option<f64>,
    /// What each whole window without a bad answer adds back to the level (default 0.1).
    step: Option<f64>,
}

/// One rule: which events it takes, how it keys them, the limits of each key, and where events go.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRule {
    /// Unique; used in metrics, logs and `drip inspect`.
    name: String,
    /// What state, tasks and overrides hang on (default: the name): keep it to rename a rule.
    id: Option<String>,
    /// The events it takes: all of these attributes equal (no match: every event).
    #[serde(rename = "match")]
    matcher: Option<RawMatch>,
    /// The key template, e.g. `merchant_{data.merchant_id}` or `{attributes.tenant}`.
    key: String,
    /// The key template before an edit: each event's old key's frontier carries over.
    previous_key: Option<String>,
    /// Every limit a key must keep, all at once (one per period and kind).
    limits: Vec<RawLimit>,
    /// What one event costs against each limit: an integer, or a template such as `{data.parts}`.
    #[schemars(with = "Option<serde_json::Value>")]
    cost: Option<Value>,
    /// The longest an event may wait for its slot (e.g. `2h`, at most `30d`); later: dead-lettered.
    max_delay: String,
    /// The longest one downstream answer may pause a key (default: half of `max_delay`).
    max_pause: Option<String>,
    /// A slot this close is waited for in-process instead of through a task (default `1s`, at most `10s`).
    inline_wait: Option<String>,
    /// Where an event goes at its slot when it is now.
    forward: RawForward,
    /// Where delayed events are published when their slot comes.
    overflow_topic: String,
    /// Delayed events are POSTed to a URL (instead of published).
    overflow: Option<RawOverflow>,
    /// Where this rule's dead letters go (default: `default_dlq_topic`).
    dlq_topic: Option<String>,
    /// What an event without the key's fields does: `dlq` (default) or `{ fallback_key: KEY }`.
    #[schemars(with = "Option<serde_json::Value>")]
    on_missing_key: Option<Value>,
    /// `original` (the data as it came) or `enriched` (the overflow body with Drip's metadata).
    overflow_format: Option<String>,
    /// `enforce` (default) or `shadow` (decide and record, but forward at once).
    mode: Option<String>,
    /// The shared budgets (by name) its events also draw from.
    budgets: Option<Vec<String>>,
    /// Where a downstream's 429s and `Retry-After` go: `key` (default) or one of its budgets.
    feedback: Option<String>,
    adaptive: Option<RawAdaptive>,
    /// The limits hold at every delivery up to this late (e.g. `100ms`): slots leave room for it.
    delivery_margin: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    attributes: BTreeMap<String, String>,
}

/// At most `limit` cost per `per`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    limit: i64,
    /// A duration: `1s`, `1m`, `1h`, `1d` or any such period.
    per: String,
    /// `fixed` (default, epoch-aligned windows), `sliding` or `gcra`.
    window: Option<String>,
    /// GCRA only: how many may go at once.
    burst: Option<i64>,
    /// Fixed windows only: `start` (default, from the window's start) or `spread` (evenly across it).
    placement: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawOverflow {
    url: String,
}

/// Exactly one of `topic` and `url`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawForward {
    topic: Option<String>,
    url: Option<String>,
}

/// The JSON Schema of the rules file (`drip schema rules`).
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RawTop)).unwrap_or_default()
}

/// Deserializes with the path of the offending field, e.g. `limits[1].limit`.
fn deserialize<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, (String, String)> {
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

fn rule_label(raw: &Value, index: usize) -> String {
    match raw.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => format!("rule '{name}'"),
        _ => format!("rule #{}", index + 1),
    }
}

/// A rule and the names of the budgets it draws from (linked once every rule is read).
fn validate_rule(
    raw: Value,
    errors: &mut RuleErrors<'_, '_>,
    default_dlq: Option<&TopicName>,
    budgets: &[String],
) -> Option<(Rule, Vec<String>)> {
    let raw: RawRule = match deserialize(raw) {
        Ok(raw) => raw,
        Err((field, message)) => {
            errors.push(&field, message);
            return None;
        }
    };
    let before = errors.errors.list.len();

    if !valid_rule_name(&raw.name) {
        errors.push("name", "must be 1-64 characters of A-Z, a-z, 0-9, _ or -".into());
    }
    let id = raw.id.clone().unwrap_or_else(|| raw.name.clone());
    if raw.id.is_some() && !valid_rule_name(&id) {
        errors.push("id", "must be 1-64 characters of A-Z, a-z, 0-9, _ or -".into());
    }
    let matcher = match raw.matcher {
        Some(m) if m.attributes.is_empty() => {
            errors.push("match.attributes", "names no attribute; omit match for a catch-all rule".into());
            None
        }
        Some(m) => Some(m.attributes),
        None => None,
    };
    let key = errors.check("key", Template::parse(&raw.key));
    let previous_key = match raw.previous_key.as_deref().map(Template::parse) {
        None => Some(None),
        Some(parsed) => errors.check("previous_key", parsed).map(Some),
    };
    let limits = validate_limits(&raw.limits, errors);
    let cost = match raw.cost {
        None => Some(Cost::Fixed(1)),
        Some(value) => errors.check("cost", parse_cost(&value)),
    };
    if let (Some(Cost::Fixed(cost)), Some(limits)) = (&cost, &limits)
        && let Some((index, smallest)) = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.max_cost(l.limit()) < *cost)
            .min_by_key(|(_, l)| l.max_cost(l.limit()))
    {
        let what = match smallest.window() {
            Window::Gcra { burst } if burst < smallest.limit() => format!("burst {burst}"),
            _ => format!("limit {}", smallest.limit()),
        };
        errors.push("cost", format!("{cost} exceeds limits[{index}].{what}, so no event could ever be scheduled"));
    }
    let max_delay = errors.check(
        "max_delay",
        parse_duration(&raw.max_delay).and_then(|d| {
            if d > MAX_DELAY_LIMIT {
                Err(format!("{} is over 30d, the longest Cloud Tasks can hold a task", raw.max_delay))
            } else {
                Ok(d)
            }
        }),
    );
    let max_pause = match (&raw.max_pause, max_delay) {
        (None, Some(max_delay)) => Some(max_delay / 2),
        (None, None) => None,
        (Some(text), max_delay) => errors.check(
            "max_pause",
            parse_duration(text).and_then(|pause| match max_delay {
                Some(max_delay) if pause > max_delay => {
                    Err(format!("{text} is longer than max_delay: a pause that long would dead-letter every event"))
                }
                _ => Ok(pause),
            }),
        ),
    };
    let inline_wait = match &raw.inline_wait {
        None => Some(DEFAULT_INLINE_WAIT),
        Some(text) => errors.check(
            "inline_wait",
            parse_duration(text).and_then(|d| {
                if d > MAX_INLINE_WAIT {
                    Err(format!("{text} is over 10s; longer waits belong in a Cloud Task"))
                } else {
                    Ok(d)
                }
            }),
        ),
    };
    let forward = match (raw.forward.topic, raw.forward.url) {
        (Some(topic), None) => errors.check("forward.topic", TopicName::new(topic)).map(Forward::Topic),
        (None, Some(url)) => errors.check("forward.url", check_url(&url)).map(|_| Forward::Url(url)),
        _ => {
            errors.push("forward", "set exactly one of topic or url".into());
            None
        }
    };
    let overflow_topic = errors.check("overflow_topic", TopicName::new(raw.overflow_topic));
    let overflow_url = match raw.overflow.map(|o| o.url) {
        None => Some(None),
        Some(url) => errors.check("overflow.url", check_url(&url)).map(|()| Some(url)),
    };
    let dlq_topic = match (raw.dlq_topic, default_dlq) {
        (Some(topic), _) => errors.check("dlq_topic", TopicName::new(topic)),
        (None, Some(default)) => Some(default.clone()),
        (None, None) => {
            errors.push("dlq_topic", "required unless default_dlq_topic is set".into());
            None
        }
    };
    let on_missing_key = match &raw.on_missing_key {
        None => Some(OnMissingKey::Dlq),
        Some(value) => errors.check("on_missing_key", parse_on_missing_key(value)),
    };
    let mode = match raw.mode.as_deref() {
        None | Some("enforce") => Some(Mode::Enforce),
        Some("shadow") => Some(Mode::Shadow),
        Some(other) => {
            errors.push("mode", format!("unknown mode '{other}', expected enforce or shadow"));
            None
        }
    };
    let overflow_format = match raw.overflow_format.as_deref() {
        None | Some("enriched") => Some(OverflowFormat::Enriched),
        Some("original") => Some(OverflowFormat::Original),
        Some(other) => {
            errors.push("overflow_format", format!("unknown format '{other}', expected enriched or original"));
            None
        }
    };

    let delivery_margin = match raw.delivery_margin.as_deref().map(parse_duration) {
        None => Some(0),
        Some(Err(message)) => errors.check("delivery_margin", Err(message)),
        Some(Ok(margin)) => {
            let fixed =
                limits.iter().flatten().find(|l| !matches!(l.window(), Window::Gcra { .. }) && 2 * margin > l.per());
            match fixed {
                Some(limit) => {
                    errors.push(
                        "delivery_margin",
                        format!("must be at most half of every fixed and sliding window ({limit})"),
                    );
                    None
                }
                None => Some(margin),
            }
        }
    };
    let budget_names = raw.budgets.unwrap_or_default();
    for (i, name) in budget_names.iter().enumerate() {
        if !budgets.contains(name) {
            let known = budgets.join(", ");
            errors.push(&format!("budgets[{i}]"), format!("unknown budget '{name}' (budgets: {known})"));
        } else if budget_names[..i].contains(name) {
            errors.push(&format!("budgets[{i}]"), format!("lists budget '{name}' twice"));
        }
    }
    let feedback = match raw.feedback {
        None => Some(FeedbackTarget::Key),
        Some(key) if key == "key" => Some(FeedbackTarget::Key),
        Some(name) if budget_names.contains(&name) => Some(FeedbackTarget::Budget(name)),
        Some(name) => {
            errors.push("feedback", format!("'{name}' is neither key nor a budget this rule lists"));
            None
        }
    };
    let adaptive = match raw.adaptive.map(|a| errors.check("adaptive", parse_adaptive(&a))) {
        None => Some(None),
        Some(parsed) => parsed.map(Some),
    };
    if let (Some(Some(_)), Some(limits)) = (&adaptive, &limits)
        && limits.iter().all(|l| matches!(l.window(), Window::Gcra { .. }))
    {
        errors.push(
            "adaptive",
            "applies to fixed and sliding limits, and this rule has only gcra ones (a gcra burst is a time measured at its count)".into(),
        );
    }
    if let (Some(Some(_)), Some(FeedbackTarget::Budget(name))) = (&adaptive, &feedback) {
        errors.push(
            "adaptive",
            format!("feedback goes to budget '{name}', so this would never adapt: set adaptive on the budget"),
        );
    }

    if errors.errors.list.len() > before {
        return None;
    }
    let rule = Rule {
        name: raw.name,
        id,
        matcher,
        key: key?,
        previous_key: previous_key?,
        limits: limits?,
        cost: cost?,
        max_delay: max_delay?,
        max_pause: max_pause?,
        inline_wait: inline_wait?,
        forward: forward?,
        overflow_topic: overflow_topic?,
        overflow_url: overflow_url?,
        dlq_topic: dlq_topic?,
        on_missing_key: on_missing_key?,
        overflow_format: overflow_format?,
        mode: mode?,
        budgets: Vec::new(),
        feedback: feedback?,
        adaptive: adaptive?,
        delivery_margin: delivery_margin?,
    };
    Some((rule, budget_names))
}

/// Each budget of the `budgets:` section, valid, without its hash tag yet (see [`link_budgets`]).
fn validate_budgets(raw: BTreeMap<String, Value>, errors: &mut Errors<'_>) -> BTreeMap<String, Budget> {
    let mut budgets = BTreeMap::new();
    for (name, value) in raw {
        let label = format!("budget '{name}'");
        let mut errors = RuleErrors { errors, label: &label };
        if !valid_rule_name(&name) {
            errors.push("", "a budget name must be 1-64 characters of A-Z, a-z, 0-9, _ or -".into());
            continue;
        }
        let fields = match deserialize::<RawBudget>(value) {
            Ok(RawBudget::Limits(limits)) => RawBudgetFields { limits, max_share: None, adaptive: None },
            Ok(RawBudget::Full(fields)) => fields,
            Err(_) => {
                errors.push(
                    "",
                    "expected a list of limits or { limits, max_share, adaptive } (fields: limit, per, placement)"
                        .into(),
                );
                continue;
            }
        };
        let Some(limits) = validate_limits(&fields.limits, &mut errors) else { continue };
        let mut ok = true;
        for (i, limit) in limits.iter().enumerate() {
            if !matches!(limit.window(), Window::Fixed(_)) {
                errors.push(
                    &format!("limits[{i}].window"),
                    format!(
                        "a budget takes fixed windows (placement start or spread), not {}: slots from many entities arrive out of order, which only a count per window can take",
                        limit.window().kind()
                    ),
                );
                ok = false;
            }
        }
        let max_share = match fields.max_share {
            None => None,
            Some(share) => match fraction_ppm(share).filter(|&ppm| ppm > 0) {
                Some(ppm) => Some(ppm),
                None => {
                    errors.push("max_share", format!("must be a fraction above 0 and at most 1, got {share}"));
                    ok = false;
                    None
                }
            },
        };
        let adaptive = match fields.adaptive.map(|a| parse_adaptive(&a)) {
            None => None,
            Some(Ok(adaptive)) => Some(adaptive),
            Some(Err(message)) => {
                errors.push("adaptive", message);
                ok = false;
                None
            }
        };
        if ok {
            budgets.insert(name.clone(), Budget { name, limits, max_share, adaptive, tag: String::new() });
        }
    }
    budgets
}

/// Gives every budget its hash tag: budgets that one rule draws from together must live on one
/// Redis Cluster slot, so each group of budgets linked by rules takes its smallest name.
fn link_budgets(specs: BTreeMap<String, Budget>, drawn: &[Vec<String>]) -> BTreeMap<String, Arc<Budget>> {
    let mut tag: BTreeMap<&str, &str> = specs.keys().map(|name| (name.as_str(), name.as_str())).collect();
    // Union by smallest name until nothing changes (budgets are few).
    loop {
        let mut changed = false;
        for names in drawn {
            let Some(smallest) = names.iter().filter_map(|n| tag.get(n.as_str()).copied()).min() else { continue };
            // A budget that did not validate has no tag (its error is reported already).
            for name in names {
                let Some(&root) = tag.get(name.as_str()) else { continue };
                for value in tag.values_mut().filter(|v| **v == root && root != smallest) {
                    *value = smallest;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let tags: BTreeMap<String, String> = tag.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    specs
        .into_iter()
        .map(|(name, budget)| (name.clone(), Arc::new(Budget { tag: tags[&name].clone(), ..budget })))
        .collect()
}

fn parse_adaptive(raw: &RawAdaptive) -> Result<Adaptive, String> {
    let fraction = |name: &str, value: Option<f64>, default: f64, open_low: bool, open_high: bool| {
        let value = value.unwrap_or(default);
        match fraction_ppm(value) {
            Some(ppm) if !((open_low && ppm == 0) || (open_high && ppm == crate::budgets::PPM)) => Ok(ppm),
            _ => Err(format!(
                "{name} must be a fraction {} 0 and {} 1, got {value}",
                if open_low { "above" } else { "from" },
                if open_high { "below" } else { "at most" }
            )),
        }
    };
    let margin = fraction("margin", raw.margin, 0.1, false, true)?;
    let decrease = fraction("decrease", raw.decrease, 0.9, true, true)?;
    let min = fraction("min", raw.min, 0.2, true, false)?;
    let step = fraction("step", raw.step, 0.1, true, false)?;
    if min > crate::budgets::PPM - margin {
        return Err(format!("min {} is above 1 - margin ({})", min as f64 / 1e6, 1.0 - margin as f64 / 1e6));
    }
    Ok(Adaptive { margin, decrease, min, step })
}

fn validate_limits(raw: &[RawLimit], errors: &mut RuleErrors<'_, '_>) -> Option<Vec<Limit>> {
    if raw.is_empty() {
        errors.push("limits", "at least one limit is required".into());
        return None;
    }
    let mut limits = Vec::new();
    let mut seen: HashMap<(&'static str, Millis), usize> = HashMap::new();
    let mut ok = true;
    for (i, raw) in raw.iter().enumerate() {
        let field = |name: &str| format!("limits[{i}].{name}");
        let limit = match u64::try_from(raw.limit) {
            Ok(n) => Some(n),
            Err(_) => {
                errors.push(&field("limit"), format!("must be at least 1, got {}", raw.limit));
                None
            }
        };
        let per = errors.check(&field("per"), parse_duration(&raw.per));
        let window = match raw.window.as_deref().unwrap_or("fixed") {
            "fixed" => match raw.placement.as_deref().unwrap_or("start") {
                "start" => Some(Window::Fixed(Placement::Start)),
                "spread" => Some(Window::Fixed(Placement::Spread)),
                other => {
                    errors.push(&field("placement"), format!("unknown placement '{other}', expected start or spread"));
                    None
                }
            },
            "sliding" => Some(Window::Sliding),
            "gcra" => match u64::try_from(raw.burst.unwrap_or(1)) {
                Ok(burst) => Some(Window::Gcra { burst }),
                Err(_) => {
                    let burst = raw.burst.unwrap_or(1);
                    errors.push(&field("burst"), format!("must be at least 1, got {burst}"));
                    None
                }
            },
            other => {
                errors.push(&field("window"), format!("unknown window '{other}', expected fixed, sliding or gcra"));
                None
            }
        };
        if raw.burst.is_some() && !matches!(window, Some(Window::Gcra { .. }) | None) {
            errors.push(&field("burst"), "applies only to window: gcra".into());
            ok = false;
        }
        if raw.placement.is_some() && !matches!(window, Some(Window::Fixed(_)) | None) {
            errors.push(&field("placement"), "applies only to window: fixed".into());
            ok = false;
        }
        match (limit, per, window) {
            (Some(limit), Some(per), Some(window)) => match Limit::new(limit, per, window) {
                Ok(limit) => {
                    if let Some(first) = seen.insert((window.kind(), per), i) {
                        errors.push(&format!("limits[{i}]"), format!("repeats the window and per of limits[{first}]"));
                        ok = false;
                    }
                    limits.push(limit);
                }
                Err(invalid) => {
                    errors.push(&field(invalid.field()), invalid.to_string());
                    ok = false;
                }
            },
            _ => ok = false,
        }
    }
    ok.then_some(limits)
}

fn parse_cost(value: &Value) -> Result<Cost, String> {
    match value {
        Value::Number(n) => match n.as_i64() {
            Some(n) if n >= 1 => Ok(Cost::Fixed(n as u64)),
            _ => Err(format!("must be an integer of at least 1 or a template, got {n}")),
        },
        Value::String(text) => {
            let template = Template::parse(text)?;
            match template.as_literal() {
                Some(literal) => literal
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .map(Cost::Fixed)
                    .ok_or_else(|| format!("must be an integer of at least 1 or a template, got '{literal}'")),
                None => Ok(Cost::Template(template)),
            }
        }
        _ => Err("must be an integer of at least 1 or a template".into()),
    }
}

fn parse_on_missing_key(value: &Value) -> Result<OnMissingKey, String> {
    const EXPECTED: &str = "expected dlq or { fallback_key: <key> }";
    match value {
        Value::String(s) if s == "dlq" => Ok(OnMissingKey::Dlq),
        Value::Mapping(map) if map.len() == 1 => match map.get("fallback_key").and_then(Value::as_str) {
            Some(key) if !key.is_empty() => Ok(OnMissingKey::FallbackKey(key.to_owned())),
            _ => Err(EXPECTED.into()),
        },
        _ => Err(EXPECTED.into()),
    }
}

fn valid_rule_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A Pub/Sub topic id (`payouts-ready`) or full name (`projects/p/topics/payouts-ready`).
fn check_topic(topic: &str) -> Result<(), String> {
    let id = match topic.strip_prefix("projects/") {
        Some(rest) => match rest.split_once("/topics/") {
            Some((project, id)) if !project.is_empty() && !project.contains('/') => id,
            _ => return Err(format!("'{topic}' is not projects/<project>/topics/<id>")),
        },
        None => topic,
    };
    let valid = (3..=255).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_alphabetic())
        && !id.starts_with("goog")
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.~+%".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "'{topic}' is not a valid Pub/Sub topic id (3-255 of A-Z a-z 0-9 - _ . ~ + %, starting with a letter, not goog)"
        ))
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(()),
        _ => Err(format!("'{url}' is not an http(s) URL")),
    }
}
