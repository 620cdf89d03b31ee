//! What the database says about itself: the identity drawn once when it was created
//! (migration `0012`), which state kept outside it (the usage journal) carries so that it is
//! only ever replayed into the database it was written for.

use super::{redact_url, Db, StoreResult};

pub(crate) mod sql {
    queries! {
        DATABASE_ID -> String = "SELECT value FROM gateway_meta WHERE name = 'database_id'";
    }
}

/// A database as state outside it names it: its drawn id, which decides, and where it is
/// (credentials hidden), which only tells an operator which deployment it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseIdentity {
    pub id: String,
    pub location: String,
}

impl std::fmt::Display for DatabaseIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.location, self.id)
    }
}

pub struct MetaStore<'a> {
    pub(super) db: &'a Db,
}

impl MetaStore<'_> {
    /// This database's identity; `url` is the address it was opened with.
    pub async fn identity(&self, url: &str) -> StoreResult<DatabaseIdentity> {
        let id: String = sqlx::query_scalar(sql::DATABASE_ID)
            .fetch_one(&self.db.pool)
            .await?;
        Ok(DatabaseIdentity {
            id,
            location: redact_url(url),
        })
    }
}
