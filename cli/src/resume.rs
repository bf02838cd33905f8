//! `drip pause` and `drip resume`: hold a key (or a budget) for a while, as for a partner's
//! maintenance window or an incident, and lift a pause, as an operator undoes a partner's bogus
//! `Retry-After` or a `drip feedback` sent in error. Audited like an override change; each prints
//! what holds the key back after it.

use std::process::ExitCode;

use drip_core::time::format_rfc3339;
use drip_store::Resumed;

use crate::output::{Output, Printed};
use crate::transport::Target;

/// The key or budget a pause or resume names, why, and how to print the answer.
#[derive(Debug, clap::Args)]
pub struct KeyOrBudget {
    #[command(flatten)]
    target: Target,
    /// The rule, as the rules file names it.
    rule: String,
    /// The key (not with --budget).
    #[arg(required_unless_present = "budget")]
    key: Option<String>,
    /// A budget the rule draws from, for every key that draws from it, instead of a key.
    #[arg(long, conflicts_with = "key")]
    budget: Option<String>,
    /// Why, kept in the rule's audit list (`drip limits history`).
    #[arg(long)]
    reason: Option<String>,
    /// `table` (a line) or `json` (the limiter's answer).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

impl KeyOrBudget {
    fn named(&self) -> (&str, &str, Option<&str>) {
        (&self.rule, self.key.as_deref().unwrap_or_default(), self.budget.as_deref())
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    named: KeyOrBudget,
}

pub fn run(args: Args) -> ExitCode {
    crate::output::run("resume", args.named.output, resume(&args.named))
}

#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    #[command(flatten)]
    named: KeyOrBudget,
    /// How long from now, e.g. `15m` (at most 7d). A pause that ends later already stays.
    #[arg(long = "for", value_name = "DURATION")]
    length: String,
}

pub fn run_pause(args: PauseArgs) -> ExitCode {
    crate::output::run("pause", args.named.output, pause(&args))
}

async fn pause(args: &PauseArgs) -> anyhow::Result<Printed> {
    let transport = args.named.target.connect().await?;
    let paused = transport.pause(args.named.named(), &args.length, args.named.reason.as_deref()).await?;
    let in_force = match paused.paused_until {
        Some(until) => format!("in force now: no new slot before {}\n", format_rfc3339(until)),
        None => "in force now: not paused\n".to_owned(),
    };
    Ok(Printed { table: format!("{}{in_force}", paused.change.describe()), json: serde_json::to_value(&paused)? })
}

async fn resume(args: &KeyOrBudget) -> anyhow::Result<Printed> {
    let transport = args.target.connect().await?;
    let resumed = transport.resume(args.named(), args.reason.as_deref()).await?;
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
