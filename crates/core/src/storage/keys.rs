//! API keys: metadata and the peppered hash. The raw key never reaches this module.

use super::{flag, Db, StoreError, StoreResult};
use crate::domain::LimitMode;
use crate::util::{new_id, now_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub key_hash: String,
    pub key_prefix: String,
    pub key_suffix: String,
    pub scopes: Vec<String>,
    pub limit_mode: LimitMode,
    pub custom_input_tpm: Option<u64>,
    pub custom_output_tpm: Option<u64>,
    pub custom_rpm: Option<u64>,
    pub model_allowlist: Vec<String>,
    pub max_input_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub revoked: bool,
    pub is_global: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// What a caller supplies to create a key; the store adds ids and timestamps.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub user_id: String,
    pub name: String,
    pub key_hash: String,
    pub key_prefix: String,
    pub key_suffix: String,
    pub scopes: Vec<String>,
    pub limit_mode: LimitMode,
    pub custom_input_tpm: Option<u64>,
    pub custom_output_tpm: Option<u64>,
    pub custom_rpm: Option<u64>,
    pub model_allowlist: Vec<String>,
    pub max_input_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub is_global: bool,
}

impl NewKey {
    /// A key of `user_id` with its own per-minute windows and nothing else set: no scopes, no
    /// custom limits, no model list (tests and benchmarks fill in what they need).
    pub fn plain(user_id: &str, name: &str, key_hash: &str) -> NewKey {
        NewKey {
            user_id: user_id.to_string(),
            name: name.to_string(),
            key_hash: key_hash.to_string(),
            key_prefix: "sk-".into(),
            key_suffix: "x".into(),
            scopes: vec![],
            limit_mode: LimitMode::PerKey,
            custom_input_tpm: None,
            custom_output_tpm: None,
            custom_rpm: None,
            model_allowlist: vec![],
            max_input_tokens: None,
            max_output_tokens: None,
            is_global: false,
        }
    }
}

/// The outcome of a rotation: the new global key and the global keys it replaced (now
/// revoked), which callers drop from their caches.
#[derive(Debug, Clone)]
pub struct Rotation {
    pub key: KeyRecord,
    pub revoked: Vec<KeyRecord>,
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.and_then(|x| u64::try_from(x).ok())
}

row! {
    /// An `api_keys` row as stored.
    struct KeyRow {
        id: String,
        user_id: String,
        name: String,
        key_hash: String,
        key_prefix: String,
        key_suffix: String,
        scopes: String,
        limit_mode: String,
        custom_input_tpm: Option<i64>,
        custom_output_tpm: Option<i64>,
        custom_rpm: Option<i64>,
        model_allowlist: String,
        max_input_tokens: Option<i64>,
        max_output_tokens: Option<i64>,
        status: String,
        is_global: i64,
        created_at: i64,
        updated_at: i64,
        last_used_at: Option<i64>,
        revoked_at: Option<i64>,
    }
}

impl From<KeyRow> for KeyRecord {
    fn from(r: KeyRow) -> KeyRecord {
        KeyRecord {
            id: r.id,
            user_id: r.user_id,
            name: r.name,
            key_hash: r.key_hash,
            key_prefix: r.key_prefix,
            key_suffix: r.key_suffix,
            scopes: serde_json::from_str(&r.scopes).unwrap_or_default(),
            limit_mode: LimitMode::parse(&r.limit_mode),
            custom_input_tpm: opt_u64(r.custom_input_tpm),
            custom_output_tpm: opt_u64(r.custom_output_tpm),
            custom_rpm: opt_u64(r.custom_rpm),
            model_allowlist: serde_json::from_str(&r.model_allowlist).unwrap_or_default(),
            max_input_tokens: opt_u64(r.max_input_tokens),
            max_output_tokens: opt_u64(r.max_output_tokens),
            revoked: r.status == "revoked",
            is_global: flag(r.is_global),
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_used_at: r.last_used_at,
            revoked_at: r.revoked_at,
        }
    }
}

row! {
    /// An active key of an account, as a rotation weighs it.
    struct ActiveKeyRow {
        id: String,
        is_global: i64,
    }
}

/// `SELECT` of a `KeyRow` followed by `$rest`.
macro_rules! select_key {
    ($rest:literal) => {
        concat!(
            "SELECT id, user_id, name, key_hash, key_prefix, key_suffix, scopes, limit_mode, \
             custom_input_tpm, custom_output_tpm, custom_rpm, model_allowlist, \
             max_input_tokens, max_output_tokens, status, is_global, created_at, updated_at, \
             last_used_at, revoked_at FROM api_keys ",
            $rest
        )
    };
}

