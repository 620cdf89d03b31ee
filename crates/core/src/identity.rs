//! The identity cache: active API keys (by peppered hash) and the account state behind them.
//!
//! The developer API validates every request here without touching the database on a hit.
//! Correctness comes from invalidation, not from short TTLs:
//! - the instance that revokes a key or changes an account updates this cache at once;
//! - a change feed polls `updated_at` every `FEED_INTERVAL` for changes made elsewhere (admin
//!   commands, other instances), so a suspension or revocation is seen within that interval.
//!
//! Unknown hashes are remembered briefly (negative cache) so a flood of bad keys cannot turn
//! into a flood of database queries.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::storage::{Db, KeyRecord, StoreResult, UserRecord};
use crate::util::{now_ms, FastHash};

pub const FEED_INTERVAL: Duration = Duration::from_millis(250);
const NEGATIVE_TTL: Duration = Duration::from_secs(30);
const NEGATIVE_MAX: usize = 100_000;
/// The feed re-reads this far back so rows written with a slightly skewed clock, or committed
/// just after a poll, are never missed. Re-applying a change is harmless.
const FEED_OVERLAP_MS: i64 = 5_000;

/// A validated key together with its account, as the request path needs them.
#[derive(Clone, Debug)]
pub struct Identity {
    pub key: Arc<KeyRecord>,
    pub user: Arc<UserRecord>,
}

#[derive(Default)]
pub struct IdentityCache {
    keys: DashMap<String, Arc<KeyRecord>, FastHash>,
    users: DashMap<String, Arc<UserRecord>, FastHash>,
    negative: DashMap<String, Instant, FastHash>,
    feed_cursor: AtomicI64,
    /// How long a request waits for the database on a miss (`storage.database_timeout_ms`).
    deadline: Duration,
}

impl IdentityCache {
    pub fn new(deadline: Duration) -> Self {
        let c = IdentityCache {
            deadline,
            ..IdentityCache::default()
        };
        c.feed_cursor.store(now_ms(), Ordering::Relaxed);
        c
    }

    /// Resolves a key hash. `Ok(None)` means unknown or revoked. Database work runs on `rt`, the
    /// long-lived storage runtime, because pools belong to it.
    pub async fn lookup(
        &self,
        db: &Db,
        rt: &tokio::runtime::Handle,
        hash: &str,
    ) -> StoreResult<Option<Identity>> {
        if let Some(key) = self.keys.get(hash).map(|k| k.clone()) {
            if let Some(user) = self.users.get(&key.user_id).map(|u| u.clone()) {
                return Ok(Some(Identity { key, user }));
            }
        }
        if let Some(at) = self.negative.get(hash).map(|t| *t) {
            if at.elapsed() < NEGATIVE_TTL {
                return Ok(None);
            }
        }
        let db2 = db.clone();
        let h = hash.to_string();
        let deadline = self.deadline;
        let found = rt
            .spawn(crate::storage::within(deadline, async move {
                let Some(key) = db2.keys().find_by_hash(&h).await? else {
                    return Ok(None);
                };
                let user = db2.users().get(&key.user_id).await?;
                Ok::<_, crate::storage::StoreError>(user.map(|u| (key, u)))
            }))
            .await
            .map_err(|e| crate::storage::StoreError::Invalid(format!("lookup task: {e}")))??;
        match found {
            Some((key, user)) if !key.revoked => {
                let key = Arc::new(key);
                let user = self.remember_user(user);
                self.keys.insert(hash.to_string(), key.clone());
                Ok(Some(Identity { key, user }))
            }
            _ => {
                if self.negative.len() >= NEGATIVE_MAX {
                    self.negative.clear();
                }
                self.negative.insert(hash.to_string(), Instant::now());
                Ok(None)
            }
        }
    }

    fn remember_user(&self, user: UserRecord) -> Arc<UserRecord> {
        let user = Arc::new(user);
        self.users.insert(user.id.clone(), user.clone());
        user
    }

    /// Applies a key change (revocation, creation, edit) seen anywhere.
    pub fn apply_key(&self, key: KeyRecord) {
        self.negative.remove(&key.key_hash);
        if key.revoked {
            self.keys.remove(&key.key_hash);
        } else if self.keys.contains_key(&key.key_hash) {
            self.keys.insert(key.key_hash.clone(), Arc::new(key));
        }
    }

    /// Forgets a key by hash (used by cross-instance invalidation messages).
    pub fn forget_key(&self, hash: &str) {
        self.keys.remove(hash);
    }

    /// Applies an account change; only accounts already cached are kept.
    pub fn apply_user(&self, user: UserRecord) {
        if self.users.contains_key(&user.id) {
            self.users.insert(user.id.clone(), Arc::new(user));
        }
    }

    /// Drops an account so its next request reloads it.
    pub fn forget_user(&self, user_id: &str) {
        self.users.remove(user_id);
        self.keys.retain(|_, k| k.user_id != user_id);
    }

    /// One poll of the change feed. Returns how many rows it applied.
    pub async fn poll_changes(&self, db: &Db) -> StoreResult<usize> {
        let started = now_ms();
        let since = self.feed_cursor.load(Ordering::Relaxed) - FEED_OVERLAP_MS;
        let keys = db.keys().changed_since(since).await?;
        let users = db.users().changed_since(since).await?;
        let n = keys.len() + users.len();
        for k in keys {
            self.apply_key(k);
        }
        for u in users {
            self.apply_user(u);
        }
        self.feed_cursor.store(started, Ordering::Relaxed);
        Ok(n)
    }

    /// Runs the change feed until the process ends.
    pub async fn run_feed(self: Arc<Self>, db: Db) {
        let mut tick = tokio::time::interval(FEED_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.poll_changes(&db).await {
                log::warn!("identity change feed: {e}");
            }
        }
    }
}
