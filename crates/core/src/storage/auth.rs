//! Sign-in storage: challenges (one emailed code plus one magic link), web sessions, the
//! request-code hit counters, and what sign-in owns of a user: the last login and two-factor
//! (the seed, a pending enrolment, the last accepted time step, recovery-code digests).
//!
//! Nothing secret is stored in the clear: callers pass HMAC digests of codes, link tokens and
//! session ids. Every state change that must happen once (an attempt, a consumption) is a single
//! conditional `UPDATE` whose affected-row count is the answer, so concurrent requests on any
//! number of instances cannot both win.

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

row! {
    /// An `auth_challenges` row as `ChallengeRecord` needs it.
    struct ChallengeRow {
        id: String,
        email: String,
        code_hash: String,
        link_hash: String,
        code_expires_at: i64,
        link_expires_at: i64,
        attempts: i64,
        consumed_at: Option<i64>,
    }
}

impl From<ChallengeRow> for ChallengeRecord {
    fn from(r: ChallengeRow) -> ChallengeRecord {
        ChallengeRecord {
            id: r.id,
            email: r.email,
            code_hash: r.code_hash,
            link_hash: r.link_hash,
            code_expires_at: r.code_expires_at,
            link_expires_at: r.link_expires_at,
            attempts: r.attempts,
            consumed_at: r.consumed_at,
        }
    }
}

row! {
    /// A session joined with its user's email.
    struct SessionRow {
        id_hash: String,
        user_id: String,
        email: String,
        created_at: i64,
        expires_at: i64,
        last_seen_at: i64,
    }
}

impl From<SessionRow> for SessionRecord {
    fn from(r: SessionRow) -> SessionRecord {
        SessionRecord {
            id_hash: r.id_hash,
            user_id: r.user_id,
            email: r.email,
            created_at: r.created_at,
            expires_at: r.expires_at,
            last_seen_at: r.last_seen_at,
        }
    }
}

row! {
    /// A user whose stored TOTP seed is not sealed yet. The seed is never NULL (the statement
    /// asks for it not to be), but its column may be.
    struct UnsealedSeedRow {
        id: String,
        totp_secret: Option<String>,
    }
}

row! {
    /// A user's two-factor columns.
    struct TwoFactorRow {
        two_factor_enabled: i64,
        totp_secret: Option<String>,
        totp_pending_secret: Option<String>,
    }
}

/// A user's two-factor state as stored (seeds sealed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TwoFactorState {
    pub enabled: bool,
    /// The confirmed seed, while two-factor is on.
    pub secret: Option<String>,
    /// The seed of an enrolment no code has confirmed yet.
    pub pending: Option<String>,
}

/// `SELECT` of a `ChallengeRow` followed by `$rest`.
macro_rules! select_challenge {
    ($rest:literal) => {
        concat!(
            "SELECT id, email, code_hash, link_hash, code_expires_at, link_expires_at, \
             attempts, consumed_at FROM auth_challenges ",
            $rest
        )
    };
}

