//! What an edit of the rules file does to entities that already have a backlog (docs/rules.md: "Changing
//! limits"), rule by rule, matched by id: `drip rules diff OLD NEW`.

use std::fmt;

use crate::budgets::{Budget, PPM};
use crate::rules::{Cost, Mode, Rule, RuleSet, Window};
use crate::schedule::{override_id, state_id};
use crate::time::{Millis, format_duration};

/// How an edit treats entities that already have a backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Safety {
    /// The promise holds as it is: FIFO, and no window over the larger of the old and new count.
    Safe,
    /// The promise holds, at the cost of delay: entities with a backlog wait past their frontier.
    Delays,
    /// The promise can break for the old backlog (or events change rule): plan it.
    NeedsCare,
}

impl fmt::Display for Safety {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Safety::Safe => "safe",
            Safety::Delays => "delays",
            Safety::NeedsCare => "needs care",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub safety: Safety,
    /// What changed and what it does.
    pub what: String,
}

/// The edits of one rule (by id); `name` is its name in the new file (or the old one, if removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDiff {
    pub id: String,
    pub name: String,
    pub edits: Vec<Edit>,
}

fn edit(safety: Safety, what: impl Into<String>) -> Edit {
    Edit { safety, what: what.into() }
}

/// Every rule that differs between `old` and `new`, in the new file's order, then removed rules.
pub fn diff(old: &RuleSet, new: &RuleSet) -> Vec<RuleDiff> {
    let mut diffs = Vec::new();
    for rule in &new.rules {
        let edits = match old.rule_by_id(&rule.id) {
            Some(before) => rule_edits(before, rule),
            None => {
                let mut edits = vec![edit(Safety::Safe, "added: its entities start empty")];
                if let Some(namesake) = old.rule(&rule.name) {
                    edits.push(edit(
                        Safety::NeedsCare,
                        format!(
                            "id changed from '{}': every entity starts empty, so until the old backlog drains a window can hold the old backlog and new events (keep `id: {}` to keep the state)",
                            namesake.id, namesake.id
                        ),
                    ));
                }
                edits
            }
        };
        if !edits.is_empty() {
            diffs.push(RuleDiff { id: rule.id.clone(), name: rule.name.clone(), edits });
        }
    }
    for rule in &old.rules {
        if new.rule_by_id(&rule.id).is_none() && new.rule(&rule.name).is_none() {
            diffs.push(RuleDiff {
                id: rule.id.clone(),
                name: rule.name.clone(),
                edits: vec![edit(
                    Safety::NeedsCare,
                    "removed: its waiting tasks are dead-lettered (overflow_topic_retired) unless another rule owns their overflow topic; its messages now match another rule or none",
                )],
            });
        }
    }
    diffs
}

fn cost_text(cost: &Cost) -> String {
    match cost {
        Cost::Fixed(n) => n.to_string(),
        Cost::Template(template) => format!("\"{template}\""),
    }
}

