//! The rules in force, re-read without a redeploy: when the file changes (polled, which is how a
//! Cloud Run volume mounted from Secret Manager's `latest` version shows a new version) and on
//! SIGHUP. A file that does not validate is refused: the rules in force stay, and an ERROR line and
//! the `drip_rules_refused` gauge say why. The ERROR line is written once per refused version of the
//! file (not at every poll: 360 lines an hour an instance said nothing new); the gauge stays 1 while
//! that version is the file. Each request takes one snapshot, so it sees one rule set.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use drip_core::rules::{RuleSet, ServiceRules};
use sha2::{Digest, Sha256};

use crate::metrics::Metrics;

/// One version of the rules: what was loaded and the hash that names it.
#[derive(Debug)]
pub struct LoadedRules {
    pub set: ServiceRules,
    /// The first 12 hex digits of the file's SHA-256: the same file is the same version everywhere.
    pub version: String,
}

impl std::ops::Deref for LoadedRules {
    type Target = ServiceRules;

    fn deref(&self) -> &ServiceRules {
        &self.set
    }
}

/// A check a service adds to validation (the limiter: no inline wait beyond its attempt deadline).
pub type Acceptance = Box<dyn Fn(&ServiceRules) -> Result<(), String> + Send + Sync>;

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    Unchanged,
    Applied { from: String, to: String },
}

/// A file a reload refused: why, the version refused, and whether this reload logged it (only the
/// first reload of each refused version does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub error: String,
    /// The refused file's version (`None` when it could not be read).
    pub version: Option<String>,
    pub logged: bool,
}

pub struct LiveRules {
    path: Option<PathBuf>,
    current: ArcSwap<LoadedRules>,
    accept: Acceptance,
    metrics: Arc<Metrics>,
    /// The version of the file last refused and logged.
    refused: std::sync::Mutex<Option<Option<String>>>,
}

impl std::fmt::Debug for LiveRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveRules").field("path", &self.path).field("version", &self.version()).finish()
    }
}

fn version_of(text: &[u8]) -> String {
    hex::encode(&Sha256::digest(text)[..6])
}

fn parse(path: &Path, text: &[u8], accept: &Acceptance) -> Result<LoadedRules, String> {
    let file = path.display().to_string();
    let text = std::str::from_utf8(text).map_err(|e| format!("{file}: not UTF-8: {e}"))?;
    let rules = RuleSet::parse(&file, text).map_err(|errors| errors.to_string())?;
    let rules = ServiceRules::new(rules, &file).map_err(|error| error.to_string())?;
    accept(&rules).map_err(|message| format!("{file}: {message}"))?;
    Ok(LoadedRules { set: rules, version: version_of(text.as_bytes()) })
}

/// The ERROR line of a refused rules file (an alert in terraform/monitoring.tf filters on it).
pub const RULES_REFUSED: &str = "new rules refused: the rules in force stay";

