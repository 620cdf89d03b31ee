//! The command line (CONTRACT §1): `serve` and the operator commands. Admin commands talk to the
//! database directly, print one JSON object on stdout and exit 0, or print an error on stderr
//! and exit non-zero.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use crate::admin::{db_error, Output};
use gateway_core::apikey;
use gateway_core::config::Config;
use gateway_core::domain::normalize_email;
use gateway_core::domain::LimitMode;
use gateway_core::domain::LotKind;
use gateway_core::domain::Tier;
use gateway_core::secrets::Secrets;
use gateway_core::storage::{Db, NewKey, StoreError};
use gateway_devapi::route::is_known_scope;
use gateway_site::views::{key_json, user_json};

/// `gateway --version`: the package version and the git commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GATEWAY_GIT_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "gateway",
    version = VERSION,
    about = "LLM gateway with an account service",
    after_help = "Without a command, `serve` runs. Admin commands talk to the database \
                  directly and print one JSON object (or CSV for `usage report --format csv`)."
)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, default_value = "conf/gateway.toml")]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Manage users.
    #[command(subcommand)]
    User(UserCmd),
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Quota lots (top-ups).
    #[command(subcommand)]
    Lot(LotCmd),
    /// Usage reports.
    #[command(subcommand)]
    Usage(UsageCmd),
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Payment reconciliation.
    #[command(subcommand)]
    Payment(PaymentCmd),
}

