//! What is wrong with a rules file: each problem with its file, rule and field, all of them at once.

use std::fmt;

/// One problem in a rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// `rule 'payouts'`, or `rule #3` when the rule has no usable name; `None` for top-level fields.
    pub rule: Option<String>,
    /// `limits[1].per`; empty when the problem is the whole file.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        if let Some(rule) = &self.rule {
            write!(f, "{rule}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a rules file, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

pub(super) struct Errors<'a> {
    pub(super) file: &'a str,
    pub(super) list: Vec<ConfigError>,
}

impl Errors<'_> {
    pub(super) fn top(&mut self, field: &str, message: String) {
        self.list.push(ConfigError { file: self.file.to_owned(), rule: None, field: field.to_owned(), message });
    }

    pub(super) fn finish(self) -> ConfigErrors {
        ConfigErrors(self.list)
    }
}

pub(super) struct RuleErrors<'a, 'b> {
    pub(super) errors: &'a mut Errors<'b>,
    pub(super) label: &'a str,
}

impl RuleErrors<'_, '_> {
    pub(super) fn push(&mut self, field: &str, message: String) {
        self.errors.list.push(ConfigError {
            file: self.errors.file.to_owned(),
            rule: Some(self.label.to_owned()),
            field: field.to_owned(),
            message,
        });
    }

    /// Records the error, if any, and hands back the value.
    pub(super) fn check<T>(&mut self, field: &str, result: Result<T, String>) -> Option<T> {
        result.map_err(|message| self.push(field, message)).ok()
    }
}
