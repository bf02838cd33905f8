//! `drip check-config FILE...`: every error of each rules file (file, rule, field, reason), or `ok`.

use std::path::PathBuf;
use std::process::ExitCode;

use drip_core::rules::RuleSet;

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
        let (errors, notes) = match RuleSet::load(file) {
            Ok(rules) if rules.default_dlq_topic.is_none() && !rules.has_catch_all() => {
                let note = "no default_dlq_topic and no catch-all rule; the limiter needs one of them";
                eprintln!("{}: note: {note}", file.display());
                (Vec::new(), vec![note])
            }
            Ok(_) => (Vec::new(), Vec::new()),
            Err(errors) => {
                table += &format!("{errors}\n");
                (errors.0, Vec::new())
            }
        };
        failed |= !errors.is_empty();
        let errors: Vec<_> = errors
            .iter()
            .map(|e| serde_json::json!({"rule": e.rule, "field": e.field, "message": e.message}))
            .collect();
        files.push(serde_json::json!({"file": file.display().to_string(), "ok": errors.is_empty(), "errors": errors, "notes": notes}));
    }
    if !failed {
        table += "ok\n";
    }
    print!("{}", Printed { table, json: serde_json::json!({"ok": !failed, "files": files}) }.render(args.output));
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
