//! Quota: reservation before a request is forwarded, settlement after it ends.
//!
//! The request path only sees `reserve` and `Reservation::settle`; how balances are kept
//! (in-process, Redis, database) lives behind them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::identity::Identity;

/// What a request consumed, as finally known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    InsufficientQuota,
    RateLimited {
        retry_after_secs: u64,
        what: &'static str,
    },
}

/// Holds reserved quota until settled. Settling twice is impossible (it consumes `self`), and a
/// reservation dropped without settling is released as a zero-usage settlement so nothing leaks.
pub struct Reservation {
    inner: Arc<Engine>,
    pub user_id: String,
    pub key_id: String,
    pub reserved_tokens: u64,
    settled: AtomicBool,
}

impl Reservation {
    /// Replaces the estimate with what was really used. Exactly once.
    pub fn settle(self, used: Used) {
        self.settle_inner(used);
    }

    fn settle_inner(&self, used: Used) {
        if self.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.settle(self, used);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled.load(Ordering::Acquire) {
            log::warn!(
                "reservation for {} dropped unsettled; releasing it",
                self.key_id
            );
            self.settle_inner(Used::default());
        }
    }
}

/// The quota engine.
#[derive(Default)]
pub struct Engine {}

pub type Quota = Arc<Engine>;

impl Engine {
    pub fn new() -> Quota {
        Arc::new(Engine {})
    }

    /// Reserves 1 request plus `input + output` tokens for the identity's account.
    pub async fn reserve(
        self: &Arc<Self>,
        who: &Identity,
        input_tokens: u64,
        output_tokens: u64,
    ) -> Result<Reservation, Denied> {
        Ok(Reservation {
            inner: self.clone(),
            user_id: who.user.id.clone(),
            key_id: who.key.id.clone(),
            reserved_tokens: input_tokens.saturating_add(output_tokens),
            settled: AtomicBool::new(false),
        })
    }

    fn settle(&self, _r: &Reservation, _used: Used) {}
}
