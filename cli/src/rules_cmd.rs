//! `drip rules diff OLD NEW`: per rule (matched by id), each edit and what it does to entities that
//! already have a backlog: safe, delays, or needs care (docs/rules.md: "Changing limits").

use std::path::PathBuf;
use std::process::ExitCode;

use drip_core::rules::RuleSet;
use drip_core::rules_diff::{Safety, diff};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RulesCommand {
    /// Compare two rules files; exits 1 with --check when an edit needs care.
    Diff {
        old: PathBuf,
        new: PathBuf,
        /// Exit 1 when any edit needs care (for CI before a rules change is applied).
        #[arg(long)]
        check: bool,
    },
}

pub fn run(args: Args) -> ExitCode {
    let RulesCommand::Diff { old, new, check } = args.command;
    let load = |path: &PathBuf| RuleSet::load(path).map_err(|errors| format!("{errors}"));
    let (old, new) = match (load(&old), load(&new)) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("drip rules diff: {e}");
            return ExitCode::from(2);
        }
    };
    let diffs = diff(&old, &new);
    if diffs.is_empty() {
        println!("no rule changes");
        return ExitCode::SUCCESS;
    }
    let mut needs_care = false;
    for rule in &diffs {
        println!("{} (id {})", rule.name, rule.id);
        for edit in &rule.edits {
            needs_care |= edit.safety == Safety::NeedsCare;
            println!("  {:<11} {}", edit.safety.to_string(), edit.what);
        }
    }
    if check && needs_care { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
