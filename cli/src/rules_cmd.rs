//! `drip rules diff OLD NEW`: per rule (matched by id), each edit and what it does to entities that
//! already have a backlog: safe, delays, or needs care (docs/rules.md: "Changing limits").

use std::path::PathBuf;
use std::process::ExitCode;

use drip_core::rules::RuleSet;
use drip_core::rules_diff::{Safety, diff};

use crate::output::{Output, Printed};

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
        /// `table` (a line per edit) or `json` (each rule's edits with their safety).
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

pub fn run(args: Args) -> ExitCode {
    let RulesCommand::Diff { old, new, check, output } = args.command;
    let load = |path: &PathBuf| RuleSet::load(path).map_err(|errors| format!("{errors}"));
    let (old, new) = match (load(&old), load(&new)) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("drip rules diff: {e}");
            return ExitCode::from(2);
        }
    };
    let diffs = diff(&old, &new);
    let needs_care = diffs.iter().flat_map(|r| &r.edits).any(|e| e.safety == Safety::NeedsCare);
    let mut table = String::new();
    for rule in &diffs {
        table += &format!("{} (id {})\n", rule.name, rule.id);
        for edit in &rule.edits {
            table += &format!("  {:<11} {}\n", edit.safety.to_string(), edit.what);
        }
    }
    if diffs.is_empty() {
        table = "no rule changes\n".into();
    }
    let rules: Vec<_> = diffs
        .iter()
        .map(|rule| {
            let edits: Vec<_> = rule
                .edits
                .iter()
                .map(|e| serde_json::json!({"safety": e.safety.to_string(), "what": e.what}))
                .collect();
            serde_json::json!({"id": rule.id, "name": rule.name, "edits": edits})
        })
        .collect();
    let json = serde_json::json!({"needsCare": needs_care, "rules": rules});
    print!("{}", Printed { table, json }.render(output));
    if check && needs_care { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
