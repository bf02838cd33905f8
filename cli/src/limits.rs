//! `drip limits`: per-entity limits at run time, through the limiter's API (`--api`) or in the
//! Redis it uses. A change applies from the entity's next reservation; each is recorded (who,
//! what, before, after) in the rule's audit list.

use std::process::ExitCode;

use drip_core::schedule::LimitOverride;
use drip_core::time::{DAY, Millis, parse_rfc3339};
use drip_store::inspect::OverrideReport;
use drip_store::{AuditEntry, OverrideChange};

use crate::output::{Output, Printed};
use crate::transport::{DeleteOverride, SetOverride, Target};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: LimitsCommand,
    /// `table` (lines) or `json` (one document).
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

/// One key of one rule.
#[derive(Debug, clap::Args)]
struct Entity {
    #[command(flatten)]
    target: Target,
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
        #[arg(long, allow_hyphen_values = true)]
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
        target: Target,
        #[arg(long)]
        rule: String,
    },
    /// Remove one key's override of the rule's limit with this period (`--per 1m`, or `--limit
    /// 500/1m` as `set` names it: the count is not needed).
    Delete {
        #[command(flatten)]
        entity: Entity,
        #[arg(long, visible_alias = "limit")]
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
        target: Target,
        #[arg(long)]
        rule: String,
        #[arg(long, default_value_t = 20)]
        count: usize,
    },
}

pub fn run(args: Args) -> ExitCode {
    crate::output::run("limits", args.output, execute(args.command))
}

/// `2026-12-31` → the end of that UTC day; an RFC 3339 time as it is.
fn parse_expiry(text: &str) -> anyhow::Result<Millis> {
    if let Ok(day_start) = parse_rfc3339(&format!("{text}T00:00:00Z")) {
        return Ok(day_start + DAY);
    }
    parse_rfc3339(text).map_err(|e| anyhow::anyhow!("--expires: {e} (give a date like 2026-12-31 or an RFC 3339 time)"))
}

fn change(change: &OverrideChange) -> anyhow::Result<Printed> {
    Ok(Printed { table: AuditEntry::Override(change.clone()).describe(), json: serde_json::to_value(change)? })
}

async fn execute(command: LimitsCommand) -> anyhow::Result<Printed> {
    match command {
        LimitsCommand::Set { entity: Entity { target, rule, key }, limit, window, expires, forever, reason } => {
            // Without --expires (or --forever) a replaced override keeps its end (LimitOverride::replacing).
            let until = expires.as_deref().map(parse_expiry).transpose()?;
            // Refused here as the limiter would refuse it, naming the flag as it was given.
            LimitOverride::replacing(None, 1, (until, forever), drip_core::time::wall_clock_millis())
                .map_err(|e| anyhow::anyhow!("--expires {}: {e}", expires.as_deref().unwrap_or_default()))?;
            let set =
                SetOverride { limit: &limit, window: window.as_deref(), until, forever, reason: reason.as_deref() };
            let transport = target.connect().await?;
            let mut printed = change(&transport.set_override(&rule, &key, &set).await?)?;
            // A key Drip holds nothing else for is either new or misspelt: said, not refused (an
            // override may be set before a merchant's first event).
            let report = transport.inspect(&rule, &key).await?;
            let seen = report.last_slot.is_some() || report.backlog > 0 || report.parked > 0;
            if !seen {
                printed.table += &format!(
                    "note: Drip remembers no event of key '{}' of rule '{rule}': the override waits for its first one (check the key's spelling if it should have some)\n",
                    report.key
                );
            }
            printed.json["keySeen"] = seen.into();
            Ok(printed)
        }
        LimitsCommand::Delete { entity: Entity { target, rule, key }, per, window, reason } => {
            // `--limit 500/1m` names the limit as `set` does: its period is what picks it.
            let per = per.rsplit_once('/').map_or(per.as_str(), |(_, per)| per);
            let which = DeleteOverride { per, window: window.as_deref(), reason: reason.as_deref() };
            change(&target.connect().await?.delete_override(&rule, &key, &which).await?)
        }
        LimitsCommand::Get { entity: Entity { target, rule, key } } => {
            let overrides = target.connect().await?.overrides(&rule, &key).await?;
            let key = drip_core::template::cap_key(key);
            let json = serde_json::json!({"rule": rule, "key": key, "overrides": overrides});
            Ok(Printed { table: render(&overrides), json })
        }
        LimitsCommand::List { target, rule } => {
            let all = target.connect().await?.list_overrides(&rule).await?;
            let table = match all.is_empty() {
                true => format!("no overrides for rule {rule}\n"),
                false => all.iter().map(|k| format!("{}\n{}", k.key, render(&k.overrides))).collect(),
            };
            Ok(Printed { table, json: serde_json::to_value(&all)? })
        }
        LimitsCommand::History { target, rule, count } => {
            let changes = target.connect().await?.history(&rule, count).await?;
            Ok(Printed {
                table: changes.iter().map(AuditEntry::describe).collect(),
                json: serde_json::to_value(&changes)?,
            })
        }
    }
}

fn render(overrides: &[OverrideReport]) -> String {
    let mut out = String::new();
    for o in overrides {
        let until = o.until.as_deref().map_or(String::new(), |u| format!(" until {u}"));
        let ended = if o.in_force { "" } else { " (ended)" };
        out += &format!("  {}: {}{until}{ended}\n", o.limit, o.count);
    }
    if out.is_empty() { "  no overrides\n".into() } else { out }
}
