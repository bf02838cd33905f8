//! The summary at the end, and whether the demo kept its promise.

use std::collections::{BTreeMap, HashSet};

use drip_core::rules::Rule;
use drip_core::time::Millis;

use crate::*;

/// The summary's text, and whether the demo kept the promise: nothing lost and no window of any
/// merchant's slots over the limit. Writes the chart.
pub(crate) fn summarize(args: &Args, rule: &Rule, burst: &Burst, outcome: &Outcome) -> anyhow::Result<(String, bool)> {
    let limit = rule.limits[0];
    let Outcome { deliveries, duplicates, dead, feedback } = outcome;
    let mut scheduled: BTreeMap<(&str, Millis), u64> = BTreeMap::new();
    let mut observed: BTreeMap<(&str, Millis), u64> = BTreeMap::new();
    for delivery in deliveries.values() {
        *scheduled.entry((&delivery.merchant, delivery.scheduled_for.div_euclid(limit.per()))).or_default() += 1;
        *observed.entry((&delivery.merchant, delivery.delivered_at.div_euclid(limit.per()))).or_default() += 1;
    }
    let max_scheduled = scheduled.values().max().copied().unwrap_or(0);
    let max_observed = observed.values().max().copied().unwrap_or(0);
    let mut delays: Vec<Millis> = deliveries
        .iter()
        .map(|(id, d)| d.scheduled_for - burst.published_at.get(id).copied().unwrap_or(burst.started))
        .map(|d| d.max(0))
        .collect();
    let mut lateness: Vec<Millis> =
        deliveries.values().filter(|d| d.route != "forward").map(|d| d.delivered_at - d.scheduled_for).collect();
    delays.sort_unstable();
    lateness.sort_unstable();
    let lost = args.events.saturating_sub(deliveries.len() + dead.len());
    // A forward whose slot came later than its publish (by more than the push's own latency)
    // waited inline in the limiter: delayed too, without a Cloud Task. Only a rule with an
    // inline_wait can do that; under `inline_wait: 0s` a late slot is the push's latency.
    const INLINE: Millis = 100;
    let waited = |id: &String, d: &Delivery| {
        rule.inline_wait > 0 && d.scheduled_for - burst.published_at.get(id).copied().unwrap_or(burst.started) >= INLINE
    };
    let forwarded = deliveries.iter().filter(|(id, d)| d.route == "forward" && !waited(id, d)).count();
    let inline = deliveries.iter().filter(|(id, d)| d.route == "forward" && waited(id, d)).count();
    let mut summary = String::new();
    summary += &format!("\nevents in:            {}\n", args.events);
    let routes = if args.throttle.is_some() {
        format!("{} delivered to the partner", deliveries.len())
    } else {
        format!(
            "{forwarded} forwarded at once, {inline} forwarded after waiting inline, {} delayed through Cloud Tasks",
            deliveries.len() - forwarded - inline
        )
    };
    summary += &format!(
        "events out:           {} ({routes}, {} dead-lettered{})\n",
        deliveries.len() + dead.len(),
        dead.len(),
        if dead.is_empty() { String::new() } else { format!(": {:?}", dead.values().collect::<HashSet<_>>()) }
    );
    summary += &format!("duplicates:           {duplicates} (a message id delivered twice)\n");
    summary += &format!("lost:                 {lost}\n");
    summary += &format!(
        "delay p50 / p99:      {:.1} s / {:.1} s\n",
        percentile(&delays, 0.5) as f64 / 1e3,
        percentile(&delays, 0.99) as f64 / 1e3
    );
    summary += &format!(
        "dispatch lateness:    p50 {} ms / p99 {} ms (Cloud Tasks stand-in -> dispatcher -> overflow)\n",
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99)
    );
    summary += &format!(
        "max per window:       {max_scheduled} scheduled, {max_observed} observed downstream, limit {} ({limit}; delivery_margin {} ms)\n",
        limit.limit(),
        rule.delivery_margin
    );
    if args.throttle.is_some() {
        let lowest = feedback.levels.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
        let last = feedback.levels.last().map_or(1.0, |l| l.1);
        let paused = feedback.levels.iter().filter(|l| l.2).map(|l| l.0).collect::<Vec<_>>();
        summary += &format!(
            "downstream:           answered 429 (Retry-After: 3) {} times, from 1 s to 7 s\n",
            feedback.refusals
        );
        summary += &format!(
            "merchant {}:        paused {}; adaptive level lowest {lowest:.2}, at the end {last:.2}\n",
            burst.merchants[0],
            match (paused.first(), paused.last()) {
                (Some(a), Some(b)) => format!("from {:.1} s to {:.1} s", *a as f64 / 1e3, *b as f64 / 1e3),
                _ => "never".into(),
            }
        );
        let samples: Vec<String> = feedback
            .levels
            .iter()
            .step_by((feedback.levels.len() / 12).max(1))
            .map(|(at, level, _)| format!("{:.0}s {level:.2}", *at as f64 / 1e3))
            .collect();
        summary += &format!("adaptive level:       {}\n", samples.join(", "));
        if let Some(drain) = drain_after_recovery(rule, burst, deliveries, feedback) {
            summary += &drain;
        }
    }
    let chart = args.out.join("drip-demo.svg");
    std::fs::create_dir_all(&args.out)?;
    draw_chart(&chart, burst, deliveries, limit)?;
    summary += &format!("chart:                {}\n", chart.display());
    if args.throttle.is_some() {
        let levels = args.out.join("drip-feedback.svg");
        draw_feedback_chart(&levels, feedback, limit)?;
        summary += &format!("adaptive chart:       {}\n", levels.display());
    }
    // With a delivery margin the promise is made where the downstream observes it.
    let observed_ok = rule.delivery_margin == 0 || max_observed <= limit.limit();
    // The demo's burst always fits its rule: an event dead-lettered is a demo that drained nothing
    // (a rules file whose key the demo's events do not carry, say), not a success.
    let ok = lost == 0 && dead.is_empty() && *duplicates == 0 && max_scheduled <= limit.limit() && observed_ok;
    summary += &if ok {
        "result:               OK: every event delivered, nothing lost, nothing doubled, no window over its limit\n"
            .to_owned()
    } else if !dead.is_empty() {
        let mut reasons: Vec<(String, usize)> = Vec::new();
        for reason in dead.values() {
            match reasons.iter_mut().find(|(r, _)| r == reason) {
                Some((_, count)) => *count += 1,
                None => reasons.push((reason.clone(), 1)),
            }
        }
        let reasons: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} × {n}")).collect();
        format!(
            "result:               FAILED: events were dead-lettered instead of delivered ({}). The rule '{}' keys \
             events by '{}'; the demo publishes payouts with the attribute event_type=payout and the data \
             {{payoutId, merchant_id, amount, currency, beneficiary}}: a rules file for the demo must match and key them \
             by those (examples/demo.yaml, examples/payouts.yaml)\n",
            reasons.join(", "),
            rule.name,
            rule.key
        )
    } else {
        let mut why = Vec::new();
        if lost > 0 {
            why.push(format!("{lost} lost"));
        }
        if *duplicates > 0 {
            why.push(format!("{duplicates} delivered twice"));
        }
        if max_scheduled > limit.limit() || !observed_ok {
            why.push("a window over its limit".to_owned());
        }
        format!("result:               FAILED: {}\n", why.join(", "))
    };
    if max_observed > limit.limit() {
        summary += &format!(
            "note:                 a window saw more deliveries than the limit: a delivery was later than the rule's delivery_margin ({} ms)\n",
            rule.delivery_margin
        );
    }
    Ok((summary, ok))
}

