//! The reservation script's reply, both ends: the numbers it answers with, declared here and
//! written into the script (`scripts.rs`'s shared numbers), and the one type every reply is read
//! into by name. Each event's reply is `REPLY_LENGTH` numbers: `{first, kind, third, now, fifth}`,
//! whose first, third and fifth mean what its kind says.

use drip_core::schedule::{Attempt, Correction, Reservation, Status, Unpark};
use drip_core::time::Millis;

use crate::request::{Reserved, StoreError};

/// How many numbers the script replies per event.
pub(crate) const REPLY_LENGTH: usize = 5;

/// The reply's second number: its kind (the script's `STATUS` table and unpark's answers).
const RESERVED: i64 = 0;
const MAX_DELAY: i64 = 1;
const COST_OVER: i64 = 2;
const LEASE_WANTED: i64 = 3;
const PARKED: i64 = 4;
const LATER: i64 = 5;
const NOT_PARKED: i64 = 6;
const NOT_HEAD: i64 = 7;
/// A decision's third number: what the attempt that asked may do (the script's `ATTEMPT`).
const DECIDED: i64 = 0;
const RESUMED: i64 = 1;
const BUSY: i64 = 2;
const DONE: i64 = 3;
/// Added to a decision's third number when its booking gave units of a leased budget's pool back
/// (the store then sends them to the pool's home): [`gave_back`].
const GAVE_BACK: i64 = 16;
/// Added to a parked decision's third number when its call armed its fair budget's ring's drain
/// ([`Reserved::armed`]).
const ARMED: i64 = 32;
/// A correction's third number: what it did (the script's `CORRECTION`).
const APPLIED: i64 = 0;
const ALREADY: i64 = 1;
const UNKNOWN: i64 = 2;

/// Each number by the name the script reads it by.
pub(crate) const KINDS: [(&str, i64); 8] = [
    ("REPLY_RESERVED", RESERVED),
    ("REPLY_MAX_DELAY", MAX_DELAY),
    ("REPLY_COST_OVER", COST_OVER),
    ("REPLY_LEASE_WANTED", LEASE_WANTED),
    ("REPLY_PARKED", PARKED),
    ("REPLY_LATER", LATER),
    ("REPLY_NOT_PARKED", NOT_PARKED),
    ("REPLY_NOT_HEAD", NOT_HEAD),
];
pub(crate) const ATTEMPTS: [(&str, i64); 4] =
    [("ATTEMPT_DECIDED", DECIDED), ("ATTEMPT_RESUMED", RESUMED), ("ATTEMPT_BUSY", BUSY), ("ATTEMPT_DONE", DONE)];
pub(crate) const FLAGS: [(&str, i64); 2] = [("REPLY_GAVE_BACK", GAVE_BACK), ("REPLY_ARMED", ARMED)];
pub(crate) const CORRECTIONS: [(&str, i64); 3] =
    [("CORRECTION_APPLIED", APPLIED), ("CORRECTION_ALREADY", ALREADY), ("CORRECTION_UNKNOWN", UNKNOWN)];

/// One event's reply, read by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// A decision: the event's slot and status, what the attempt may do.
    Decided(Reserved),
    /// The call stopped at this event: a partition's pool needs a lease of `window` for limit
    /// `limit` of the event's budget `budget` (both counted from 1, as the script's tables), for
    /// a slot no later than `horizon` (a parked message's drain: what is left of its max_delay);
    /// the pool can book no window before `reach` (it gave up a longer limit's windows there).
    LeaseWanted { window: Millis, budget: usize, limit: usize, horizon: Millis, reach: Millis },
    /// An unpark whose head's slot is past the drain's deadline: the next wake is at `wake`.
    Later { slot: Millis, wake: Millis, now: Millis },
    /// An unpark of a message that is not parked.
    NotParked { now: Millis },
    /// An unpark of a message that is not the head of its key's queue.
    NotHead { now: Millis },
}

