//! Latency as the leading signal (docs/rules.md, "Latency"): each call to a forward or overflow
//! URL is timed; the calls of a window are kept here, per feedback target (key or budget) whose
//! adaptive limit follows latency, and the first call of the next window reports the window's high
//! percentile to the store, where the controller (`Adaptive::after_latency`) moves the level.
//! `/v1/feedback` reports go the same way: one call's latency joins its window here; a window's
//! percentile from a consumer (with its count of calls) goes straight to the store.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use drip_core::budgets::{Budget, LatencyChange, LatencyControl, LatencyReport, LatencyVerdict, PPM, adaptive_window};
use drip_core::rules::Rule;
use drip_core::time::{Millis, wall_clock_millis};
use drip_store::{Store, StoreError};

use crate::metrics::ServiceMetrics;

/// Fewer calls in a window than this are not judged alone: one slow call is not a trend. They are
/// judged with the next window's.
pub const MIN_CALLS: usize = 5;
/// A window keeps at most this many calls (an instance past it samples the first ones).
const MAX_SAMPLES: usize = 10_000;
/// Past this many open windows, those that can no longer be reported are dropped.
const SWEEP_AT: usize = 10_000;

/// The window's high percentile (µs): p99 over 100 calls or more, p95 over 20, p90 over
/// [`MIN_CALLS`]; `None` under that. Nearest rank.
pub fn high_percentile(samples: &mut [u64]) -> Option<u64> {
    let n = samples.len();
    let q = match n {
        100.. => 0.99,
        20.. => 0.95,
        _ if n >= MIN_CALLS => 0.90,
        _ => return None,
    };
    samples.sort_unstable();
    Some(samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    Key { rule: String, key: String },
    Budget(String),
}

#[derive(Debug)]
struct Open {
    window: i64,
    samples: Vec<u64>,
}

/// The open windows of calls, per target: one per instance.
#[derive(Debug, Default)]
pub struct LatencyWindows {
    open: Mutex<HashMap<Target, Open>>,
}

impl LatencyWindows {
    /// One call of `rule`'s key `key` that took `elapsed`: joins its window (the key's, or that
    /// of `budget` or else the budget the rule's feedback names); a call that opens a new window
    /// reports the window before it, when that one was the last window and held enough calls.
    /// Nothing for a target whose adaptive limit does not follow latency. A failed report is only
    /// logged: the call it rode on is done.
    pub async fn record(
        &self,
        (store, metrics): (&dyn Store, &ServiceMetrics),
        (rule, key, budget): (&Rule, &str, Option<&Budget>),
        elapsed: Duration,
    ) {
        let Some((target, window)) = latency_target(rule, key, budget) else { return };
        let now = wall_clock_millis();
        let Some(report) = self.add(target, window, now, elapsed.as_micros() as u64) else { return };
        if let Err(error) = report_to_store((store, metrics), rule, key, budget, report).await {
            tracing::warn!(rule = %rule.name, key, %error, "could not report the downstream's latency");
        }
    }

    /// Adds a sample at `now`; returns the report of the window it closed, if any.
    fn add(&self, target: Target, window: Millis, now: Millis, micros: u64) -> Option<LatencyReport> {
        let current = now.div_euclid(window);
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.len() >= SWEEP_AT {
            open.retain(|_, o| o.window >= current - 1);
        }
        let entry = open.entry(target).or_insert_with(|| Open { window: current, samples: Vec::new() });
        let mut closed = None;
        if entry.window != current {
            let samples = std::mem::take(&mut entry.samples);
            if entry.window == current - 1 {
                if samples.len() >= MIN_CALLS {
                    closed = Some(samples);
                } else {
                    // Too few to judge: they join the next window's (a slow key is judged over
                    // two windows or more rather than never).
                    entry.samples = samples;
                }
            }
            entry.window = current;
        }
        if entry.samples.len() < MAX_SAMPLES {
            entry.samples.push(micros);
        }
        drop(open);
        let mut samples = closed?;
        let percentile = high_percentile(&mut samples)?;
        Some(LatencyReport { percentile, calls: samples.len() as u64 })
    }
}

/// The latency control of `rule`'s feedback target: `budget`'s, else that of the budget its
/// feedback names, else its keys' (`None`: that target's adaptive limit does not follow latency).
pub fn latency_control(rule: &Rule, budget: Option<&Budget>) -> Option<LatencyControl> {
    budget.or_else(|| rule.feedback_budget()).map_or(rule.adaptive, |b| b.adaptive)?.latency
}

/// Where `rule`'s latency goes (`budget`, else its feedback budget, else the key) and that
/// target's adaptive window, when that target's adaptive limit follows latency.
fn latency_target(rule: &Rule, key: &str, budget: Option<&Budget>) -> Option<(Target, Millis)> {
    latency_control(rule, budget)?;
    Some(match budget.or_else(|| rule.feedback_budget()) {
        Some(budget) => (Target::Budget(budget.name.clone()), adaptive_window(&budget.limits)),
        None => (Target::Key { rule: rule.id.clone(), key: key.to_owned() }, adaptive_window(&rule.limits)),
    })
}

/// Reports a window's latency of `rule`'s feedback target (or `budget`) to the store, then logs
/// and counts what the controller did. `None`: the target's adaptive limit does not follow latency.
pub async fn report_to_store(
    (store, metrics): (&dyn Store, &ServiceMetrics),
    rule: &Rule,
    key: &str,
    budget: Option<&Budget>,
    report: LatencyReport,
) -> Result<Option<LatencyChange>, StoreError> {
    let budget = budget.or_else(|| rule.feedback_budget());
    let (change, labelled) = match budget {
        Some(budget) => (store.report_budget_latency(budget, report).await?, format!("budget:{}", budget.name)),
        None => (store.report_latency(rule, key, report).await?, format!("rule:{}", rule.name)),
    };
    let (Some(change), Some(control)) = (change, latency_control(rule, budget)) else { return Ok(None) };
    let verdict = verdict_name(change.verdict);
    let percentile_ms = report.percentile as f64 / 1_000.0;
    metrics.shared.latency_judged(labelled.clone(), percentile_ms, verdict, control.shadow);
    let (before, after) = (change.before as f64 / PPM as f64, change.after as f64 / PPM as f64);
    if !control.shadow && change.before != change.after {
        metrics.shared.adaptive_level(labelled.clone(), after);
    }
    if let LatencyVerdict::Slow { gradient } = change.verdict {
        let gradient = gradient as f64 / PPM as f64;
        if control.shadow {
            tracing::warn!(rule = %rule.name, key, target = %labelled, percentile_ms, calls = report.calls, gradient, level = before, would_be = after, "the downstream is slowing down: the latency controller (shadow) would lower the adaptive limit");
        } else {
            tracing::warn!(rule = %rule.name, key, target = %labelled, percentile_ms, calls = report.calls, gradient, level_before = before, level = after, "the downstream is slowing down: adaptive limit lowered");
        }
    } else if let LatencyVerdict::Lagging { gradient } = change.verdict {
        let gradient = gradient as f64 / PPM as f64;
        tracing::info!(rule = %rule.name, key, target = %labelled, percentile_ms, calls = report.calls, gradient, level = before, "the downstream is still slow, at a rate booked before the last cut: adaptive limit held");
    } else {
        tracing::debug!(rule = %rule.name, key, target = %labelled, percentile_ms, calls = report.calls, verdict, level = after, shadow = control.shadow, "latency judged");
    }
    Ok(Some(change))
}

/// A verdict as metrics, logs and answers name it.
pub fn verdict_name(verdict: LatencyVerdict) -> &'static str {
    match verdict {
        LatencyVerdict::Slow { .. } => "slow",
        LatencyVerdict::Grew => "grew",
        LatencyVerdict::Held => "held",
        LatencyVerdict::Lagging { .. } => "lagging",
        LatencyVerdict::Repeat => "repeat",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percentile_follows_the_number_of_calls() {
        assert_eq!(high_percentile(&mut [9, 1, 5, 3]), None, "under MIN_CALLS");
        let mut ten: Vec<u64> = (1..=10).rev().collect();
        assert_eq!(high_percentile(&mut ten), Some(9), "p90 of 1..=10");
        let mut forty: Vec<u64> = (1..=40).collect();
        assert_eq!(high_percentile(&mut forty), Some(38), "p95 of 1..=40");
        let mut thousand: Vec<u64> = (1..=1000).collect();
        assert_eq!(high_percentile(&mut thousand), Some(990), "p99 of 1..=1000");
    }

    #[test]
    fn a_window_is_reported_by_the_first_call_of_the_next_and_only_then() {
        let windows = LatencyWindows::default();
        let target = || Target::Key { rule: "r".into(), key: "k".into() };
        for i in 0..6 {
            assert_eq!(windows.add(target(), 1_000, 5_000 + i * 100, 1_000 * (i as u64 + 1)), None);
        }
        let report = windows.add(target(), 1_000, 6_010, 50_000).expect("window 5 closes");
        assert_eq!(report, LatencyReport { percentile: 6_000, calls: 6 });
        assert_eq!(windows.add(target(), 1_000, 6_020, 1), None, "window 6 is open");
        for i in 0..6 {
            windows.add(target(), 1_000, 6_100 + i, 1);
        }
        assert_eq!(windows.add(target(), 1_000, 9_000, 1), None, "window 6 is too old to judge at 9 s");
        // Three calls in window 9 are too few: they are judged with window 10's.
        for i in 0..2 {
            windows.add(target(), 1_000, 9_100 + i, 7_000);
        }
        assert_eq!(windows.add(target(), 1_000, 10_000, 3_000), None, "window 9 carries over");
        windows.add(target(), 1_000, 10_500, 3_000);
        let report = windows.add(target(), 1_000, 11_000, 1).expect("windows 9 and 10 close");
        assert_eq!(report, LatencyReport { percentile: 7_000, calls: 5 });
    }
}
