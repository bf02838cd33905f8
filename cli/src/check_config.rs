use std::path::PathBuf;
use std::process::ExitCode;

use drip_core::rules::RuleSet;

pub fn run(files: &[PathBuf]) -> ExitCode {
    let mut failed = false;
    for file in files {
        match RuleSet::load(file) {
            Ok(rules) => {
                if rules.default_dlq_topic.is_none() && !rules.has_catch_all() {
                    eprintln!(
                        "{}: note: no default_dlq_topic and no catch-all rule; the limiter needs one of them",
                        file.display()
                    );
                }
            }
            Err(errors) => {
                println!("{errors}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        println!("ok");
        ExitCode::SUCCESS
    }
}
