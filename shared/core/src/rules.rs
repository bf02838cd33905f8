//! The rules file: parsing and validation of the YAML contract (docs/rules.md: "Rules").
//!
//! Every problem is reported, not only the first, each naming the file, the rule, the field and why.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde_yaml_ng::Value;

use crate::budgets::{Adaptive, Budget, FeedbackTarget};
pub use crate::limit::{InvalidLimit, Limit, MAX_WINDOW, Placement, Window};
use crate::template::Template;
use crate::time::{DAY, Millis, SECOND, parse_duration};

mod errors;
mod raw;
mod validate;

use errors::*;
pub use errors::{ConfigError, ConfigErrors};
pub use raw::schema;
use raw::*;
use validate::*;

/// Cloud Tasks holds a task for at most 30 days.
pub const MAX_DELAY_LIMIT: Millis = 30 * DAY;
/// An inline wait holds the push request open; Pub/Sub's deadline and Cloud Run's cost say keep it short.
pub const MAX_INLINE_WAIT: Millis = 10 * SECOND;
pub const DEFAULT_INLINE_WAIT: Millis = SECOND;
/// `park_horizon` when a rule does not say.
pub const DEFAULT_PARK_HORIZON: Millis = 2 * SECOND;

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
    /// What an event that comes later than that does.
    pub late_events: LateEvents,
    /// A call the downstream refused (429/503) still counts: its slot is kept when it is
    /// rescheduled (`OldSlot::Kept`); by default its units go back.
    pub count_refused: bool,
    /// `park_horizon`: while a key is throttled, an event whose slot lies further ahead than this
    /// parks (the model's `Status::Parked`); `None`: `off`. See [`Rule::park`].
    pub park_horizon: Option<Millis>,
    /// Classes under its limits (docs/rules.md: "Classes under one limit").
    pub classes: Option<Classes>,
    /// `learn:`: the key follows what the partner says of its limits on its answers (docs/rules.md:
    /// "Learning the partner's limits"); `None`: its headers are not read.
    pub learn: Option<Learn>,
}

/// A rule's `learn:`: which partner policy holds which of its limits, and how far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learn {
    /// A partner policy (its name) held to the rule's limit of this period; a policy not named
    /// here holds the limit whose period is its window, if any.
    pub policies: BTreeMap<String, Millis>,
    /// Whether a learned limit may be above the file's count (default: only lower).
    pub above_rules: bool,
}

impl Learn {
    /// The rule's limit a partner policy holds: the one its name maps to, else the one whose
    /// period is the policy's window.
    pub fn limit_for<'a>(&self, limits: &'a [Limit], policy: &crate::partner::Policy) -> Option<&'a Limit> {
        let per = policy.name.as_ref().and_then(|name| self.policies.get(name).copied()).or(policy.window)?;
        limits.iter().find(|l| l.per() == per)
    }

    /// The count a policy of `quota` sets for a limit of `count` in the rules file: never above it
    /// unless `above_rules`.
    pub fn learned_count(&self, count: u64, quota: u64) -> u64 {
        if self.above_rules { quota } else { quota.min(count) }.max(1)
    }
}

/// A rule's `classes:`. An event of class `c` of key `k` is reserved by entity `k#c` (its own
/// FIFO) against the key's calendar of the rule's limits, where each class's reserve is a floor.
#[derive(Debug, Clone)]
pub struct Classes {
    /// Where an event's class is read.
    pub from: Template,
    /// The class of an event whose template renders nothing or a name not listed.
    pub default: String,
    /// Every class: the default and each one with a reserve.
    pub names: Vec<String>,
    /// The rule's limits as one calendar per key, each reserve a floor of it ([`Budget::per_key`]).
    pub calendar: Arc<Budget>,
    /// The calendar, then the rule's budgets: what an event of a class draws from.
    pub draws: Vec<Arc<Budget>>,
}

impl Classes {
    /// The event's class: the template's value when it names a class, else the default.
    pub fn class_of(&self, event: &crate::event::Event) -> &str {
        let rendered = self.from.render(event).ok();
        rendered.and_then(|name| self.names.iter().find(|n| **n == name)).unwrap_or(&self.default)
    }

    /// The entity that reserves the events of `key`'s class `class`: `<key>#<class>`.
    pub fn entity(key: &str, class: &str) -> String {
        format!("{key}#{class}")
    }

    /// An entity of a classed rule as its key and class (class names hold no `#`).
    pub fn split(entity: &str) -> Option<(&str, &str)> {
        entity.rsplit_once('#')
    }

