//! Sign-in storage: challenges (one emailed code plus one magic link), web sessions, the
//! request-code hit counters, and the two user fields sign-in owns (last login, two-factor).
//!
//! Nothing secret is stored in the clear: callers pass HMAC digests of codes, link tokens and
//! session ids. Every state change that must happen once (an attempt, a consumption) is a single
//! conditional `UPDATE` whose affected-row count is the answer, so concurrent requests on any
//! number of instances cannot both win.

use sqlx::Row;

use super::{Db, StoreError, StoreResult};

/// A stored sign-in challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeRecord {
    pub id: String,
    pub email: String,
    pub code_hash: String,
    pub link_hash: String,
    pub code_expires_at: i64,
    pub link_expires_at: i64,
    /// Code checks made so far (each verify-code, and each two-factor check of a link).
    pub attempts: i64,
    pub consumed_at: Option<i64>,
}

/// The digests and deadlines of a freshly issued code and link.
#[derive(Debug, Clone)]
pub struct ChallengeSecrets {
    pub code_hash: String,
    pub link_hash: String,
    pub code_expires_at: i64,
    pub link_expires_at: i64,
}

/// A stored web session joined with its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub id_hash: String,
    pub user_id: String,
    pub email: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub last_seen_at: i64,
}

const CHALLENGE_COLUMNS: &str = "id, email, code_hash, link_hash, code_expires_at, \
     link_expires_at, attempts, consumed_at";

fn challenge_from_row(row: &sqlx::any::AnyRow) -> StoreResult<ChallengeRecord> {
    Ok(ChallengeRecord {
        id: row.try_get("id")?,
        email: row.try_get("email")?,
        code_hash: row.try_get("code_hash")?,
        link_hash: row.try_get("link_hash")?,
        code_expires_at: row.try_get("code_expires_at")?,
        link_expires_at: row.try_get("link_expires_at")?,
        attempts: row.try_get("attempts")?,
        consumed_at: row.try_get("consumed_at")?,
    })
}

pub struct AuthStore<'a> {
    pub(super) db: &'a Db,
}

