//! `drip pause` and `drip resume`: hold a key (or a budget) for a while, as for a partner's
//! maintenance window or an incident, and lift a pause, as an operator undoes a partner's bogus
//! `Retry-After` or a `drip feedback` sent in error. Audited like an override change; each prints
//! what holds the key back after it.

use std::process::ExitCode;

use drip_core::time::format_rfc3339;
use drip_store::Resumed;

use crate::output::{Output, Printed};
use crate::transport::Target;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// The rule, as the rules file names it.
    rule: String,
    /// The key whose pause to lift (not with --budget).
    #[arg(required_unless_present = "budget")]
    key: Option<String>,
    /// A budget the rule draws from: lift its pause instead of a key's.
    #[arg(long, conflicts_with = "key")]
    budget: Option<String>,
    /// Why, kept in the rule's audit list (`drip limits history`).
    #[arg(long)]
    reason: Option<String>,
    /// `table` (a line) or `json` (the limiter's answer).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub fn run(args: Args) -> ExitCode {
    crate::output::run("resume", args.output, resume(&args))
}

#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    #[command(flatten)]
    target: Target,
    /// The rule, as the rules file names it.
    rule: String,
    /// The key to pause (not with --budget).
    #[arg(required_unless_present = "budget")]
    key: Option<String>,
    /// A budget the rule draws from: pause it, for every key that draws from it.
    #[arg(long, conflicts_with = "key")]
    budget: Option<String>,
    /// How long from now, e.g. `15m` (at most 7d). A pause that ends later already stays.
    #[arg(long = "for", value_name = "DURATION")]
    length: String,
    /// Why, kept in the rule's audit list (`drip limits history`).
    #[arg(long)]
    reason: Option<String>,
    /// `table` (a line) or `json` (the limiter's answer).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub fn run_pause(args: PauseArgs) -> ExitCode {
    crate::output::run("pause", args.output, pause(&args))
}

async fn pause(args: &PauseArgs) -> anyhow::Result<Printed> {
    let transport = args.target.connect().await?;
    let named = (args.rule.as_str(), args.key.as_deref().unwrap_or_default(), args.budget.as_deref());
    let paused = transport.pause(named, &args.length, args.reason.as_deref()).await?;
    let in_force = match paused.paused_until {
        Some(until) => format!("in force now: no new slot before {}\n", format_rfc3339(until)),
        None => "in force now: not paused\n".to_owned(),
    };
    Ok(Printed { table: format!("{}{in_force}", paused.change.describe()), json: serde_json::to_value(&paused)? })
}

async fn resume(args: &Args) -> anyhow::Result<Printed> {
    let transport = args.target.connect().await?;
    let resumed = transport
        .resume(&args.rule, args.key.as_deref().unwrap_or_default(), args.budget.as_deref(), args.reason.as_deref())
        .await?;
    Ok(Printed { table: describe(&resumed), json: serde_json::to_value(&resumed)? })
}

/// The change, then what is in force now.
fn describe(resumed: &Resumed) -> String {
    let in_force = match (resumed.paused_until, resumed.change.key.is_empty()) {
        (_, true) => "in force now: the budget is not paused".to_owned(),
        (None, false) => "in force now: not paused (new events take slots at the rate in force)".to_owned(),
        (Some(until), false) => {
            format!("in force now: still paused until {} by a budget of the rule", format_rfc3339(until))
        }
    };
    format!("{}{in_force}\n", resumed.change.describe())
}