    /// The key and class an entity of the rule reserves as: a class's entity `<key>#<class>` as
    /// that class; any other entity (a key that waited or booked before the rule had classes) as
    /// the default class of its own key, so that what it still holds is counted by its key's
    /// calendar.
    pub fn of_entity<'a>(&'a self, entity: &'a str) -> (&'a str, &'a str) {
        self.class_entity(entity).unwrap_or((entity, &self.default))
    }

    /// A class's entity `<key>#<class>` (its suffix one of the classes) as its key and class;
    /// `None` for any other entity.
    pub fn class_entity<'k>(&self, entity: &'k str) -> Option<(&'k str, &'k str)> {
        Self::split(entity).filter(|(_, class)| self.names.iter().any(|n| n == class))
    }

    /// Each class's reserve of a window with `count` in force, in units.
    pub fn reserves(&self, count: u64) -> impl Iterator<Item = (&str, u64)> {
        self.calendar.floor_units(count)
    }
}

impl Rule {
    /// The key an entity of the rule belongs to: a class's entity `<key>#<class>` is its key's;
    /// any other entity (every entity of a rule without classes, a bare key that parked or booked
    /// before its rule had them) is its own, a `#` in it included.
    pub fn scope_of<'k>(&self, entity: &'k str) -> &'k str {
        self.classes.as_ref().and_then(|classes| classes.class_entity(entity)).map_or(entity, |(key, _)| key)
    }

    /// The fair budget it draws from, if any (a rule draws from one at most).
    pub fn fair_budget(&self) -> Option<&Budget> {
        self.budgets.iter().find(|b| b.fair.is_some()).map(|b| &**b)
    }

    /// The horizon past which a throttled key's events park (`ReserveRequest::park`): the rule's
    /// `park_horizon` when it enforces (a class of a key parks in its own queue); else `None`.
    pub fn park(&self) -> Option<Millis> {
        self.park_horizon.filter(|_| self.mode == Mode::Enforce)
    }
}

/// What an event that reaches Drip after its slot plus the rule's `delivery_margin` does (a push
/// redelivered after the limiter was killed, a Cloud Task created late or retried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateEvents {
    /// It takes the earliest slot that fits now (its old one given back), so no window at the
    /// consumer holds more than its limit.
    Wait,
    /// It goes at once: latency over the limit.
    Deliver,
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
    crate::time::format_duration(per)
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

    /// The budget it draws from that is named `name`, if any.
    pub fn budget(&self, name: &str) -> Option<&Budget> {
        self.budgets.iter().find(|b| b.name == name).map(|b| &**b)
    }

    /// The budget its feedback goes to, when not the key.
    pub fn feedback_budget(&self) -> Option<&Budget> {
        match &self.feedback {
            FeedbackTarget::Key => None,
            FeedbackTarget::Budget(name) => self.budget(name),
        }
    }
}

impl RuleSet {
    /// What the file allows but a person likely did not mean, as `drip check-config` warns of it
    /// (`file` is left empty for the caller to fill): a rule whose cost is a template, under a
    /// gcra limit that takes fewer units at once (`burst`, default 1) than its count, dead-letters
    /// every event whose cost is above that burst (`cost_exceeds_limit`), whatever the rate.
    pub fn warnings(&self) -> Vec<ConfigError> {
        let mut warnings = Vec::new();
        for rule in &self.rules {
            let Cost::Template(template) = &rule.cost else { continue };
            let own = rule.limits.iter().enumerate().map(|(i, l)| (format!("limits[{i}]"), l));
            let budgets = rule.budgets.iter().flat_map(|b| {
                b.limits.iter().enumerate().map(move |(i, l)| (format!("budgets.{}.limits[{i}]", b.name), l))
            });
            for (field, limit) in own.chain(budgets) {
                let at_once = limit.max_cost(limit.limit());
                if at_once < limit.limit() {
                    warnings.push(ConfigError {
                        file: String::new(),
                        rule: Some(format!("rule '{}'", rule.name)),
                        field: format!("{field}.burst"),
                        message: format!(
                            "the cost is a template ('{template}') and this gcra limit takes at most {at_once} unit{} at once: \
                             an event whose cost is above {at_once} can never be scheduled and is dead-lettered \
                             (cost_exceeds_limit); set burst to the largest cost an event may have",
                            if at_once == 1 { "" } else { "s" }
                        ),
                    });
                }
            }
        }
        warnings
    }

