//! `drip inspect`: what Redis holds for one entity, for an operator asking "why is this merchant
//! waiting, and until when?".

use std::process::ExitCode;

use drip_core::counted;
use drip_store::inspect::EntityReport;

use crate::output::{Output, Printed};
use crate::transport::Target;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// `table` (lines) or `json` (as the limiter's GET /v1/rules/{rule}/keys/{key}).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// The same as `--output json` (kept for scripts that pass it).
    #[arg(long, hide = true)]
    json: bool,
    /// The rule's name (`--rule`, as `drip limits` takes it, works too).
    #[arg(required_unless_present = "rule_flag", conflicts_with = "rule_flag")]
    rule: Option<String>,
    /// The entity's key (`--key` works too).
    #[arg(required_unless_present = "key_flag", conflicts_with = "key_flag")]
    key: Option<String>,
    #[arg(long = "rule", id = "rule_flag", hide = true)]
    rule_flag: Option<String>,
    #[arg(long = "key", id = "key_flag", hide = true)]
    key_flag: Option<String>,
}

pub fn run(args: Args) -> ExitCode {
    let output = if args.json { Output::Json } else { args.output };
    crate::output::run("inspect", output, report(&args))
}

async fn report(args: &Args) -> anyhow::Result<Printed> {
    let rule = args.rule.as_deref().or(args.rule_flag.as_deref()).unwrap_or_default();
    let key = args.key.as_deref().or(args.key_flag.as_deref()).unwrap_or_default();
    let report = args.target.connect().await?.inspect(rule, key).await?;
    Ok(Printed { table: render(&report), json: serde_json::to_value(&report)? })
}

/// `n`, or `n-m` when only the bounds are known.
fn range(least: u64, most: Option<u64>) -> String {
    match most {
        Some(most) => format!("{least}-{most}"),
        None => least.to_string(),
    }
}