impl Reply {
    /// Reads one event's reply; a number of no kind this version knows is an unexpected reply.
    pub fn parse(reply: &[i64]) -> Result<Reply, StoreError> {
        let unexpected = || StoreError::UnexpectedReply(format!("{reply:?}"));
        let &[first, kind, third, now, fifth] = reply else { return Err(unexpected()) };
        let status = match kind {
            RESERVED => Status::Reserved,
            MAX_DELAY => Status::MaxDelayExceeded,
            COST_OVER => Status::CostExceedsLimit,
            PARKED => Status::Parked,
            LEASE_WANTED => {
                let (budget, limit) = ((third / 256) as usize, (third % 256) as usize);
                return Ok(Reply::LeaseWanted { window: first, budget, limit, horizon: now, reach: fifth });
            }
            LATER => return Ok(Reply::Later { slot: first, wake: third, now }),
            NOT_PARKED => return Ok(Reply::NotParked { now }),
            NOT_HEAD => return Ok(Reply::NotHead { now }),
            _ => return Err(unexpected()),
        };
        let attempt = match third % GAVE_BACK {
            DECIDED => Attempt::Decided,
            RESUMED => Attempt::Resumed,
            BUSY => Attempt::Busy,
            DONE => Attempt::Done,
            _ => return Err(unexpected()),
        };
        let reservation = Reservation { slot: first, status, decided_at: fifth, attempt };
        Ok(Reply::Decided(Reserved { reservation, now, armed: third & ARMED != 0 }))
    }

    /// The decision, or an unexpected reply where only a decision may come.
    pub fn decided(reply: &[i64]) -> Result<Reserved, StoreError> {
        match Reply::parse(reply)? {
            Reply::Decided(reserved) => Ok(reserved),
            _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
        }
    }

    /// An unpark's reply, and the script's now.
    pub fn unpark(reply: &[i64]) -> Result<(Unpark, Millis), StoreError> {
        Ok(match Reply::parse(reply)? {
            Reply::Decided(reserved) => (Unpark::Decided(reserved.reservation), reserved.now),
            Reply::Later { slot, wake, now } => (Unpark::Later { slot, wake }, now),
            Reply::NotParked { now } => (Unpark::NotParked, now),
            Reply::NotHead { now } => (Unpark::NotHead, now),
            Reply::LeaseWanted { .. } => return Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
        })
    }

    /// A correction's reply (`correct` in the script): what it did, with the cost it had booked.
    pub fn correction(reply: &[i64], actual: u64) -> Result<Correction, StoreError> {
        match *reply {
            [_, _, APPLIED, _, booked] => Ok(Correction::Applied { booked: booked as u64, actual }),
            [_, _, ALREADY, _, _] => Ok(Correction::Already),
            [_, _, UNKNOWN, _, _] => Ok(Correction::Unknown),
            _ => Err(StoreError::UnexpectedReply(format!("{reply:?}"))),
        }
    }
}

/// Whether an event's reply is a decision whose booking gave units of a leased budget's pool back
/// (`lua/reserve/leases.lua`'s give_up_short_leases).
pub(crate) fn gave_back(reply: &[i64]) -> bool {
    matches!(*reply, [_, kind, third, _, _] if kind != LEASE_WANTED && kind != LATER && third & GAVE_BACK != 0)
}

