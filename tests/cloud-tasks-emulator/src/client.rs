//! What tests use to read the stand-in's record and inject faults, over its `/_emulator/` API.

use crate::model::{AttemptRecord, Faults, TaskSnapshot};

#[derive(Debug, Clone)]
pub struct EmulatorClient {
    base: String,
    http: reqwest::Client,
}

impl EmulatorClient {
    /// `base`: `http://127.0.0.1:PORT`.
    pub fn new(base: impl Into<String>) -> Self {
        Self { base: base.into(), http: reqwest::Client::new() }
    }

    pub async fn tasks(&self) -> reqwest::Result<Vec<TaskSnapshot>> {
        self.http.get(format!("{}/_emulator/tasks", self.base)).send().await?.error_for_status()?.json().await
    }

    /// What Cloud Tasks would bill for the creates so far.
    pub async fn billing(&self) -> reqwest::Result<crate::model::Billing> {
        self.http.get(format!("{}/_emulator/billing", self.base)).send().await?.error_for_status()?.json().await
    }

    pub async fn attempts(&self) -> reqwest::Result<Vec<AttemptRecord>> {
        self.http.get(format!("{}/_emulator/attempts", self.base)).send().await?.error_for_status()?.json().await
    }

    pub async fn set_faults(&self, faults: Faults) -> reqwest::Result<()> {
        self.http.put(format!("{}/_emulator/faults", self.base)).json(&faults).send().await?.error_for_status()?;
        Ok(())
    }

    pub fn jwks_url(&self) -> String {
        format!("{}/_emulator/jwks.json", self.base)
    }
}
