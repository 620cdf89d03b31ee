//! The usage writer: usage events and key last-use times leave the request path through a
//! channel and are written in batches by one background task, so no request waits for a
//! database write. `flush` drains everything queued (used at shutdown and by tests).
//!
//! With a [`Journal`], each admission and each settled event is also appended to a local file
//! before it is queued, and the event keeps its journal segments alive until its batch is
//! committed: a killed process loses no usage (see `journal`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use crate::journal::{Hold, Journal, Mark, Reserved};
use crate::storage::{Db, UsageEvent};

/// Handle used by the request path. Cloning is cheap.
///
/// Events go into a shared buffer under a short lock; the writer wakes on its own timer (every
/// `usage_flush_ms`), when a batch is full, or for a flush. Waking the writer for every event
/// cost a cross-runtime wake-up (futex, eventfd, context switch) per request.
#[derive(Clone)]
pub struct UsageSink {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Mutex<Queue>,
    wake: Notify,
    batch: usize,
    written: AtomicU64,
    queued: AtomicU64,
    pending: Arc<AtomicU64>,
    journal: Option<Arc<Journal>>,
}

#[derive(Default)]
struct Queue {
    events: Vec<UsageEvent>,
    /// `marks[i]` holds `events[i]`'s journal segments until it is committed.
    marks: Vec<Mark>,
    flush_waiters: Vec<oneshot::Sender<()>>,
}

/// An event still being prepared (its settlement in flight); `flush` waits for it.
pub struct Pending(Arc<AtomicU64>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl UsageSink {
    /// Starts the writer task on `rt` (the storage runtime).
    pub fn start(
        db: Db,
        rt: &tokio::runtime::Handle,
        batch: usize,
        every: Duration,
        journal: Option<Arc<Journal>>,
    ) -> UsageSink {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            batch: batch.max(1),
            written: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            pending: Arc::new(AtomicU64::new(0)),
            journal,
        });
        rt.spawn(run_writer(inner.clone(), db, every));
        UsageSink { inner }
    }

    /// Journals an admitted request and what it reserved (one append); the returned segment
    /// goes back with the event to [`record`](Self::record).
    pub fn admit(
        &self,
        event: &UsageEvent,
        input_estimate: u64,
        reserved: Reserved,
    ) -> Option<Hold> {
        self.inner
            .journal
            .as_ref()
            .map(|j| j.admit(event, input_estimate, reserved))
    }

    /// Journals the settled event (one append) and queues it; never blocks on the database.
    pub fn record(&self, event: UsageEvent, admitted: Option<Hold>) {
        let settled = self.inner.journal.as_ref().map(|j| j.settle(&event));
        self.inner.queued.fetch_add(1, Ordering::Relaxed);
        let full = {
            let mut q = self.inner.lock();
            q.events.push(event);
            q.marks.push(Mark::new(admitted, settled));
            q.events.len() == self.inner.batch
        };
        if full {
            self.inner.wake.notify_one();
        }
    }

    /// Marks an event as coming; drop the guard once it is recorded.
    pub fn begin_pending(&self) -> Pending {
        self.inner.pending.fetch_add(1, Ordering::AcqRel);
        Pending(self.inner.pending.clone())
    }

    /// Waits until pending events are recorded (bounded) and everything queued is written.
    pub async fn flush(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while self.inner.pending.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (tx, rx) = oneshot::channel();
        self.inner.lock().flush_waiters.push(tx);
        self.inner.wake.notify_one();
        let _ = rx.await;
    }

    pub fn written(&self) -> u64 {
        self.inner.written.load(Ordering::Relaxed)
    }

    pub fn queued(&self) -> u64 {
        self.inner.queued.load(Ordering::Relaxed)
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Takes what is queued every `every` (or sooner when woken) and writes it, in batches.
async fn run_writer(inner: Arc<Inner>, db: Db, every: Duration) {
    let db = db.dedicated().await;
    if let Err(e) = db.usage().prepare_inserts().await {
        log::warn!("preparing the usage inserts: {e}; each is prepared when first used");
    }
    loop {
        let _ = tokio::time::timeout(every, inner.wake.notified()).await;
        loop {
            let (mut events, marks, waiters) = {
                let mut q = inner.lock();
                let n = q.events.len().min(inner.batch);
                let events: Vec<UsageEvent> = q.events.drain(..n).collect();
                let marks: Vec<Mark> = q.marks.drain(..n).collect();
                let waiters = if q.events.is_empty() {
                    std::mem::take(&mut q.flush_waiters)
                } else {
                    Vec::new()
                };
                (events, marks, waiters)
            };
            let more = events.len() == inner.batch;
            write_all(&db, &mut events, &inner.written).await;
            // Committed: their journal lines are no longer needed.
            marks.into_iter().for_each(Mark::release);
            for w in waiters {
                let _ = w.send(());
            }
            if !more {
                break;
            }
        }
    }
}

/// Writes the buffer, retrying with backoff: a database hiccup delays usage records, it never
/// drops them.
async fn write_all(db: &Db, buf: &mut Vec<UsageEvent>, written: &AtomicU64) {
    if buf.is_empty() {
        return;
    }
    let mut delay = Duration::from_millis(50);
    loop {
        match db.usage().insert_batch(buf).await {
            Ok(()) => break,
            Err(e) => {
                log::error!("usage batch of {} failed, retrying: {e}", buf.len());
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
    written.fetch_add(buf.len() as u64, Ordering::Relaxed);
    buf.clear();
}
