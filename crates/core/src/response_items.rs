//! The item registry: which account each Responses id belongs to, and the items the gateway
//! issued in translated answers (CONTRACT §3: "Responses and conversation ids belong to the
//! account that created them").
//!
//! Every tenant's stored responses live in the operator's one provider account, so the
//! provider cannot tell tenants apart: the gateway remembers which account it answered with
//! each response and item id, and a request referring to an id its account was not answered
//! with is refused before it reaches the provider. For translated answers the gateway is the
//! one keeping the items, so their content is kept too, for `item_reference`s to resolve.
//!
//! Recording never waits on the database: an answer's ids go into an in-process cache at once
//! (so this instance knows them before the client can send its next request) and into a queue
//! that one background task writes in batches every `storage.usage_flush_ms`, like usage events.
//! A lookup reads the cache, then the database; ids still missing are looked up once more after
//! two flush intervals (a record waits up to one interval for the writer, then for its write),
//! for a follow-up that reaches another instance right after the first one answered. Rows older than `storage.responses_retention_days` are pruned hourly and never
//! found.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;
use tokio::sync::{oneshot, Notify};

use crate::storage::response_items::ItemRecord;
use crate::storage::{within, Db, StoreError, StoreResult};
use crate::util::now_ms;

/// The ids one answer issued, as the request path hands them over.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Issued {
    pub ids: Vec<IssuedId>,
}

/// One id an answer issued: a response or an output item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedId {
    pub id: String,
    /// The item's JSON when the gateway issued it (a translated answer); `None` for a
    /// provider's id.
    pub item: Option<Arc<str>>,
}