pub(crate) mod sql {
    queries! {
        INSERT_CHALLENGE = "INSERT INTO auth_challenges (id, email, code_hash, link_hash, \
             code_expires_at, link_expires_at, attempts, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8)";
        CHALLENGE_BY_ID -> super::ChallengeRow = select_challenge!("WHERE id = $1");
        CHALLENGE_BY_LINK -> super::ChallengeRow = select_challenge!("WHERE link_hash = $1");
        REPLACE_SECRETS = "UPDATE auth_challenges SET code_hash = $1, link_hash = $2, \
             code_expires_at = $3, link_expires_at = $4, attempts = 0, updated_at = $5 \
             WHERE id = $6 AND consumed_at IS NULL";
        TAKE_ATTEMPT = "UPDATE auth_challenges SET attempts = attempts + 1, updated_at = $1 \
             WHERE id = $2 AND consumed_at IS NULL AND attempts < $3";
        CONSUME = "UPDATE auth_challenges SET consumed_at = $1, updated_at = $2 \
             WHERE id = $3 AND consumed_at IS NULL";
        INSERT_SESSION = "INSERT INTO auth_sessions (id_hash, user_id, created_at, expires_at, \
             last_seen_at) VALUES ($1, $2, $3, $4, $5)";
        SESSION -> super::SessionRow = "SELECT s.id_hash, s.user_id, u.email, s.created_at, \
             s.expires_at, s.last_seen_at \
             FROM auth_sessions s JOIN users u ON u.id = s.user_id WHERE s.id_hash = $1";
        TOUCH_SESSION = "UPDATE auth_sessions SET last_seen_at = $1 WHERE id_hash = $2";
        DELETE_SESSION = "DELETE FROM auth_sessions WHERE id_hash = $1";
        DELETE_USER_SESSIONS = "DELETE FROM auth_sessions WHERE user_id = $1";
        RECORD_LOGIN = "UPDATE users SET last_login_at = $1, updated_at = $2 WHERE id = $3";
        SET_TWO_FACTOR = "UPDATE users SET two_factor_enabled = $1, totp_secret = $2, \
             updated_at = $3, totp_last_step = NULL, totp_pending_secret = NULL WHERE id = $4";
        TWO_FACTOR_STATE -> super::TwoFactorRow = "SELECT two_factor_enabled, totp_secret, \
             totp_pending_secret FROM users WHERE id = $1";
        START_ENROLMENT = "UPDATE users SET totp_pending_secret = $1, updated_at = $2 \
             WHERE id = $3 AND two_factor_enabled = 0";
        CANCEL_ENROLMENT = "UPDATE users SET totp_pending_secret = NULL, updated_at = $1 \
             WHERE id = $2 AND two_factor_enabled = 0 AND totp_pending_secret IS NOT NULL";
        CONFIRM_ENROLMENT = "UPDATE users SET two_factor_enabled = 1, \
             totp_secret = totp_pending_secret, totp_pending_secret = NULL, totp_last_step = $1, \
             updated_at = $2 WHERE id = $3 AND two_factor_enabled = 0 AND totp_pending_secret = $4";
        DISABLE_TWO_FACTOR = "UPDATE users SET two_factor_enabled = 0, totp_secret = NULL, \
             totp_pending_secret = NULL, totp_last_step = NULL, updated_at = $1 \
             WHERE id = $2 AND two_factor_enabled = 1";
        DELETE_RECOVERY_CODES = "DELETE FROM two_factor_recovery_codes WHERE user_id = $1";
        /// Locks the user's row while two-factor is on (the recovery codes are replaced under it).
        TOUCH_TWO_FACTOR_ON = "UPDATE users SET updated_at = $1 \
             WHERE id = $2 AND two_factor_enabled = 1";
        INSERT_RECOVERY_CODE = "INSERT INTO two_factor_recovery_codes \
             (user_id, code_hash, created_at) VALUES ($1, $2, $3)";
        UNUSED_RECOVERY_CODES -> String = "SELECT code_hash FROM two_factor_recovery_codes \
             WHERE user_id = $1 AND used_at IS NULL";
        USE_RECOVERY_CODE = "UPDATE two_factor_recovery_codes SET used_at = $1 \
             WHERE user_id = $2 AND code_hash = $3 AND used_at IS NULL";
        CLAIM_TOTP_STEP = "UPDATE users SET totp_last_step = $1 \
             WHERE id = $2 AND (totp_last_step IS NULL OR totp_last_step < $1)";
        UNSEALED_SEEDS -> super::UnsealedSeedRow = "SELECT id, totp_secret FROM users \
             WHERE totp_secret IS NOT NULL AND totp_secret NOT LIKE $1";
        RESEAL_SEED = "UPDATE users SET totp_secret = $1 WHERE id = $2 AND totp_secret = $3";
        HIT -> i64 = "INSERT INTO auth_rate_counters (bucket, window_start, hits) \
             VALUES ($1, $2, 1) ON CONFLICT (bucket, window_start) \
             DO UPDATE SET hits = auth_rate_counters.hits + 1 RETURNING hits";
        HITS -> i64 =
            "SELECT hits FROM auth_rate_counters WHERE bucket = $1 AND window_start = $2";
        UNHIT = "UPDATE auth_rate_counters SET hits = hits - 1 \
             WHERE bucket = $1 AND window_start = $2 AND hits > 0";
        PURGE_CHALLENGES =
            "DELETE FROM auth_challenges WHERE code_expires_at < $1 AND link_expires_at < $2";
        PURGE_SESSIONS = "DELETE FROM auth_sessions WHERE expires_at < $1 OR last_seen_at < $2";
        PURGE_COUNTERS = "DELETE FROM auth_rate_counters WHERE window_start < $1";
    }
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
        sqlx::query(sql::INSERT_CHALLENGE)
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
        let row = sqlx::query_as::<_, ChallengeRow>(sql::CHALLENGE_BY_ID)
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(ChallengeRecord::from))
    }

    pub async fn challenge_by_link(&self, link_hash: &str) -> StoreResult<Option<ChallengeRecord>> {
        let row = sqlx::query_as::<_, ChallengeRow>(sql::CHALLENGE_BY_LINK)
            .bind(link_hash)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(ChallengeRecord::from))
    }

    /// Resend: swaps in a new code and link (the old ones stop working) and resets the attempt
    /// count. False when the challenge is gone or already used.
    pub async fn replace_secrets(
        &self,
        id: &str,
        secrets: &ChallengeSecrets,
        now: i64,
    ) -> StoreResult<bool> {
        let r = sqlx::query(sql::REPLACE_SECRETS)
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
        let r = sqlx::query(sql::TAKE_ATTEMPT)
            .bind(now)
            .bind(id)
            .bind(max)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Marks the challenge used (its code and link both). True for exactly one caller.
    pub async fn consume(&self, id: &str, now: i64) -> StoreResult<bool> {
        let r = sqlx::query(sql::CONSUME)
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
        sqlx::query(sql::INSERT_SESSION)
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
        let row = sqlx::query_as::<_, SessionRow>(sql::SESSION)
            .bind(id_hash)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(SessionRecord::from))
    }

    /// Records activity for the idle limit.
    pub async fn touch_session(&self, id_hash: &str, now: i64) -> StoreResult<()> {
        sqlx::query(sql::TOUCH_SESSION)
            .bind(now)
            .bind(id_hash)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    pub async fn delete_session(&self, id_hash: &str) -> StoreResult<()> {
        sqlx::query(sql::DELETE_SESSION)
            .bind(id_hash)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Signs a user out everywhere (e.g. after a security change); returns how many sessions
    /// ended.
    pub async fn delete_user_sessions(&self, user_id: &str) -> StoreResult<u64> {
        let r = sqlx::query(sql::DELETE_USER_SESSIONS)
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// `users.last_login_at`, set at every sign-in. `updated_at` moves too so the identity
    /// caches of other instances pick the row up.
    pub async fn record_login(&self, user_id: &str, now: i64) -> StoreResult<()> {
        sqlx::query(sql::RECORD_LOGIN)
            .bind(now)
            .bind(now)
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Turns two-factor on with `totp_secret` (as stored: sealed by `twofactor::SeedKey`), or
    /// off with `None`. Either way a pending enrolment, the recovery codes and the single-use
    /// record start afresh. Operators reset two-factor with it (`gateway user reset-2fa`).
    pub async fn set_two_factor(
        &self,
        user_id: &str,
        totp_secret: Option<&str>,
        now: i64,
    ) -> StoreResult<()> {
        let mut tx = self.db.pool.begin().await?;
        let r = sqlx::query(sql::SET_TWO_FACTOR)
            .bind(totp_secret.is_some() as i64)
            .bind(totp_secret.map(str::to_string))
            .bind(now)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        sqlx::query(sql::DELETE_RECOVERY_CODES)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The user's two-factor columns; `None` for an unknown user.
    pub async fn two_factor(&self, user_id: &str) -> StoreResult<Option<TwoFactorState>> {
        let row = sqlx::query_as::<_, TwoFactorRow>(sql::TWO_FACTOR_STATE)
            .bind(user_id)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(|r| TwoFactorState {
            enabled: super::flag(r.two_factor_enabled),
            secret: r.totp_secret,
            pending: r.totp_pending_secret,
        }))
    }

    /// Starts (or restarts) an enrolment with the sealed seed `pending`, replacing any earlier
    /// pending one. False when two-factor is already on.
    pub async fn start_enrolment(
        &self,
        user_id: &str,
        pending: &str,
        now: i64,
    ) -> StoreResult<bool> {
        let r = sqlx::query(sql::START_ENROLMENT)
            .bind(pending)
            .bind(now)
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Drops a pending enrolment; false when there was none (or two-factor is on).
    pub async fn cancel_enrolment(&self, user_id: &str, now: i64) -> StoreResult<bool> {
        let r = sqlx::query(sql::CANCEL_ENROLMENT)
            .bind(now)
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Confirms the enrolment whose pending seed is still `pending`: two-factor on with that
    /// seed, `step` (the confirming code's) recorded as used, and `recovery_hashes` as the only
    /// recovery codes, in one transaction. False when the pending seed changed meanwhile (a
    /// newer enrolment, a confirmation that won) or two-factor is already on.
    pub async fn confirm_enrolment(
        &self,
        user_id: &str,
        pending: &str,
        step: i64,
        recovery_hashes: &[String],
        now: i64,
    ) -> StoreResult<bool> {
        let mut tx = self.db.pool.begin().await?;
        let r = sqlx::query(sql::CONFIRM_ENROLMENT)
            .bind(step)
            .bind(now)
            .bind(user_id)
            .bind(pending)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        put_recovery_codes(&mut tx, user_id, recovery_hashes, now).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Replaces every recovery code of the user (used or not) with `recovery_hashes`, in one
    /// transaction, while two-factor is on. False when it is off (a concurrent request turned
    /// it off): nothing changes then.
    pub async fn replace_recovery_codes(
        &self,
        user_id: &str,
        recovery_hashes: &[String],
        now: i64,
    ) -> StoreResult<bool> {
        let mut tx = self.db.pool.begin().await?;
        let r = sqlx::query(sql::TOUCH_TWO_FACTOR_ON)
            .bind(now)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        put_recovery_codes(&mut tx, user_id, recovery_hashes, now).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Turns two-factor off: seed, pending enrolment, single-use record and recovery codes all
    /// go. False when it was already off (a concurrent request won).
    pub async fn disable_two_factor(&self, user_id: &str, now: i64) -> StoreResult<bool> {
        let mut tx = self.db.pool.begin().await?;
        let r = sqlx::query(sql::DISABLE_TWO_FACTOR)
            .bind(now)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(sql::DELETE_RECOVERY_CODES)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    /// The digests of the user's unused recovery codes.
    pub async fn unused_recovery_codes(&self, user_id: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(sql::UNUSED_RECOVERY_CODES)
            .bind(user_id)
            .fetch_all(&self.db.pool)
            .await?)
    }

    /// Marks the recovery code with digest `code_hash` used: true for exactly one caller, and
    /// only while it was unused.
    pub async fn use_recovery_code(
        &self,
        user_id: &str,
        code_hash: &str,
        now: i64,
    ) -> StoreResult<bool> {
        let r = sqlx::query(sql::USE_RECOVERY_CODE)
            .bind(now)
            .bind(user_id)
            .bind(code_hash)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Claims TOTP time step `step` for the user: true only when no code of this or a later
    /// step was accepted before. One conditional statement, so of two concurrent uses of one
    /// code exactly one succeeds.
    pub async fn claim_totp_step(&self, user_id: &str, step: i64) -> StoreResult<bool> {
        let r = sqlx::query(sql::CLAIM_TOTP_STEP)
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
        let rows = sqlx::query_as::<_, UnsealedSeedRow>(sql::UNSEALED_SEEDS)
            .bind(format!("{sealed_prefix}%"))
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| Some((r.id, r.totp_secret?)))
            .collect())
    }

    /// Replaces a stored seed with its sealed form, only while it still reads `old` (a
    /// concurrent change of the user's two-factor wins).
    pub async fn reseal_totp_seed(
        &self,
        user_id: &str,
        old: &str,
        sealed: &str,
    ) -> StoreResult<bool> {
        let r = sqlx::query(sql::RESEAL_SEED)
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
        Ok(sqlx::query_scalar(sql::HIT)
            .bind(bucket)
            .bind(window_start)
            .fetch_one(&self.db.pool)
            .await?)
    }

    /// The count of `bucket` in the window starting at `window_start` (0 when none).
    pub async fn hits(&self, bucket: &str, window_start: i64) -> StoreResult<i64> {
        let hits: Option<i64> = sqlx::query_scalar(sql::HITS)
            .bind(bucket)
            .bind(window_start)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(hits.unwrap_or(0))
    }

    /// Takes one hit back from `bucket`'s window starting at `window_start` (never below 0).
    pub async fn unhit(&self, bucket: &str, window_start: i64) -> StoreResult<()> {
        sqlx::query(sql::UNHIT)
            .bind(bucket)
            .bind(window_start)
            .execute(&self.db.pool)
            .await?;
        Ok(())
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
        sqlx::query(sql::PURGE_CHALLENGES)
            .bind(challenges_before)
            .bind(challenges_before)
            .execute(&self.db.pool)
            .await?;
        sqlx::query(sql::PURGE_SESSIONS)
            .bind(now)
            .bind(idle_before)
            .execute(&self.db.pool)
            .await?;
        sqlx::query(sql::PURGE_COUNTERS)
            .bind(counters_before)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }
}

/// Makes `recovery_hashes` the user's only recovery codes, inside `tx`.
async fn put_recovery_codes(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    user_id: &str,
    recovery_hashes: &[String],
    now: i64,
) -> StoreResult<()> {
    sqlx::query(sql::DELETE_RECOVERY_CODES)
        .bind(user_id)
        .execute(&mut **tx)
        .await?;
    for hash in recovery_hashes {
        sqlx::query(sql::INSERT_RECOVERY_CODE)
            .bind(user_id)
            .bind(hash)
            .bind(now)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::from_sqlx)?;
    }
    Ok(())
}
