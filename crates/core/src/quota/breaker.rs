//! The circuit breaker in front of Redis. Closed, every call goes to Redis under its deadline;
//! open, none does, so a dead Redis costs requests nothing while the keeper task probes it.
//!
//! It opens on the first failure that says the connection is gone (refused, reset, dropped) and
//! after `STRIKES` failures in a row of any other kind (a missed deadline), so one slow answer
//! on a busy host does not switch every instance to the outage policy. Only a successful probe
//! followed by reconciliation closes it (`Shared::recover`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Consecutive failures that open the breaker when none of them was a lost connection.
pub const STRIKES: u32 = 3;

#[derive(Default)]
pub struct Breaker {
    open: AtomicBool,
    strikes: AtomicU32,
}

impl Breaker {
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// A call answered: the count of failures in a row starts over. Read first so the usual
    /// case (no failures) writes nothing shared.
    pub fn success(&self) {
        if self.strikes.load(Ordering::Relaxed) != 0 {
            self.strikes.store(0, Ordering::Relaxed);
        }
    }

    /// A call failed. Returns true when this failure opened the breaker.
    pub fn failure(&self, connection_lost: bool) -> bool {
        let n = self.strikes.fetch_add(1, Ordering::Relaxed) + 1;
        if connection_lost || n >= STRIKES {
            !self.open.swap(true, Ordering::AcqRel)
        } else {
            false
        }
    }

    pub fn close(&self) {
        self.strikes.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_opens_at_once_timeouts_after_strikes() {
        let b = Breaker::default();
        assert!(b.failure(true));
        assert!(b.is_open());
        assert!(!b.failure(true), "already open");
        b.close();
        assert!(!b.is_open());
        for _ in 1..STRIKES {
            assert!(!b.failure(false));
        }
        assert!(!b.is_open());
        assert!(b.failure(false));
        assert!(b.is_open());
        b.close();
        // A success between failures starts the count over.
        for _ in 1..STRIKES {
            b.failure(false);
        }
        b.success();
        b.failure(false);
        assert!(!b.is_open());
    }
}