fn rule_edits(old: &Rule, new: &Rule) -> Vec<Edit> {
    // Every field of a rule is named here, none left to `..`: a field added to `Rule` does not
    // compile until its edit is classified below (or said to be classified elsewhere).
    let Rule {
        name,
        id: _, // rules are matched by id: an id change is a removal and an addition (`diff`)
        matcher,
        key,
        previous_key,
        limits,
        cost: _,      // below, with its text
        max_delay: _, // below, with inline_wait
        max_pause,
        inline_wait: _,     // below, with max_delay
        forward: _,         // below
        overflow_topic: _,  // below
        overflow_url: _,    // budget_edits, with delivery_margin
        dlq_topic: _,       // below
        on_missing_key: _,  // below, with overflow_format
        overflow_format: _, // below
        mode,
        budgets: _,         // budget_edits
        feedback: _,        // budget_edits, with adaptive
        adaptive: _,        // budget_edits
        delivery_margin: _, // budget_edits
        late_events,
        count_refused,
        park_horizon,
        classes: _, // class_edits
        learn,
    } = new;
    let mut edits = Vec::new();
    if &old.name != name {
        edits.push(edit(Safety::Safe, format!("renamed from '{}' (same id: state and backlog kept)", old.name)));
    }
    if &old.matcher != matcher {
        edits.push(edit(
            Safety::NeedsCare,
            "match changed: messages may move between rules, and each rule's entities count only its own",
        ));
    }
    if old.key.to_string() != key.to_string() {
        let carried = previous_key.as_ref().is_some_and(|previous| previous.to_string() == old.key.to_string());
        edits.push(if carried {
            edit(
                Safety::Delays,
                format!(
                    "key \"{}\" -> \"{}\" with previous_key: each new key starts at its old key's frontier, full up to it (FIFO and the window bound hold)",
                    old.key, key
                ),
            )
        } else {
            edit(
                Safety::NeedsCare,
                format!(
                    "key \"{}\" -> \"{}\": every key is a new entity, so until the old backlog drains a window can hold the old backlog and new events (up to twice the limit); set previous_key: \"{}\" to carry each frontier over",
                    old.key, key, old.key
                ),
            )
        });
    } else if old.previous_key.as_ref().map(ToString::to_string) != previous_key.as_ref().map(ToString::to_string) {
        edits.push(edit(Safety::Safe, "previous_key changed: it is read only when the key changes"));
    }
    if &old.mode != mode {
        edits.push(match mode {
            Mode::Enforce => edit(
                Safety::Delays,
                "mode shadow -> enforce: events now wait for their slots; a key whose shadow schedule ran ahead (slots booked that nobody waited for) holds new events behind it until those windows pass (drip inspect shows each key's backlog first)",
            ),
            Mode::Shadow => edit(
                Safety::NeedsCare,
                "mode enforce -> shadow: every new event is forwarded at once whatever the limits (the downstream may receive more than they allow); tasks already scheduled still dispatch at their slots",
            ),
        });
    }
    if &old.max_pause != max_pause {
        edits.push(edit(
            Safety::Safe,
            format!(
                "max_pause {} -> {}: caps the next pause; pauses in force keep their end",
                format_duration(old.max_pause),
                format_duration(*max_pause)
            ),
        ));
    }
    if &old.late_events != late_events {
        edits.push(edit(
            Safety::Safe,
            format!("late_events {:?} -> {:?}: from the next late event", old.late_events, late_events),
        ));
    }
    if &old.learn != learn {
        let show = |learn: &Option<crate::rules::Learn>| match learn {
            None => "off".to_owned(),
            Some(l) if l.policies.is_empty() && !l.above_rules => "headers".to_owned(),
            Some(l) => {
                format!("headers (policies {:?}, above_rules {})", l.policies.keys().collect::<Vec<_>>(), l.above_rules)
            }
        };
        edits.push(edit(
            Safety::Safe,
            format!(
                "learn {} -> {}: from the next answer; limits learned before end at their own end (drip limits clear ends one now)",
                show(&old.learn),
                show(learn)
            ),
        ));
    }
    if &old.count_refused != count_refused {
        edits.push(edit(
            Safety::Safe,
            format!(
                "count_refused {} -> {count_refused}: from the next call the downstream refuses (units already given back or kept stay so)",
                old.count_refused
            ),
        ));
    }
    if &old.park_horizon != park_horizon {
        let show = |horizon: Option<Millis>| horizon.map_or("off".to_owned(), format_duration);
        edits.push(edit(
            Safety::Safe,
            format!(
                "park_horizon {} -> {}: from the next event of a throttled key; events already parked drain as before (at the default horizon when off)",
                show(old.park_horizon),
                show(*park_horizon)
            ),
        ));
    }
    for limit in limits {
        match old.limits.iter().find(|l| override_id(l) == override_id(limit)) {
            None => edits.push(edit(
                Safety::Delays,
                format!(
                    "limit {limit} added: it counts as full up to each entity's frontier, so an entity with a backlog waits for its next window"
                ),
            )),
            Some(before) if state_id(before) != state_id(limit) => edits.push(edit(
                Safety::Delays,
                format!(
                    "limit {before} -> {limit}: a new GCRA state, full up to each entity's frontier (one interval of delay after a backlog)"
                ),
            )),
            Some(before) if before.limit() != limit.limit() => edits.push(edit(
                Safety::Safe,
                format!(
                    "limit {before} -> {limit}: usage carries over; windows in use hold at most {}",
                    before.limit().max(limit.limit())
                ),
            )),
            Some(before) if before != limit => {
                let placement = matches!((before.window(), limit.window()), (Window::Fixed(_), Window::Fixed(_)));
                let what = if placement { "placement" } else { "burst" };
                edits.push(edit(Safety::Safe, format!("limit {before} -> {limit}: {what} only, usage carries over")));
            }
            Some(_) => {}
        }
    }
    for limit in &old.limits {
        if !limits.iter().any(|l| override_id(l) == override_id(limit)) {
            edits.push(edit(Safety::Safe, format!("limit {limit} removed: one constraint less from the next event")));
        }
    }
    if old.cost != new.cost {
        edits.push(edit(
            Safety::Safe,
            format!("cost {} -> {}: from the next reservation", cost_text(&old.cost), cost_text(&new.cost)),
        ));
    }
    let durations = [
        ("max_delay", old.max_delay, new.max_delay, "applies to the next reservation"),
        ("inline_wait", old.inline_wait, new.inline_wait, "a reload refuses one longer than the revision's deadline"),
    ];
    for (field, before, after, note) in durations {
        if before != after {
            edits.push(edit(Safety::Safe, format!("{field} {before} ms -> {after} ms: {note}")));
        }
    }
    if old.forward != new.forward {
        edits.push(edit(Safety::Safe, "forward changed: events forwarded from now on go to the new target"));
    }
    if old.overflow_topic != new.overflow_topic {
        edits.push(edit(
            Safety::Safe,
            format!(
                "overflow_topic {} -> {}: waiting tasks publish on the new topic (its consumers must be ready)",
                old.overflow_topic, new.overflow_topic
            ),
        ));
    }
    if old.dlq_topic != new.dlq_topic {
        edits.push(edit(Safety::Safe, format!("dlq_topic {} -> {}", old.dlq_topic, new.dlq_topic)));
    }
    if old.overflow_format != new.overflow_format || old.on_missing_key != new.on_missing_key {
        edits.push(edit(Safety::Safe, "overflow_format or on_missing_key changed: from the next event"));
    }
    edits.extend(budget_edits(old, new));
    edits.extend(class_edits(old, new));
    edits
}

