//! The schema history of each dialect, embedded in the binary and applied by `Db::connect`.
//!
//! `migrations/sqlite` and `migrations/postgres` hold one history: the same versions under the
//! same names, each doing on its database what its name says, or, where a step has no
//! counterpart on one database, an explicit no-op whose comment says why (Postgres `0007`).
//! The tests below keep the two folders in step.
//!
//! How sqlx's `Migrator::run` treats a database it migrated before: it applies every embedded
//! version the database has not recorded, in version order, wherever that version falls among
//! the recorded ones (a version added below applied ones runs at the next start: Postgres
//! `0007`, added after `0008` and `0009` had shipped). It refuses to start when the database
//! records a version the binary does not embed (`VersionMissing`, unless `set_ignore_missing`)
//! or one whose text changed (`VersionMismatch`, a checksum over the whole file): an applied
//! migration is never edited, not even its comments.

use sqlx::migrate::Migrator;

use super::Backend;

static SQLITE: Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES: Migrator = sqlx::migrate!("../../migrations/postgres");

/// The embedded history of `backend`'s dialect.
pub(super) fn migrator(backend: Backend) -> &'static Migrator {
    match backend {
        Backend::Sqlite => &SQLITE,
        Backend::Postgres => &POSTGRES,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sqlx::migrate::Migration;

    use super::*;
    use crate::storage::testdb::PgDatabase;
    use crate::storage::Db;

    fn history(m: &Migrator) -> Vec<(i64, String)> {
        m.iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect()
    }

    #[test]
    fn both_dialects_have_one_numbered_history() {
        let sqlite = history(&SQLITE);
        assert_eq!(
            sqlite,
            history(&POSTGRES),
            "sqlite (left) and postgres differ"
        );
        let versions: Vec<i64> = sqlite.iter().map(|(v, _)| *v).collect();
        let expected: Vec<i64> = (1..=versions.len() as i64).collect();
        assert_eq!(
            versions, expected,
            "versions are numbered 1, 2, 3, … without gaps"
        );
        for m in SQLITE.iter().chain(POSTGRES.iter()) {
            assert!(
                m.migration_type.is_up_migration(),
                "{} {}: only forward migrations",
                m.version,
                m.description
            );
        }
    }

    /// Writes `migrations` as files sqlx reads back into the same migrations (same versions,
    /// names and texts, so the same checksums).
    fn write_folder(dir: &Path, migrations: &[&Migration]) {
        for m in migrations {
            let name = format!("{:04}_{}.sql", m.version, m.description.replace(' ', "_"));
            std::fs::write(dir.join(name), m.sql.as_bytes()).expect("write migration");
        }
    }

    /// Tables, columns, indexes and constraints of the public schema, as text that two
    /// databases with the same schema share.
    async fn schema(db: &Db) -> Vec<String> {
        let mut conn = db.pool.acquire().await.expect("connection");
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable \
             || ' ' || COALESCE(column_default, '') FROM information_schema.columns \
             WHERE table_schema = 'public' \
             UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' \
             UNION ALL SELECT conrelid::regclass::text || ' ' || conname || ' ' \
             || pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE connamespace = 'public'::regnamespace ORDER BY 1",
        )
        .fetch_all(&mut *conn)
        .await
        .expect("read schema");
        rows.into_iter()
            .filter(|r| !r.contains("_sqlx_migrations"))
            .collect()
    }

    async fn versions(db: &Db) -> Vec<i64> {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&db.pool)
            .await
            .expect("read applied versions")
    }

    /// A Postgres database migrated by a release whose history lacked `0007` (it had 0001-0006,
    /// 0008 and 0009) starts with this history: the gateway applies `0007` at its next start,
    /// and ends with the schema of a database migrated from scratch.
    #[tokio::test]
    async fn postgres_databases_migrated_without_0007_still_start() {
        let Some(old) = PgDatabase::create().await else {
            return;
        };
        let Some(fresh) = PgDatabase::create().await else {
            return;
        };
        let dir = tempfile::tempdir().expect("temporary directory");
        let before: Vec<&Migration> = POSTGRES
            .iter()
            .filter(|m| m.version <= 9 && m.version != 7)
            .collect();
        assert_eq!(before.len(), 8, "the history as it shipped before 0007");
        write_folder(dir.path(), &before);
        let shipped = Migrator::new(dir.path()).await.expect("read old history");
        let pool = sqlx::PgPool::connect(&old.url).await.expect("connect");
        shipped.run(&pool).await.expect("old migrations");
        pool.close().await;

        let upgraded = Db::connect(&old.url)
            .await
            .expect("start on the old database");
        let all: Vec<i64> = POSTGRES.iter().map(|m| m.version).collect();
        assert_eq!(versions(&upgraded).await, all);
        let from_scratch = Db::connect(&fresh.url)
            .await
            .expect("start on a new database");
        assert_eq!(schema(&upgraded).await, schema(&from_scratch).await);
        // The check is not vacuous: the schema holds the tables of every version.
        assert!(schema(&from_scratch)
            .await
            .iter()
            .any(|r| r.starts_with("users.totp_last_step ")));
        upgraded.pool.close().await;
        from_scratch.pool.close().await;
    }
}
