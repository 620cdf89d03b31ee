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
        if !self.enabled(record.metadata()) || !self.inner.matches(record) {
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
    fn only_our_targets_log_below_info() {
        assert!(ours("gateway"));
        assert!(ours("gateway::proxy::upstream"));
        assert!(!ours("pingora_proxy::proxy_h1"));
        assert!(!ours("sqlx::query"));
        assert!(ours("gateway_core::quota::shared"));
        assert!(!ours("gatewayish"));
    }
}