/// Classes added, removed or changed: what becomes of the backlog already scheduled.
fn class_edits(old: &Rule, new: &Rule) -> Vec<Edit> {
    let show = |rule: &Rule| {
        rule.classes.as_ref().map_or("none".to_owned(), |c| {
            let reserves: Vec<String> =
                c.calendar.floors.iter().map(|(class, r)| format!("{class} {}", *r as f64 / PPM as f64)).collect();
            format!("{} (default {}; reserve {})", c.names.join(", "), c.default, reserves.join(", "))
        })
    };
    match (&old.classes, &new.classes) {
        (None, None) => Vec::new(),
        (None, Some(_)) => {
            // A key's calendar carries over its key's fixed windows (schedule.rs's carry_over).
            let carried = new.limits.iter().all(|l| {
                old.limits.iter().any(|o| o.per() == l.per() && matches!(o.window(), crate::rules::Window::Fixed(_)))
            });
            let classes = show(new);
            vec![if carried && new.park().is_some() {
                edit(
                    Safety::Safe,
                    format!(
                        "classes added ({classes}): each key's calendar takes over the backlog already scheduled under the key (its last window counted, every class after its last slot), and what a key parked before (while paused or throttled, or waiting in a fair budget) drains as its default class against that calendar, so every window stays exact; the classes' events may book before those parked events, as they would before any parked backlog"
                    ),
                )
            } else if carried {
                edit(
                    Safety::Safe,
                    format!(
                        "classes added ({classes}): each key's calendar takes over the backlog already scheduled under the key (its last window counted, every class after its last slot), so every window stays exact; the classes' events wait behind that backlog, and classes overtake one another once it has drained"
                    ),
                )
            } else {
                edit(
                    Safety::NeedsCare,
                    format!(
                        "classes added ({classes}) with limits the rule did not have as fixed windows before: each key's calendar books every class after the key's backlog, but counts none of that backlog in the windows of those limits, so the window holding the backlog's last slot can hold it and the classes' events too: add classes when the rule's backlog is empty (drip inspect), or pause its keys until it drains"
                    ),
                )
            }]
        }
        (Some(_), None) => vec![edit(
            Safety::NeedsCare,
            "classes removed: the classes' backlogs keep their slots, which the keys' own limits do not count, so until they drain a window can hold them and new events too: remove classes when the rule's backlog is empty",
        )],
        (Some(before), Some(after)) => {
            let same = before.from == after.from
                && before.default == after.default
                && before.names == after.names
                && before.calendar.floors == after.calendar.floors;
            let mut edits = Vec::new();
            if !same {
                edits.push(edit(
                    Safety::Safe,
                    format!(
                        "classes {} -> {}: from the next reservation, in every window that has not started; events already scheduled keep their slots (a class no longer listed keeps its backlog, which the calendar counts)",
                        show(old),
                        show(new)
                    ),
                ));
            }
            if new.limits.iter().any(|l| !old.limits.iter().any(|o| o.per() == l.per())) {
                edits.push(edit(
                    Safety::NeedsCare,
                    "a limit of a new period on a rule with classes: its windows in the keys' calendars start empty, so until the backlog already scheduled drains a window of it can hold that backlog and new events too",
                ));
            }
            edits
        }
    }
}