#[derive(Subcommand, Debug)]
pub enum PaymentCmd {
    /// Webhook transactions waiting for an operator (default: unmatched and amount_mismatch).
    List {
        /// Only this status: unmatched, amount_mismatch, matched, ignored or credited.
        #[arg(long)]
        status: Option<String>,
        /// Most transactions to print, newest first.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Credit a transaction to an order by hand: the order becomes paid and its lot is granted,
    /// once; who, when and why go to the audit table.
    Credit {
        /// The webhook transaction's id.
        #[arg(long)]
        transaction: String,
        /// The order (`ord_…`) to credit it to.
        #[arg(long)]
        order: String,
        /// Why (kept in the audit table).
        #[arg(long, default_value = "manual reconciliation")]
        reason: String,
        /// Who (kept in the audit table); default: $USER.
        #[arg(long)]
        actor: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum LotCmd {
    /// Grant a quota lot (a top-up that lasts `--days`, default `[payment] lot_days`).
    Grant {
        /// The account's email.
        #[arg(long)]
        email: String,
        /// `token` or `request`: the meter the lot tops up.
        #[arg(long = "type")]
        kind: String,
        /// Tokens or requests the lot adds.
        #[arg(long)]
        amount: u64,
        /// Days until the lot expires (default: `[payment] lot_days`).
        #[arg(long)]
        days: Option<u64>,
        /// Entitlement tier the lot carries while active.
        #[arg(long)]
        tier: Option<String>,
    },
    /// An account's lots, soonest expiry first (unexpired ones unless `--all`).
    List {
        /// The account's email.
        #[arg(long)]
        email: String,
        /// Include expired lots.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum UserCmd {
    /// Create a user.
    Create {
        /// The account's email.
        #[arg(long)]
        email: String,
        /// Manual tier: beginner, steady, persistent or tryharder (default: `[quota] default_tier`).
        #[arg(long)]
        tier: Option<String>,
        /// Skip the weekly meters (per-key limits still apply).
        #[arg(long)]
        unlimited: bool,
    },
    /// Suspend an account: its keys fail with account_suspended.
    Suspend {
        /// The account's email.
        #[arg(long)]
        email: String,
    },
    /// Lift a suspension.
    Unsuspend {
        /// The account's email.
        #[arg(long)]
        email: String,
    },
    /// Set the manual tier.
    SetTier {
        /// The account's email.
        #[arg(long)]
        email: String,
        /// beginner, steady, persistent or tryharder.
        #[arg(long)]
        tier: String,
    },
    /// List accounts, newest first.
    List {
        /// Only `active` or only `suspended` accounts.
        #[arg(long, value_parser = ["active", "suspended"])]
        status: Option<String>,
        /// Most accounts to print (1 to 10000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One account: profile, keys, unexpired lots and quota.
    Show {
        /// The account's email.
        #[arg(long)]
        email: String,
    },
    /// Turn two-factor off for an account that lost its authenticator and recovery codes.
    #[command(name = "reset-2fa")]
    Reset2fa {
        /// The account's email.
        #[arg(long)]
        email: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Create an API key; the secret is printed once.
    Create(KeyCreate),
    /// An account's keys, newest first (metadata only: never a secret or a hash).
    List {
        /// The account's email.
        #[arg(long)]
        email: String,
    },
    /// Revoke a key: refused on this database's gateways within a second.
    Revoke {
        /// The key's id (`key_…`).
        #[arg(long)]
        id: String,
    },
}

#[derive(Args, Debug)]
pub struct KeyCreate {
    /// The account's email.
    #[arg(long)]
    email: String,
    /// A name to tell keys apart (default `API key`).
    #[arg(long)]
    name: Option<String>,
    /// Comma-separated scopes (default `*`).
    #[arg(long)]
    scopes: Option<String>,
    /// Comma-separated model allowlist (default: unrestricted).
    #[arg(long)]
    models: Option<String>,
    /// Most input tokens one request may carry.
    #[arg(long)]
    max_input_tokens: Option<u64>,
    /// Most output tokens one request may ask for.
    #[arg(long)]
    max_output_tokens: Option<u64>,
    /// Requests per minute for this key (gives the key its own per-minute windows).
    #[arg(long)]
    rpm: Option<u64>,
    /// Input tokens per minute for this key.
    #[arg(long)]
    itpm: Option<u64>,
    /// Output tokens per minute for this key.
    #[arg(long)]
    otpm: Option<u64>,
}

#[derive(Subcommand, Debug)]
pub enum UsageCmd {
    /// Requests and tokens per day, model or user over a range of UTC days.
    Report(crate::admin::ReportArgs),
}

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// Validate the configuration file; warns on stderr about secrets and provider keys that
    /// are not set.
    Check,
}

fn list(raw: &Option<String>) -> Vec<String> {
    raw.as_deref()
        .unwrap_or("")
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn tier(raw: &str) -> Result<Tier, String> {
    Tier::parse(raw).ok_or_else(|| {
        format!("unknown tier {raw:?}; use beginner, steady, persistent or tryharder")
    })
}

async fn user_by_email(db: &Db, email: &str) -> Result<gateway_core::storage::UserRecord, String> {
    let email = normalize_email(email).ok_or_else(|| format!("invalid email {email:?}"))?;
    db.users()
        .find_by_email(&email)
        .await
        .map_err(db_error)?
        .ok_or_else(|| format!("no user with email {email}"))
}

/// Runs an admin command and returns what it prints.
pub fn run_admin(cfg: &Config, command: Command) -> Result<Output, String> {
    if let Command::Config(ConfigCmd::Check) = command {
        let warnings = crate::admin::config_warnings(cfg, |name| std::env::var_os(name));
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        return Ok(Output::Json(json!({
            "ok": true,
            "file": cfg.path.display().to_string(),
            "providers": cfg.providers.len(),
            "models": cfg.models.len(),
            "warnings": warnings,
        })));
    }
    let rt = gateway_core::storage::storage_runtime()?;
    rt.block_on(async {
        let db = Db::connect(&cfg.storage.database_url).await.map_err(|e| {
            format!(
                "database {}: {e}",
                gateway_core::storage::redact_url(&cfg.storage.database_url)
            )
        })?;
        let json = match command {
            Command::User(cmd) => user_command(cfg, &db, cmd).await,
            Command::Key(KeyCmd::Create(k)) => key_create(cfg, &db, k).await,
            Command::Key(KeyCmd::List { email }) => {
                let user = user_by_email(&db, &email).await?;
                crate::admin::key_list(&db, &user).await
            }
            Command::Key(KeyCmd::Revoke { id }) => crate::admin::key_revoke(&db, &id).await,
            Command::Lot(LotCmd::List { email, all }) => {
                let user = user_by_email(&db, &email).await?;
                crate::admin::lot_list(&db, &user, all).await
            }
            Command::Usage(UsageCmd::Report(args)) => {
                let user = match &args.email {
                    Some(e) => Some(user_by_email(&db, e).await?),
                    None => None,
                };
                return crate::admin::usage_report(cfg, &db, user.as_ref(), &args).await;
            }
            Command::Lot(LotCmd::Grant {
                email,
                kind,
                amount,
                days,
                tier: t,
            }) => {
                let kind = LotKind::parse(&kind)
                    .ok_or_else(|| format!("--type must be token or request, got {kind:?}"))?;
                if amount == 0 || amount > i64::MAX as u64 {
                    return Err("--amount must be a positive integer".into());
                }
                let t = t.as_deref().map(tier).transpose()?;
                let days = days.unwrap_or(cfg.payment.lot_days);
                if days == 0 {
                    return Err("--days must be a positive integer".into());
                }
                let user = user_by_email(&db, &email).await?;
                let lot = db
                    .quota()
                    .grant_lot(&user.id, kind, amount, days, t, "admin")
                    .await
                    .map_err(db_error)?;
                if kind == LotKind::Request {
                    if let Some(w) = crate::admin::request_lot_warning(cfg, &db, &user).await? {
                        eprintln!("warning: {w}");
                    }
                }
                Ok(gateway_site::views::lot_json(&lot))
            }
            Command::Payment(cmd) => payment_command(cfg, &db, cmd).await,
            Command::Serve | Command::Config(_) => Err("not an admin command".into()),
        };
        json.map(Output::Json)
    })
}

/// Statuses `payment list` accepts.
const LISTABLE: [&str; 5] = [
    "unmatched",
    "amount_mismatch",
    "matched",
    "ignored",
    "credited",
];

async fn payment_command(cfg: &Config, db: &Db, cmd: PaymentCmd) -> Result<Value, String> {
    use gateway_core::storage::payments::CREDITABLE;
    use gateway_site::payment::{order_json, transaction_json};
    let store = db.payments();
    match cmd {
        PaymentCmd::List { status, limit } => {
            let statuses: Vec<&str> = match status.as_deref() {
                None => CREDITABLE.to_vec(),
                Some(s) => vec![LISTABLE.iter().copied().find(|l| *l == s).ok_or_else(|| {
                    format!("--status must be one of {}, got {s:?}", LISTABLE.join(", "))
                })?],
            };
            let txs = store
                .transactions(&statuses, i64::from(limit.max(1)))
                .await
                .map_err(db_error)?;
            Ok(json!({
                "ok": true,
                "statuses": statuses,
                "transactions": txs.iter().map(transaction_json).collect::<Vec<_>>(),
            }))
        }
        PaymentCmd::Credit {
            transaction,
            order,
            reason,
            actor,
        } => {
            let actor = actor
                .or_else(|| std::env::var("USER").ok())
                .or_else(|| std::env::var("LOGNAME").ok())
                .filter(|a| !a.trim().is_empty())
                .unwrap_or_else(|| "operator".into());
            if reason.trim().is_empty() {
                return Err("--reason must not be empty".into());
            }
            let credit = store
                .credit(&transaction, &order, &actor, &reason, cfg.payment.lot_days)
                .await
                .map_err(|e| e.to_string())?;
            Ok(json!({
                "ok": true,
                "order": order_json(&credit.order, &cfg.payment, gateway_core::util::now_ms()),
                "transaction": transaction_json(&credit.transaction),
                "lot": gateway_site::views::lot_json(&credit.lot),
                "audit": {
                    "id": credit.audit_id,
                    "actor": actor,
                    "reason": reason,
                },
            }))
        }
    }
}

async fn user_command(cfg: &Config, db: &Db, cmd: UserCmd) -> Result<Value, String> {
    match cmd {
        UserCmd::Create {
            email,
            tier: t,
            unlimited,
        } => {
            let email =
                normalize_email(&email).ok_or_else(|| format!("invalid email {email:?}"))?;
            let t = match t {
                Some(t) => tier(&t)?,
                None => cfg.quota.default_tier,
            };
            match db.users().create(&email, t, unlimited).await {
                Ok(u) => Ok(user_json(&u)),
                Err(StoreError::Conflict(_)) => {
                    Err(format!("a user with email {email} already exists"))
                }
                Err(e) => Err(db_error(e)),
            }
        }
        UserCmd::List { status, limit } => {
            crate::admin::user_list(db, status.as_deref(), limit).await
        }
        UserCmd::Show { email } => {
            let user = user_by_email(db, &email).await?;
            crate::admin::user_show(cfg, db, user).await
        }
        UserCmd::Reset2fa { email } => {
            let user = user_by_email(db, &email).await?;
            crate::admin::reset_two_factor(db, &user).await
        }
        UserCmd::Suspend { email } => set_suspended(db, &email, true).await,
        UserCmd::Unsuspend { email } => set_suspended(db, &email, false).await,
        UserCmd::SetTier { email, tier: t } => {
            let t = tier(&t)?;
            let u = user_by_email(db, &email).await?;
            db.users()
                .set_manual_tier(&u.id, t)
                .await
                .map_err(db_error)?;
            let u = user_by_email(db, &email).await?;
            Ok(user_json(&u))
        }
    }
}

async fn set_suspended(db: &Db, email: &str, suspended: bool) -> Result<Value, String> {
    let u = user_by_email(db, email).await?;
    db.users()
        .set_suspended(&u.id, suspended)
        .await
        .map_err(db_error)?;
    let u = user_by_email(db, email).await?;
    Ok(user_json(&u))
}

async fn key_create(cfg: &Config, db: &Db, k: KeyCreate) -> Result<Value, String> {
    let secrets = Secrets::load(&cfg.secrets)?;
    let pepper = secrets
        .key_pepper
        .ok_or("GATEWAY_KEY_PEPPER is not set (or enable [secrets] dev_generate)")?;
    let user = user_by_email(db, &k.email).await?;
    let mut scopes = list(&k.scopes);
    if scopes.is_empty() {
        scopes.push("*".into());
    }
    if let Some(bad) = scopes.iter().find(|s| !is_known_scope(s)) {
        return Err(format!(
            "unknown scope {bad:?}; known: {}",
            gateway_devapi::route::SCOPES.join(", ")
        ));
    }
    let models = list(&k.models);
    for (flag, v) in [
        ("--max-input-tokens", k.max_input_tokens),
        ("--max-output-tokens", k.max_output_tokens),
        ("--rpm", k.rpm),
        ("--itpm", k.itpm),
        ("--otpm", k.otpm),
    ] {
        if v == Some(0) || v.is_some_and(|n| n > i64::MAX as u64) {
            return Err(format!("{flag} must be a positive integer"));
        }
    }
    let custom = k.rpm.is_some() || k.itpm.is_some() || k.otpm.is_some();
    let generated = apikey::generate();
    let new = NewKey {
        user_id: user.id.clone(),
        name: k.name.unwrap_or_else(|| "API key".into()),
        key_hash: apikey::hash(pepper.expose(), &generated.secret),
        key_prefix: generated.prefix,
        key_suffix: generated.suffix,
        scopes,
        limit_mode: if custom {
            LimitMode::PerKey
        } else {
            LimitMode::AccountPool
        },
        custom_input_tpm: k.itpm,
        custom_output_tpm: k.otpm,
        custom_rpm: k.rpm,
        model_allowlist: models,
        max_input_tokens: k.max_input_tokens,
        max_output_tokens: k.max_output_tokens,
        is_global: false,
    };
    let rec = db.keys().create(&new).await.map_err(db_error)?;
    let mut v = key_json(&rec);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("secret".into(), Value::String(generated.secret));
        obj.insert("userId".into(), Value::String(user.id));
    }
    Ok(v)
}
