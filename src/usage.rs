//! The usage writer: usage events and key last-use times leave the request path through a
//! channel and are written in batches by one background task, so no request waits for a
//! database write. `flush` drains everything queued (used at shutdown and by tests).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::storage::{Db, UsageEvent};

enum Msg {
    Event(Box<UsageEvent>),
    Flush(oneshot::Sender<()>),
}

/// Handle used by the request path. Cloning is cheap.
#[derive(Clone)]
pub struct UsageSink {
    tx: mpsc::UnboundedSender<Msg>,
    written: Arc<AtomicU64>,
    queued: Arc<AtomicU64>,
    pending: Arc<AtomicU64>,
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
    pub fn start(db: Db, rt: &tokio::runtime::Handle, batch: usize, every: Duration) -> UsageSink {
        let (tx, rx) = mpsc::unbounded_channel();
        let written = Arc::new(AtomicU64::new(0));
        rt.spawn(run_writer(rx, db, batch, every, written.clone()));
        UsageSink {
            tx,
            written,
            queued: Arc::new(AtomicU64::new(0)),
            pending: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Queues an event; never blocks.
    pub fn record(&self, event: UsageEvent) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Msg::Event(Box::new(event))).is_err() {
            log::error!("usage writer is gone; usage event lost");
        }
    }

    /// Marks an event as coming; drop the guard once it is recorded.
    pub fn begin_pending(&self) -> Pending {
        self.pending.fetch_add(1, Ordering::AcqRel);
        Pending(self.pending.clone())
    }

    /// Waits until pending events are recorded (bounded) and everything queued is written.
    pub async fn flush(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while self.pending.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
}

async fn run_writer(
    mut rx: mpsc::UnboundedReceiver<Msg>,
    db: Db,
    batch: usize,
    every: Duration,
    written: Arc<AtomicU64>,
) {
    let mut buf: Vec<UsageEvent> = Vec::with_capacity(batch);
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        // Wait for the first message, then gather what else is ready up to one batch, waiting at
        // most `every` so a quiet gateway still writes promptly.
        let first = rx.recv().await;
        let Some(first) = first else {
            write_all(&db, &mut buf, &written).await;
            return;
        };
        let deadline = tokio::time::Instant::now() + every;
        let mut next = Some(first);
        loop {
            match next.take() {
                Some(Msg::Event(e)) => buf.push(*e),
                Some(Msg::Flush(w)) => {
                    waiters.push(w);
                    break;
                }
                None => {}
            }
            if buf.len() >= batch {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(m)) => next = Some(m),
                Ok(None) | Err(_) => break,
            }
        }
        write_all(&db, &mut buf, &written).await;
        for w in waiters.drain(..) {
            let _ = w.send(());
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
    let mut last_used: HashMap<String, i64> = HashMap::new();
    for e in buf.iter() {
        let at = last_used.entry(e.key_id.clone()).or_insert(e.created_at);
        *at = (*at).max(e.created_at);
    }
    let uses: Vec<(String, i64)> = last_used.into_iter().collect();
    if let Err(e) = db.keys().touch_last_used(&uses).await {
        log::warn!("lastUsedAt update failed: {e}");
    }
    written.fetch_add(buf.len() as u64, Ordering::Relaxed);
    buf.clear();
}
