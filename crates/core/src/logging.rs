//! The process's logger: `env_logger` (RUST_LOG, stderr) behind a gate that keeps secrets out
//! of every line at every level (CONTRACT §1).
//!
//! Two layers, because either alone leaves a hole:
//! - Dependencies print whole requests and answers at `debug` and `trace`: Pingora's proxy
//!   logs every request header (`authorization`, `cookie`) and every upstream answer head
//!   (`set-cookie`), its HTTP/1 client logs the raw header it writes (the provider key), sqlx
//!   logs statements, hyper and reqwest log connection details. Their `debug`/`trace` records
//!   are dropped whatever RUST_LOG says; their `info` and above, and every level of the
//!   gateway's own targets, pass. RUST_LOG still chooses the gateway's own verbosity.
//! - Every line that passes is scrubbed before it is written: credential-shaped text
//!   (`Bearer …`, `sk-…` keys, session and OTP cookies, secret query parameters) and the exact
//!   values of the process's secrets (registered with [`never_print`]) become `<redacted>`.
//!   This catches a dependency's `warn`/`error` that quotes a request (Pingora's
//!   `Fail to proxy: … GET /api/auth/verify-link?token=…`).
//!
//! A few dependency records describe the happy path in alarming terms (an `ERROR` on every
//! graceful upgrade, a Postgres notice on every start): [`EXPECTED`] drops them or says what
//! happened at `INFO`, in the gateway's words, so an operator's alerts on `ERROR` stay quiet
//! when nothing is wrong.

use std::sync::OnceLock;

use arc_swap::ArcSwap;
use log::{Level, Log, Metadata, Record};
use regex::Regex;

/// Shorter values are not registered: redacting every "1" or "on" would garble lines and a
/// value that short is no secret anyway.
const MIN_SECRET_LEN: usize = 8;

/// Environment variables whose values are treated as secrets even before the config names them.
const SECRET_ENV_SUFFIXES: &[&str] = &["KEY", "SECRET", "PEPPER", "PASSWORD", "TOKEN"];

static SECRETS: OnceLock<ArcSwap<Vec<String>>> = OnceLock::new();

fn secrets() -> &'static ArcSwap<Vec<String>> {
    SECRETS.get_or_init(|| ArcSwap::from_pointee(Vec::new()))
}

/// Registers `value` so that no later log line prints it. Called for each secret the process
/// loads (environment secrets, provider keys of every config, reloaded ones included).
pub fn never_print(value: &str) {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        return;
    }
    secrets().rcu(|old| {
        if old.iter().any(|v| v == value) {
            return old.clone();
        }
        let mut new = Vec::clone(old);
        new.push(value.to_string());
        // Longest first, so a secret containing another is redacted whole.
        new.sort_by_key(|v| std::cmp::Reverse(v.len()));
        std::sync::Arc::new(new)
    });
}

/// Credential-shaped text, whatever produced it. `None` only if the constant pattern failed to
/// compile, which the unit tests rule out; a logger must never panic.
fn patterns() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(concat!(
            // A header's whole value, as Pingora's and hyper's Debug print it and as wire text
            // (where `\r\n` may appear escaped).
            r#"(?i)(?P<header>"?(?:authorization|proxy-authorization|x-api-key|api-key|cookie|set-cookie|x-csrf-token)"?\s*[:=]\s*"?)[^"\r\n\\]+"#,
            // A credential token after its scheme, cookie name or query parameter.
            r"|(?P<label>(?:bearer|basic|apikey)\s+|(?:__Host-)?gw_(?:session|otp)=",
            r"|[?&](?:token|key|api_key|code|secret|password)=)[^\x22\s;&,}\\]+",
            // An API key anywhere.
            r"|sk-[A-Za-z0-9_-]{16,}",
        ))
        .ok()
    })
    .as_ref()
}

/// `line` with every credential-shaped span and every registered secret replaced.
pub fn redact(line: &str) -> String {
    let mut out = match patterns() {
        Some(re) => re
            .replace_all(line, |c: &regex::Captures<'_>| {
                let keep = c.name("header").or_else(|| c.name("label"));
                format!("{}<redacted>", keep.map_or("", |k| k.as_str()))
            })
            .into_owned(),
        None => line.to_string(),
    };
    for secret in secrets().load().iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "<redacted>");
        }
    }
    out
}

/// What to do with one expected dependency record.
enum Expected {
    /// Noise: nothing an operator needs.
    Drop,
    /// An expected event: written at `INFO` under `gateway::lifecycle` with this text.
    Info(&'static str),
}

/// Dependency records matched by target (prefix) and message (prefix).
const EXPECTED: &[(&str, &str, Expected)] = &[
    // The new process of a graceful upgrade polls the upgrade socket once a second until the
    // old one sends its listeners (on SIGQUIT); every poll was an ERROR.
    (
        "pingora_core::server::transfer_fd",
        "No incoming socket transfer",
        Expected::Info(
            "graceful upgrade: waiting for the running gateway to hand its listeners over \
             (send it SIGQUIT)",
        ),
    ),
    // A pooled connection another task still held for a moment: Pingora opens a new one.
    (
        "pingora_core::connectors",
        "failed to acquire reusable stream",
        Expected::Drop,
    ),
    // `CREATE TABLE IF NOT EXISTS _sqlx_migrations` on every Postgres start.
    (
        "sqlx::postgres::notice",
        "relation \"_sqlx_migrations\" already exists",
        Expected::Drop,
    ),
];

/// What [`EXPECTED`] says about a dependency's record, if anything.
fn expected(target: &str, message: &str) -> Option<&'static Expected> {
    EXPECTED
        .iter()
        .find(|(t, m, _)| target.starts_with(t) && message.starts_with(m))
        .map(|(_, _, e)| e)
}

