//! Cloud Run sends SIGTERM, then SIGKILL a grace later (10 s). A request in flight at SIGTERM
//! must end before the kill, having answered (a 503 is redelivered; a killed request is too, but
//! without its lease released). So after SIGTERM every remaining step of a request is bounded by
//! the time left, less a reserve for what must follow it (releasing the lease, the answer).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// What a response needs after its request is cut short at SIGKILL's approach.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// When the process was asked to stop, and how long it then has.
#[derive(Debug)]
pub struct Shutdown {
    grace: Duration,
    reserve: Duration,
    began: watch::Sender<Option<Instant>>,
}

/// A step cut short: its own limit passed, or the process is about to be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Cut {
    #[error("took longer than {0:?}")]
    Limit(Duration),
    #[error("cut short: the process stops (SIGTERM) and must answer before it is killed")]
    Stopping,
}

impl Shutdown {
    /// `grace`: from SIGTERM to SIGKILL; `reserve`: what a request still needs after a cut step.
    pub fn new(grace: Duration, reserve: Duration) -> Arc<Self> {
        Arc::new(Self { grace, reserve, began: watch::Sender::new(None) })
    }

    /// SIGTERM arrived now (the first call counts).
    pub fn begin(&self) {
        self.began.send_if_modified(|began| began.is_none() && began.replace(Instant::now()).is_none());
    }

    /// Resolves once SIGTERM came and only `left` is left before SIGKILL; never before SIGTERM.
    async fn left(&self, left: Duration) {
        let mut began = self.began.subscribe();
        let Ok(at) = began.wait_for(Option::is_some).await.map(|at| at.expect("waited for Some")) else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(at + self.grace.saturating_sub(left)).await;
    }

    /// A step of a request, given at most `limit`, and cut once only the reserve is left.
    pub async fn bound<F: Future>(&self, limit: Duration, step: F) -> Result<F::Output, Cut> {
        tokio::select! {
            result = tokio::time::timeout(limit, step) => result.map_err(|_| Cut::Limit(limit)),
            () = self.left(self.reserve) => Err(Cut::Stopping),
        }
    }

    /// A whole request, cut just before SIGKILL, so that it still answers.
    pub async fn before_kill<F: Future>(&self, request: F) -> Result<F::Output, Cut> {
        tokio::select! {
            output = request => Ok(output),
            () = self.left(ANSWER_MARGIN) => Err(Cut::Stopping),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn a_step_runs_to_its_limit_until_sigterm_then_to_the_cutoff() {
        let shutdown = Shutdown::new(10 * SECOND, 2 * SECOND);
        let started = Instant::now();
        assert_eq!(shutdown.bound(30 * SECOND, std::future::pending::<()>()).await, Err(Cut::Limit(30 * SECOND)));
        assert_eq!(started.elapsed(), 30 * SECOND, "no SIGTERM: its own limit");
        assert_eq!(shutdown.bound(SECOND, async { 7 }).await, Ok(7));

        let stopping = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(3 * SECOND).await;
            stopping.begin();
        });
        let started = Instant::now();
        assert_eq!(shutdown.bound(30 * SECOND, std::future::pending::<()>()).await, Err(Cut::Stopping));
        assert_eq!(started.elapsed(), 11 * SECOND, "SIGTERM at 3 s, grace 10 s, 2 s kept in reserve");
        shutdown.begin();
        let started = Instant::now();
        assert_eq!(shutdown.bound(30 * SECOND, std::future::pending::<()>()).await, Err(Cut::Stopping));
        assert_eq!(started.elapsed(), Duration::ZERO, "past the cutoff (a second SIGTERM changes nothing)");
        assert_eq!(shutdown.before_kill(async { 7 }).await, Ok(7));
        assert_eq!(shutdown.before_kill(std::future::pending::<()>()).await, Err(Cut::Stopping));
        assert_eq!(started.elapsed(), 1_500 * Duration::from_millis(1), "half a second before SIGKILL");
    }
}
