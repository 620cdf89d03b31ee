//! The process-wide state both services share. Built once at start; the config inside is
//! swapped atomically on reload, everything else lives for the whole process.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::identity::IdentityCache;
use crate::quota::Quota;
use crate::response_items::ItemRegistry;
use crate::secrets::Secrets;
use crate::storage::Db;
use crate::usage::UsageSink;

pub struct AppState {
    pub config: ArcSwap<Config>,
    pub db: Db,
    /// The long-lived runtime that owns the database and Redis pools. Pingora services run on
    /// their own runtimes, so database work is spawned here.
    pub rt: tokio::runtime::Handle,
    pub secrets: Secrets,
    /// The key pepper's HMAC, keyed once (`None` without a pepper).
    pub key_hasher: Option<crate::apikey::KeyHasher>,
    pub identity: Arc<IdentityCache>,
    pub usage: UsageSink,
    pub quota: Quota,
    /// Which account each Responses id belongs to, and the items translated answers issued.
    pub items: ItemRegistry,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// A snapshot of the live config for one request: later reloads do not affect it.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Runs database work on the storage runtime and waits for it.
    pub async fn on_storage<F, T>(&self, fut: F) -> Option<T>
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        match self.rt.spawn(fut).await {
            Ok(v) => Some(v),
            Err(e) => {
                log::error!("storage task failed: {e}");
                None
            }
        }
    }
}
