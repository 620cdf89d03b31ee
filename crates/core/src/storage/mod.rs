//! Storage: one small store per area (users, keys, …) over a sqlx `AnyPool`, so the same
//! queries serve the embedded SQLite default and Postgres in production. Requests share one
//! pool; the usage writer has a connection of its own (`Db::dedicated`).
//!
//! Portability rules the stores follow: timestamps are `BIGINT` Unix milliseconds, flags are
//! 0/1 integers, placeholders are `$1, $2, …` in first-use order (SQLite binds them by order of
//! appearance), aggregates are cast to `BIGINT` (Postgres sums to `NUMERIC`).
//!
//! Each store declares its statements as named constants (`queries!`) and reads rows into
//! `#[derive(sqlx::FromRow)]` structs (`row!`), converted into its public records. The `check`
//! tests describe every statement on a migrated SQLite and Postgres and compare its columns
//! with the struct it is read into (`declare` says why this is not sqlx's compile-time macros).
//! `migrate` holds the two dialects' schema histories, one numbered history for both.

#[macro_use]
mod declare;

pub mod auth;
#[cfg(test)]
mod check;
pub mod keys;
pub mod meta;
mod migrate;
pub mod payments;
pub mod quota;
pub mod reports;
pub mod response_items;
pub mod usage;
pub mod users;

use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Executor};

pub use auth::{AuthStore, ChallengeRecord, ChallengeSecrets, SessionRecord, TwoFactorState};
pub use keys::{KeyRecord, KeyStore, NewKey};
pub use usage::{UsageEvent, UsageStore};
pub use users::{UserRecord, UserStore};

/// Creates the runtime that owns the pools for the whole process.
pub fn storage_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gw-storage")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the storage runtime: {e}"))
}

/// Hides credentials in a database URL for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_string(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Storage failures. `Conflict` is a unique-constraint violation, which callers turn into a
/// domain answer; everything else is an internal error whose cause is logged, never sent.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    Invalid(String),
    /// The database did not answer within the request path's deadline.
    #[error("database deadline of {0:?} passed")]
    Timeout(Duration),
}

impl StoreError {
    /// Maps a unique violation to `Conflict` so callers can answer it as a domain error.
    pub fn from_sqlx(e: sqlx::Error) -> StoreError {
        if let sqlx::Error::Database(d) = &e {
            if d.is_unique_violation() {
                return StoreError::Conflict(d.message().to_string());
            }
        }
        StoreError::Db(e)
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Runs database work a request waits for, giving up after `limit`: a slow or unreachable
/// database costs a request its deadline, never an unbounded wait. Dropping the work returns
/// its connection to the pool, which finishes the statement before reusing it.
pub async fn within<T>(
    limit: Duration,
    work: impl std::future::Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)))
}

/// The database handle: a pool plus which dialect it speaks.
#[derive(Clone, Debug)]
pub struct Db {
    pub pool: AnyPool,
    pub backend: Backend,
}

/// The pool settings every handle shares: at most `max` connections, SQLite's pragmas on
/// each new connection.
fn pool_options(backend: Backend, max: u32, acquire: Duration) -> AnyPoolOptions {
    AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if backend == Backend::Sqlite {
                    // WAL lets readers run beside the single writer; busy_timeout makes a
                    // second process (admin commands) wait instead of failing.
                    conn.execute(
                        "PRAGMA journal_mode=WAL; PRAGMA busy_timeout=10000; \
                         PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
                    )
                    .await?;
                }
                Ok(())
            })
        })
}

impl Db {
    /// Connects (creating the SQLite file and its directory if needed) and applies migrations.
    pub async fn connect(url: &str) -> StoreResult<Db> {
        Db::connect_with_timeout(url, Duration::from_secs(10)).await
    }