/// The reply's numbers as the script reads them: every name above, with its value.
pub(crate) fn reply_numbers() -> impl Iterator<Item = (&'static str, i64)> {
    KINDS.into_iter().chain(ATTEMPTS).chain(FLAGS).chain(CORRECTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(table: &[(&str, i64)], name: &str) -> i64 {
        table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).expect("a declared name")
    }

    fn kind(name: &str) -> i64 {
        number(&KINDS, name)
    }

    /// Every kind, attempt and correction reads back as the variant its name says; an unknown
    /// number is an unexpected reply, never a guess.
    #[test]
    fn every_reply_is_read_by_its_name() {
        let reserved = Reply::parse(&[10, kind("REPLY_RESERVED"), number(&ATTEMPTS, "ATTEMPT_RESUMED"), 3, 2]).unwrap();
        let Reply::Decided(Reserved { reservation, now, armed }) = reserved else { panic!("{reserved:?}") };
        assert!(!armed);
        assert_eq!(
            (reservation.slot, reservation.status, reservation.attempt, reservation.decided_at, now),
            (10, Status::Reserved, Attempt::Resumed, 2, 3)
        );
        let lease = Reply::parse(&[1000, kind("REPLY_LEASE_WANTED"), 2 * 256 + 1, 500, 99]).unwrap();
        assert_eq!(lease, Reply::LeaseWanted { window: 1000, budget: 2, limit: 1, horizon: 500, reach: 99 });
        assert_eq!(
            Reply::unpark(&[50, kind("REPLY_LATER"), 40, 9, 0]).unwrap(),
            (Unpark::Later { slot: 50, wake: 40 }, 9)
        );
        assert_eq!(Reply::unpark(&[0, kind("REPLY_NOT_HEAD"), 0, 9, 0]).unwrap(), (Unpark::NotHead, 9));
        assert_eq!(Reply::unpark(&[0, kind("REPLY_NOT_PARKED"), 0, 9, 0]).unwrap(), (Unpark::NotParked, 9));
        let applied = number(&CORRECTIONS, "CORRECTION_APPLIED");
        assert_eq!(Reply::correction(&[0, 0, applied, 0, 4], 2).unwrap(), Correction::Applied { booked: 4, actual: 2 });
        assert!(Reply::parse(&[0, 42, 0, 0, 0]).is_err(), "a kind no version knows");
        assert!(Reply::parse(&[0, 0, 9, 0, 0]).is_err(), "an attempt no version knows");
        let flagged = [10, kind("REPLY_RESERVED"), number(&ATTEMPTS, "ATTEMPT_DECIDED") + GAVE_BACK, 3, 3];
        assert_eq!(Reply::decided(&flagged).unwrap().reservation.attempt, Attempt::Decided);
        assert!(gave_back(&flagged));
        assert!(!gave_back(&[10, kind("REPLY_RESERVED"), 0, 3, 3]));
        assert!(!gave_back(&[50, kind("REPLY_LATER"), 40, 9, 0]), "a wake, not a flag");
        let armed = [10, kind("REPLY_PARKED"), number(&ATTEMPTS, "ATTEMPT_DECIDED") + ARMED, 3, 3];
        let parked = Reply::decided(&armed).unwrap();
        assert!(parked.armed && parked.reservation.attempt == Attempt::Decided && !gave_back(&armed), "{parked:?}");
        assert!(Reply::parse(&[0, 0, 0]).is_err(), "too short");
    }

    /// The golden list of the reply's names and numbers, as the script reads them: a change here
    /// is a change of the contract between the script and every version reading its replies.
    #[test]
    fn the_reply_contract_is_pinned() {
        let names: Vec<String> = reply_numbers().map(|(n, v)| format!("{n}={v}")).collect();
        assert_eq!(
            names.join(" "),
            "REPLY_RESERVED=0 REPLY_MAX_DELAY=1 REPLY_COST_OVER=2 REPLY_LEASE_WANTED=3 REPLY_PARKED=4 \
             REPLY_LATER=5 REPLY_NOT_PARKED=6 REPLY_NOT_HEAD=7 ATTEMPT_DECIDED=0 ATTEMPT_RESUMED=1 \
             ATTEMPT_BUSY=2 ATTEMPT_DONE=3 REPLY_GAVE_BACK=16 REPLY_ARMED=32 CORRECTION_APPLIED=0 CORRECTION_ALREADY=1 CORRECTION_UNKNOWN=2"
        );
    }
}