/// The `p` quantile of sorted values (nearest rank).
pub(crate) fn percentile(sorted: &[Millis], p: f64) -> Millis {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0)
}

/// How the first merchant's backlog drained once its adaptive level was back at its ceiling (after
/// its lowest point, not paused): its deliveries in each window from then on; the full windows
/// before its last (which holds only what was left) against the count in force; and the time from
/// then to its last delivery against backlog ÷ the configured limit. `None` when it never
/// recovered with a backlog left.
fn drain_after_recovery(
    rule: &Rule,
    burst: &Burst,
    deliveries: &std::collections::HashMap<String, Delivery>,
    feedback: &crate::throttle::Feedback,
) -> Option<String> {
    let adaptive = rule.adaptive?;
    let ceiling = adaptive.ceiling() as f64 / drip_core::budgets::PPM as f64;
    let (limit, per) = (rule.limits[0], rule.limits[0].per());
    let lowest_at = feedback.levels.iter().min_by(|a, b| a.1.total_cmp(&b.1))?.0;
    let recovered = feedback.levels.iter().find(|l| l.0 >= lowest_at && !l.2 && l.1 >= ceiling - 1e-9)?.0;
    // From the first window that starts after the level was read back at its ceiling: the window
    // it was read in delivered its events at its start (start placement), before the reading.
    let from = ((burst.started + recovered).div_euclid(per) + 1) * per;
    let merchant = &burst.merchants[0];
    let mut windows: BTreeMap<Millis, u64> = BTreeMap::new();
    for d in deliveries.values().filter(|d| d.merchant == *merchant && d.delivered_at >= from) {
        *windows.entry(d.delivered_at.div_euclid(per)).or_default() += 1;
    }
    let (&last_window, _) = windows.last_key_value()?;
    let backlog: u64 = windows.values().sum();
    let last = deliveries.values().filter(|d| d.merchant == *merchant).map(|d| d.delivered_at).max()?;
    let in_force = (limit.limit() as f64 * ceiling).floor();
    // Whole windows before the last (which holds only what was left).
    let full: Vec<u64> = windows.range(..last_window).map(|(_, &n)| n).collect();
    let rate = match full.len() {
        0 => "no full window before the last".to_owned(),
        n => {
            let mean = full.iter().sum::<u64>() as f64 / n as f64;
            format!(
                "{mean:.1} a window over {n} full windows, {:.0} % of the {in_force:.0} in force",
                100.0 * mean / in_force
            )
        }
    };
    let took = (last - from) as f64 / per as f64;
    let counts: Vec<String> =
        windows.iter().map(|(w, n)| format!("{:.0}s {n}", (w * per - burst.started) as f64 / 1e3)).collect();
    Some(format!(
        "drain after recovery: level back at {ceiling:.2} at {:.1} s; {backlog} of {merchant}'s events left from the next \
         window, {:.1} s: {rate}; the last at {:.1} s, {took:.1} windows = {:.2}× backlog ÷ limit\n\
         {merchant} per window:    {}\n",
        recovered as f64 / 1e3,
        (from - burst.started) as f64 / 1e3,
        (last - burst.started) as f64 / 1e3,
        took / (backlog as f64 / limit.limit() as f64),
        counts.join(", "),
    ))
}