pub(crate) mod sql {
    queries! {
        INSERT = "INSERT INTO api_keys (id, user_id, name, key_hash, key_prefix, key_suffix, \
             scopes, limit_mode, custom_input_tpm, custom_output_tpm, custom_rpm, \
             model_allowlist, max_input_tokens, max_output_tokens, status, is_global, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
             $13, $14, 'active', $15, $16, $17)";
        REVOKE_GLOBAL = "UPDATE api_keys SET status = 'revoked', revoked_at = $1, \
             updated_at = $2 WHERE user_id = $3 AND is_global = 1 AND status = 'active'";
        /// A no-op write: a row lock on Postgres, the write lock on SQLite.
        LOCK_USER = "UPDATE users SET updated_at = updated_at WHERE id = $1";
        ACTIVE_OF_USER -> super::ActiveKeyRow =
            "SELECT id, is_global FROM api_keys WHERE user_id = $1 AND status = 'active'";
        REVOKE_BY_ID = "UPDATE api_keys SET status = 'revoked', revoked_at = $1, \
             updated_at = $2 WHERE id = $3";
        BY_ID -> super::KeyRow = select_key!("WHERE id = $1");
        BY_HASH -> super::KeyRow = select_key!("WHERE key_hash = $1");
        OF_USER -> super::KeyRow = select_key!("WHERE user_id = $1 ORDER BY created_at DESC");
        COUNT_ACTIVE -> i64 = "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM api_keys \
             WHERE user_id = $1 AND status = 'active'";
        REVOKE_OWN = "UPDATE api_keys SET status = 'revoked', revoked_at = $1, \
             updated_at = $2 WHERE id = $3 AND user_id = $4 AND status = 'active'";
        REVOKE_ANY = "UPDATE api_keys SET status = 'revoked', revoked_at = $1, \
             updated_at = $2 WHERE id = $3 AND status = 'active'";
        CHANGED_SINCE -> super::KeyRow = select_key!("WHERE updated_at >= $1 LIMIT 10000");
        TOUCH_LAST_USED = "UPDATE api_keys SET last_used_at = $1 WHERE id = $2 \
             AND (last_used_at IS NULL OR last_used_at < $3)";
    }
}

fn to_i64(v: Option<u64>) -> Option<i64> {
    v.map(|x| i64::try_from(x).unwrap_or(i64::MAX))
}

pub struct KeyStore<'a> {
    pub(super) db: &'a Db,
}