fn render(report: &EntityReport) -> String {
    let mut out = format!("rule       {}\nkey        {}\nnow        {}\n", report.rule, report.key, report.now);
    out += &format!("last slot  {}\n", report.last_slot.as_deref().unwrap_or("none remembered (idle)"));
    match (&report.drains_at, &report.drains_after) {
        (Some(at), _) => out += &format!("backlog    {} ahead, drains at {at}\n", counted(report.backlog, "event")),
        (None, Some(after)) => {
            out += &format!(
                "backlog    {} ahead, drains after the pause ends at {after} (they take new slots then)\n",
                counted(report.backlog, "event")
            )
        }
        (None, None) => out += "backlog    none\n",
    }
    if report.parked > 0 {
        out += &format!(
            "parked     {}, no slot yet: the drain books them at the rate in force\n",
            counted(report.parked, "event")
        );
    }
    for class in &report.classes {
        let drains = class.drains_at.as_deref().map_or(String::new(), |at| format!(", drains at {at}"));
        out += &format!("class      {}: {} ahead{drains}\n", class.class, counted(class.backlog, "event"));
    }
    for why in &report.waiting_on {
        out += &format!("waiting    {why}\n");
    }
    out += "limits\n";
    let mut estimated = false;
    for limit in &report.limits {
        let used = range(limit.used_now, limit.used_now_at_most);
        let ahead = range(limit.ahead, limit.ahead_at_most);
        estimated |= limit.used_now_at_most.is_some() || limit.ahead_at_most.is_some();
        out += &format!("  {:<28} {used:>6} of {:<6} used now, {ahead} ahead\n", limit.limit, limit.capacity);
    }
    if estimated {
        out += "  (a range is an estimate with its bounds: a fixed limit keeps only its last window, and a\n   cost template's events cost between 1 and the rule's largest cost)\n";
    }
    if let Some(until) = &report.paused_until {
        out += &format!("paused     until {until} (the partner said to wait, or an operator paused it)\n");
    }
    for o in &report.overrides {
        let until = o.until.as_deref().map_or(String::new(), |u| format!(" until {u}"));
        let state = if o.in_force { "" } else { " (ended)" };
        let set = o.set.as_deref().map_or(String::new(), |set| format!(" ({set})"));
        out += &format!("override   {} -> {}{until}{state}{set}\n", o.limit, o.count);
    }
    if let Some(level) = report.adaptive_level {
        out += &format!("adaptive   level {level:.3} of each count\n");
    }
    if let Some(latency) = &report.latency {
        out += &format!("latency    {}\n", describe_latency(latency));
    }
    for budget in &report.budgets {
        let share = budget.max_share.map_or(String::new(), |s| format!(", max share {s}"));
        out += &format!("budget     {}{share}\n", budget.name);
        for limit in &budget.limits {
            out += &format!(
                "  {:<28} {:>6} of {:<6} used now by everyone, {} booked ahead\n",
                limit.limit, limit.used_now, limit.capacity, limit.ahead
            );
        }
        for floor in &budget.floors {
            for (limit, held) in budget.limits.iter().zip(&floor.limits) {
                let kind = if budget.classes { "reserve" } else { "floor" };
                let holder =
                    floor.key.as_ref().map_or_else(|| floor.rule.clone(), |key| format!("{} key {key}", floor.rule));
                out += &format!(
                    "  {kind} {holder} {}: {} of {} units of each {} window; {} used now, {} booked ahead\n",
                    floor.floor, held.units, limit.capacity, limit.limit, held.used_now, held.ahead
                );
            }
        }
        if let Some(lease) = &budget.lease {
            out += &format!(
                "  leased over {} partitions (use above: what the home leased); this key's partition {}:\n",
                lease.partitions, lease.partition
            );
            for (limit, held) in budget.limits.iter().zip(&lease.limits) {
                let full =
                    held.home_full_through.as_deref().map_or(String::new(), |w| format!("; home full through {w}"));
                let returned = match held.returned {
                    0 => String::new(),
                    units => format!(", {units} given back"),
                };
                out += &format!(
                    "  {:<28} {} of {} leased now booked, {} of {} ahead{returned}, {} stranded so far{full}\n",
                    limit.limit, held.booked_now, held.leased_now, held.booked_ahead, held.leased_ahead, held.stranded
                );
            }
        }
        if let Some(fair) = &budget.fair {
            let wait = fair.expected_wait_ms.map_or_else(
                || "nothing parked".to_owned(),
                |ms| format!("its parked events through in about {:.1} s", ms as f64 / 1e3),
            );
            out += &format!(
                "  fair: books {} ms ahead; {} keys waiting; this key weight {}, {:.0} % of each window while they wait, {wait}\n",
                fair.near_horizon_ms,
                fair.waiting_keys,
                fair.weight,
                100.0 * fair.share
            );
            for waiting in &fair.busiest {
                out += &format!(
                    "    waiting {} key {}: {} parked, weight {} ({:.0} %)\n",
                    waiting.rule,
                    waiting.key,
                    waiting.parked,
                    waiting.weight,
                    100.0 * waiting.share
                );
            }
        }
        if let Some(until) = &budget.paused_until {
            out += &format!("  paused until {until}\n");
        }
        if let Some(level) = budget.adaptive_level {
            out += &format!("  adaptive level {level:.3}\n");
        }
        if let Some(latency) = &budget.latency {
            out += &format!("  latency {}\n", describe_latency(latency));
        }
    }
    out
}

/// `baseline 80.0 ms; cut from 0.900 to 0.675, climbing for 2 windows; last judged …`.
fn describe_latency(latency: &drip_store::inspect::LatencyView) -> String {
    let mut line = format!("baseline {:.1} ms", latency.baseline_ms);
    if let (Some(hurt), Some(cut)) = (latency.level_that_hurt, latency.cut_to) {
        line += &format!("; cut from {hurt:.3} to {cut:.3}, climbing for {} windows", latency.climbing_for);
    }
    if let Some(level) = latency.shadow_level {
        line += &format!("; shadow: would be at level {level:.3}");
    }
    line + &format!("; last judged the window of {}", latency.last_judged)
}
