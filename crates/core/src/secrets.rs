//! Secrets come from the environment only (CONTRACT §2). For a development checkout,
//! `[secrets] dev_generate = true` creates the missing ones once under the data directory
//! (mode 0600) and reuses them on later starts, so `cargo run` works with nothing set.

use std::fmt;
use std::io::Write;
use std::path::Path;

use rand::RngCore;

use crate::config::SecretsConfig;

/// A secret value that never prints itself.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: Vec<u8>) -> Self {
        Secret(bytes)
    }
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The process's secrets; each is `None` when neither the environment nor a generated file has it.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    pub key_pepper: Option<Secret>,
    pub session_secret: Option<Secret>,
    pub webhook_secret: Option<Secret>,
    pub captcha_secret: Option<Secret>,
}

pub const KEY_PEPPER_ENV: &str = "GATEWAY_KEY_PEPPER";
pub const SESSION_SECRET_ENV: &str = "GATEWAY_SESSION_SECRET";
pub const WEBHOOK_SECRET_ENV: &str = "GATEWAY_WEBHOOK_SECRET";
pub const CAPTCHA_SECRET_ENV: &str = "GATEWAY_CAPTCHA_SECRET";

impl Secrets {
    /// Reads the environment, then (when allowed) the generated files, generating what is missing.
    pub fn load(cfg: &SecretsConfig) -> Result<Secrets, String> {
        let generated = |name: &str| -> Result<Option<Secret>, String> {
            if let Some(v) = env_secret(name) {
                return Ok(Some(v));
            }
            if !cfg.dev_generate {
                return Ok(None);
            }
            load_or_generate(&cfg.dir.join("secrets"), name).map(Some)
        };
        Ok(Secrets {
            key_pepper: generated(KEY_PEPPER_ENV)?,
            session_secret: generated(SESSION_SECRET_ENV)?,
            webhook_secret: generated(WEBHOOK_SECRET_ENV)?,
            captcha_secret: env_secret(CAPTCHA_SECRET_ENV),
        })
    }
}

fn env_secret(name: &str) -> Option<Secret> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| known(Secret(v.into_bytes())))
}

/// `secret`, after telling the logger never to print it.
fn known(secret: Secret) -> Secret {
    crate::logging::never_print(&String::from_utf8_lossy(secret.expose()));
    secret
}

/// One file per secret, hex text, created with mode 0600 so other local users cannot read it.
fn load_or_generate(dir: &Path, name: &str) -> Result<Secret, String> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => {
            return Ok(known(Secret(text.trim().as_bytes().to_vec())))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    let value = hex::encode(raw);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(&path) {
        Ok(mut f) => {
            f.write_all(value.as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            log::info!("generated development secret {name} in {}", path.display());
            Ok(known(Secret(value.into_bytes())))
        }
        // Another process (a CLI command racing the server) created it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            Ok(known(Secret(text.trim().as_bytes().to_vec())))
        }
        Err(e) => Err(format!("cannot create {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = load_or_generate(dir.path(), "X").expect("gen");
        let b = load_or_generate(dir.path(), "X").expect("reuse");
        assert_eq!(a.expose(), b.expose());
        assert_eq!(a.expose().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("X"))
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(format!("{a:?}"), "Secret(<redacted>)");
    }
}
