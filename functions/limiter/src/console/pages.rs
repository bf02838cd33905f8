//! The console's pages: the rules and budgets, one rule's busiest keys, one key. Every figure is
//! the store's, read as `drip inspect` reads it.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use drip_core::rules::Rule;
use drip_core::time::{Millis, format_duration, parse_rfc3339, wall_clock_millis};
use drip_store::inspect::{BudgetReport, EntityReport};
use drip_store::{AuditEntry, BusyKeys};
use serde::Deserialize;

use super::{Caller, FormTokens, Refusal, render};
use crate::AppState;
use crate::entities::PathTarget;

/// How many state hashes a rule's page examines for its busiest keys, and the overview per rule.
const RULE_EXAMINE: usize = 10_000;
const OVERVIEW_EXAMINE: usize = 2_000;
/// Keys a rule's page lists (each one inspected).
const BUSIEST: usize = 20;
/// Audit entries read for a page's history, and how far back the partner's answers are counted.
const HISTORY: usize = 200;
const RECENT: Millis = 15 * 60_000;

fn unavailable(what: &str, error: impl std::fmt::Display) -> Refusal {
    tracing::warn!(%error, "console: {what} failed");
    Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "redis unavailable")
}

/// The rule (and key) a console path names, as the API finds them; a page naming no rule is a 404.
fn target(state: &AppState, name: &str, key: &str) -> Result<PathTarget, Refusal> {
    PathTarget::named(state, name, key).ok_or_else(|| Refusal::new(StatusCode::NOT_FOUND, "no such rule"))
}

/// Where a key (or a rule) stands, in the words the console's tables use.
pub(super) fn verdict(report: &EntityReport, now: Millis) -> &'static str {
    let later = |at: &Option<String>| at.as_deref().and_then(|t| parse_rfc3339(t).ok()).is_some_and(|t| t > now);
    if later(&report.paused_until) || report.budgets.iter().any(|b| later(&b.paused_until)) {
        "paused"
    } else if report.backlog + report.parked > 0 {
        "backlogged"
    } else if report.limits.iter().any(|l| l.capacity > 0 && l.used_now >= l.capacity) {
        "at capacity"
    } else if report.last_slot.as_deref().and_then(|t| parse_rfc3339(t).ok()).is_some_and(|t| t + 60_000 > now) {
        "active"
    } else {
        "idle"
    }
}

/// What sets each limit in force for a key: the file, an override, the adaptive level, a pause.
fn limit_sources(report: &EntityReport) -> Vec<String> {
    let mut sources = Vec::new();
    for o in report.overrides.iter().filter(|o| o.in_force) {
        let until = o.until.as_deref().map_or(String::new(), |u| format!(" until {u}"));
        let set = o.set.as_deref().map_or(String::new(), |s| format!(", {s}"));
        sources.push(format!("{}: {} by override{until}{set}", o.limit, o.count));
    }
    if let Some(level) = report.adaptive_level.filter(|l| *l < 1.0) {
        sources.push(format!("adaptive level {level:.2} of each count"));
    }
    if let Some(until) = &report.paused_until {
        sources.push(format!("paused until {until}"));
    }
    if sources.is_empty() {
        sources.push("the rules file".into());
    }
    sources
}

struct RuleRow {
    name: String,
    limits: String,
    budgets: String,
    verdict: &'static str,
    busiest: Option<String>,
    drains: String,
    keys_seen: String,
}

struct BudgetRow {
    name: String,
    limits: Vec<String>,
    fair: bool,
    paused_until: String,
    level: String,
}

impl BudgetRow {
    fn of(report: &BudgetReport) -> Self {
        Self {
            name: report.name.clone(),
            limits: report
                .limits
                .iter()
                .map(|l| format!("{}: {} of {} now, {} ahead", l.limit, l.used_now, l.capacity, l.ahead))
                .collect(),
            fair: report.fair.is_some(),
            paused_until: report.paused_until.clone().unwrap_or_default(),
            level: report.adaptive_level.map_or(String::new(), |l| format!("{l:.2}")),
        }
    }
}

#[derive(Template)]
#[template(path = "console/overview.html")]
struct OverviewPage {
    caller: Caller,
    rules: Vec<RuleRow>,
    budgets: Vec<BudgetRow>,
}