impl AuthStore<'_> {
    /// Stores a new challenge for `email`.
    pub async fn create_challenge(
        &self,
        id: &str,
        email: &str,
        secrets: &ChallengeSecrets,
        now: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO auth_challenges (id, email, code_hash, link_hash, code_expires_at, \
             link_expires_at, attempts, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8)",
        )
        .bind(id)
        .bind(email)
        .bind(&secrets.code_hash)
        .bind(&secrets.link_hash)
        .bind(secrets.code_expires_at)
        .bind(secrets.link_expires_at)
        .bind(now)
        .bind(now)
        .execute(&self.db.pool)
        .await
        .map_err(StoreError::from_sqlx)?;
        Ok(())
    }

    pub async fn challenge(&self, id: &str) -> StoreResult<Option<ChallengeRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {CHALLENGE_COLUMNS} FROM auth_challenges WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await?;
        row.as_ref().map(challenge_from_row).transpose()
    }

    pub async fn challenge_by_link(&self, link_hash: &str) -> StoreResult<Option<ChallengeRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {CHALLENGE_COLUMNS} FROM auth_challenges WHERE link_hash = $1"
        ))
        .bind(link_hash)
        .fetch_optional(&self.db.pool)
        .await?;
        row.as_ref().map(challenge_from_row).transpose()
    }

    /// Resend: swaps in a new code and link (the old ones stop working) and resets the attempt
    /// count. False when the challenge is gone or already used.
    pub async fn replace_secrets(
        &self,
        id: &str,
        secrets: &ChallengeSecrets,
        now: i64,
    ) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE auth_challenges SET code_hash = $1, link_hash = $2, code_expires_at = $3, \
             link_expires_at = $4, attempts = 0, updated_at = $5 \
             WHERE id = $6 AND consumed_at IS NULL",
        )
        .bind(&secrets.code_hash)
        .bind(&secrets.link_hash)
        .bind(secrets.code_expires_at)
        .bind(secrets.link_expires_at)
        .bind(now)
        .bind(id)
        .execute(&self.db.pool)
        .await
        .map_err(StoreError::from_sqlx)?;
        Ok(r.rows_affected() == 1)
    }

    /// Takes one of the challenge's `max` attempts before a code is compared, so parallel
    /// guesses cannot exceed the limit. False when none is left or the challenge was used.
    pub async fn take_attempt(&self, id: &str, max: i64, now: i64) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE auth_challenges SET attempts = attempts + 1, updated_at = $1 \
             WHERE id = $2 AND consumed_at IS NULL AND attempts < $3",
        )
        .bind(now)
        .bind(id)
        .bind(max)
        .execute(&self.db.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Marks the challenge used (its code and link both). True for exactly one caller.
    pub async fn consume(&self, id: &str, now: i64) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE auth_challenges SET consumed_at = $1, updated_at = $2 \
             WHERE id = $3 AND consumed_at IS NULL",
        )
        .bind(now)
        .bind(now)
        .bind(id)
        .execute(&self.db.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn create_session(
        &self,
        id_hash: &str,
        user_id: &str,
        now: i64,
        expires_at: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO auth_sessions (id_hash, user_id, created_at, expires_at, last_seen_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id_hash)
        .bind(user_id)
        .bind(now)
        .bind(expires_at)
        .bind(now)
        .execute(&self.db.pool)
        .await
        .map_err(StoreError::from_sqlx)?;
        Ok(())
    }

    /// The session with this id digest and its user's email, expired or not: the caller
    /// applies the absolute and idle limits of the live config.
    pub async fn session(&self, id_hash: &str) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(
            "SELECT s.id_hash, s.user_id, u.email, s.created_at, s.expires_at, s.last_seen_at \
             FROM auth_sessions s JOIN users u ON u.id = s.user_id WHERE s.id_hash = $1",
        )
        .bind(id_hash)
        .fetch_optional(&self.db.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(SessionRecord {
            id_hash: row.try_get("id_hash")?,
            user_id: row.try_get("user_id")?,
            email: row.try_get("email")?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            last_seen_at: row.try_get("last_seen_at")?,
        }))
    }

    /// Records activity for the idle limit.
    pub async fn touch_session(&self, id_hash: &str, now: i64) -> StoreResult<()> {
        sqlx::query("UPDATE auth_sessions SET last_seen_at = $1 WHERE id_hash = $2")
            .bind(now)
            .bind(id_hash)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    pub async fn delete_session(&self, id_hash: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM auth_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Signs a user out everywhere (e.g. after a security change); returns how many sessions
    /// ended.
    pub async fn delete_user_sessions(&self, user_id: &str) -> StoreResult<u64> {
        let r = sqlx::query("DELETE FROM auth_sessions WHERE user_id = $1")
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// `users.last_login_at`, set at every sign-in. `updated_at` moves too so the identity
    /// caches of other instances pick the row up.
    pub async fn record_login(&self, user_id: &str, now: i64) -> StoreResult<()> {
        sqlx::query("UPDATE users SET last_login_at = $1, updated_at = $2 WHERE id = $3")
            .bind(now)
            .bind(now)
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Turns two-factor on with `totp_secret` (as stored: sealed by `twofactor::SeedKey`), or
    /// off with `None` (clearing the secret). Either way the single-use record starts afresh.
    pub async fn set_two_factor(
        &self,
        user_id: &str,
        totp_secret: Option<&str>,
        now: i64,
    ) -> StoreResult<()> {
        let r = sqlx::query(
            "UPDATE users SET two_factor_enabled = $1, totp_secret = $2, updated_at = $3, \
             totp_last_step = NULL WHERE id = $4",
        )
        .bind(totp_secret.is_some() as i64)
        .bind(totp_secret.map(str::to_string))
        .bind(now)
        .bind(user_id)
        .execute(&self.db.pool)
        .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// `set_two_factor` only while the flag still reads `enabled_before`: of two concurrent
    /// changes exactly one wins, so a double-clicked "turn on" can never show a secret that a
    /// second request has already replaced. False when the flag had changed meanwhile.
    pub async fn set_two_factor_if(
        &self,
        user_id: &str,
        enabled_before: bool,
        totp_secret: Option<&str>,
        now: i64,
    ) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE users SET two_factor_enabled = $1, totp_secret = $2, updated_at = $3, \
             totp_last_step = NULL WHERE id = $4 AND two_factor_enabled = $5",
        )
        .bind(totp_secret.is_some() as i64)
        .bind(totp_secret.map(str::to_string))
        .bind(now)
        .bind(user_id)
        .bind(enabled_before as i64)
        .execute(&self.db.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Claims TOTP time step `step` for the user: true only when no code of this or a later
    /// step was accepted before. One conditional statement, so of two concurrent uses of one
    /// code exactly one succeeds.
    pub async fn claim_totp_step(&self, user_id: &str, step: i64) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE users SET totp_last_step = $1 \
             WHERE id = $2 AND (totp_last_step IS NULL OR totp_last_step < $1)",
        )
        .bind(step)
        .bind(user_id)
        .execute(&self.db.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Users whose stored TOTP seed is not sealed yet (written before seeds were sealed, or by
    /// an older instance): `(user id, stored seed)`.
    pub async fn unsealed_totp_seeds(
        &self,
        sealed_prefix: &str,
    ) -> StoreResult<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT id, totp_secret FROM users \
             WHERE totp_secret IS NOT NULL AND totp_secret NOT LIKE $1",
        )
        .bind(format!("{sealed_prefix}%"))
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("totp_secret")?)))
            .collect()
    }

    /// Replaces a stored seed with its sealed form, only while it still reads `old` (a
    /// concurrent change of the user's two-factor wins).
    pub async fn reseal_totp_seed(
        &self,
        user_id: &str,
        old: &str,
        sealed: &str,
    ) -> StoreResult<bool> {
        let r = sqlx::query("UPDATE users SET totp_secret = $1 WHERE id = $2 AND totp_secret = $3")
            .bind(sealed)
            .bind(user_id)
            .bind(old)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Adds one hit to `bucket` in the window starting at `window_start` and returns the
    /// window's count including it. One statement, so concurrent hits all count.
    pub async fn hit(&self, bucket: &str, window_start: i64) -> StoreResult<i64> {
        let row = sqlx::query(
            "INSERT INTO auth_rate_counters (bucket, window_start, hits) VALUES ($1, $2, 1) \
             ON CONFLICT (bucket, window_start) \
             DO UPDATE SET hits = auth_rate_counters.hits + 1 RETURNING hits",
        )
        .bind(bucket)
        .bind(window_start)
        .fetch_one(&self.db.pool)
        .await?;
        Ok(row.try_get("hits")?)
    }

    /// The count of `bucket` in the window starting at `window_start` (0 when none).
    pub async fn hits(&self, bucket: &str, window_start: i64) -> StoreResult<i64> {
        let row = sqlx::query(
            "SELECT hits FROM auth_rate_counters WHERE bucket = $1 AND window_start = $2",
        )
        .bind(bucket)
        .bind(window_start)
        .fetch_optional(&self.db.pool)
        .await?;
        match row {
            Some(r) => Ok(r.try_get("hits")?),
            None => Ok(0),
        }
    }

    /// Deletes what can no longer be used: challenges whose code and link both expired before
    /// `challenges_before`, sessions past their absolute expiry or idle since `idle_before`,
    /// counters of windows that started before `counters_before`.
    pub async fn purge(
        &self,
        now: i64,
        challenges_before: i64,
        idle_before: i64,
        counters_before: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "DELETE FROM auth_challenges WHERE code_expires_at < $1 AND link_expires_at < $2",
        )
        .bind(challenges_before)
        .bind(challenges_before)
        .execute(&self.db.pool)
        .await?;
        sqlx::query("DELETE FROM auth_sessions WHERE expires_at < $1 OR last_seen_at < $2")
            .bind(now)
            .bind(idle_before)
            .execute(&self.db.pool)
            .await?;
        sqlx::query("DELETE FROM auth_rate_counters WHERE window_start < $1")
            .bind(counters_before)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }
}
