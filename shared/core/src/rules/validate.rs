//! From the raw shapes to validated rules: every field checked, every problem reported.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_yaml_ng::Value;

use super::errors::*;
use super::raw::*;
use super::*;
use crate::budgets::{Adaptive, Budget, FeedbackTarget, LatencyControl, Leases, PPM, fraction_ppm};
use crate::fair::{Fair, MAX_WEIGHT};
use crate::template::Template;
use crate::time::{Millis, parse_duration};

pub(super) fn rule_label(raw: &Value, index: usize) -> String {
    match raw.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => format!("rule '{name}'"),
        _ => format!("rule #{}", index + 1),
    }
}

/// A rule and the names of the budgets it draws from (linked once every rule is read).
pub(super) fn validate_rule(
    raw: Value,
    errors: &mut RuleErrors<'_, '_>,
    default_dlq: Option<&TopicName>,
    budgets: &[String],
) -> Option<(Rule, Vec<String>)> {
    let raw: RawRule = match deserialize(raw) {
        Ok(raw) => raw,
        Err(found) => {
            for (field, message) in found {
                errors.push(&field, message);
            }
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
    let park_horizon = match raw.park_horizon.as_deref().map(str::trim) {
        None => Some(Some(DEFAULT_PARK_HORIZON)),
        Some("off") => Some(None),
        // Said, not ignored: a horizon on a rule that never parks would promise what it cannot.
        Some(_) if mode == Some(Mode::Shadow) => {
            errors.push("park_horizon", "a shadow rule never parks (it enforces nothing): remove park_horizon".into());
            None
        }
        Some(text) => errors.check(
            "park_horizon",
            parse_duration(text).and_then(|horizon| match max_delay {
                Some(max_delay) if horizon > max_delay => {
                    Err(format!("{text} is longer than max_delay: nothing would ever park"))
                }
                _ => Ok(Some(horizon)),
            }),
        ),
    };
    let late_events = match raw.late_events.as_deref() {
        None | Some("wait") => Some(LateEvents::Wait),
        Some("deliver") => Some(LateEvents::Deliver),
        Some(other) => {
            errors.push("late_events", format!("unknown value '{other}', expected wait or deliver"));
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

    let learn = match (&raw.learn, &limits) {
        (None, _) => Some(None),
        (Some(value), Some(limits)) => errors.check("learn", parse_learn(value, limits).map(Some)),
        (Some(_), None) => None,
    };
    let classes = match (raw.classes, &limits) {
        (None, _) => Some(None),
        (Some(raw), Some(limits)) => validate_classes(raw, (&id, limits), adaptive.flatten(), errors),
        (Some(_), None) => None,
    };

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
        late_events: late_events?,
        count_refused: raw.count_refused.unwrap_or(false),
        park_horizon: park_horizon?,
        classes: classes?,
        learn: learn?,
    };
    Some((rule, budget_names))
}

/// A rule's classes: names, the `from` template, reserves (as floors of a calendar of the rule's
/// limits, which must be fixed windows, at the rule's adaptive level when it has one).
fn validate_classes(
    raw: RawClasses,
    (id, limits): (&str, &[Limit]),
    adaptive: Option<Adaptive>,
    errors: &mut RuleErrors<'_, '_>,
) -> Option<Option<Classes>> {
    let before = errors.errors.list.len();
    let from = errors.check("classes.from", Template::parse(&raw.from));
    const CLASS_NAME: &str = "a class name must be 1-64 characters of A-Z, a-z, 0-9, _ or -";
    if !valid_rule_name(&raw.default) {
        errors.push("classes.default", CLASS_NAME.into());
    }
    let reserve = raw.reserve.unwrap_or_default();
    for name in reserve.keys().filter(|name| !valid_rule_name(name)) {
        errors.push(&format!("classes.reserve.{name}"), CLASS_NAME.into());
    }
    let floors = validate_floors(reserve, "classes.reserve", errors);
    if let Some((i, limit)) = limits.iter().enumerate().find(|(_, l)| !matches!(l.window(), Window::Fixed(_))) {
        errors.push(
            &format!("limits[{i}].window"),
            format!(
                "classes need fixed windows (placement start or spread), not {}: classes book a key's windows out of order, which only a count per window can take",
                limit.window().kind()
            ),
        );
    }
    if errors.errors.list.len() > before {
        return None;
    }
    let floors = floors?;
    let mut names: Vec<String> = floors.iter().map(|(name, _)| name.clone()).collect();
    if !names.contains(&raw.default) {
        names.push(raw.default.clone());
    }
    let calendar = Arc::new(Budget {
        name: id.to_owned(),
        limits: limits.to_vec(),
        max_share: None,
        adaptive,
        floors,
        per_key: true,
        fair: None,
        leases: None,
        tag: String::new(),
    });
    Some(Some(Classes { from: from?, default: raw.default, names, calendar, draws: Vec::new() }))
}

/// Each budget of the `budgets:` section, valid, without its hash tag yet (see [`link_budgets`]).
pub(super) fn validate_budgets(raw: BTreeMap<String, Value>, errors: &mut Errors<'_>) -> BTreeMap<String, Budget> {
    let mut budgets = BTreeMap::new();
    for (name, value) in raw {
        let label = format!("budget '{name}'");
        let mut errors = RuleErrors { errors, label: &label };
        if !valid_rule_name(&name) {
            errors.push("", "a budget name must be 1-64 characters of A-Z, a-z, 0-9, _ or -".into());
            continue;
        }
        // Each form read as itself (the schema's RawBudget is untagged), so that an error names
        // the field it is in.
        let parsed = match value {
            Value::Mapping(_) => deserialize::<RawBudgetFields>(value),
            Value::Sequence(_) => deserialize::<Vec<RawLimit>>(value)
                .map(|limits| RawBudgetFields {
                    limits,
                    max_share: None,
                    adaptive: None,
                    floors: None,
                    leases: None,
                    fair: None,
                    weights: None,
                })
                .map_err(|found| found.into_iter().map(|(path, message)| (format!("limits{path}"), message)).collect()),
            _ => Err(vec![(
                String::new(),
                "expected a list of limits or { limits, max_share, adaptive, floors, leases, fair, weights }".into(),
            )]),
        };
        let fields = match parsed {
            Ok(fields) => fields,
            Err(found) => {
                for (field, message) in found {
                    errors.push(&field, message);
                }
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
        let floors = budget_floors(fields.floors.unwrap_or_default(), &mut errors)
            .and_then(|floors| validate_floors(floors, "floors", &mut errors));
        ok &= floors.is_some();
        let leases = fields.leases.map(|raw| validate_leases(raw, &limits, &mut errors));
        ok &= !matches!(leases, Some(None));
        if leases.is_some() && floors.as_ref().is_some_and(|f| !f.is_empty()) {
            errors.push(
                "leases",
                "a leased budget cannot hold floors: a floor keeps a window's units for one rule until the window starts, and that rule's keys are spread over every partition, so its units would either sit in the partitions that leased them (a floor that strands where the rule's events do not come) or stay with the home (a trip to it for each of the rule's events)".into(),
            );
            ok = false;
        }
        let fair = validate_fair(fields.fair, fields.weights, &mut errors);
        ok &= fair.is_some();
        if ok {
            let floors = floors.unwrap_or_default();
            let (leases, fair) = (leases.flatten(), fair.flatten());
            budgets.insert(
                name.clone(),
                Budget { name, limits, max_share, adaptive, floors, per_key: false, fair, leases, tag: String::new() },
            );
        }
    }
    budgets
}

/// A budget's `fair` and `weights`: `Some(None)` when it is not fair, `None` when they are wrong.
fn validate_fair(
    fair: Option<bool>,
    weights: Option<BTreeMap<String, u64>>,
    errors: &mut RuleErrors<'_, '_>,
) -> Option<Option<Fair>> {
    match (fair, weights) {
        (None | Some(false), None) => Some(None),
        (None | Some(false), Some(_)) => {
            errors.push("weights", "weights share a fair budget's windows: add fair: true, or remove weights".into());
            None
        }
        (Some(true), weights) => {
            let weights = weights.unwrap_or_default();
            let mut ok = true;
            for (key, &weight) in &weights {
                if !(1..=MAX_WEIGHT).contains(&weight) {
                    errors.push(
                        &format!("weights.{key}"),
                        format!("must be a whole number from 1 to {MAX_WEIGHT}, got {weight}"),
                    );
                    ok = false;
                }
            }
            ok.then_some(Some(Fair { weights }))
        }
    }
}

/// A budget's `leases`: partitions at least 2, a chunk above 0 and at most 1, start-placed windows
/// (spread placement would put every partition's events at the same places in a window).
fn validate_leases(raw: RawLeases, limits: &[Limit], errors: &mut RuleErrors<'_, '_>) -> Option<Leases> {
    let mut ok = true;
    if !(2..=1024).contains(&raw.partitions) {
        errors.push("leases.partitions", format!("must be 2 to 1024, got {}", raw.partitions));
        ok = false;
    }
    let chunk = match raw.chunk {
        None => Leases::default_chunk(raw.partitions),
        Some(chunk) => fraction_ppm(chunk).filter(|&ppm| ppm > 0).unwrap_or_else(|| {
            errors.push("leases.chunk", format!("must be a fraction above 0 and at most 1, got {chunk}"));
            ok = false;
            0
        }),
    };
    if let Some(i) = limits.iter().position(|l| l.window() == Window::Fixed(Placement::Spread)) {
        errors.push(
            &format!("limits[{i}].placement"),
            "a leased budget takes start placement: each partition books its own lease, so spread positions would collide".into(),
        );
        ok = false;
    }
    ok.then_some(Leases { partitions: raw.partitions, chunk })
}

/// A budget's floors by member: a rule's as its name, each named key's of a rule as `<rule>|<key>`
/// (rule names hold no `|`; the rule's id replaces its name once the rules are read).
fn budget_floors(raw: BTreeMap<String, RawFloor>, errors: &mut RuleErrors<'_, '_>) -> Option<BTreeMap<String, f64>> {
    let mut floors = BTreeMap::new();
    for (rule, floor) in raw {
        match floor {
            RawFloor::Rule(share) => {
                floors.insert(rule, share);
            }
            RawFloor::Keys(keys) if keys.is_empty() => {
                errors.push(&format!("floors.{rule}"), "names no key: give the rule a share, or keys their own".into());
                return None;
            }
            RawFloor::Keys(keys) => {
                floors.extend(keys.into_iter().map(|(key, share)| (format!("{rule}|{key}"), share)))
            }
        }
    }
    Some(floors)
}

/// Floors (a budget's, by rule or key) or reserves (classes') in ppm, each above 0 and together at most 1
/// (which rules a budget's floors name is checked once the rules are read).
fn validate_floors(
    raw: BTreeMap<String, f64>,
    field: &str,
    errors: &mut RuleErrors<'_, '_>,
) -> Option<Vec<(String, u64)>> {
    let mut floors = Vec::new();
    for (name, floor) in &raw {
        match fraction_ppm(*floor).filter(|&ppm| ppm > 0) {
            Some(ppm) => floors.push((name.clone(), ppm)),
            None => errors.push(
                &format!("{field}.{}", name.replacen('|', ".", 1)),
                format!("must be a fraction above 0 and at most 1, got {floor}"),
            ),
        }
    }
    if floors.len() < raw.len() {
        return None;
    }
    let sum: u64 = floors.iter().map(|(_, ppm)| ppm).sum();
    if sum > PPM {
        let terms: Vec<String> =
            raw.iter().map(|(name, floor)| format!("{} {floor}", name.replacen('|', ".", 1))).collect();
        let message = format!(
            "sum to {} ({}): at most 1, since each must fit in every window at once",
            sum as f64 / PPM as f64,
            terms.join(" + ")
        );
        errors.push(field, message);
        return None;
    }
    Some(floors)
}

/// Gives every budget its hash tag: budgets that one rule draws from together must live on one
/// Redis Cluster slot, so each group of budgets linked by rules takes its smallest name.
pub(super) fn link_budgets(specs: BTreeMap<String, Budget>, drawn: &[Vec<String>]) -> BTreeMap<String, Arc<Budget>> {
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

pub(super) fn parse_adaptive(raw: &RawAdaptive) -> Result<Adaptive, String> {
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
    let latency = raw.latency.as_ref().map(parse_latency).transpose()?;
    Ok(Adaptive { margin, decrease, min, step, latency })
}

fn parse_latency(raw: &RawLatency) -> Result<LatencyControl, String> {
    let tolerance = raw.tolerance.unwrap_or(2.0);
    if !(tolerance.is_finite() && tolerance > 1.0 && tolerance <= 10.0) {
        return Err(format!("latency.tolerance must be above 1 and at most 10, got {tolerance}"));
    }
    let fraction = |name: &str, value: Option<f64>, default: f64| match fraction_ppm(value.unwrap_or(default)) {
        Some(ppm) if ppm > 0 => Ok(ppm),
        _ => Err(format!("latency.{name} must be a fraction above 0 and at most 1, got {}", value.unwrap_or(default))),
    };
    let recover = raw.recover.unwrap_or(8);
    if !(1..=100).contains(&recover) {
        return Err(format!("latency.recover must be a whole number of windows from 1 to 100, got {recover}"));
    }
    Ok(LatencyControl {
        tolerance: (tolerance * PPM as f64).round() as u64,
        smoothing: fraction("smoothing", raw.smoothing, 0.5)?,
        baseline: fraction("baseline", raw.baseline, 0.05)?,
        recover,
        shadow: raw.shadow.unwrap_or(false),
    })
}

pub(super) fn validate_limits(raw: &[RawLimit], errors: &mut RuleErrors<'_, '_>) -> Option<Vec<Limit>> {
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

pub(super) fn parse_cost(value: &Value) -> Result<Cost, String> {
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

pub(super) fn parse_on_missing_key(value: &Value) -> Result<OnMissingKey, String> {
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

/// `learn: headers`, or `{ from: headers, policies: { NAME: PERIOD }, above_rules: BOOL }`; each
/// period must be one of the rule's limits'.
pub(super) fn parse_learn(value: &Value, limits: &[Limit]) -> Result<Learn, String> {
    const EXPECTED: &str = "expected headers or { from: headers, policies: { NAME: PERIOD }, above_rules: true|false }";
    let from = |v: Option<&Value>| match v.and_then(Value::as_str) {
        Some("headers") => Ok(()),
        Some(other) => Err(format!("learns from '{other}': the only source is headers")),
        None => Err(EXPECTED.to_owned()),
    };
    let Value::Mapping(map) = value else {
        from(Some(value))?;
        return Ok(Learn::default());
    };
    from(map.get("from"))?;
    let mut learn = Learn::default();
    for (field, v) in map {
        match field.as_str() {
            Some("from") => {}
            Some("above_rules") => learn.above_rules = v.as_bool().ok_or("above_rules must be true or false")?,
            Some("policies") => {
                let Value::Mapping(policies) = v else { return Err("policies: a map of NAME: PERIOD".into()) };
                for (name, period) in policies {
                    let name = name.as_str().ok_or("policies: each name is a string")?;
                    let text = period.as_str().ok_or(format!("policies.{name}: a period such as 1s"))?;
                    let per = crate::time::parse_duration(text).map_err(|e| format!("policies.{name}: {e}"))?;
                    if !limits.iter().any(|l| l.per() == per) {
                        return Err(format!("policies.{name}: {text} is the period of none of the rule's limits"));
                    }
                    learn.policies.insert(name.to_owned(), per);
                }
            }
            _ => return Err(format!("unknown field {field:?}; {EXPECTED}")),
        }
    }
    Ok(learn)
}

pub(super) fn valid_rule_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A Pub/Sub topic id (`payouts-ready`) or full name (`projects/p/topics/payouts-ready`).
pub(super) fn check_topic(topic: &str) -> Result<(), String> {
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

pub(super) fn check_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(()),
        _ => Err(format!("'{url}' is not an http(s) URL")),
    }
}
