//! What one client can hold of the listeners: connection caps (in total and per address), a
//! deadline for the whole request head, a keep-alive idle timeout, a minimum body rate and a
//! cap on head bytes (431). Pingora 0.9 has none of these as settings (its read timeout is
//! reset by every byte, its head limit is a fixed 1 MiB and idle keep-alives never time out),
//! so they are enforced on the connection's stream itself: every read of a client connection
//! goes through [`Watch`], which knows the phase of the connection's current request.
//!
//! Phases: `Head` (a fresh connection, or a kept-alive one once its next request's first byte
//! arrived) → `Body` (set by the request handler when it reads a body) → `Serving` (no read
//! deadline: a streamed answer may run for minutes while the connection is watched for a
//! disconnect) → `Idle` (set when the connection is kept alive for the next request).
//!
//! Each connection costs one map entry update at accept and close (per-address count); each
//! request costs a few relaxed atomic stores and a timer re-arm, no allocation and no lock.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::{Instant, Sleep};

use gateway_core::config::EdgeLimits;

/// How often a refused address is logged at most.
const LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Addresses remembered for the log interval; beyond this the memory is cleared (a flood from
/// many addresses then logs a line per address again, still bounded by the refusals).
const LOGGED_MAX: usize = 10_000;

/// The shared connection counts of both listeners.
pub struct Limiter {
    limits: EdgeLimits,
    total: AtomicUsize,
    per_address: DashMap<IpAddr, usize>,
    logged: DashMap<IpAddr, Instant>,
}

impl Limiter {
    pub fn new(limits: EdgeLimits) -> Arc<Limiter> {
        Arc::new(Limiter {
            limits,
            total: AtomicUsize::new(0),
            per_address: DashMap::new(),
            logged: DashMap::new(),
        })
    }

    pub fn limits(&self) -> &EdgeLimits {
        &self.limits
    }

    /// Open connections now (both listeners).
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// A slot for a new connection from `addr`, or `None` when a cap is reached (the caller
    /// closes the connection without reading from it).
    pub fn admit(self: &Arc<Self>, addr: Option<IpAddr>, listener: &str) -> Option<Slot> {
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.limits.max_connections {
            self.total.fetch_sub(1, Ordering::AcqRel);
            self.refused(addr, listener, "max_connections");
            return None;
        }
        if let Some(ip) = addr {
            let mut count = self.per_address.entry(ip).or_insert(0);
            if *count >= self.limits.max_connections_per_address {
                drop(count);
                self.total.fetch_sub(1, Ordering::AcqRel);
                self.refused(addr, listener, "max_connections_per_address");
                return None;
            }
            *count += 1;
        }
        Some(Slot {
            limiter: self.clone(),
            addr,
        })
    }

    fn release(&self, addr: Option<IpAddr>) {
        if let Some(ip) = addr {
            self.per_address.remove_if_mut(&ip, |_, count| {
                *count = count.saturating_sub(1);
                *count == 0
            });
        }
        self.total.fetch_sub(1, Ordering::AcqRel);
    }

    /// Logs a refusal once per address and interval.
    fn refused(&self, addr: Option<IpAddr>, listener: &str, cap: &str) {
        let key = addr.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let now = Instant::now();
        if self.logged.len() >= LOGGED_MAX {
            self.logged.clear();
        }
        let mut first = false;
        self.logged
            .entry(key)
            .and_modify(|last| {
                if now.duration_since(*last) >= LOG_INTERVAL {
                    *last = now;
                    first = true;
                }
            })
            .or_insert_with(|| {
                first = true;
                now
            });
        if first {
            log::warn!(
                "{listener}: refusing connections from {key}: server.limits.{cap} reached \
                 (logged once a minute per address)"
            );
        }
    }
}

/// One counted connection; released when dropped (with the connection's stream).
pub struct Slot {
    limiter: Arc<Limiter>,
    addr: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limiter.release(self.addr);
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("addr", &self.addr).finish()
    }
}

/// Where a connection's current request is (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Head = 0,
    Body = 1,
    Serving = 2,
    Idle = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Head,
            1 => Phase::Body,
            2 => Phase::Serving,
            _ => Phase::Idle,
        }
    }
}

/// What a read did to the connection's limits.
pub enum Verdict {
    Fine,
    /// The head grew past `max_header_bytes`: answer 431 and close.
    HeadTooLarge,
}

