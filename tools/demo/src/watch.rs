//! Watching the burst drain: pulling what comes out at each topic, and the live view.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use drip_core::rules::Rule;
use drip_core::time::{Millis, parse_rfc3339, wall_clock_millis};
use pubsub_emulator_client::{EmulatorClient, Pulled};

use crate::*;

/// Pulls the forward, overflow and dead-letter topics until every event came out (or the
/// timeout), drawing the live view meanwhile.
pub(crate) async fn watch(
    args: &Args,
    rule: &Rule,
    pubsub: &EmulatorClient,
    topics: &Topics,
    burst: &Burst,
    target: Option<&Throttle>,
) -> anyhow::Result<Outcome> {
    let http = reqwest::Client::new();
    let live = std::io::stdout().is_terminal();
    let mut outcome = Outcome::default();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut last_frame = Instant::now() - Duration::from_secs(1);
    let mut printed_lines = 0;
    let frame = |outcome: &Outcome| render_frame(args, rule, &burst.merchants, outcome, burst.started);
    while outcome.deliveries.len() + outcome.dead.len() < args.events && Instant::now() < deadline {
        for (topic, route) in [(&topics.forward, "forward"), (&topics.overflow, "delay")] {
            for message in pubsub.pull(topic, 1_000).await? {
                let Some(delivery) = delivery_of(&message, route, &burst.merchant_of) else { continue };
                let id = message.attributes.get("drip-message-id").cloned().unwrap_or_default();
                if outcome.deliveries.insert(id, delivery).is_some() {
                    outcome.duplicates += 1;
                }
            }
        }
        if let Some(target) = target {
            outcome.feedback.refusals = target.take_deliveries(&burst.merchant_of, &mut outcome.deliveries);
            outcome.duplicates = target.duplicates();
            let first = format!("merchant_{}", burst.merchants[0]);
            let url = format!("{}/v1/rules/{}/keys/{first}", args.limiter.trim_end_matches('/'), rule.name);
            if let Ok(response) = http.get(&url).send().await
                && let Ok(report) = response.json::<serde_json::Value>().await
            {
                let at = wall_clock_millis() - burst.started;
                let level = report["adaptiveLevel"].as_f64().unwrap_or(1.0);
                outcome.feedback.levels.push((at, level, report["pausedUntil"].as_str().is_some()));
            }
        }
        for message in pubsub.pull(&topics.dlq, 1_000).await? {
            let reason = message.attributes.get("drip-reason").cloned().unwrap_or_default();
            outcome
                .dead
                .insert(message.attributes.get("drip-message-id").cloned().unwrap_or(message.message_id), reason);
        }
        if last_frame.elapsed() >= Duration::from_millis(if live { 250 } else { 1_000 }) {
            if live {
                let frame = frame(&outcome);
                print!("{}{frame}", clear_lines(printed_lines));
                printed_lines = frame.lines().count();
            } else {
                println!(
                    "t={:>5.1}s delivered {}/{}",
                    (wall_clock_millis() - burst.started) as f64 / 1_000.0,
                    outcome.deliveries.len(),
                    args.events
                );
            }
            std::io::stdout().flush()?;
            last_frame = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if live {
        print!("{}{}", clear_lines(printed_lines), frame(&outcome));
    }
    Ok(outcome)
}

pub(crate) fn delivery_of(
    message: &Pulled,
    route: &'static str,
    merchant_of: &HashMap<String, String>,
) -> Option<Delivery> {
    let id = message.attributes.get("drip-message-id")?;
    Some(Delivery {
        merchant: merchant_of.get(id).cloned().unwrap_or_default(),
        route,
        scheduled_for: parse_rfc3339(message.attributes.get("drip-scheduled-for")?).ok()?,
        delivered_at: parse_rfc3339(&message.publish_time).ok()?,
    })
}

/// Moves the cursor up over the previous frame and clears it.
pub(crate) fn clear_lines(lines: usize) -> String {
    if lines == 0 { String::new() } else { format!("\x1b[{lines}A\x1b[J") }
}

pub(crate) fn bar(filled: usize, width: usize) -> String {
    format!("{}{}", "█".repeat(filled.min(width)), "░".repeat(width - filled.min(width)))
}

pub(crate) fn render_frame(
    args: &Args,
    rule: &Rule,
    merchants: &[String],
    outcome: &Outcome,
    started: Millis,
) -> String {
    let deliveries = &outcome.deliveries;
    let limit = rule.limits[0];
    let now = wall_clock_millis();
    let per_merchant = args.events.div_ceil(merchants.len());
    let mut frame = format!(
        "Drip demo: {} payouts over {} merchants, limit {limit}   t = {:.1} s\n\n",
        args.events,
        merchants.len(),
        (now - started) as f64 / 1e3
    );
    for merchant in merchants {
        let mine: Vec<&Delivery> = deliveries.values().filter(|d| &d.merchant == merchant).collect();
        let recent = mine.iter().filter(|d| d.delivered_at > now - limit.per()).count();
        frame += &format!(
            "  merchant {merchant}  {} {:>3} in the last {}   delivered {:>4}/{per_merchant}\n",
            bar(recent * 20 / limit.limit().max(1) as usize, 20),
            recent,
            drip_core::time::format_duration(limit.per()),
            mine.len()
        );
    }
    let done = deliveries.len() + outcome.dead.len();
    frame += &format!("\n  backlog  {} {done}/{} delivered\n", bar(done * 40 / args.events.max(1), 40), args.events);
    if let Some(&(_, level, paused)) = outcome.feedback.levels.last() {
        let refusing = now - started >= THROTTLE_FROM && now - started < THROTTLE_UNTIL;
        frame += &format!(
            "\n  downstream  {}   merchant {}: {}, adaptive level {level:.2} ({:.0} a second)\n",
            if refusing { "429 Retry-After: 3" } else { "204 OK            " },
            merchants[0],
            if paused { "PAUSED" } else { "going " },
            level * limit.limit() as f64
        );
    }
    frame
}
