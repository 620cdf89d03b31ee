//! Response and item ids and the account each belongs to (`response_items`): written in
//! batches by the item registry (`crate::response_items`), read when its cache does not know
//! an id a request references, pruned past the retention.
//!
//! Both the batch insert and the lookup have a fixed number of placeholders, filled up by
//! repeating the last row or id: one statement text each, kept in every connection's statement
//! cache, whatever the batch or the request holds. A repeated row is skipped by
//! `ON CONFLICT DO NOTHING`, a repeated id in `IN (…)` matches nothing more.

use std::sync::OnceLock;

use sqlx::any::AnyArguments;
use sqlx::Arguments;

use super::usage::push_placeholders;
use super::{Backend, Db, StoreError, StoreResult};

/// One id as stored: who it belongs to, the item itself when the gateway issued it, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRecord {
    pub id: String,
    pub user_id: String,
    /// The item's JSON for an item the gateway issued; `None` for an id a provider issued.
    pub item: Option<std::sync::Arc<str>>,
    pub created_at: i64,
}

row! {
    /// A `response_items` row as a lookup reads it.
    struct FoundRow {
        id: String,
        item: Option<String>,
        created_at: i64,
    }
}

/// Rows per INSERT statement.
pub const INSERT_ROWS: usize = 64;
const INSERT_COLUMNS: usize = 4;
/// Ids per lookup statement.
pub const LOOKUP_IDS: usize = 16;

pub(crate) mod sql {
    queries! {
        /// The ids of `$3…$18` that belong to account `$1`, recorded at `$2` or later.
        LOOKUP -> super::FoundRow = "SELECT id, item, created_at FROM response_items \
             WHERE user_id = $1 AND created_at >= $2 AND id IN \
             ($3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)";
        PRUNE = "DELETE FROM response_items WHERE created_at < $1";
    }
}

/// The INSERT of [`INSERT_ROWS`] rows, built once per backend. SQLite gets anonymous `?`
/// placeholders (see `usage::build_insert_sql`).
fn insert_sql(backend: Backend) -> &'static str {
    static TEXTS: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    TEXTS[backend as usize].get_or_init(|| {
        let mut sql = String::with_capacity(120 + INSERT_ROWS * 30);
        sql.push_str("INSERT INTO response_items (id, user_id, item, created_at) VALUES ");
        for row in 0..INSERT_ROWS {
            sql.push_str(if row == 0 { "(" } else { ", (" });
            push_placeholders(&mut sql, backend, row * INSERT_COLUMNS, INSERT_COLUMNS);
            sql.push(')');
        }
        sql.push_str(" ON CONFLICT (id, user_id) DO NOTHING");
        sql
    })
}

/// The statements built at run time, for `storage::check`.
#[cfg(test)]
pub(crate) fn built_statements(
    backend: Backend,
) -> Vec<(String, String, Option<&'static [super::check::Column]>)> {
    vec![(
        format!("INSERT_ITEMS({INSERT_ROWS})"),
        insert_sql(backend).to_string(),
        None,
    )]
}

pub struct ResponseItemStore<'a> {
    pub(super) db: &'a Db,
}

