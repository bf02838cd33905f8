//! What a handler answers: the status, and each outcome it had, under its rule. Both services'
//! handlers return an [`Answer`]; its outcomes travel in the response's extensions to
//! [`count_outcomes`], the one layer that counts them (as axum's error-handling example carries an
//! error to the layer that logs it), so no handler counts by hand and none can forget to.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use drip_core::outcome::Outcome;

use crate::metrics::ServiceMetrics;

/// The rule a request's outcome is counted under when it has none (a request no rule matched).
pub const NO_RULE: &str = "-";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    status: StatusCode,
    outcomes: Outcomes,
}

/// The outcomes of one response, by rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Outcomes(Vec<(String, Outcome)>);

impl Answer {
    /// `status`, counting `outcome` under `rule` (`None`: [`NO_RULE`]).
    pub fn new(status: StatusCode, rule: Option<&str>, outcome: Outcome) -> Self {
        Self { status, outcomes: Outcomes(vec![(rule.unwrap_or(NO_RULE).to_owned(), outcome)]) }
    }

    /// The answers of a batch's events as one: each one's outcomes, and the first status other
    /// than `ok` (a retry of the whole batch), else `ok`.
    pub fn all(answers: impl IntoIterator<Item = Answer>, ok: StatusCode) -> Self {
        let mut all = Self { status: ok, outcomes: Outcomes::default() };
        for answer in answers {
            if all.status == ok {
                all.status = answer.status;
            }
            all.outcomes.0.extend(answer.outcomes.0);
        }
        all
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The outcomes counted, in order, with their rules.
    pub fn outcomes(&self) -> impl Iterator<Item = (&str, Outcome)> {
        self.outcomes.0.iter().map(|(rule, outcome)| (rule.as_str(), *outcome))
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = self.status.into_response();
        response.extensions_mut().insert(self.outcomes);
        response
    }
}

/// Counts the outcomes of each response a handler answered with an [`Answer`].
pub async fn count_outcomes(
    State(metrics): State<Arc<ServiceMetrics>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if let Some(Outcomes(outcomes)) = response.extensions().get::<Outcomes>() {
        for (rule, outcome) in outcomes {
            metrics.count(rule, outcome.as_str());
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use drip_core::outcome::DlqReason;

    use super::*;

    #[test]
    fn a_batch_answers_its_first_failure_and_counts_every_event() {
        let ok = StatusCode::OK;
        let answers = [
            Answer::new(ok, Some("a"), Outcome::Published),
            Answer::new(StatusCode::SERVICE_UNAVAILABLE, Some("a"), Outcome::Retry),
            Answer::new(StatusCode::FORBIDDEN, None, Outcome::NotATask),
            Answer::new(ok, Some("b"), Outcome::DeadLetter(DlqReason::ClaimCheckMissing)),
        ];
        let all = Answer::all(answers, ok);
        assert_eq!(all.status(), StatusCode::SERVICE_UNAVAILABLE);
        let counted: Vec<_> = all.outcomes().map(|(rule, outcome)| (rule.to_owned(), outcome.as_str())).collect();
        assert_eq!(
            counted,
            [("a", "published"), ("a", "retry"), ("-", "not_a_task"), ("b", "claim_check_missing")]
                .map(|(r, o)| (r.to_owned(), o))
        );
        assert_eq!(Answer::all([Answer::new(ok, None, Outcome::Published)], ok).status(), ok);
    }
}