impl KeyStore<'_> {
    pub async fn create(&self, k: &NewKey) -> StoreResult<KeyRecord> {
        let mut tx = self.db.pool.begin().await?;
        let id = insert(&mut tx, k).await?;
        tx.commit().await?;
        self.get(&id).await?.ok_or(StoreError::NotFound)
    }

    /// Creates a new global key and revokes the account's previous global keys in the same
    /// transaction, so a rotation never leaves two global keys or none.
    pub async fn rotate_global(&self, k: &NewKey) -> StoreResult<KeyRecord> {
        let now = now_ms();
        let mut tx = self.db.pool.begin().await?;
        sqlx::query(sql::REVOKE_GLOBAL)
            .bind(now)
            .bind(now)
            .bind(&k.user_id)
            .execute(&mut *tx)
            .await?;
        let id = insert(&mut tx, k).await?;
        tx.commit().await?;
        self.get(&id).await?.ok_or(StoreError::NotFound)
    }

    /// `rotate_global` for the account API: in one transaction that first locks the account
    /// row (so concurrent rotations of one account run one after the other on any number of
    /// instances), checks that the account ends with at most `max_active` active keys (the
    /// global keys being replaced do not count), revokes them and creates the new key.
    /// `Ok(None)` when the limit would be exceeded; nothing changes then.
    pub async fn rotate_global_limited(
        &self,
        k: &NewKey,
        max_active: i64,
    ) -> StoreResult<Option<Rotation>> {
        let now = now_ms();
        let mut tx = self.db.pool.begin().await?;
        let locked = sqlx::query(sql::LOCK_USER)
            .bind(&k.user_id)
            .execute(&mut *tx)
            .await?;
        if locked.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        let rows = sqlx::query_as::<_, ActiveKeyRow>(sql::ACTIVE_OF_USER)
            .bind(&k.user_id)
            .fetch_all(&mut *tx)
            .await?;
        let active = rows.len();
        let replaced: Vec<String> = rows
            .into_iter()
            .filter(|r| flag(r.is_global))
            .map(|r| r.id)
            .collect();
        let after = i64::try_from(active - replaced.len()).unwrap_or(i64::MAX) + 1;
        if after > max_active {
            return Ok(None);
        }
        for id in &replaced {
            sqlx::query(sql::REVOKE_BY_ID)
                .bind(now)
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        let id = insert(&mut tx, k).await?;
        tx.commit().await?;
        let key = self.get(&id).await?.ok_or(StoreError::NotFound)?;
        let mut revoked = Vec::with_capacity(replaced.len());
        for id in &replaced {
            if let Some(r) = self.get(id).await? {
                revoked.push(r);
            }
        }
        Ok(Some(Rotation { key, revoked }))
    }

    pub async fn get(&self, id: &str) -> StoreResult<Option<KeyRecord>> {
        let row = sqlx::query_as::<_, KeyRow>(sql::BY_ID)
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(KeyRecord::from))
    }

    pub async fn find_by_hash(&self, hash: &str) -> StoreResult<Option<KeyRecord>> {
        let row = sqlx::query_as::<_, KeyRow>(sql::BY_HASH)
            .bind(hash)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(KeyRecord::from))
    }

    pub async fn list_for_user(&self, user_id: &str) -> StoreResult<Vec<KeyRecord>> {
        let rows = sqlx::query_as::<_, KeyRow>(sql::OF_USER)
            .bind(user_id)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(KeyRecord::from).collect())
    }

    pub async fn count_active(&self, user_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(sql::COUNT_ACTIVE)
            .bind(user_id)
            .fetch_one(&self.db.pool)
            .await?)
    }

    /// Revokes the key if it belongs to `user_id`. `NotFound` when it does not exist or belongs
    /// to someone else, so the caller cannot learn about other accounts' keys.
    pub async fn revoke(&self, id: &str, user_id: &str) -> StoreResult<KeyRecord> {
        let now = now_ms();
        sqlx::query(sql::REVOKE_OWN)
            .bind(now)
            .bind(now)
            .bind(id)
            .bind(user_id)
            .execute(&self.db.pool)
            .await?;
        match self.get(id).await? {
            Some(k) if k.user_id == user_id => Ok(k),
            _ => Err(StoreError::NotFound),
        }
    }

    /// Revokes a key whoever owns it (the operator's `key revoke`). `updated_at` moves, so
    /// every gateway's change feed drops the key from its cache at its next poll. `None` when
    /// no key has this id; a key already revoked is returned unchanged.
    pub async fn revoke_any(&self, id: &str) -> StoreResult<Option<KeyRecord>> {
        let now = now_ms();
        sqlx::query(sql::REVOKE_ANY)
            .bind(now)
            .bind(now)
            .bind(id)
            .execute(&self.db.pool)
            .await?;
        self.get(id).await
    }

    /// Keys changed at or after `since_ms` (created, revoked, edited): the cache change feed.
    pub async fn changed_since(&self, since_ms: i64) -> StoreResult<Vec<KeyRecord>> {
        let rows = sqlx::query_as::<_, KeyRow>(sql::CHANGED_SINCE)
            .bind(since_ms)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(KeyRecord::from).collect())
    }

    /// Moves each key's last use forward (never back) inside the usage writer's transaction,
    /// in key order. Deliberately does not bump `updated_at`: last use is not a change the
    /// caches need to hear about.
    pub(crate) async fn touch_last_used_tx(
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        uses: &std::collections::BTreeMap<&str, i64>,
    ) -> StoreResult<()> {
        for (id, at) in uses {
            sqlx::query(sql::TOUCH_LAST_USED)
                .bind(*at)
                .bind(*id)
                .bind(*at)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }
}

async fn insert(tx: &mut sqlx::Transaction<'_, sqlx::Any>, k: &NewKey) -> StoreResult<String> {
    let now = now_ms();
    let id = new_id("key");
    let scopes = serde_json::to_string(&k.scopes).unwrap_or_else(|_| "[]".into());
    let models = serde_json::to_string(&k.model_allowlist).unwrap_or_else(|_| "[]".into());
    sqlx::query(sql::INSERT)
        .bind(&id)
        .bind(&k.user_id)
        .bind(&k.name)
        .bind(&k.key_hash)
        .bind(&k.key_prefix)
        .bind(&k.key_suffix)
        .bind(scopes)
        .bind(k.limit_mode.as_str())
        .bind(to_i64(k.custom_input_tpm))
        .bind(to_i64(k.custom_output_tpm))
        .bind(to_i64(k.custom_rpm))
        .bind(models)
        .bind(to_i64(k.max_input_tokens))
        .bind(to_i64(k.max_output_tokens))
        .bind(k.is_global as i64)
        .bind(now)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(StoreError::from_sqlx)?;
    Ok(id)
}
