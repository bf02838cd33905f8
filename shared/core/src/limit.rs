//! One limit: at most `limit` cost per `per`, counted by a fixed window (placed at its start or
//! spread), a sliding window or GCRA. Kept apart from the rules file's parsing so that the model,
//! the budgets and the store name a limit without the rules (and without an import cycle).

use std::fmt;

use crate::time::{DAY, HOUR, MINUTE, Millis, SECOND};

/// The longest window a limit may have; it bounds how long an idle entity's state lives.
pub const MAX_WINDOW: Millis = 31 * DAY;

/// At most `limit` cost per `per`, counted by `window`. Only [`Limit::new`] makes one (as
/// governor's `Quota`), so every limit in the system has `limit` ≥ 1, 0 < `per` ≤ [`MAX_WINDOW`],
/// and a GCRA burst ≥ 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    limit: u64,
    per: Millis,
    window: Window,
}

/// Why [`Limit::new`] refused; `field()` names the rules file's field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLimit {
    #[error("must be at least 1, got 0")]
    ZeroLimit,
    #[error("must be longer than 0")]
    EmptyPeriod,
    #[error("{:.1} days is over 31d, the longest supported window", *.0 as f64 / DAY as f64)]
    PeriodTooLong(Millis),
    #[error("must be at least 1, got 0")]
    ZeroBurst,
}

impl InvalidLimit {
    pub fn field(&self) -> &'static str {
        match self {
            Self::ZeroLimit => "limit",
            Self::EmptyPeriod | Self::PeriodTooLong(_) => "per",
            Self::ZeroBurst => "burst",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    Fixed(Placement),
    Sliding,
    Gcra { burst: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    Start,
    Spread,
}

impl Window {
    /// Identifies a limit's state within its entity: limits of the same kind and period share it,
    /// so a changed `limit` count keeps the usage already recorded.
    pub fn kind(&self) -> &'static str {
        match self {
            Window::Fixed(_) => "fixed",
            Window::Sliding => "sliding",
            Window::Gcra { .. } => "gcra",
        }
    }
}

impl Limit {
    pub fn new(limit: u64, per: Millis, window: Window) -> Result<Self, InvalidLimit> {
        match (limit, per, window) {
            (0, _, _) => Err(InvalidLimit::ZeroLimit),
            (_, ..=0, _) => Err(InvalidLimit::EmptyPeriod),
            (_, per, _) if per > MAX_WINDOW => Err(InvalidLimit::PeriodTooLong(per)),
            (_, _, Window::Gcra { burst: 0 }) => Err(InvalidLimit::ZeroBurst),
            _ => Ok(Self { limit, per, window }),
        }
    }

    /// The cost allowed per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The largest cost one event may have under this limit with `count` in force: the count of a
    /// window, the burst of a gcra limit (an event of cost c waits until c units conform, and
    /// `burst` units conform at once, whatever the rate: a token bucket's `check_n`).
    pub fn max_cost(&self, count: u64) -> u64 {
        match self.window {
            Window::Gcra { burst } => burst,
            _ => count,
        }
    }

    pub fn per(&self) -> Millis {
        self.per
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// `RPS`, `RPM`, `RPH`, `RPD`, or `per 90s` for other periods (the seed's `windowType`).
    pub fn window_type(&self) -> String {
        match self.per {
            SECOND => "RPS".into(),
            MINUTE => "RPM".into(),
            HOUR => "RPH".into(),
            DAY => "RPD".into(),
            per => format!("per {}", crate::time::format_duration(per)),
        }
    }
}

/// `100 per 1m (fixed)`, `5 per 1s (gcra, burst 10)`.
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = crate::time::format_duration(self.per);
        write!(f, "{} per {per} (", self.limit)?;
        match self.window {
            Window::Fixed(Placement::Start) => write!(f, "fixed)"),
            Window::Fixed(Placement::Spread) => write!(f, "fixed, spread)"),
            Window::Sliding => write!(f, "sliding)"),
            Window::Gcra { burst } => write!(f, "gcra, burst {burst})"),
        }
    }
}
