//! Throwaway Postgres databases for the storage tests. Postgres tests run when
//! `GATEWAY_TEST_DATABASE=postgres` (then an unreachable server fails them) or whenever the
//! server answers (CI has one); otherwise they say so and pass without checking anything.
//! The server is the one the integration tests use: `GATEWAY_TEST_PG_ADMIN`, default
//! `postgres://postgres@127.0.0.1:5432/test`.

use sqlx::{Connection, Executor, PgConnection};

/// A database created for one test, dropped when it goes out of scope (also on panic).
pub(crate) struct PgDatabase {
    pub url: String,
    admin: String,
    name: String,
}

fn admin_url() -> String {
    std::env::var("GATEWAY_TEST_PG_ADMIN")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

impl PgDatabase {
    /// A new empty database, or `None` (after saying why) when Postgres is not required and
    /// not reachable.
    pub(crate) async fn create() -> Option<PgDatabase> {
        let admin = admin_url();
        let required = std::env::var("GATEWAY_TEST_DATABASE").as_deref() == Ok("postgres");
        let mut conn = match PgConnection::connect(&admin).await {
            Ok(c) => c,
            Err(e) if required => panic!("GATEWAY_TEST_DATABASE=postgres, but {admin}: {e}"),
            Err(e) => {
                eprintln!("no Postgres at {admin} ({e}); skipping the Postgres half");
                return None;
            }
        };
        let name = format!(
            "gw_storage_{}_{}",
            std::process::id(),
            crate::util::random_base62(10).to_ascii_lowercase()
        );
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .expect("create test database");
        conn.close().await.ok();
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        Some(PgDatabase {
            url: format!("{base}/{name}"),
            admin,
            name,
        })
    }
}

impl Drop for PgDatabase {
    /// Drops the database from a thread of its own: `Drop` cannot await, and the test's
    /// runtime may be a single thread that is busy running this very drop.
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&admin).await.ok()?;
                conn.execute(sql.as_str()).await.ok()?;
                conn.close().await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}