/// Budgets the rule draws from, and where its entities live (a budget's hash tag).
fn budget_edits(old: &Rule, new: &Rule) -> Vec<Edit> {
    let names = |rule: &Rule| rule.budgets.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
    let mut edits = Vec::new();
    let leases = |rule: &Rule| rule.budgets.iter().find_map(|b| b.leases).map(|l| l.partitions);
    if old.budget_tag() == new.budget_tag() && leases(old) != leases(new) {
        let shape = |partitions: Option<u32>| match partitions {
            Some(p) => format!("{p} partitions, each its own hash tag, booking what the budget's home leases them"),
            None => "the budget group's one hash tag (one shard)".to_owned(),
        };
        edits.push(edit(
            Safety::NeedsCare,
            format!(
                "leases: its entities move from {} to {}: their state starts empty and the budget's calendar                  restarts as leases (what windows already hold is not carried over), so until the old backlog                  drains a window can hold the old backlog and new events; switch with an empty backlog or the                  budget paused. Each reservation stays one script call; a partition asks the home for units about                  once per window (docs/rules.md: \"A budget past one shard\")",
                shape(leases(old)),
                shape(leases(new))
            ),
        ));
    } else if old.budget_tag() != new.budget_tag() {
        let home =
            |rule: &Rule| rule.budget_tag().map_or("its own".to_owned(), |tag| format!("budget group '{tag}''s"));
        edits.push(edit(
            Safety::NeedsCare,
            format!(
                "its entities move from {} hash tag to {}: their state starts empty, so until the old backlog drains a window can hold the old backlog and new events; events parked under the old tag stay there (change it with no key parked)",
                home(old),
                home(new)
            ),
        ));
        if let Some(fair) = old.fair_budget().filter(|b| new.budget(&b.name).is_none()) {
            edits.push(edit(
                Safety::NeedsCare,
                format!(
                    "stops drawing from fair budget '{}' and its state moves to another hash tag: its keys waiting in the budget's ring cannot be drained from there; set fair: false on the budget and let its ring empty (drip inspect) first",
                    fair.name
                ),
            ));
        }
    } else if names(old) != names(new) {
        edits.push(edit(
            Safety::Safe,
            format!(
                "budgets {:?} -> {:?}: from the next reservation (a slot booked before a budget was added gives it \
                 nothing back, one booked before a budget was removed stays booked in it)",
                names(old),
                names(new)
            ),
        ));
    }
    for (before, after) in
        old.budgets.iter().filter_map(|b| new.budgets.iter().find(|n| n.name == b.name).map(|n| (b, n)))
    {
        // Every field of a budget, none left to `..`: a new one does not compile until classified.
        let Budget {
            name: _, // budgets are matched by name: a rename is a removal and an addition
            limits,
            max_share,
            adaptive,
            floors: _,  // below, with its own text
            per_key: _, // a classes calendar's, never written in the rules file (class_edits)
            leases: _,  // above: the entities move between shards
            fair,
            tag: _, // above: budget_tag
        } = after.as_ref();
        if &before.limits != limits || &before.max_share != max_share || &before.adaptive != adaptive {
            edits.push(edit(
                Safety::Safe,
                format!(
                    "budget '{}' changed: from the next reservation (windows already booked keep their use)",
                    after.name
                ),
            ));
        }
        if &before.fair != fair {
            let said = match fair {
                Some(_) if before.fair.is_some() => "its weights changed: from the next drain of its waiting keys",
                Some(_) => {
                    "now fair: from the next reservation, events past its near horizon park and its waiting keys share each window"
                }
                None => {
                    "no longer fair: from the next reservation, first come, first served; the keys already waiting drain through its ring until it is empty"
                }
            };
            edits.push(edit(Safety::Safe, format!("budget '{}' {said}", after.name)));
        }
        if before.floors != after.floors {
            let show = |floors: &[(String, u64)]| {
                let each: Vec<String> =
                    floors.iter().map(|(rule, f)| format!("{rule} {}", *f as f64 / PPM as f64)).collect();
                if each.is_empty() { "none".to_owned() } else { each.join(", ") }
            };
            edits.push(edit(
                Safety::Safe,
                format!(
                    "budget '{}' floors {} -> {}: from the next reservation, in every window that has not started; \
                     what windows already hold stays booked (a new floor holds only what they have left), and a \
                     floor's rule's events booked before it are not counted as its part",
                    after.name,
                    show(&before.floors),
                    show(&after.floors)
                ),
            ));
        }
    }
    if old.delivery_margin != new.delivery_margin || old.overflow_url != new.overflow_url {
        edits.push(edit(
            Safety::Safe,
            "delivery_margin or overflow url changed: from the next reservation and dispatch (slots already reserved keep their place)",
        ));
    }
    if old.adaptive != new.adaptive || old.feedback != new.feedback {
        edits.push(edit(Safety::Safe, "adaptive or feedback changed: from the next signal and reservation"));
    }
    edits
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"
default_dlq_topic: dlq
rules:
  - name: payouts
    match: { attributes: { t: payout } }
    key: "m_{data.m}"
    limits:
      - { limit: 100, per: 1m, window: fixed }
      - { limit: 10, per: 1s, window: gcra }
    max_delay: 1h
    forward: { topic: ready }
    overflow_topic: overflow
  - name: sms
    match: { attributes: { t: sms } }
    key: "u_{data.u}"
    limits: [ { limit: 5, per: 1s, window: sliding } ]
    max_delay: 1h
    forward: { topic: ready }
    overflow_topic: overflow
  - name: kyc
    match: { attributes: { t: kyc } }
    key: "k"
    limits: [ { limit: 5, per: 1s, window: fixed } ]
    max_delay: 1h
    forward: { topic: ready }
    overflow_topic: overflow
"#;

    fn parse(text: &str) -> RuleSet {
        RuleSet::parse("t.yaml", text).unwrap()
    }

    fn edits(diff: &[RuleDiff], name: &str) -> Vec<(Safety, String)> {
        diff.iter()
            .find(|d| d.name == name)
            .map_or_else(Vec::new, |d| d.edits.iter().map(|e| (e.safety, e.what.clone())).collect())
    }

    #[test]
    fn the_same_file_has_no_edits() {
        assert!(diff(&parse(OLD), &parse(OLD)).is_empty());
    }

    #[test]
    fn adding_classes_over_fixed_limits_and_changing_reserves_are_safe() {
        let classed = OLD.replacen(
            "    key: \"k\"\n",
            "    key: \"k\"\n    classes: { from: \"{attributes.p}\", default: bulk, reserve: { live: 0.1 } }\n",
            1,
        );
        // A rule that parks: what is parked under a key drains as its default class.
        let kyc = edits(&diff(&parse(OLD), &parse(&classed)), "kyc");
        assert!(
            matches!(kyc.as_slice(), [(Safety::Safe, what)] if what.contains("drains as its default class")),
            "{kyc:?}"
        );
        let unparked = |file: &str| file.replacen("    key: \"k\"\n", "    key: \"k\"\n    park_horizon: \"off\"\n", 1);
        let (old_file, classed) = (unparked(OLD), unparked(&classed));
        let kyc = edits(&diff(&parse(&old_file), &parse(&classed)), "kyc");
        assert!(
            matches!(kyc.as_slice(), [(Safety::Safe, what)] if what.contains("classes added (live, bulk (default bulk; reserve live 0.1)): each key's calendar takes over")),
            "{kyc:?}"
        );
        let from_sliding = OLD.replacen(
            "limits: [ { limit: 5, per: 1s, window: fixed } ]",
            "limits: [ { limit: 5, per: 1s, window: sliding } ]",
            1,
        );
        let kyc = edits(&diff(&parse(&unparked(&from_sliding)), &parse(&classed)), "kyc");
        assert!(
            kyc.iter().any(|(s, w)| *s == Safety::NeedsCare && w.contains("did not have as fixed windows")),
            "{kyc:?}"
        );
        let raised = classed.replacen("live: 0.1", "live: 0.2", 1);
        let kyc = edits(&diff(&parse(&classed), &parse(&raised)), "kyc");
        assert!(matches!(kyc.as_slice(), [(Safety::Safe, what)] if what.contains("reserve live 0.2")), "{kyc:?}");
        let longer = raised.replacen(
            "limits: [ { limit: 5, per: 1s, window: fixed } ]",
            "limits: [ { limit: 5, per: 1s }, { limit: 100, per: 1m } ]",
            1,
        );
        let kyc = edits(&diff(&parse(&raised), &parse(&longer)), "kyc");
        assert!(
            kyc.iter().any(|(s, w)| *s == Safety::NeedsCare && w.contains("new period on a rule with classes")),
            "{kyc:?}"
        );
        let kyc = edits(&diff(&parse(&raised), &parse(&old_file)), "kyc");
        assert!(
            matches!(kyc.as_slice(), [(Safety::NeedsCare, what)] if what.starts_with("classes removed")),
            "{kyc:?}"
        );
    }

    #[test]
    fn every_field_a_rule_file_may_edit_is_reported() {
        let with = |field: &str| OLD.replacen("    max_delay: 1h\n", &format!("    max_delay: 1h\n    {field}\n"), 1);
        let cases = [
            ("mode: shadow", Safety::NeedsCare, "enforce -> shadow"),
            ("max_pause: 5m", Safety::Safe, "max_pause 30m -> 5m"),
            ("late_events: deliver", Safety::Safe, "late_events Wait -> Deliver"),
            ("count_refused: true", Safety::Safe, "count_refused false -> true"),
            ("learn: headers", Safety::Safe, "learn off -> headers"),
            ("park_horizon: off", Safety::Safe, "park_horizon 2s -> off"),
            ("previous_key: \"x_{data.m}\"", Safety::Safe, "previous_key changed"),
        ];
        for (field, safety, what) in cases {
            let found = edits(&diff(&parse(OLD), &parse(&with(field))), "payouts");
            assert!(found.iter().any(|(s, w)| *s == safety && w.contains(what)), "{field}: {found:?}");
        }
        let enforcing = edits(&diff(&parse(&with("mode: shadow")), &parse(OLD)), "payouts");
        assert!(
            enforcing.iter().any(|(s, w)| *s == Safety::Delays && w.contains("shadow -> enforce")),
            "a switch from shadow to enforcing is never silent: {enforcing:?}"
        );
    }

    #[test]
    fn each_kind_of_edit_is_classified() {
        let new = OLD
            .replacen("  - name: payouts\n", "  - name: payouts-v2\n    id: payouts\n", 1)
            .replacen("{ limit: 100, per: 1m, window: fixed }", "{ limit: 500, per: 1m, window: fixed }", 1)
            .replacen("{ limit: 10, per: 1s, window: gcra }", "{ limit: 20, per: 1s, window: gcra }", 1)
            .replacen("key: \"u_{data.u}\"", "key: \"user_{data.u}\"", 1)
            .replacen(
                "    limits: [ { limit: 5, per: 1s, window: fixed } ]\n",
                "    limits: [ { limit: 5, per: 1h, window: fixed } ]\n",
                1,
            );
        let diff = diff(&parse(OLD), &parse(&new));
        let payouts = edits(&diff, "payouts-v2");
        assert_eq!(payouts[0].0, Safety::Safe);
        assert!(payouts[0].1.starts_with("renamed from 'payouts'"), "{payouts:?}");
        assert!(payouts.iter().any(|(s, w)| *s == Safety::Safe && w.contains("windows in use hold at most 500")));
        assert!(payouts.iter().any(|(s, w)| *s == Safety::Delays && w.contains("a new GCRA state")), "{payouts:?}");
        let sms = edits(&diff, "sms");
        assert_eq!(sms.len(), 1);
        assert_eq!(sms[0].0, Safety::NeedsCare);
        assert!(sms[0].1.contains("every key is a new entity"));
        let carried =
            new.replacen("key: \"user_{data.u}\"", "key: \"user_{data.u}\"\n    previous_key: \"u_{data.u}\"", 1);
        let carried = super::diff(&parse(OLD), &parse(&carried));
        assert_eq!(edits(&carried, "sms")[0].0, Safety::Delays, "{:?}", edits(&carried, "sms"));
        let kyc = edits(&diff, "kyc");
        assert!(kyc.iter().any(|(s, w)| *s == Safety::Delays && w.contains("added")), "{kyc:?}");
        assert!(kyc.iter().any(|(s, w)| *s == Safety::Safe && w.contains("removed")), "{kyc:?}");
    }

    #[test]
    fn drawing_from_a_budget_moves_the_entities_and_needs_care() {
        let with_budget = format!("budgets:\n  gateway: [ {{ limit: 50, per: 1s }} ]\n{OLD}").replacen(
            "    key: \"k\"\n",
            "    key: \"k\"\n    budgets: [gateway]\n",
            1,
        );
        let diff = diff(&parse(OLD), &parse(&with_budget));
        let kyc = edits(&diff, "kyc");
        assert!(kyc.iter().any(|(s, w)| *s == Safety::NeedsCare && w.contains("budget group 'gateway'")), "{kyc:?}");
        let raised = with_budget.replacen("limit: 50, per: 1s", "limit: 80, per: 1s", 1);
        let kyc = edits(&super::diff(&parse(&with_budget), &parse(&raised)), "kyc");
        assert_eq!(kyc.len(), 1);
        assert_eq!(kyc[0].0, Safety::Safe, "{kyc:?}");
        let floored = raised.replacen(
            "  gateway: [ { limit: 80, per: 1s } ]\n",
            "  gateway: { limits: [ { limit: 80, per: 1s } ], floors: { kyc: 0.25 } }\n",
            1,
        );
        let kyc = edits(&super::diff(&parse(&raised), &parse(&floored)), "kyc");
        assert!(
            matches!(kyc.as_slice(), [(Safety::Safe, what)] if what.contains("floors none -> kyc 0.25")),
            "{kyc:?}"
        );
        let leased = raised.replacen(
            "  gateway: [ { limit: 80, per: 1s } ]\n",
            "  gateway: { limits: [ { limit: 80, per: 1s } ], leases: { partitions: 4 } }\n",
            1,
        );
        let kyc = edits(&super::diff(&parse(&raised), &parse(&leased)), "kyc");
        assert!(matches!(kyc.as_slice(), [(Safety::NeedsCare, what)] if what.contains("to 4 partitions")), "{kyc:?}");
        let fair = with_budget.replacen(
            "  gateway: [ { limit: 50, per: 1s } ]\n",
            "  gateway: { limits: [ { limit: 50, per: 1s } ], fair: true }\n",
            1,
        );
        let kyc = edits(&super::diff(&parse(&fair), &parse(OLD)), "kyc");
        assert!(kyc.iter().any(|(s, w)| *s == Safety::NeedsCare && w.contains("fair budget 'gateway'")), "{kyc:?}");
        let margin = OLD.replacen("    key: \"k\"\n", "    key: \"k\"\n    delivery_margin: 100ms\n", 1);
        let kyc = edits(&super::diff(&parse(OLD), &parse(&margin)), "kyc");
        assert!(matches!(kyc.as_slice(), [(Safety::Safe, what)] if what.contains("delivery_margin")), "{kyc:?}");
    }

    #[test]
    fn a_rename_without_the_id_and_a_removal_need_care() {
        let new = OLD.replacen("  - name: payouts\n", "  - name: payouts-v2\n", 1);
        let without_kyc = &new[..new.find("  - name: kyc").unwrap()];
        let diff = diff(&parse(OLD), &parse(without_kyc));
        let payouts = edits(&diff, "payouts-v2");
        assert_eq!(payouts[0], (Safety::Safe, "added: its entities start empty".into()));
        let renamed_new = new.replacen("  - name: payouts-v2\n", "  - name: payouts\n    id: payouts-2\n", 1);
        let by_id = super::diff(&parse(OLD), &parse(&renamed_new));
        assert!(edits(&by_id, "payouts").iter().any(|(s, w)| *s == Safety::NeedsCare && w.contains("id changed")));
        let kyc = edits(&diff, "kyc");
        assert_eq!(kyc.len(), 1);
        assert_eq!(kyc[0].0, Safety::NeedsCare);
        assert!(kyc[0].1.starts_with("removed"));
    }
}
