//! `drip check-config FILE...`: every error of each rules file (file, rule, field, reason), or `ok`;
//! and what the file allows but likely does not mean, as warnings (exit 0).

use std::path::PathBuf;
use std::process::ExitCode;

use drip_core::rules::{ConfigError, RuleSet};

use crate::output::{Output, Printed};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// `table` (`ok`, or an error a line) or `json` (each file's errors and notes).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub fn run(args: Args) -> ExitCode {
    let (mut table, mut files, mut failed) = (String::new(), Vec::new(), false);
    for file in &args.files {
        let (errors, notes, warnings) = match RuleSet::load(file) {
            Ok(rules) => {
                let mut notes = Vec::new();
                if rules.default_dlq_topic.is_none() && !rules.has_catch_all() {
                    notes.push("no default_dlq_topic and no catch-all rule; the limiter needs one of them");
                }
                let warnings: Vec<_> = rules
                    .warnings()
                    .into_iter()
                    .map(|w| ConfigError { file: file.display().to_string(), ..w })
                    .collect();
                (Vec::new(), notes, warnings)
            }
            Err(errors) => {
                table += &format!("{errors}\n");
                (errors.0, Vec::new(), Vec::new())
            }
        };
        for note in &notes {
            eprintln!("{}: note: {note}", file.display());
        }
        for warning in &warnings {
            table += &format!("warning: {warning}\n");
        }
        failed |= !errors.is_empty();
        let as_json = |problems: &[ConfigError]| -> Vec<serde_json::Value> {
            problems
                .iter()
                .map(|e| serde_json::json!({"rule": e.rule, "field": e.field, "message": e.message}))
                .collect()
        };
        files.push(serde_json::json!({
            "file": file.display().to_string(),
            "ok": errors.is_empty(),
            "errors": as_json(&errors),
            "warnings": as_json(&warnings),
            "notes": notes,
        }));
    }
    if !failed {
        table += "ok\n";
    }
    print!("{}", Printed { table, json: serde_json::json!({"ok": !failed, "files": files}) }.render(args.output));
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