impl LiveRules {
    /// Loads `path` (start-up fails if it does not validate) and publishes its version.
    pub fn load(path: impl Into<PathBuf>, accept: Acceptance, metrics: Arc<Metrics>) -> Result<Arc<Self>, String> {
        let path = path.into();
        let text = std::fs::read(&path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        let loaded = parse(&path, &text, &accept)?;
        metrics.rules_version(None, &loaded.version);
        metrics.rules_in_force(&loaded.set);
        Ok(Arc::new(Self {
            path: Some(path),
            current: ArcSwap::from_pointee(loaded),
            accept,
            metrics,
            refused: std::sync::Mutex::new(None),
        }))
    }

    /// Rules that never change (tests that build a service's state by hand).
    pub fn fixed(rules: ServiceRules, metrics: Arc<Metrics>) -> Arc<Self> {
        let version = "fixed".to_owned();
        metrics.rules_version(None, &version);
        metrics.rules_in_force(&rules);
        let accept: Acceptance = Box::new(|_| Ok(()));
        Arc::new(Self {
            refused: std::sync::Mutex::new(None),
            path: None,
            current: ArcSwap::from_pointee(LoadedRules { set: rules, version }),
            accept,
            metrics,
        })
    }

    /// The rules in force now; hold the snapshot for the whole request.
    pub fn current(&self) -> Arc<LoadedRules> {
        self.current.load_full()
    }

    pub fn version(&self) -> String {
        self.current.load().version.clone()
    }

    /// Re-reads the file: a new valid version replaces the rules in force; an invalid one is
    /// refused (`drip_rules_refused` 1, and an ERROR line the first time that version is seen)
    /// and changes nothing.
    pub fn reload(&self) -> Result<Reloaded, Refused> {
        let Some(path) = &self.path else { return Ok(Reloaded::Unchanged) };
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) => return Err(self.refuse(format!("{}: cannot read: {e}", path.display()), None)),
        };
        let from = self.version();
        let version = version_of(&text);
        if version == from {
            self.cleared();
            return Ok(Reloaded::Unchanged);
        }
        let loaded = parse(path, &text, &self.accept).map_err(|error| self.refuse(error, Some(version)))?;
        let to = loaded.version.clone();
        self.current.store(Arc::new(loaded));
        self.cleared();
        self.metrics.rules_version(Some(&from), &to);
        self.metrics.rules_in_force(&self.current().set);
        tracing::info!(from = %from, to = %to, file = %path.display(), "rules reloaded");
        Ok(Reloaded::Applied { from, to })
    }

    fn cleared(&self) {
        self.metrics.rules_refused(false);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn refuse(&self, error: String, version: Option<String>) -> Refused {
        self.metrics.rules_refused(true);
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let logged = refused.as_ref() != Some(&version);
        if logged {
            let shown = version.as_deref().unwrap_or("unreadable");
            tracing::error!(version = %self.version(), refused_version = %shown, %error, "{RULES_REFUSED}");
            *refused = Some(version.clone());
        }
        Refused { error, version, logged }
    }

    /// Reloads every `poll` (none when zero) and on SIGHUP, for as long as the process runs.
    pub fn watch(self: &Arc<Self>, poll: Duration) {
        let live = self.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut ticker = tokio::time::interval(if poll.is_zero() { Duration::from_secs(3_600) } else { poll });
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                #[cfg(unix)]
                let hangup_received = async {
                    match hangup.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup_received = std::future::pending::<Option<()>>();
                tokio::select! {
                    _ = ticker.tick(), if !poll.is_zero() => {}
                    _ = hangup_received => tracing::info!("SIGHUP: re-reading the rules"),
                }
                let _ = live.reload();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "default_dlq_topic: dlq\nrules:\n  - name: payouts\n    key: k\n    limits: [ { limit: LIMIT, per: 1m, window: fixed } ]\n    max_delay: 1h\n    forward: { topic: ready }\n    overflow_topic: overflow\n";

    fn write(path: &Path, limit: &str) {
        std::fs::write(path, RULES.replace("LIMIT", limit)).unwrap();
    }

    #[test]
    fn a_valid_change_applies_and_an_invalid_one_is_refused() {
        let path = std::env::temp_dir().join(format!("drip-live-rules-{}.yaml", std::process::id()));
        write(&path, "100");
        let metrics = Arc::new(Metrics::default());
        let accept: Acceptance =
            Box::new(|rules| if rules.rules[0].limits[0].limit() > 1_000 { Err("too high".into()) } else { Ok(()) });
        let live = LiveRules::load(&path, accept, metrics.clone()).unwrap();
        let first = live.version();
        assert_eq!(live.reload(), Ok(Reloaded::Unchanged));

        write(&path, "200");
        let Ok(Reloaded::Applied { from, to }) = live.reload() else { panic!("not applied") };
        assert_eq!((from.as_str(), to.as_str()), (first.as_str(), live.version().as_str()));
        assert_eq!(live.current().rules[0].limits[0].limit(), 200);
        let rendered = metrics.render();
        assert!(rendered.contains(&format!("drip_rules_info{{version=\"{to}\"}} 1")), "{rendered}");
        assert!(!rendered.contains(&format!("version=\"{first}\"")), "the old version is gone: {rendered}");

        write(&path, "0");
        let refused = live.reload().unwrap_err();
        let error = &refused.error;
        assert!(error.contains("limits[0].limit") && error.contains(&path.display().to_string()), "{error}");
        assert!(refused.logged && refused.version.is_some(), "the first refusal of a version is logged");
        assert_eq!(live.current().rules[0].limits[0].limit(), 200, "the rules in force stay");
        assert!(metrics.render().contains("drip_rules_refused 1"));
        let again = live.reload().unwrap_err();
        assert_eq!((again.logged, &again.version), (false, &refused.version), "the same file: not logged again");
        assert!(metrics.render().contains("drip_rules_refused 1"), "the gauge stays");

        write(&path, "5000");
        let other = live.reload().unwrap_err();
        assert!(other.error.contains("too high"), "the service's own check refuses it too");
        assert!(other.logged && other.version != refused.version, "another refused version is logged once");
        assert!(!live.reload().unwrap_err().logged);

        write(&path, "300");
        assert!(matches!(live.reload(), Ok(Reloaded::Applied { .. })));
        assert!(metrics.render().contains("drip_rules_refused 0"));
        std::fs::remove_file(&path).unwrap();
    }
}
