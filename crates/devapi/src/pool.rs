//! Idle upstream connections, kept per provider address and per worker thread.
//!
//! Pingora's stock pool parks every idle connection in a watcher task spawned on a random
//! worker thread; taking the connection back wakes that task and waits for it to let go, two
//! cross-thread wake-ups per request, and when the watcher is slow to let go the connection is
//! thrown away ("failed to acquire reusable stream") and a new one is dialled. Here an idle
//! connection simply sits in a list: it is checked for a close or stray bytes (one non-blocking
//! read) when taken, the list is per worker thread so a connection stays with the event loop
//! that registered it, and a sweep closes the ones idle longer than the idle timeout.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use futures::FutureExt;
use pingora_core::protocols::Stream;
use tokio::io::AsyncReadExt;

use gateway_core::util::FastHash;

/// Most idle connections kept per provider address and thread.
const MAX_IDLE_PER_KEY: usize = 256;

type Key = (u64, ThreadId);
/// Idle connections per key, most recently used last.
type IdleMap = HashMap<Key, Vec<(Stream, Instant)>, FastHash>;

pub struct IdlePool {
    idle: Mutex<IdleMap>,
    max_idle: Duration,
}

impl IdlePool {
    pub fn new(max_idle: Duration) -> Self {
        IdlePool {
            idle: Mutex::new(HashMap::default()),
            max_idle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdleMap> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used live connection to `peer`, if any.
    pub fn take(&self, peer: u64) -> Option<Stream> {
        let key = (peer, std::thread::current().id());
        loop {
            let (mut stream, since) = self.lock().get_mut(&key)?.pop()?;
            if since.elapsed() < self.max_idle && still_idle(&mut stream) {
                return Some(stream);
            }
            // Closed by the provider, sent stray bytes, or idle too long: dropped (closed).
        }
    }

    /// Keeps a connection whose exchange ended cleanly.
    pub fn put(&self, peer: u64, stream: Stream) {
        let key = (peer, std::thread::current().id());
        let mut idle = self.lock();
        let list = idle.entry(key).or_default();
        if list.len() < MAX_IDLE_PER_KEY {
            list.push((stream, Instant::now()));
        }
    }

    /// Closes connections idle longer than the idle timeout.
    pub fn sweep(&self) {
        let expired: Vec<(Stream, Instant)> = {
            let mut idle = self.lock();
            let mut out = Vec::new();
            for list in idle.values_mut() {
                // Oldest first: entries are pushed as they are released.
                let n = list
                    .iter()
                    .take_while(|(_, since)| since.elapsed() >= self.max_idle)
                    .count();
                out.extend(list.drain(..n));
            }
            idle.retain(|_, list| !list.is_empty());
            out
        };
        drop(expired); // closed outside the lock
    }
}

/// True when a read would block: the provider neither closed the connection nor sent anything
/// while it was idle (a server never speaks first on an idle HTTP/1.1 connection).
fn still_idle(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    tokio::task::unconstrained(stream.read(&mut byte))
        .now_or_never()
        .is_none()
}