    /// `connect` whose pool gives up acquiring a connection after `acquire` (the server's
    /// `storage.database_timeout_ms`), so no caller queues for the pool without bound.
    pub async fn connect_with_timeout(url: &str, acquire: Duration) -> StoreResult<Db> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            Backend::Postgres
        };
        let mut url = url.to_string();
        if backend == Backend::Sqlite {
            if let Some(path) = sqlite_path(&url) {
                create_private_database(std::path::Path::new(&path))?;
            }
            if !url.contains('?') {
                url.push_str("?mode=rwc");
            }
        }
        let opts = AnyConnectOptions::from_str(&url)?
            .log_statements(log::LevelFilter::Trace)
            .log_slow_statements(log::LevelFilter::Warn, Duration::from_millis(500));
        let max = match backend {
            Backend::Sqlite => 8,
            Backend::Postgres => 16,
        };
        let pool = pool_options(backend, max, acquire)
            .connect_with(opts)
            .await?;
        let db = Db { pool, backend };
        db.migrate().await?;
        Ok(db)
    }

    /// A handle on a pool of its own holding one connection that is kept (never retired for
    /// age or idleness), for a task that writes batches one after another: the usage writer.
    /// A connection keeps the statements it has prepared, and the writer's multi-row inserts
    /// come in several sizes; on the shared pool each of its connections prepared each size
    /// again (for SQLite a parse and a plan, several times what inserting the rows costs) and
    /// lost them when retired. When that connection cannot be opened (or the database is an
    /// in-memory SQLite, which a second connection would not see), this handle is returned.
    pub async fn dedicated(&self) -> Db {
        let opts = (*self.pool.connect_options()).clone();
        if self.backend == Backend::Sqlite && sqlite_path(opts.database_url.as_str()).is_none() {
            return self.clone();
        }
        let acquire = self.pool.options().get_acquire_timeout();
        let pool = pool_options(self.backend, 1, acquire)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts)
            .await;
        match pool {
            Ok(pool) => Db {
                pool,
                backend: self.backend,
            },
            Err(e) => {
                log::warn!("a connection of its own for the usage writer: {e}; sharing the pool");
                self.clone()
            }
        }
    }

    async fn migrate(&self) -> StoreResult<()> {
        migrate::migrator(self.backend).run(&self.pool).await?;
        Ok(())
    }

    pub fn users(&self) -> UserStore<'_> {
        UserStore { db: self }
    }

    pub fn auth(&self) -> AuthStore<'_> {
        AuthStore { db: self }
    }

    pub fn keys(&self) -> KeyStore<'_> {
        KeyStore { db: self }
    }

    pub fn payments(&self) -> payments::PaymentStore<'_> {
        payments::PaymentStore { db: self }
    }

    pub fn quota(&self) -> quota::QuotaStore<'_> {
        quota::QuotaStore { db: self }
    }

    pub fn reports(&self) -> reports::ReportStore<'_> {
        reports::ReportStore { db: self }
    }

    pub fn usage(&self) -> UsageStore<'_> {
        UsageStore { db: self }
    }

    pub fn meta(&self) -> meta::MetaStore<'_> {
        meta::MetaStore { db: self }
    }

    pub fn response_items(&self) -> response_items::ResponseItemStore<'_> {
        response_items::ResponseItemStore { db: self }
    }
}

/// Creates the SQLite file (and its directory, mode 0700) with mode 0600 before SQLite opens
/// it: SQLite would create it with the umask's mode (usually 0644, readable by every local
/// user), and it gives the `-wal` and `-shm` files the main file's mode. An existing file is
/// left as the operator set it, with a warning when others can read it.
fn create_private_database(path: &std::path::Path) -> StoreResult<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::Invalid(format!("cannot create {}: {e}", dir.display())))?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    log::warn!(
                        "{} is readable by other users (mode {:o}); chmod 600 it",
                        path.display(),
                        meta.permissions().mode() & 0o777
                    );
                }
            }
            Ok(())
        }
        Err(e) => Err(StoreError::Invalid(format!(
            "cannot create {}: {e}",
            path.display()
        ))),
    }
}

fn sqlite_path(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() || path == ":memory:" {
        None
    } else {
        Some(path.to_string())
    }
}

/// 0/1 integer columns as booleans.
pub(crate) fn flag(v: i64) -> bool {
    v != 0
}

#[cfg(test)]
mod testdb;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_past_its_deadline_is_a_timeout() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        };
        let started = std::time::Instant::now();
        let r = within(Duration::from_millis(20), slow).await;
        assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            within(Duration::from_secs(1), async { Ok(7) }).await.ok(),
            Some(7)
        );
    }

    #[tokio::test]
    async fn the_writers_handle_is_one_kept_connection_on_the_same_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("g.db").display());
        let db = Db::connect(&url).await.expect("connect");
        let writer = db.dedicated().await;
        let opts = writer.pool.options();
        assert_eq!(opts.get_max_connections(), 1);
        assert_eq!(
            (opts.get_idle_timeout(), opts.get_max_lifetime()),
            (None, None)
        );
        assert_eq!(db.pool.options().get_max_connections(), 8);
        // What the writer commits, the shared pool reads (the pragmas hold on its connection).
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&writer.pool)
            .await
            .expect("create");
        sqlx::query("INSERT INTO t VALUES (7)")
            .execute(&writer.pool)
            .await
            .expect("insert");
        let x: i64 = sqlx::query_scalar("SELECT x FROM t")
            .fetch_one(&db.pool)
            .await
            .expect("read");
        assert_eq!(x, 7);
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&writer.pool)
            .await
            .expect("pragma");
        assert_eq!(mode, "wal");

        // An in-memory database exists only on its own connections: the writer shares them.
        let memory = Db::connect("sqlite::memory:").await.expect("memory");
        let shared = memory.dedicated().await;
        assert_eq!(shared.pool.options().get_max_connections(), 8);
    }
}
