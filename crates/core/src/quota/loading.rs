//! Loading accounts into Redis from the database, the record of truth: on first use (the
//! first loader wins, `load.lua`) and after an outage (`reload.lua`, which keeps the
//! reservations and leases other instances hold).

use super::scripts::ACCOUNT_TTL_SECS;
use super::scripts::{account_keys, push_balance};
use super::shared::{LoadError, Shared};
use crate::domain::Lot;
use crate::storage::Db;

impl Shared {
    /// Reads an account's balance from the database (under the request path's deadline).
    pub(super) async fn read_balance(
        &self,
        db: &Db,
        user_id: &str,
        now: i64,
    ) -> Result<(Vec<crate::domain::SpendBucket>, Vec<Lot>), String> {
        crate::storage::within(self.settings.db_timeout, async {
            let spend = db.quota().spend(user_id, now).await?;
            let lots = db.quota().lots(user_id, now).await?;
            Ok((spend, lots))
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Remembers the tier hint a balance gives.
    pub(super) fn hint_from(
        &self,
        user_id: &str,
        spend: &[crate::domain::SpendBucket],
        lots: &[Lot],
        now: i64,
    ) {
        let weekly: u64 = spend
            .iter()
            .map(|b| b.allowance_tokens + b.lot_tokens)
            .sum();
        let top = crate::quota::tiers::entitlement_tier(lots, now);
        self.hints.insert(user_id.to_string(), (weekly, top));
    }

    /// Copies an account's balance from the database into Redis (first loader wins).
    pub(super) async fn load_account(
        &self,
        db: &Db,
        user_id: &str,
        now: i64,
    ) -> Result<(), LoadError> {
        self.write_account(db, user_id, now, None).await
    }

    /// Overwrites an account in Redis with the database's balance, keeping the reservations
    /// other instances hold except `released`.
    pub(super) async fn reload_account(
        &self,
        db: &Db,
        user_id: &str,
        released: &[String],
        now: i64,
    ) -> Result<(), LoadError> {
        self.write_account(db, user_id, now, Some(released)).await
    }

    /// Reads the account's balance from the database and hands it to the load script, or to the
    /// reload script when `released` names reservations to drop.
    async fn write_account(
        &self,
        db: &Db,
        user_id: &str,
        now: i64,
        released: Option<&[String]>,
    ) -> Result<(), LoadError> {
        let (spend, lots) = self
            .read_balance(db, user_id, now)
            .await
            .map_err(LoadError::Db)?;
        self.hint_from(user_id, &spend, &lots, now);
        let (script, what) = match released {
            None => (&self.load, "load"),
            Some(_) => (&self.reload, "reload"),
        };
        let mut inv = script.prepare_invoke();
        for key in &account_keys(&self.prefix, user_id) {
            inv.key(key);
        }
        inv.arg(ACCOUNT_TTL_SECS).arg(spend.len());
        if let Some(released) = released {
            inv.arg(released.len());
            for id in released {
                inv.arg(id);
            }
        }
        push_balance(&mut inv, &spend, &lots);
        let mut conn = self.conn();
        self.guarded(what, inv.invoke_async::<i64>(&mut conn))
            .await
            .map_err(LoadError::Redis)?;
        Ok(())
    }
}