fn limits_of(rule: &Rule) -> String {
    rule.limits.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// How long until `at` (an RFC 3339 time) from `now`, or nothing once it is past.
fn until(at: Option<&str>, now: Millis) -> String {
    match at.and_then(|t| parse_rfc3339(t).ok()) {
        Some(t) if t > now => format!("in {}", format_duration((t - now).div_euclid(1_000).max(1) * 1_000)),
        _ => String::new(),
    }
}

fn seen(busy: &BusyKeys) -> String {
    match (&busy.unsupported, busy.complete) {
        (Some(why), _) => format!("not listed on {why}"),
        (None, true) => format!("{} entities with state, all examined", busy.examined),
        (None, false) => format!("the first {} entities examined: search for others by key", busy.examined),
    }
}

pub async fn overview(State(state): State<AppState>, caller: Caller) -> Response {
    let rules = state.rules.current();
    let now = wall_clock_millis();
    let (mut rows, mut budgets) = (Vec::new(), BTreeMap::new());
    for rule in &rules.rules {
        let busy = match state.store.busiest_keys(rule, 1, OVERVIEW_EXAMINE).await {
            Ok(busy) => busy,
            Err(e) => return unavailable("listing keys", e).into_response(),
        };
        let top = busy.keys.first().map(|k| k.key.clone());
        let report = match drip_store::inspect_key(&*state.store, rule, top.as_deref().unwrap_or_default()).await {
            Ok(report) => report,
            Err(e) => return unavailable("inspect", e).into_response(),
        };
        for budget in &report.budgets {
            budgets.entry(budget.name.clone()).or_insert_with(|| BudgetRow::of(budget));
        }
        rows.push(RuleRow {
            name: rule.name.clone(),
            limits: limits_of(rule),
            budgets: rule.budgets.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", "),
            verdict: match (&top, &busy.unsupported) {
                (Some(_), _) => verdict(&report, now),
                // On a Redis Cluster no key is listed: the rule's state is not known from here.
                (None, Some(_)) => "unknown",
                (None, None) => "idle",
            },
            drains: until(report.drains_at.as_deref().or(report.drains_after.as_deref()), now),
            busiest: top,
            keys_seen: seen(&busy),
        });
    }
    render(&OverviewPage { caller, rules: rows, budgets: budgets.into_values().collect() })
}

struct KeyRow {
    key: String,
    verdict: &'static str,
    backlog: u64,
    parked: u64,
    drains: String,
    waiting_on: String,
    /// Its downstream's latency baseline, when its adaptive limit follows latency.
    latency: String,
}

#[derive(Template)]
#[template(path = "console/rule.html")]
struct RulePage {
    caller: Caller,
    token: String,
    rule: String,
    limits: String,
    budgets: Vec<BudgetRow>,
    max_delay: String,
    keys: Vec<KeyRow>,
    keys_seen: String,
    /// Events waiting (booked ahead or parked) over the keys listed.
    waiting: u64,
    answers: String,
    history: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Search {
    key: Option<String>,
}

/// The downstream's refusals of the last minutes, by status: `3 × 429, 1 × timeout`.
fn recent_answers(by_status: &BTreeMap<u16, u64>) -> String {
    if by_status.is_empty() {
        return "no 429, 5xx or timeout in the last 15 minutes".into();
    }
    let name = |status: u16| if status == 0 { "timeout".to_owned() } else { status.to_string() };
    let each: Vec<String> = by_status.iter().map(|(&status, n)| format!("{n} × {}", name(status))).collect();
    format!("{} in the last 15 minutes", each.join(", "))
}

pub async fn rule(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(search): Query<Search>,
) -> Response {
    let target = match target(&state, &name, "") {
        Ok(target) => target,
        Err(refusal) => return refusal.into_response(),
    };
    if let Some(key) = search.key.filter(|k| !k.trim().is_empty()) {
        return Redirect::to(&key_path(&name, key.trim())).into_response();
    }
    let rule = target.rule();
    let now = wall_clock_millis();
    let loaded = async {
        let busy = state.store.busiest_keys(rule, BUSIEST, RULE_EXAMINE).await?;
        let mut reports = Vec::new();
        for key in &busy.keys {
            reports.push(drip_store::inspect_key(&*state.store, rule, &key.key).await?);
        }
        let budgets = match reports.first() {
            Some(report) => report.budgets.clone(),
            None => drip_store::inspect_key(&*state.store, rule, "").await?.budgets,
        };
        let history = state.store.audit_history(rule, HISTORY).await?;
        let answers = state.store.answers_since(rule, now - RECENT).await?;
        Ok::<_, drip_store::StoreError>((busy, reports, budgets, history, answers))
    };
    let (busy, reports, budgets, history, answers) = match loaded.await {
        Ok(loaded) => loaded,
        Err(e) => return unavailable("the rule's page", e).into_response(),
    };
    let keys = reports
        .iter()
        .map(|r| KeyRow {
            key: r.key.clone(),
            verdict: verdict(r, now),
            backlog: r.backlog,
            parked: r.parked,
            drains: until(r.drains_at.as_deref().or(r.drains_after.as_deref()), now),
            waiting_on: r.waiting_on.join("; "),
            latency: r.latency.as_ref().map_or(String::new(), |l| format!("{:.0} ms", l.baseline_ms)),
        })
        .collect();
    let token = match FormTokens::of(&state).await {
        Ok(tokens) => tokens.issue(&caller.email, now as u64),
        Err(refusal) => return refusal.into_response(),
    };
    render(&RulePage {
        caller,
        token,
        rule: rule.name.clone(),
        limits: limits_of(rule),
        budgets: budgets.iter().map(BudgetRow::of).collect(),
        max_delay: format_duration(rule.max_delay),
        waiting: reports.iter().map(|r| r.backlog + r.parked).sum(),
        keys,
        keys_seen: seen(&busy),
        answers: recent_answers(&answers),
        history: history.iter().take(20).map(AuditEntry::describe).collect(),
    })
}

/// `/console/rules/<rule>/keys/<key>`, each part percent-encoded.
pub(super) fn key_path(rule: &str, key: &str) -> String {
    format!("/console/rules/{}/keys/{}", encode(rule), encode(key))
}

pub(super) fn encode(part: &str) -> String {
    part.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Template)]
