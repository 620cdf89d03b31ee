//! Users: accounts, their tier settings and their flags.

use sqlx::Row;

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

const COLUMNS: &str = "id, email, created_at, updated_at, last_login_at, two_factor_enabled, \
     totp_secret, manual_tier, unlimited, suspended, max_tier, payment_code";

fn from_row(row: &sqlx::any::AnyRow) -> StoreResult<UserRecord> {
    let tier: String = row.try_get("manual_tier")?;
    let max_tier: Option<String> = row.try_get("max_tier")?;
    Ok(UserRecord {
        id: row.try_get("id")?,
        email: row.try_get("email")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        last_login_at: row.try_get("last_login_at")?,
        two_factor_enabled: flag(row.try_get("two_factor_enabled")?),
        totp_secret: row.try_get("totp_secret")?,
        manual_tier: Tier::parse(&tier).unwrap_or(Tier::Beginner),
        unlimited: flag(row.try_get("unlimited")?),
        suspended: flag(row.try_get("suspended")?),
        max_tier: max_tier.as_deref().and_then(Tier::parse),
        payment_code: row.try_get("payment_code")?,
    })
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
        sqlx::query(
            "INSERT INTO users (id, email, created_at, updated_at, manual_tier, unlimited) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
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
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM users WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    pub async fn find_by_email(&self, email: &str) -> StoreResult<Option<UserRecord>> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM users WHERE email = $1"))
            .bind(email)
            .fetch_optional(&self.db.pool)
            .await?;
        row.as_ref().map(from_row).transpose()
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
        self.update_one(
            "UPDATE users SET suspended = $1, updated_at = $2 WHERE id = $3",
            suspended as i64,
            id,
        )
        .await
    }

    pub async fn set_manual_tier(&self, id: &str, tier: Tier) -> StoreResult<()> {
        let r = sqlx::query("UPDATE users SET manual_tier = $1, updated_at = $2 WHERE id = $3")
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
        self.update_one(
            "UPDATE users SET unlimited = $1, updated_at = $2 WHERE id = $3",
            unlimited as i64,
            id,
        )
        .await
    }

    async fn update_one(&self, sql: &str, value: i64, id: &str) -> StoreResult<()> {
        let r = sqlx::query(sql)
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
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM users WHERE suspended = $1 \
                     ORDER BY created_at DESC, id DESC LIMIT $2"
                ))
                .bind(s as i64)
                .bind(limit)
                .fetch_all(&self.db.pool)
                .await?
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM users ORDER BY created_at DESC, id DESC LIMIT $1"
                ))
                .bind(limit)
                .fetch_all(&self.db.pool)
                .await?
            }
        };
        rows.iter().map(from_row).collect()
    }

    /// Users changed at or after `since_ms`: the change feed that keeps every instance's caches
    /// in step with admin commands and other instances.
    pub async fn changed_since(&self, since_ms: i64) -> StoreResult<Vec<UserRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM users WHERE updated_at >= $1 LIMIT 10000"
        ))
        .bind(since_ms)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }
}
