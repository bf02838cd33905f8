//! `drip resume`: lift a key's (or a budget's) pause, as an operator undoes a partner's bogus
//! `Retry-After` or a `drip feedback` sent in error. Audited like an override change; prints what
//! holds the key back after it.

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