impl ResponseItemStore<'_> {
    /// Records `rows` in one transaction; ids recorded before for the same account are kept as
    /// they were.
    pub async fn insert_batch(&self, rows: &[ItemRecord]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        // Sorted: two instances writing the same keys lock them in the same order.
        let mut sorted: Vec<&ItemRecord> = rows.iter().collect();
        sorted.sort_unstable_by(|a, b| (&a.id, &a.user_id).cmp(&(&b.id, &b.user_id)));
        let mut tx = self.db.pool.begin().await?;
        for chunk in sorted.chunks(INSERT_ROWS) {
            let mut args = AnyArguments::default();
            args.reserve(INSERT_ROWS * INSERT_COLUMNS, 0);
            let last = chunk.last().copied();
            for r in chunk
                .iter()
                .copied()
                .chain(std::iter::repeat_n(last, INSERT_ROWS - chunk.len()).flatten())
            {
                add_row(&mut args, r)
                    .map_err(|e| StoreError::Invalid(format!("response item: {e}")))?;
            }
            sqlx::query_with(insert_sql(self.db.backend), args)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Which of `ids` belong to `user_id`, recorded at `since` or later: each found id with its
    /// item (`None` for a provider's id) and when it was recorded. Ids not found are absent
    /// from the answer.
    pub async fn lookup(
        &self,
        user_id: &str,
        ids: &[&str],
        since: i64,
    ) -> StoreResult<Vec<(String, Option<String>, i64)>> {
        let mut found = Vec::new();
        for chunk in ids.chunks(LOOKUP_IDS) {
            let Some(last) = chunk.last() else { continue };
            let mut q = sqlx::query_as::<_, FoundRow>(sql::LOOKUP)
                .bind(user_id)
                .bind(since);
            for id in chunk
                .iter()
                .chain(std::iter::repeat_n(last, LOOKUP_IDS - chunk.len()))
            {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&self.db.pool).await? {
                found.push((row.id, row.item, row.created_at));
            }
        }
        Ok(found)
    }

    /// Deletes the rows recorded before `before`; returns how many went.
    pub async fn prune(&self, before: i64) -> StoreResult<u64> {
        Ok(sqlx::query(sql::PRUNE)
            .bind(before)
            .execute(&self.db.pool)
            .await?
            .rows_affected())
    }
}

fn add_row<'q>(
    args: &mut AnyArguments<'q>,
    r: &'q ItemRecord,
) -> Result<(), sqlx::error::BoxDynError> {
    args.add(r.id.as_str())?;
    args.add(r.user_id.as_str())?;
    args.add(r.item.as_deref())?;
    args.add(r.created_at)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, user: &str, item: Option<&str>, at: i64) -> ItemRecord {
        ItemRecord {
            id: id.into(),
            user_id: user.into(),
            item: item.map(std::sync::Arc::from),
            created_at: at,
        }
    }

    async fn round_trip(db: &Db) {
        let store = db.response_items();
        // More rows than one statement holds, a repeated key, and an id two accounts share.
        let mut rows: Vec<ItemRecord> = (0..INSERT_ROWS + 3)
            .map(|n| {
                record(
                    &format!("msg_{n}"),
                    "usr_a",
                    Some("{\"type\":\"message\"}"),
                    1000,
                )
            })
            .collect();
        rows.push(record("resp_x", "usr_a", None, 1000));
        rows.push(record("resp_x", "usr_b", None, 2000));
        store.insert_batch(&rows).await.expect("insert");
        store.insert_batch(&rows[..2]).await.expect("insert again");

        let ids: Vec<String> = (0..LOOKUP_IDS + 5).map(|n| format!("msg_{n}")).collect();
        let mut wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
        wanted.extend(["resp_x", "nope"]);
        let found = store.lookup("usr_a", &wanted, 0).await.expect("lookup");
        assert_eq!(found.len(), LOOKUP_IDS + 5 + 1, "{found:?}");
        assert!(found.contains(&("resp_x".into(), None, 1000)));
        assert!(found.contains(&("msg_0".into(), Some("{\"type\":\"message\"}".into()), 1000)));
        // Bound to the account and to the retention.
        assert!(store
            .lookup("usr_c", &["msg_0"], 0)
            .await
            .expect("lookup")
            .is_empty());
        assert!(store
            .lookup("usr_a", &["resp_x"], 1001)
            .await
            .expect("lookup")
            .is_empty());
        assert_eq!(
            store
                .lookup("usr_b", &["resp_x"], 1001)
                .await
                .expect("lookup"),
            vec![("resp_x".to_string(), None, 2000)]
        );
        assert_eq!(
            store.prune(1500).await.expect("prune"),
            INSERT_ROWS as u64 + 4
        );
        assert!(store
            .lookup("usr_a", &["msg_0"], 0)
            .await
            .expect("lookup")
            .is_empty());
        assert_eq!(
            store
                .lookup("usr_b", &["resp_x"], 0)
                .await
                .expect("lookup")
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn records_are_bound_to_their_account_on_sqlite() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let db = Db::connect(&format!("sqlite://{}/items.db", dir.path().display()))
            .await
            .expect("migrated SQLite");
        round_trip(&db).await;
    }

    #[tokio::test]
    async fn records_are_bound_to_their_account_on_postgres() {
        let Some(pg) = super::super::testdb::PgDatabase::create().await else {
            return;
        };
        let db = Db::connect(&pg.url).await.expect("migrated Postgres");
        round_trip(&db).await;
        db.pool.close().await;
    }
}
