//! Vertex AI's OAuth access tokens, minted from a service account's key file.
//!
//! The gateway signs a JWT assertion (RS256, the account's key) and exchanges it at the token
//! endpoint for an access token (the JWT bearer grant, RFC 7523), as Google's own client
//! libraries do. A token is cached per account and used until shortly before it expires; from
//! halfway through its life (at most five minutes before its end) the first request to use it
//! starts a refresh in the background, so requests wait for the token endpoint only for an
//! account's first token, or after the gateway sat idle past a token's end. One fetch per
//! account runs at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;

use crate::routing::Failure;
use gateway_core::config::VertexAccess;

/// What the token is for: Vertex AI (and every Google Cloud API).
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The assertion's lifetime (Google's maximum).
const ASSERTION_SECONDS: u64 = 3600;
/// A token answer is a few hundred bytes; anything past this is not one.
const ANSWER_LIMIT: usize = 64 * 1024;
/// The whole exchange with the token endpoint.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token endpoint refused the assertion (a wrong or disabled key, a wrong account).
    #[error("the token endpoint refused the service account's assertion: {0}")]
    Refused(String),
    /// The token endpoint could not be reached or failed.
    #[error("the token endpoint could not be reached: {0}")]
    Unreachable(String),
    /// The assertion could not be signed.
    #[error("the assertion could not be signed: {0}")]
    Signing(String),
}

impl TokenError {
    /// How the deployment is scored for it: a refused credential is the operator's to fix
    /// (`provider_auth_failed` when nothing else answers), an unreachable endpoint like a
    /// provider that cannot be reached.
    pub fn failure(&self) -> Failure {
        match self {
            TokenError::Refused(_) | TokenError::Signing(_) => Failure::Credential,
            TokenError::Unreachable(_) => Failure::Connect,
        }
    }
}

#[derive(Clone)]
struct Token {
    value: Arc<str>,
    issued: Instant,
    expires: Instant,
}

impl Token {
    fn lifetime(&self) -> Duration {
        self.expires.saturating_duration_since(self.issued)
    }

    /// Usable: not within a tenth of its life (at most a minute) of its end.
    fn usable(&self, now: Instant) -> bool {
        let margin = (self.lifetime() / 10).min(Duration::from_secs(60));
        now + margin < self.expires
    }

    /// Due for a refresh: past half its life, or within five minutes of its end.
    fn due(&self, now: Instant) -> bool {
        let ahead = (self.lifetime() / 2).min(Duration::from_secs(300));
        now + ahead >= self.expires
    }
}

/// One account's token and the fetch under way.
#[derive(Default)]
struct Entry {
    current: Mutex<Option<Token>>,
    fetching: tokio::sync::Mutex<()>,
    refreshing: AtomicBool,
}

impl Entry {
    fn usable(&self, now: Instant) -> Option<Token> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().filter(|t| t.usable(now)).cloned()
    }

    fn store(&self, token: Token) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(token);
    }
}

/// The access tokens of every Vertex account, kept across config reloads (keyed by the
/// account, not by the provider that names it).
pub struct TokenCache {
    client: reqwest::Client,
    entries: DashMap<String, Arc<Entry>>,
}

impl Default for TokenCache {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenCache {
    pub fn new() -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        TokenCache {
            client,
            entries: DashMap::new(),
        }
    }

    fn entry(&self, access: &VertexAccess) -> Arc<Entry> {
        let key = format!(
            "{}\n{}\n{}",
            access.account.file, access.account.client_email, access.token_url
        );
        if let Some(e) = self.entries.get(&key) {
            return Arc::clone(&e);
        }
        Arc::clone(&self.entries.entry(key).or_default())
    }

