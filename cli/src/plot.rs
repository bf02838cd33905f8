//! The `--plot` chart: for each limit of each rule, the cost each key got per window, as bars side
//! by side within the window, against the limit as a red line.

use std::path::Path;

use drip_core::ledger::fixed_window_usage;
use drip_core::rules::RuleSet;
use drip_core::time::{Millis, format_rfc3339};
use plotters::prelude::*;

use crate::decisions::Outcome;
use crate::summary::{Ledger, ledgers};

pub const KEYS_DRAWN: usize = 6;
/// Blue, orange, green, purple, teal, brown: apart from each other and from the red limit line.
pub const KEY_COLORS: [RGBColor; KEYS_DRAWN] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
];
const PANEL_HEIGHT: u32 = 340;

pub fn draw(path: &Path, rules: &RuleSet, outcomes: &[Outcome]) -> anyhow::Result<()> {
    let ledgers = ledgers(outcomes);
    let mut panels = Vec::new();
    for (rule_name, keys) in &ledgers {
        let Some(rule) = rules.rule(rule_name) else { continue };
        let mut busiest: Vec<(&str, &Ledger)> = keys.iter().map(|(k, l)| (*k, l)).collect();
        busiest.sort_by_key(|(key, ledger)| (std::cmp::Reverse(ledger.iter().map(|&(_, c)| c).sum::<u64>()), *key));
        let hidden = busiest.len().saturating_sub(KEYS_DRAWN);
        busiest.truncate(KEYS_DRAWN);
        for limit in &rule.limits {
            panels.push((rule_name, *limit, busiest.clone(), hidden));
        }
    }
    if panels.is_empty() {
        anyhow::bail!("nothing was scheduled, so there is nothing to chart");
    }
    let first = ledgers.values().flat_map(|keys| keys.values().flatten()).map(|&(s, _)| s).min().unwrap_or(0);
    let root = SVGBackend::new(path, (1100, PANEL_HEIGHT * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, (rule_name, limit, keys, hidden)) in root.split_evenly((panels.len(), 1)).iter().zip(&panels) {
        let per = limit.per();
        let origin = first.div_euclid(per) * per;
        let usage: Vec<(&str, Vec<(Millis, u64)>)> =
            keys.iter().map(|(key, ledger)| (*key, fixed_window_usage(ledger, per).into_iter().collect())).collect();
        let last = usage.iter().flat_map(|(_, u)| u.iter().map(|&(w, _)| w)).max().unwrap_or(origin) + per;
        let top = usage.iter().flat_map(|(_, u)| u.iter().map(|&(_, c)| c)).max().unwrap_or(0).max(limit.limit());
        let seconds = |t: Millis| (t - origin) as f64 / 1_000.0;
        let mut title = format!("{rule_name}: {} — cost per window, by key", limit);
        if *hidden > 0 {
            title.push_str(&format!(" (busiest {KEYS_DRAWN} keys; {hidden} more not drawn)"));
        }
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..seconds(last), 0f64..(top as f64 * 1.15))?;
        chart
            .configure_mesh()
            .x_desc(format!("seconds since {}", format_rfc3339(origin)))
            .y_desc("cost in window")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        let width = per as f64 / 1_000.0 / usage.len() as f64;
        for (index, (key, windows)) in usage.iter().enumerate() {
            let color = KEY_COLORS[index % KEYS_DRAWN];
            chart
                .draw_series(windows.iter().map(|&(window, cost)| {
                    let x0 = seconds(window) + width * index as f64;
                    Rectangle::new([(x0 + width * 0.1, 0.0), (x0 + width * 0.9, cost as f64)], color.filled())
                }))?
                .label(*key)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        }
        chart
            .draw_series(LineSeries::new(
                [(0.0, limit.limit() as f64), (seconds(last), limit.limit() as f64)],
                RED.stroke_width(2),
            ))?
            .label(format!("limit {}", limit.limit()))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED.stroke_width(2)));
        chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.85)).draw()?;
    }
    root.present()?;
    Ok(())
}