    /// The rule that governs a message: the first whose `match` holds, in file order.
    pub fn find(&self, attributes: &BTreeMap<String, String>) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(attributes))
    }

    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rule_index(name).map(|i| &self.rules[i])
    }

    /// Where the rule named `name` is in `rules` (for a holder of the set that keeps the rule by
    /// its place rather than by a borrow).
    pub fn rule_index(&self, name: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.name == name)
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
                Err(found) => {
                    for (field, message) in found {
                        errors.top(&field, message);
                    }
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
        let named: Vec<String> =
            top.rules.iter().filter_map(|raw| raw.get("name").and_then(|n| n.as_str()).map(str::to_owned)).collect();
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
        // A budget's floors name rules (or keys of rules: `<rule>|<key>`); its state counts them by
        // the rule's id (what survives a rename).
        let mut specs = specs;
        for budget in specs.values_mut() {
            for (member, _) in &mut budget.floors {
                let (name, key) =
                    member.split_once('|').map_or((member.clone(), None), |(n, k)| (n.to_owned(), Some(k)));
                let drawing =
                    rules.iter().zip(&drawn).find(|(r, names)| r.name == name && names.contains(&budget.name));
                if let Some((rule, _)) = drawing {
                    *member = key.map_or_else(|| rule.id.clone(), |key| format!("{}|{key}", rule.id));
                    continue;
                }
                let message = if rules.iter().any(|r| r.name == name) {
                    format!("rule '{name}' does not draw from this budget: a floor is held for a rule that lists it")
                } else if named.contains(&name) {
                    continue; // The rule's own errors are reported.
                } else {
                    format!("there is no rule '{name}' in this file")
                };
                let label = format!("budget '{}'", budget.name);
                RuleErrors { errors: &mut errors, label: &label }.push(&format!("floors.{name}"), message);
            }
        }
        let budgets = link_budgets(specs, &drawn);
        for (rule, names) in rules.iter_mut().zip(&drawn) {
            // A budget that did not validate is reported already (and the file refused).
            rule.budgets = names.iter().filter_map(|name| budgets.get(name).cloned()).collect();
            if let Some(classes) = &mut rule.classes {
                classes.draws = std::iter::once(classes.calendar.clone()).chain(rule.budgets.iter().cloned()).collect();
            }
            if let Some(limit) =
                rule.budgets.iter().flat_map(|b| &b.limits).find(|l| 2 * rule.delivery_margin > l.per())
            {
                let label = format!("rule '{}'", rule.name);
                RuleErrors { errors: &mut errors, label: &label }
                    .push("delivery_margin", format!("must be at most half of every window of its budgets ({limit})"));
            }
            let partitions: Vec<Option<u32>> = rule.budgets.iter().map(|b| b.leases.map(|l| l.partitions)).collect();
            if partitions.windows(2).any(|pair| pair[0] != pair[1]) {
                let label = format!("rule '{}'", rule.name);
                let each: Vec<String> = rule
                    .budgets
                    .iter()
                    .map(|b| match b.leases {
                        Some(l) => format!("'{}' leased over {} partitions", b.name, l.partitions),
                        None => format!("'{}' not leased", b.name),
                    })
                    .collect();
                RuleErrors { errors: &mut errors, label: &label }.push(
                    "budgets",
                    format!(
                        "budgets drawn from together must be leased over the same partitions, or none of them ({}): a key lives in one partition of all of them",
                        each.join(", ")
                    ),
                );
            }
            let fair: Vec<&str> = rule.budgets.iter().filter(|b| b.fair.is_some()).map(|b| b.name.as_str()).collect();
            if let Some(first) = fair.first() {
                let label = format!("rule '{}'", rule.name);
                let mut errors = RuleErrors { errors: &mut errors, label: &label };
                let refusal = if fair.len() > 1 {
                    Some((
                        "budgets",
                        format!(
                            "draws from fair budgets {fair:?}: a key waits in one fair budget's ring, so a rule draws from one at most"
                        ),
                    ))
                } else if rule.mode == Mode::Enforce && rule.park_horizon.is_none() {
                    Some((
                        "park_horizon",
                        format!(
                            "is off, but the rule draws from fair budget '{first}', which parks what lies past its near horizon: remove park_horizon: off"
                        ),
                    ))
                } else {
                    None
                };
                if let Some((field, message)) = refusal {
                    errors.push(field, message);
                }
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