    /// Drops the cached token of `access`'s account (Vertex refused it): the next request
    /// mints a new one.
    pub fn forget(&self, access: &VertexAccess) {
        *self
            .entry(access)
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// A usable access token for `access`'s account: the cached one, else a new one.
    pub async fn token(&self, access: &Arc<VertexAccess>) -> Result<Arc<str>, TokenError> {
        let entry = self.entry(access);
        if let Some(t) = entry.usable(Instant::now()) {
            if t.due(Instant::now()) && !entry.refreshing.swap(true, Ordering::AcqRel) {
                let (client, entry, access) =
                    (self.client.clone(), Arc::clone(&entry), Arc::clone(access));
                tokio::spawn(async move {
                    let _one = entry.fetching.lock().await;
                    match fetch(&client, &access).await {
                        Ok(t) => entry.store(t),
                        Err(e) => log::warn!(
                            "refreshing the access token of {} failed (the current one is used \
                             until it expires): {e}",
                            access.account.client_email
                        ),
                    }
                    entry.refreshing.store(false, Ordering::Release);
                });
            }
            return Ok(t.value);
        }
        let _one = entry.fetching.lock().await;
        // Another request may have fetched one while this one waited.
        if let Some(t) = entry.usable(Instant::now()) {
            return Ok(t.value);
        }
        let t = fetch(&self.client, access).await?;
        let value = Arc::clone(&t.value);
        entry.store(t);
        Ok(value)
    }
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

/// Signs an assertion and exchanges it for an access token.
async fn fetch(client: &reqwest::Client, access: &Arc<VertexAccess>) -> Result<Token, TokenError> {
    // RSA signing is the one costly step: kept off the request-serving threads.
    let signer = Arc::clone(access);
    let assertion = tokio::task::spawn_blocking(move || assertion(&signer))
        .await
        .map_err(|e| TokenError::Signing(e.to_string()))??;
    let issued = Instant::now();
    let answer = client
        .post(&access.token_url)
        .timeout(FETCH_TIMEOUT)
        .form(&[
            ("grant_type", GRANT_TYPE),
            ("assertion", assertion.as_str()),
        ])
        .send()
        .await
        .map_err(|e| TokenError::Unreachable(e.without_url().to_string()))?;
    let status = answer.status();
    let body = answer
        .bytes()
        .await
        .map_err(|e| TokenError::Unreachable(e.without_url().to_string()))?;
    let text = || -> String { String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned() };
    if status.is_server_error() {
        return Err(TokenError::Unreachable(format!("{status}: {}", text())));
    }
    if !status.is_success() {
        return Err(TokenError::Refused(format!("{status}: {}", text())));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        access_token: String,
        expires_in: Option<u64>,
    }
    let parsed: Answer = (body.len() <= ANSWER_LIMIT)
        .then(|| serde_json::from_slice(&body).ok())
        .flatten()
        .ok_or_else(|| TokenError::Unreachable(format!("not a token answer: {}", text())))?;
    gateway_core::logging::never_print(&parsed.access_token);
    let seconds = parsed.expires_in.unwrap_or(3600).clamp(1, 86_400);
    Ok(Token {
        value: Arc::from(parsed.access_token),
        issued,
        expires: issued + Duration::from_secs(seconds),
    })
}

/// The signed JWT that asks for a token for the account.
fn assertion(access: &VertexAccess) -> Result<String, TokenError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let account = &access.account;
    let claims = Claims {
        iss: &account.client_email,
        scope: SCOPE,
        aud: &access.token_url,
        iat: now,
        exp: now + ASSERTION_SECONDS,
    };
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = account.private_key_id.clone();
    jsonwebtoken::encode(&header, &claims, &account.key)
        .map_err(|e| TokenError::Signing(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_refreshed_ahead_and_dropped_before_their_end() {
        let issued = Instant::now();
        let hour = Token {
            value: Arc::from("t"),
            issued,
            expires: issued + Duration::from_secs(3600),
        };
        assert!(hour.usable(issued) && !hour.due(issued));
        assert!(hour.due(issued + Duration::from_secs(3300)));
        assert!(hour.usable(issued + Duration::from_secs(3500)));
        assert!(!hour.usable(issued + Duration::from_secs(3560)));
        let short = Token {
            value: Arc::from("t"),
            issued,
            expires: issued + Duration::from_secs(4),
        };
        assert!(!short.due(issued + Duration::from_secs(1)));
        assert!(short.due(issued + Duration::from_secs(2)));
        assert!(short.usable(issued + Duration::from_secs(3)));
    }
}
