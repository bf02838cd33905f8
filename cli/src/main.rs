//! `drip`: check rules files and simulate schedules.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod api;
mod check_config;
mod connect;
mod decisions;
mod dlq;
mod feedback;
mod inspect;
mod limits;
mod output;
mod plot;
mod resume;
mod rules_cmd;
mod schema;
mod simulate;
mod summary;
mod transport;

#[derive(Debug, Parser)]
#[command(name = "drip", version, about = "Drip: a distributed drip rate limiter for Pub/Sub event streams")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate rules files: prints `ok`, or every error (file, rule, field, reason) and exits 1.
    CheckConfig(check_config::Args),
    /// Run an event file through the scheduler and print one decision per event (JSON lines).
    Simulate(simulate::Args),
    /// Show what the limiter holds for one entity: use of each limit, backlog, when it drains.
    Inspect(inspect::Args),
    /// Report a downstream's answer (429, 503 with Retry-After, ...) to the limiter (--api).
    Feedback(feedback::Args),
    /// Pause a key or a budget for a while (a partner's maintenance window, an incident).
    Pause(resume::PauseArgs),
    /// Lift a key's or a budget's pause (a partner's Retry-After, or feedback sent in error).
    Resume(resume::Args),
    /// Per-entity limits at run time: set, get, list, delete, history.
    Limits(limits::Args),
    /// Rules files: `diff OLD NEW` says what each edit does to entities with a backlog.
    Rules(rules_cmd::Args),
    /// Dead letters: `replay` publishes their events again, idempotently.
    Dlq(dlq::Args),
    /// Print the JSON Schema of the rules file or of an enriched overflow message.
    Schema(schema::Args),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::CheckConfig(args) => check_config::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Feedback(args) => feedback::run(args),
        Command::Pause(args) => resume::run_pause(args),
        Command::Resume(args) => resume::run(args),
        Command::Limits(args) => limits::run(args),
        Command::Rules(args) => rules_cmd::run(args),
        Command::Dlq(args) => dlq::run(args),
        Command::Schema(args) => schema::run(args),
    }
}
