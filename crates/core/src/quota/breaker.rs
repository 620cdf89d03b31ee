//! The circuit breaker in front of Redis. Closed, every call goes to Redis; open, none does,
//! so a dead Redis costs requests nothing while the keeper task probes it.
//!
//! It opens on the first failure that says the connection is gone (refused, reset, dropped),
//! and on missed deadlines only when they go on: at least `STRIKES` misses with no answer in
//! between, the first of them at least `MISS_SPAN_MS` ago. A busy host answers late now and
//! then (a flood on a saturated machine makes calls miss a 50 ms deadline), and every late
//! answer that does come proves Redis alive and starts the count over; a Redis that is gone
//! answers nothing at all, and the misses pile up within the span. Opening on the first few
//! misses under load switched every instance to the outage policy, where each admitted its own
//! per-minute window. Only a successful probe followed by reconciliation closes it
//! (`Shared::recover`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};

/// Misses with no answer in between that may open the breaker.
pub const STRIKES: u32 = 3;
/// How long (ms) misses must have gone on, with no answer, before they open the breaker.
pub const MISS_SPAN_MS: i64 = 250;

#[derive(Default)]
pub struct Breaker {
    open: AtomicBool,
    strikes: AtomicU32,
    /// When the first of the current run of misses happened (Unix ms; 0: none).
    first_miss: AtomicI64,
}

impl Breaker {
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// A call answered (late or not): the run of misses is over. Read first so the usual case
    /// (no misses) writes nothing shared.
    pub fn success(&self) {
        if self.strikes.load(Ordering::Relaxed) != 0 {
            self.strikes.store(0, Ordering::Relaxed);
            self.first_miss.store(0, Ordering::Relaxed);
        }
    }

    /// A call failed at `now` (Unix ms): `connection_lost`, or it missed its deadline. Returns
    /// true when this failure opened the breaker.
    pub fn failure(&self, connection_lost: bool, now: i64) -> bool {
        let n = self.strikes.fetch_add(1, Ordering::Relaxed) + 1;
        let first =
            match self
                .first_miss
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now,
                Err(earlier) => earlier,
            };
        if connection_lost || (n >= STRIKES && now.saturating_sub(first) >= MISS_SPAN_MS) {
            !self.open.swap(true, Ordering::AcqRel)
        } else {
            false
        }
    }

    pub fn close(&self) {
        self.strikes.store(0, Ordering::Relaxed);
        self.first_miss.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_opens_at_once() {
        let b = Breaker::default();
        assert!(b.failure(true, 1_000));
        assert!(b.is_open());
        assert!(!b.failure(true, 1_001), "already open");
        b.close();
        assert!(!b.is_open());
    }

    #[test]
    fn misses_open_only_when_they_go_on_without_an_answer() {
        let b = Breaker::default();
        // Many misses within a moment: a burst of slow answers, not yet an outage.
        for t in 0..10 {
            assert!(!b.failure(false, 1_000 + t));
        }
        assert!(!b.is_open());
        // Still no answer a span after the first miss: Redis is gone.
        assert!(b.failure(false, 1_000 + MISS_SPAN_MS));
        assert!(b.is_open());
        b.close();

        // Misses spread over seconds, each run broken by a late answer, never open it.
        for round in 0..20 {
            let t = 10_000 + round * 200;
            b.failure(false, t);
            b.failure(false, t + 100);
            b.success();
        }
        assert!(!b.is_open());

        // Long apart but too few to count: two misses a span apart are not enough.
        let b = Breaker::default();
        assert!(!b.failure(false, 50_000));
        assert!(!b.failure(false, 50_000 + 10 * MISS_SPAN_MS));
        assert!(!b.is_open());
        assert!(b.failure(false, 50_000 + 10 * MISS_SPAN_MS + 1));
    }
}