/// True for the gateway's own targets: the binary's (`gateway`, `gateway::…`) and its crates'
/// (`gateway_core::…`, `gateway_devapi::…`, …).
fn ours(target: &str) -> bool {
    let crate_name = target.split("::").next().unwrap_or(target);
    crate_name == "gateway" || crate_name.starts_with("gateway_")
}

struct SafeLogger {
    inner: env_logger::Logger,
}

impl Log for SafeLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        (metadata.level() <= Level::Info || ours(metadata.target())) && self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if !ours(record.target()) {
            let message = record.args().to_string();
            match expected(record.target(), &message) {
                Some(Expected::Drop) => return,
                Some(Expected::Info(text)) => {
                    let metadata = Metadata::builder()
                        .level(Level::Info)
                        .target("gateway::lifecycle")
                        .build();
                    let info = Record::builder().metadata(metadata).build();
                    if self.inner.matches(&info) {
                        self.inner.log(
                            &Record::builder()
                                .metadata(info.metadata().clone())
                                .args(format_args!("{text}"))
                                .build(),
                        );
                    }
                    return;
                }
                None => {}
            }
        }
        if !self.inner.matches(record) {
            return;
        }
        let text = redact(&record.args().to_string());
        self.inner.log(
            &Record::builder()
                .metadata(record.metadata().clone())
                .args(format_args!("{text}"))
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build(),
        );
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the logger: RUST_LOG (default `info`) to stderr, behind the gate above, and
/// registers the secrets already in the environment.
pub fn init() {
    for (name, value) in std::env::vars() {
        let upper = name.to_ascii_uppercase();
        if SECRET_ENV_SUFFIXES.iter().any(|s| upper.ends_with(s)) {
            never_print(&value);
        }
    }
    let inner = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        .build();
    // Dependencies never get past `info` (see the module doc), so their debug records are not
    // even formatted.
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(SafeLogger { inner })).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_shapes_are_redacted() {
        assert!(patterns().is_some());
        let cases = [
            (
                r#"headers: {"authorization": "Bearer sk-abcdefghijklmnopqrstuvwxyz", "accept": "*/*"}"#,
                r#"headers: {"authorization": "<redacted>", "accept": "*/*"}"#,
            ),
            (
                "authorization: Apikey whsecret-123\r\ncontent-type: x",
                "authorization: <redacted>\r\ncontent-type: x",
            ),
            (
                r#""set-cookie": "gw_otp=chl_1.sig; Max-Age=4500; Path=/""#,
                r#""set-cookie": "<redacted>""#,
            ),
            (
                "GET /api/auth/verify-link?token=abcDEF123 Host: x",
                "GET /api/auth/verify-link?token=<redacted> Host: x",
            ),
            (
                "key sk-6TdFrR6rU94BmbbzfB9mSjJ0Gys09MPEy2KS1boY failed",
                "key <redacted> failed",
            ),
            ("cookie: gw_session=abc.def", "cookie: <redacted>"),
            ("nothing to hide here", "nothing to hide here"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    #[test]
    fn registered_values_are_redacted() {
        never_print("short");
        never_print("a-provider-key-value");
        assert_eq!(
            redact("upstream said a-provider-key-value is bad; short"),
            "upstream said <redacted> is bad; short"
        );
    }

    #[test]
    fn expected_dependency_records_are_dropped_or_reworded() {
        assert!(matches!(
            expected(
                "pingora_core::server::transfer_fd",
                "No incoming socket transfer, sleep 1s and try again"
            ),
            Some(Expected::Info(t)) if t.starts_with("graceful upgrade")
        ));
        assert!(matches!(
            expected(
                "pingora_core::connectors",
                "failed to acquire reusable stream"
            ),
            Some(Expected::Drop)
        ));
        assert!(matches!(
            expected(
                "sqlx::postgres::notice",
                "relation \"_sqlx_migrations\" already exists, skipping"
            ),
            Some(Expected::Drop)
        ));
        assert!(expected("pingora_core::connectors", "connect failed").is_none());
        assert!(expected("sqlx::postgres::notice", "something else").is_none());
    }

    #[test]
    fn only_our_targets_log_below_info() {
        assert!(ours("gateway"));
        assert!(ours("gateway::proxy::upstream"));
        assert!(!ours("pingora_proxy::proxy_h1"));
        assert!(!ours("sqlx::query"));
        assert!(ours("gateway_core::quota::shared"));
        assert!(!ours("gatewayish"));
    }
}
