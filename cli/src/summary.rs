//! The per-window summary `drip simulate` prints on stderr.

use std::collections::BTreeMap;
use std::fmt::Write;

use drip_core::ledger::{fixed_window_usage, max_sliding_usage};
use drip_core::rules::{RuleSet, Window};
use drip_core::time::{Millis, format_rfc3339};

use crate::decisions::Outcome;

const MAX_ROWS: usize = 60;

/// (slot, cost) of each reservation of one entity, in reservation order.
pub type Ledger = Vec<(Millis, u64)>;

/// Cost reserved per rule, then per key.
pub fn ledgers(outcomes: &[Outcome]) -> BTreeMap<&str, BTreeMap<&str, Ledger>> {
    let mut ledgers: BTreeMap<&str, BTreeMap<&str, Ledger>> = BTreeMap::new();
    for outcome in outcomes {
        if let (Some(rule), Some(key), Some(s)) = (&outcome.rule, &outcome.key, outcome.scheduled) {
            ledgers.entry(rule).or_default().entry(key).or_default().push((s.slot, s.cost));
        }
    }
    ledgers
}

pub fn render(rules: &RuleSet, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let count = |decision: &str| outcomes.iter().filter(|o| o.decision == decision).count();
    let _ = writeln!(
        out,
        "\n{} events: {} forward, {} delay, {} dlq",
        outcomes.len(),
        count("forward"),
        count("delay"),
        count("dlq")
    );
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for reason in outcomes.iter().filter_map(|o| o.reason) {
        *reasons.entry(reason).or_default() += 1;
    }
    if !reasons.is_empty() {
        let list: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ = writeln!(out, "dlq reasons: {}", list.join(", "));
    }

    let mut rows = vec![["rule", "key", "limit", "window start (UTC)", "cost", "limit"].map(String::from)];
    let mut over = Vec::new();
    for (rule_name, keys) in ledgers(outcomes) {
        let Some(rule) = rules.rule(rule_name) else { continue };
        for limit in &rule.limits {
            for (key, ledger) in &keys {
                for (window, used) in fixed_window_usage(ledger, limit.per()) {
                    let fixed = matches!(limit.window(), Window::Fixed(_));
                    if fixed && used > limit.limit() {
                        over.push(format!("{rule_name} {key} {}: {used} in {}", limit, format_rfc3339(window)));
                    }
                    rows.push([
                        rule_name.to_owned(),
                        (*key).to_owned(),
                        limit.to_string(),
                        format_rfc3339(window),
                        used.to_string(),
                        limit.limit().to_string(),
                    ]);
                }
                if limit.window() == Window::Sliding {
                    let fullest = max_sliding_usage(ledger, limit.per());
                    if fullest > limit.limit() {
                        over.push(format!("{rule_name} {key} {}: {fullest} in one interval", limit));
                    }
                }
            }
        }
    }
    let shown = rows.len().min(MAX_ROWS + 1);
    let widths: Vec<usize> = (0..6).map(|c| rows[..shown].iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    for row in &rows[..shown] {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    if rows.len() > shown {
        let _ = writeln!(out, "… and {} more windows", rows.len() - shown);
    }
    if over.is_empty() {
        let _ = writeln!(out, "every fixed window and sliding interval is within its limit");
    } else {
        let _ = writeln!(out, "OVER LIMIT:\n  {}", over.join("\n  "));
    }
    out
}