#[template(path = "console/key.html")]
struct KeyPage {
    caller: Caller,
    token: String,
    rule: String,
    key: String,
    path: String,
    report: EntityReport,
    verdict: &'static str,
    drains: String,
    sources: Vec<String>,
    budgets: Vec<BudgetRow>,
    history: Vec<String>,
    decisions: Vec<String>,
    latency: Option<String>,
}

/// The slots the key's events took, a line per second: `2026-12-04T12:00:01.000Z · 3 events`
/// (the latest [`DECISIONS`] seconds).
fn decisions(slots: &[Millis]) -> Vec<String> {
    let mut by_second = BTreeMap::<Millis, usize>::new();
    for slot in slots {
        *by_second.entry(slot.div_euclid(1_000) * 1_000).or_default() += 1;
    }
    let lines = by_second.iter().rev().take(DECISIONS).map(|(&second, &n)| {
        format!("{} · {}", drip_core::time::format_rfc3339(second), drip_core::counted(n as u64, "event"))
    });
    lines.collect()
}

const DECISIONS: usize = 30;

fn latency_line(view: &drip_store::inspect::LatencyView) -> String {
    let hurt = view.level_that_hurt.map_or(String::new(), |l| format!(", hurt at level {l:.2}"));
    format!("baseline {:.0} ms{hurt}, last judged {}", view.baseline_ms, view.last_judged)
}

pub async fn key(State(state): State<AppState>, caller: Caller, Path((name, key)): Path<(String, String)>) -> Response {
    let target = match target(&state, &name, &key) {
        Ok(target) => target,
        Err(refusal) => return refusal.into_response(),
    };
    let (rule, key) = (target.rule(), target.key().to_owned());
    let loaded = async {
        let report = drip_store::inspect_key(&*state.store, rule, &key).await?;
        let report = drip_store::with_provenance(&*state.store, rule, report).await?;
        let history = state.store.audit_history(rule, HISTORY).await?;
        let slots = state.store.slots_since(rule, &key, wall_clock_millis() - RECENT).await?;
        Ok::<_, drip_store::StoreError>((report, history, slots))
    };
    let (report, history, slots) = match loaded.await {
        Ok(loaded) => loaded,
        Err(e) => return unavailable("the key's page", e).into_response(),
    };
    let token = match FormTokens::of(&state).await {
        Ok(tokens) => tokens.issue(&caller.email, wall_clock_millis() as u64),
        Err(refusal) => return refusal.into_response(),
    };
    let now = wall_clock_millis();
    render(&KeyPage {
        token,
        path: key_path(&rule.name, &key),
        rule: rule.name.clone(),
        verdict: verdict(&report, now),
        drains: until(report.drains_at.as_deref().or(report.drains_after.as_deref()), now),
        sources: limit_sources(&report),
        budgets: report.budgets.iter().map(BudgetRow::of).collect(),
        history: history.iter().filter(|e| e.key() == key).take(30).map(AuditEntry::describe).collect(),
        decisions: decisions(&slots),
        latency: report.latency.as_ref().map(latency_line),
        key,
        report,
        caller,
    })
}
