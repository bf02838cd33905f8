//! `drip limits`: per-entity limits at run time, in the Redis the limiter uses (the same as the
//! limiter's `/v1/rules/{rule}/keys/{key}/limits`). A change applies from the entity's next
//! reservation; each is recorded (who, what, before, after) in the rule's audit list.

use std::process::ExitCode;

use drip_core::schedule::{LimitOverride, override_id};
use drip_core::time::{DAY, Millis, format_rfc3339, parse_rfc3339};
use drip_store::{AuditEntry, Author, FeedbackChange, OverrideChange, OverrideView};

use crate::connect::StoreArgs;
use crate::output::{Output, Printed};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: LimitsCommand,
    /// `table` (lines) or `json` (one document).
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

/// One key of one rule, in the limiter's Redis.
#[derive(Debug, clap::Args)]
struct Entity {
    #[command(flatten)]
    target: StoreArgs,
    #[arg(long)]
    rule: String,
    #[arg(long)]
    key: String,
}

#[derive(Debug, clap::Subcommand)]
enum LimitsCommand {
    /// Override one limit of a rule for one key, e.g. `--limit 500/1m` (the rule's 1m limit).
    Set {
        #[command(flatten)]
        entity: Entity,
        /// COUNT/PERIOD: the new count of the rule's limit with that period.
        #[arg(long)]
        limit: String,
        /// fixed, sliding or gcra, when two of the rule's limits share the period.
        #[arg(long)]
        window: Option<String>,
        /// When it ends: an RFC 3339 time, or a date (the override holds through that UTC day).
        /// Without it an override that already has an end keeps it.
        #[arg(long, conflicts_with = "forever")]
        expires: Option<String>,
        /// No end, even if the override being replaced had one.
        #[arg(long)]
        forever: bool,
        /// Why, kept in the rule's audit list (`history`).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Show one key's overrides.
    Get {
        #[command(flatten)]
        entity: Entity,
    },
    /// Every key of a rule with overrides.
    List {
        #[command(flatten)]
        target: StoreArgs,
        #[arg(long)]
        rule: String,
    },
    /// Remove one key's override of the rule's limit with this period (e.g. `--per 1m`).
    Delete {
        #[command(flatten)]
        entity: Entity,
        #[arg(long)]
        per: String,
        #[arg(long)]
        window: Option<String>,
        /// Why, kept in the rule's audit list (`history`).
        #[arg(long)]
        reason: Option<String>,
    },
    /// The rule's latest override changes, newest first.
    History {
        #[command(flatten)]
        target: StoreArgs,
        #[arg(long)]
        rule: String,
        #[arg(long, default_value_t = 20)]
        count: usize,
    },
}

pub fn run(args: Args) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(execute(args.command)));
    match result {
        Ok(printed) => {
            print!("{}", printed.render(args.output));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drip limits: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `2026-12-31` → the end of that UTC day; an RFC 3339 time as it is.
fn parse_expiry(text: &str) -> anyhow::Result<Millis> {
    if let Ok(day_start) = parse_rfc3339(&format!("{text}T00:00:00Z")) {
        return Ok(day_start + DAY);
    }
    parse_rfc3339(text).map_err(|e| anyhow::anyhow!("--expires: {e} (give a date like 2026-12-31 or an RFC 3339 time)"))
}

/// Who is making the change, for the audit list.
fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    format!("{user}@{host} (drip limits)")
}

fn show(o: Option<&OverrideView>) -> String {
    match o {
        None => "the rule's".into(),
        Some(OverrideView { limit, until: None }) => limit.to_string(),
        Some(OverrideView { limit, until: Some(until) }) => format!("{limit} until {}", format_rfc3339(*until)),
    }
}

fn describe(entry: &AuditEntry) -> String {
    match entry {
        AuditEntry::Override(change) => describe_override(change),
        AuditEntry::Feedback(call) => describe_feedback(call),
    }
}

fn describe_override(change: &OverrideChange) -> String {
    let reason = change.reason.as_deref().map_or(String::new(), |reason| format!(": {reason}"));
    format!(
        "{} {} {}: {} -> {} (by {} at {}{reason})\n",
        change.rule,
        change.key,
        change.limit,
        show(change.before.as_ref()),
        show(change.after.as_ref()),
        change.by,
        format_rfc3339(change.at)
    )
}

/// `payouts merchant_7 feedback 429 (Retry-After 30 s): paused until … (was none), level 0.5 (by … at …)`.
fn describe_feedback(call: &FeedbackChange) -> String {
    let paused = |at: Option<Millis>| at.map_or("none".to_owned(), format_rfc3339);
    let retry_after = call.retry_after.map_or(String::new(), |s| format!(" (Retry-After {s} s)"));
    let level = call.adaptive_level.map_or(String::new(), |l| format!(", adaptive level {l}"));
    format!(
        "{} {} feedback {}{retry_after} on {}: paused until {} (was {}){level} (by {} at {})\n",
        call.rule,
        call.key,
        call.status,
        call.target,
        paused(call.paused_after),
        paused(call.paused_before),
        call.by,
        format_rfc3339(call.at)
    )
}

fn change(change: &OverrideChange) -> anyhow::Result<Printed> {
    Ok(Printed { table: describe_override(change), json: serde_json::to_value(change)? })
}

/// A key's overrides as JSON: each of the rule's limits that has one.
fn overrides_json(
    rule: &drip_core::rules::Rule,
    overrides: &std::collections::BTreeMap<String, LimitOverride>,
) -> serde_json::Value {
    let now = drip_core::time::wall_clock_millis();
    let each = rule.limits.iter().filter_map(|limit| {
        overrides.get(&override_id(limit)).map(|o| {
            serde_json::json!({
                "limit": limit.to_string(),
                "count": o.limit,
                "until": o.until.map(format_rfc3339),
                "inForce": o.in_force(now),
            })
        })
    });
    serde_json::Value::Array(each.collect())
}

async fn execute(command: LimitsCommand) -> anyhow::Result<Printed> {
    match command {
        LimitsCommand::Set { entity: Entity { target, rule, key }, limit, window, expires, forever, reason } => {
            let rules = target.rules()?;
            let rule = target.rule(&rules, &rule)?;
            let (limit, count) = rule.override_target(&limit, window.as_deref()).map_err(anyhow::Error::msg)?;
            let now = drip_core::time::wall_clock_millis();
            let key = drip_core::template::cap_key(key);
            let store = target.store().await?;
            let rule_ref = drip_store::RuleRef::of(rule);
            // Without --expires (or --forever) a replaced override keeps its end (LimitOverride::replacing).
            let until = expires.as_deref().map(parse_expiry).transpose()?;
            let current = store.overrides(rule_ref, &key).await?.get(&override_id(limit)).copied();
            let set = LimitOverride::replacing(current, count, (until, forever), now)
                .map_err(|e| anyhow::anyhow!("--expires {}: {e}", expires.as_deref().unwrap_or_default()))?;
            let author = Author { by: &operator(), reason: reason.as_deref() };
            change(&store.set_override(rule_ref, &key, limit, set, author, None).await?)
        }
        LimitsCommand::Delete { entity: Entity { target, rule, key }, per, window, reason } => {
            let rules = target.rules()?;
            let rule = target.rule(&rules, &rule)?;
            let (limit, _) =
                rule.override_target(&format!("1/{per}"), window.as_deref()).map_err(anyhow::Error::msg)?;
            let key = drip_core::template::cap_key(key);
            let author = Author { by: &operator(), reason: reason.as_deref() };
            let store = target.store().await?;
            change(&store.delete_override(drip_store::RuleRef::of(rule), &key, limit, author, None).await?)
        }
        LimitsCommand::Get { entity: Entity { target, rule, key } } => {
            let rules = target.rules()?;
            let rule = target.rule(&rules, &rule)?;
            let key = drip_core::template::cap_key(key);
            let overrides = target.store().await?.overrides(drip_store::RuleRef::of(rule), &key).await?;
            let json =
                serde_json::json!({"rule": rule.name, "key": key, "overrides": overrides_json(rule, &overrides)});
            Ok(Printed { table: render(rule, &overrides), json })
        }
        LimitsCommand::List { target, rule } => {
            let rules = target.rules()?;
            let rule = target.rule(&rules, &rule)?;
            let all = target.store().await?.list_overrides(drip_store::RuleRef::of(rule)).await?;
            let json = all
                .iter()
                .map(|(key, overrides)| serde_json::json!({"key": key, "overrides": overrides_json(rule, overrides)}))
                .collect();
            let table = match all.is_empty() {
                true => format!("no overrides for rule {}\n", rule.name),
                false => all.iter().map(|(key, overrides)| format!("{key}\n{}", render(rule, overrides))).collect(),
            };
            Ok(Printed { table, json: serde_json::Value::Array(json) })
        }
        LimitsCommand::History { target, rule, count } => {
            let changes = target.store().await?.audit_history(&rule, count).await?;
            Ok(Printed { table: changes.iter().map(describe).collect(), json: serde_json::to_value(&changes)? })
        }
    }
}

fn render(rule: &drip_core::rules::Rule, overrides: &std::collections::BTreeMap<String, LimitOverride>) -> String {
    let now = drip_core::time::wall_clock_millis();
    let mut out = String::new();
    for limit in &rule.limits {
        if let Some(o) = overrides.get(&override_id(limit)) {
            let until = o.until.map_or(String::new(), |u| format!(" until {}", format_rfc3339(u)));
            let ended = if o.in_force(now) { "" } else { " (ended)" };
            out += &format!("  {limit}: {}{until}{ended}\n", o.limit);
        }
    }
    if out.is_empty() { "  no overrides\n".into() } else { out }
}