/// The limits of one connection, consulted on every read of it.
pub struct Watch {
    _slot: Slot,
    limits: EdgeLimits,
    /// Set by the request handler (through a shared reference to the stream).
    phase: AtomicU8,
    /// The phase the deadline below was computed for.
    seen: Phase,
    deadline: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    head_bytes: usize,
    body_start: Instant,
    body_bytes: u64,
    /// The answer to a head over the cap, in the listener's error shape.
    pub too_large: &'static [u8],
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("phase", &self.seen)
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Watch {
    /// The watch of a connection accepted at `accepted`: its head is due by
    /// `accepted + header_timeout`.
    pub fn new(slot: Slot, accepted: Instant, too_large: &'static [u8]) -> Watch {
        let limits = *slot.limiter.limits();
        Watch {
            _slot: slot,
            limits,
            phase: AtomicU8::new(Phase::Head as u8),
            seen: Phase::Head,
            deadline: Some(accepted + limits.header_timeout),
            timer: None,
            head_bytes: 0,
            body_start: accepted,
            body_bytes: 0,
            too_large,
        }
    }

    /// Moves the connection to `phase`; takes effect at its next read.
    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// Before a read: picks up a phase set since the last one.
    pub fn before_read(&mut self) {
        let phase = Phase::from_u8(self.phase.load(Ordering::Relaxed));
        if phase == self.seen {
            return;
        }
        self.seen = phase;
        let now = Instant::now();
        self.deadline = match phase {
            // Only a fresh connection starts in `Head`, with its deadline set at accept; a
            // kept-alive one enters it from `Idle` on its first byte (`after_read`).
            Phase::Head => self.deadline,
            Phase::Body => {
                self.body_start = now;
                self.body_bytes = 0;
                Some(now + self.limits.body_timeout)
            }
            Phase::Serving => None,
            Phase::Idle => {
                self.head_bytes = 0;
                Some(now + self.limits.idle_timeout)
            }
        };
    }

    /// After a read of `n` bytes.
    pub fn after_read(&mut self, n: usize) -> Verdict {
        if n == 0 {
            return Verdict::Fine;
        }
        match self.seen {
            Phase::Idle => {
                self.seen = Phase::Head;
                self.phase.store(Phase::Head as u8, Ordering::Relaxed);
                self.deadline = Some(Instant::now() + self.limits.header_timeout);
                self.head_bytes = n;
            }
            Phase::Head => self.head_bytes = self.head_bytes.saturating_add(n),
            Phase::Body => {
                // The body may pause `body_timeout` at most, and must average `body_min_rate`
                // after its first `body_timeout`.
                self.body_bytes = self.body_bytes.saturating_add(n as u64);
                let earned = Duration::from_secs_f64(
                    self.body_bytes as f64 / self.limits.body_min_rate as f64,
                );
                let by_rate = self.body_start + self.limits.body_timeout + earned;
                let by_pause = Instant::now() + self.limits.body_timeout;
                self.deadline = Some(by_rate.min(by_pause));
            }
            Phase::Serving => {}
        }
        // A read in the head phase may carry the start of the body with the end of the head:
        // at most one read's worth (Pingora reads the head in 4 KiB steps) beyond the cap.
        if self.seen == Phase::Head && self.head_bytes > self.limits.max_header_bytes {
            return Verdict::HeadTooLarge;
        }
        Verdict::Fine
    }

    /// A read is pending: `Some(error)` once the phase's deadline has passed (the connection
    /// is then closed), else the timer is armed to wake the reader at the deadline.
    pub fn on_pending(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let deadline = self.deadline?;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        match timer.as_mut().poll(cx) {
            Poll::Pending => None,
            Poll::Ready(()) => {
                let what = match self.seen {
                    Phase::Head => {
                        "request head not received within server.limits.header_timeout_seconds"
                    }
                    Phase::Body => "request body slower than server.limits.body_min_rate_bytes",
                    Phase::Idle => "keep-alive idle for server.limits.idle_timeout_seconds",
                    Phase::Serving => "timed out",
                };
                Some(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
            }
        }
    }
}

use std::future::Future;

/// The 431 answer of the developer API, in its error shape.
pub const API_HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\n\
content-type: application/json; charset=utf-8\r\ncontent-length: 140\r\nconnection: close\r\n\r\n\
{\"error\":{\"message\":\"The request head is larger than the server accepts.\",\"type\":\"invalid_request_error\",\"code\":\"request_header_too_large\"}}";

/// The 431 answer of the site listener, in the site's error shape.
pub const SITE_HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\n\
content-type: application/json; charset=utf-8\r\ncontent-length: 46\r\nconnection: close\r\n\r\n\
{\"ok\":false,\"code\":\"request_header_too_large\"}";

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> EdgeLimits {
        EdgeLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            body_min_rate: 1024,
            max_header_bytes: 1024,
            max_connections: 3,
            max_connections_per_address: 2,
            max_body_bytes_in_flight: 1 << 20,
        }
    }

    fn body_of(answer: &[u8]) -> &[u8] {
        let at = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("head end");
        &answer[at + 4..]
    }

    /// The canned answers declare their bodies' real lengths and are valid JSON.
    #[test]
    fn canned_answers_are_well_formed() {
        for answer in [API_HEAD_TOO_LARGE, SITE_HEAD_TOO_LARGE] {
            let body = body_of(answer);
            let text = std::str::from_utf8(answer).expect("ascii");
            assert!(
                text.contains(&format!("content-length: {}\r\n", body.len())),
                "{text}"
            );
            serde_json::from_slice::<serde_json::Value>(body).expect("JSON body");
        }
    }

    /// Caps per address and in total; released slots are given out again.
    #[test]
    fn caps_refuse_and_recover() {
        let limiter = Limiter::new(limits());
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let a1 = limiter.admit(Some(a), "t").expect("first");
        let _a2 = limiter.admit(Some(a), "t").expect("second");
        assert!(limiter.admit(Some(a), "t").is_none(), "per-address cap");
        let _b1 = limiter.admit(Some(b), "t").expect("other address");
        assert!(limiter.admit(Some(b), "t").is_none(), "total cap");
        drop(a1);
        assert_eq!(limiter.open(), 2);
        let _b2 = limiter.admit(Some(b), "t").expect("after a release");
        assert_eq!(limiter.per_address.get(&a).map(|c| *c), Some(1));
    }
}