impl Issued {
    /// Adds a provider's id once (an id appears in several events of a stream).
    pub fn provider_id(&mut self, id: &str) {
        if id.is_empty()
            || self.ids.len() >= MAX_IDS_PER_ANSWER
            || self.ids.iter().any(|i| i.id == id)
        {
            return;
        }
        self.ids.push(IssuedId {
            id: id.to_string(),
            item: None,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Most ids kept from one answer: an answer is a response and its output items, and a
/// provider sending thousands cannot grow the queue without bound.
pub const MAX_IDS_PER_ANSWER: usize = 1024;

/// What the registry knows of an id for the account that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// A provider issued it to this account.
    Provider,
    /// The gateway issued this item (its JSON) to this account.
    Item(Arc<str>),
}

/// Ids (and items) kept in process: most references are to the answers of the last minutes.
const CACHE_ENTRIES: usize = 200_000;
const CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Bytes of records waiting for the database: past this (the database has been down for a
/// while) new records are dropped, and references to them will be refused.
const QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// Records written per transaction.
const BATCH: usize = 4096;
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Handle used by the request path. Cloning is cheap.
#[derive(Clone)]
pub struct ItemRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    cache: Mutex<Cache>,
    queue: Mutex<Queue>,
    wake: Notify,
    db: Db,
    rt: tokio::runtime::Handle,
    every: Duration,
    retention: Duration,
    db_timeout: Duration,
    dropped: AtomicU64,
}

struct Entry {
    user_id: Arc<str>,
    item: Option<Arc<str>>,
    at: i64,
}

struct Cache {
    map: LruCache<String, Entry>,
    bytes: usize,
}

impl Cache {
    fn size(id: &str, e: &Entry) -> usize {
        id.len() + e.user_id.len() + e.item.as_ref().map_or(0, |i| i.len()) + 64
    }

    fn put(&mut self, id: String, e: Entry) {
        self.bytes += Cache::size(&id, &e);
        if let Some((old_id, old)) = self.map.push(id, e) {
            self.bytes = self.bytes.saturating_sub(Cache::size(&old_id, &old));
        }
        while self.map.len() > CACHE_ENTRIES || self.bytes > CACHE_BYTES {
            let Some((id, e)) = self.map.pop_lru() else {
                break;
            };
            self.bytes = self.bytes.saturating_sub(Cache::size(&id, &e));
        }
    }
}

#[derive(Default)]
struct Queue {
    rows: Vec<ItemRecord>,
    bytes: usize,
    flush_waiters: Vec<oneshot::Sender<()>>,
}

impl ItemRegistry {
    /// Starts the writer and the pruning on `rt` (the storage runtime). `every` is the write
    /// interval (and the wait before a missing id is looked up again), `retention` how long
    /// ids are kept, `db_timeout` the deadline of a lookup.
    pub fn start(
        db: Db,
        rt: &tokio::runtime::Handle,
        every: Duration,
        retention: Duration,
        db_timeout: Duration,
    ) -> ItemRegistry {
        let inner = Arc::new(Inner {
            cache: Mutex::new(Cache {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            db,
            rt: rt.clone(),
            every,
            retention,
            db_timeout,
            dropped: AtomicU64::new(0),
        });
        rt.spawn(run_writer(inner.clone()));
        rt.spawn(run_pruning(inner.clone()));
        ItemRegistry { inner }
    }

    /// Records that `user_id` was answered with `issued`: known to this process at once,
    /// written to the database with the next batch.
    pub fn record(&self, user_id: &str, issued: Issued) {
        if issued.is_empty() {
            return;
        }
        let at = now_ms();
        let owner: Arc<str> = Arc::from(user_id);
        {
            let mut cache = self.inner.lock_cache();
            for i in &issued.ids {
                let entry = Entry {
                    user_id: owner.clone(),
                    item: i.item.clone(),
                    at,
                };
                cache.put(i.id.clone(), entry);
            }
        }
        let mut q = self.inner.lock_queue();
        for i in issued.ids {
            let size = i.id.len() + user_id.len() + i.item.as_ref().map_or(0, |s| s.len());
            if q.bytes + size > QUEUE_BYTES {
                if self.inner.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    log::error!(
                        "response item queue full (the database is not taking writes): \
                         new ids are kept in memory only"
                    );
                }
                continue;
            }
            q.bytes += size;
            q.rows.push(ItemRecord {
                id: i.id,
                user_id: user_id.to_string(),
                item: i.item,
                created_at: at,
            });
        }
    }

    /// What the registry knows of each of `ids` for `user_id` (`None`: not this account's, or
    /// unknown, or past the retention), from the cache, else the database; ids still missing are
    /// looked up once more after one write interval. `Err` when the database failed.
    pub async fn lookup(&self, user_id: &str, ids: &[&str]) -> StoreResult<Vec<Option<Known>>> {
        let since = now_ms().saturating_sub(self.retention_ms());
        let mut found: Vec<Option<Known>> = vec![None; ids.len()];
        for attempt in 0..2 {
            if attempt == 1 {
                tokio::time::sleep(self.inner.every * 2).await;
            }
            self.fill_from_cache(user_id, ids, since, &mut found);
            let missing: Vec<&str> = ids
                .iter()
                .zip(&found)
                .filter(|(_, f)| f.is_none())
                .map(|(id, _)| *id)
                .collect();
            if missing.is_empty() {
                break;
            }
            let rows = self.read_database(user_id, &missing, since).await?;
            let owner: Arc<str> = Arc::from(user_id);
            let mut cache = self.inner.lock_cache();
            for (id, item, at) in rows {
                // Known here from now on: the next turn of this conversation needs no query.
                let entry = Entry {
                    user_id: owner.clone(),
                    item: item.map(Arc::from),
                    at,
                };
                cache.put(id, entry);
            }
            drop(cache);
            self.fill_from_cache(user_id, ids, since, &mut found);
            if found.iter().all(Option::is_some) {
                break;
            }
        }
        Ok(found)
    }

    /// Fills the empty slots of `found` with what the cache knows of `ids` for `user_id`.
    fn fill_from_cache(
        &self,
        user_id: &str,
        ids: &[&str],
        since: i64,
        found: &mut [Option<Known>],
    ) {
        let mut cache = self.inner.lock_cache();
        for (id, slot) in ids.iter().zip(found.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            *slot = match cache.map.get(*id) {
                Some(e) if &*e.user_id == user_id && e.at >= since => Some(match &e.item {
                    Some(item) => Known::Item(item.clone()),
                    None => Known::Provider,
                }),
                _ => None,
            };
        }
    }

    /// Looks `ids` up on the storage runtime, within the database deadline.
    async fn read_database(
        &self,
        user_id: &str,
        ids: &[&str],
        since: i64,
    ) -> StoreResult<Vec<(String, Option<String>, i64)>> {
        let db = self.inner.db.clone();
        let limit = self.inner.db_timeout;
        let user = user_id.to_string();
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let work = async move {
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            within(limit, db.response_items().lookup(&user, &refs, since)).await
        };
        match self.inner.rt.spawn(work).await {
            Ok(r) => r,
            Err(e) => Err(StoreError::Invalid(format!("response item lookup: {e}"))),
        }
    }

    fn retention_ms(&self) -> i64 {
        i64::try_from(self.inner.retention.as_millis()).unwrap_or(i64::MAX)
    }

    /// Waits until everything recorded so far is written (shutdown, tests).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.inner.lock_queue().flush_waiters.push(tx);
        self.inner.wake.notify_one();
        let _ = rx.await;
    }
}

impl Inner {
    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes what is queued every write interval (or at once for a flush), retrying with backoff:
/// a database hiccup delays the records, it does not drop them.
async fn run_writer(inner: Arc<Inner>) {
    loop {
        let _ = tokio::time::timeout(inner.every, inner.wake.notified()).await;
        loop {
            let (rows, waiters) = {
                let mut q = inner.lock_queue();
                let n = q.rows.len().min(BATCH);
                let rows: Vec<ItemRecord> = q.rows.drain(..n).collect();
                let written: usize = rows
                    .iter()
                    .map(|r| r.id.len() + r.user_id.len() + r.item.as_ref().map_or(0, |s| s.len()))
                    .sum();
                q.bytes = q.bytes.saturating_sub(written);
                let waiters = if q.rows.is_empty() {
                    std::mem::take(&mut q.flush_waiters)
                } else {
                    Vec::new()
                };
                (rows, waiters)
            };
            let more = rows.len() == BATCH;
            let mut delay = Duration::from_millis(50);
            while !rows.is_empty() {
                match inner.db.response_items().insert_batch(&rows).await {
                    Ok(()) => break,
                    Err(e) => {
                        log::error!(
                            "response item batch of {} failed, retrying: {e}",
                            rows.len()
                        );
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            for w in waiters {
                let _ = w.send(());
            }
            if !more {
                break;
            }
        }
    }
}

/// Deletes rows past the retention, at start and then hourly (every instance does: the
/// delete is idempotent).
async fn run_pruning(inner: Arc<Inner>) {
    let retention = i64::try_from(inner.retention.as_millis()).unwrap_or(i64::MAX);
    loop {
        let before = now_ms().saturating_sub(retention);
        match inner.db.response_items().prune(before).await {
            Ok(0) => {}
            Ok(n) => log::info!("pruned {n} response items past the retention"),
            Err(e) => log::warn!("pruning response items failed: {e}"),
        }
        tokio::time::sleep(PRUNE_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(ids: &[(&str, Option<&str>)]) -> Issued {
        Issued {
            ids: ids
                .iter()
                .map(|(id, item)| IssuedId {
                    id: id.to_string(),
                    item: item.map(Arc::from),
                })
                .collect(),
        }
    }

    /// Known at once in process, bound to its account, and written to the database, where a
    /// second registry (another instance, or this one after a restart) finds it.
    #[test]
    fn ids_are_known_at_once_and_after_a_restart() {
        let rt = crate::storage::storage_runtime().expect("runtime");
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}/registry.db", dir.path().display());
        let db = rt.block_on(Db::connect(&url)).expect("database");
        let start = |db: Db| {
            ItemRegistry::start(
                db,
                rt.handle(),
                Duration::from_millis(20),
                Duration::from_secs(86_400),
                Duration::from_secs(2),
            )
        };
        let first = start(db.clone());
        first.record(
            "usr_a",
            issued(&[("resp_1", None), ("msg_1", Some("{\"type\":\"message\"}"))]),
        );
        let want = vec![
            Some(Known::Provider),
            Some(Known::Item(Arc::from("{\"type\":\"message\"}"))),
            None,
        ];
        let ids = ["resp_1", "msg_1", "msg_2"];
        assert_eq!(
            rt.block_on(first.lookup("usr_a", &ids)).expect("lookup"),
            want
        );
        assert_eq!(
            rt.block_on(first.lookup("usr_b", &ids)).expect("lookup"),
            vec![None, None, None]
        );
        rt.block_on(first.flush());
        let second = start(db);
        assert_eq!(
            rt.block_on(second.lookup("usr_a", &ids)).expect("lookup"),
            want
        );
        assert_eq!(
            rt.block_on(second.lookup("usr_b", &ids)).expect("lookup"),
            vec![None, None, None]
        );
    }

    /// A follow-up that arrives just before its answer's ids are recorded (another instance
    /// answered a moment ago) still finds them: a missing id is looked up once more.
    #[test]
    fn ids_recorded_while_a_lookup_waits_are_found() {
        let rt = crate::storage::storage_runtime().expect("runtime");
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}/registry.db", dir.path().display());
        let db = rt.block_on(Db::connect(&url)).expect("database");
        let every = Duration::from_millis(100);
        let day = Duration::from_secs(86_400);
        let first = ItemRegistry::start(db.clone(), rt.handle(), every, day, day);
        let other = ItemRegistry::start(db, rt.handle(), every, day, day);
        let started = std::time::Instant::now();
        let found = rt.block_on(async {
            let late = first.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                late.record("usr_a", issued(&[("resp_late", None)]));
            });
            other.lookup("usr_a", &["resp_late", "resp_never"]).await
        });
        assert_eq!(found.expect("lookup"), vec![Some(Known::Provider), None]);
        assert!(started.elapsed() >= every * 2, "{:?}", started.elapsed());
    }

    #[test]
    fn an_answer_adds_each_provider_id_once_and_boundedly() {
        let mut i = Issued::default();
        for n in 0..3000 {
            i.provider_id(&format!("id_{}", n % 2000));
            i.provider_id("");
        }
        assert_eq!(i.ids.len(), MAX_IDS_PER_ANSWER);
        assert_eq!(i.ids[1].id, "id_1");
    }
}
