//! Counts the developer API's requests in flight, for the drain at shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests currently being served by the developer API (for the drain monitor).
pub static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Counts a request as in flight for as long as it lives.
pub struct InFlightGuard;

impl InFlightGuard {
    pub fn enter() -> InFlightGuard {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        InFlightGuard
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}
