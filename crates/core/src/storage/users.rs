//! Users: accounts, their tier settings and their flags.

use super::{flag, Db, StoreError, StoreResult};
use crate::domain::Tier;
use crate::util::{new_id, now_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub id: String,
    pub email: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_login_at: Option<i64>,
    pub two_factor_enabled: bool,
    pub totp_secret: Option<String>,
    pub manual_tier: Tier,
    pub unlimited: bool,
    pub suspended: bool,
    pub max_tier: Option<Tier>,
    pub payment_code: Option<String>,
}

row! {
    /// A `users` row as stored (everything but the two-factor single-use record).
    struct UserRow {
        id: String,
        email: String,
        created_at: i64,
        updated_at: i64,
        last_login_at: Option<i64>,
        two_factor_enabled: i64,
        totp_secret: Option<String>,
        manual_tier: String,
        unlimited: i64,
        suspended: i64,
        max_tier: Option<String>,
        payment_code: Option<String>,
    }
}

impl From<UserRow> for UserRecord {
    fn from(r: UserRow) -> UserRecord {
        UserRecord {
            id: r.id,
            email: r.email,
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_login_at: r.last_login_at,
            two_factor_enabled: flag(r.two_factor_enabled),
            totp_secret: r.totp_secret,
            manual_tier: Tier::parse(&r.manual_tier).unwrap_or(Tier::Beginner),
            unlimited: flag(r.unlimited),
            suspended: flag(r.suspended),
            max_tier: r.max_tier.as_deref().and_then(Tier::parse),
            payment_code: r.payment_code,
        }
    }
}

/// `SELECT` of a `UserRow` followed by `$rest`.
macro_rules! select_user {
    ($rest:literal) => {
        concat!(
            "SELECT id, email, created_at, updated_at, last_login_at, two_factor_enabled, \
             totp_secret, manual_tier, unlimited, suspended, max_tier, payment_code FROM users ",
            $rest
        )
    };
}

pub(crate) mod sql {
    queries! {
        INSERT = "INSERT INTO users (id, email, created_at, updated_at, manual_tier, unlimited) \
             VALUES ($1, $2, $3, $4, $5, $6)";
        BY_ID -> super::UserRow = select_user!("WHERE id = $1");
        BY_EMAIL -> super::UserRow = select_user!("WHERE email = $1");
        SET_SUSPENDED = "UPDATE users SET suspended = $1, updated_at = $2 WHERE id = $3";
        SET_MANUAL_TIER = "UPDATE users SET manual_tier = $1, updated_at = $2 WHERE id = $3";
        SET_UNLIMITED = "UPDATE users SET unlimited = $1, updated_at = $2 WHERE id = $3";
        LIST_BY_SUSPENDED -> super::UserRow = select_user!(
            "WHERE suspended = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
        );
        LIST -> super::UserRow = select_user!("ORDER BY created_at DESC, id DESC LIMIT $1");
        CHANGED_SINCE -> super::UserRow = select_user!("WHERE updated_at >= $1 LIMIT 10000");
    }
}

pub struct UserStore<'a> {
    pub(super) db: &'a Db,
}

impl UserStore<'_> {
    /// Creates a user; an existing email is `Conflict`.
    pub async fn create(
        &self,
        email: &str,
        tier: Tier,
        unlimited: bool,
    ) -> StoreResult<UserRecord> {
        let now = now_ms();
        let id = new_id("usr");
        sqlx::query(sql::INSERT)
            .bind(&id)
            .bind(email)
            .bind(now)
            .bind(now)
            .bind(tier.as_str())
            .bind(unlimited as i64)
            .execute(&self.db.pool)
            .await
            .map_err(StoreError::from_sqlx)?;
        self.get(&id).await?.ok_or(StoreError::NotFound)
    }

    pub async fn get(&self, id: &str) -> StoreResult<Option<UserRecord>> {
        let row = sqlx::query_as::<_, UserRow>(sql::BY_ID)
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(UserRecord::from))
    }

    pub async fn find_by_email(&self, email: &str) -> StoreResult<Option<UserRecord>> {
        let row = sqlx::query_as::<_, UserRow>(sql::BY_EMAIL)
            .bind(email)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(UserRecord::from))
    }

    /// Finds the user or creates it with the default tier (first sign-in).
    pub async fn find_or_create(&self, email: &str, tier: Tier) -> StoreResult<UserRecord> {
        if let Some(u) = self.find_by_email(email).await? {
            return Ok(u);
        }
        match self.create(email, tier, false).await {
            Ok(u) => Ok(u),
            // A concurrent sign-in created it between our read and insert.
            Err(StoreError::Conflict(_)) => {
                self.find_by_email(email).await?.ok_or(StoreError::NotFound)
            }
            Err(e) => Err(e),
        }
    }

    pub async fn set_suspended(&self, id: &str, suspended: bool) -> StoreResult<()> {
        self.update_one(sql::SET_SUSPENDED, suspended as i64, id)
            .await
    }

    pub async fn set_manual_tier(&self, id: &str, tier: Tier) -> StoreResult<()> {
        let r = sqlx::query(sql::SET_MANUAL_TIER)
            .bind(tier.as_str())
            .bind(now_ms())
            .bind(id)
            .execute(&self.db.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    pub async fn set_unlimited(&self, id: &str, unlimited: bool) -> StoreResult<()> {
        self.update_one(sql::SET_UNLIMITED, unlimited as i64, id)
            .await
    }

    async fn update_one(&self, statement: &'static str, value: i64, id: &str) -> StoreResult<()> {
        let r = sqlx::query(statement)
            .bind(value)
            .bind(now_ms())
            .bind(id)
            .execute(&self.db.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// Up to `limit` accounts, newest first; only suspended (`Some(true)`) or only active
    /// (`Some(false)`) ones when asked. For the operator's `user list`.
    pub async fn list(&self, suspended: Option<bool>, limit: i64) -> StoreResult<Vec<UserRecord>> {
        let rows = match suspended {
            Some(s) => {
                sqlx::query_as::<_, UserRow>(sql::LIST_BY_SUSPENDED)
                    .bind(s as i64)
                    .bind(limit)
                    .fetch_all(&self.db.pool)
                    .await?
            }
            None => {
                sqlx::query_as::<_, UserRow>(sql::LIST)
                    .bind(limit)
                    .fetch_all(&self.db.pool)
                    .await?
            }
        };
        Ok(rows.into_iter().map(UserRecord::from).collect())
    }

    /// Users changed at or after `since_ms`: the change feed that keeps every instance's caches
    /// in step with admin commands and other instances.
    pub async fn changed_since(&self, since_ms: i64) -> StoreResult<Vec<UserRecord>> {
        let rows = sqlx::query_as::<_, UserRow>(sql::CHANGED_SINCE)
            .bind(since_ms)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(UserRecord::from).collect())
    }
}
