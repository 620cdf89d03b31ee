//! Google's OAuth token endpoint and the access tokens Vertex AI accepts.
//!
//! `POST /token` takes the JWT bearer grant as Google's does: the assertion must be signed
//! (RS256) by the service account's key (the mock holds its public half), name the account as
//! issuer, this endpoint as audience and the Cloud Platform scope, and live at most an hour.
//! It answers with a fresh access token, which the Vertex routes then accept until it expires.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::StatusCode;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::json;

use crate::recording::lock;
use crate::reply::Reply;

/// The service account the mock trusts.
pub(crate) struct GoogleAccount {
    pub(crate) client_email: String,
    pub(crate) public_key: DecodingKey,
    /// `expires_in` of the tokens it issues.
    pub(crate) token_seconds: u64,
}

impl std::fmt::Debug for GoogleAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleAccount")
            .field("client_email", &self.client_email)
            .field("token_seconds", &self.token_seconds)
            .finish_non_exhaustive()
    }
}

impl GoogleAccount {
    /// Reads the account's public key (PEM) from `path`.
    pub(crate) fn load(
        path: &str,
        client_email: String,
        token_seconds: u64,
    ) -> std::io::Result<GoogleAccount> {
        let pem = std::fs::read(path)?;
        let public_key = DecodingKey::from_rsa_pem(&pem).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{path}: not an RSA public key in PEM: {e}"),
            )
        })?;
        Ok(GoogleAccount {
            client_email,
            public_key,
            token_seconds,
        })
    }
}

/// The tokens issued and when each expires.
#[derive(Default)]
pub(crate) struct Tokens {
    issued: std::sync::Mutex<HashMap<String, Instant>>,
}

impl Tokens {
    pub(crate) fn count(&self) -> usize {
        lock(&self.issued).len()
    }
}

const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

fn oauth_error(error: &str, description: &str) -> Reply {
    Reply::json(
        StatusCode::BAD_REQUEST,
        &json!({ "error": error, "error_description": description }),
    )
}

#[derive(Deserialize)]
struct Claims {
    scope: Option<String>,
    iat: u64,
    exp: u64,
}

/// `POST /token`: the JWT bearer grant. `host` is the `Host` the request came to (the
/// assertion's audience is this endpoint's URL).
pub(crate) fn token_endpoint(
    account: &GoogleAccount,
    tokens: &Tokens,
    host: &str,
    body: &[u8],
) -> Reply {
    let form: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    if form.get("grant_type").map(String::as_str) != Some(GRANT_TYPE) {
        return oauth_error(
            "unsupported_grant_type",
            &format!(
                "Invalid grant_type: {}",
                form.get("grant_type").map_or("", String::as_str)
            ),
        );
    }
    let Some(assertion) = form.get("assertion") else {
        return oauth_error("invalid_request", "Missing required parameter: assertion");
    };
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&[format!("http://{host}/token")]);
    validation.set_issuer(&[&account.client_email]);
    validation.set_required_spec_claims(&["exp", "iat", "aud", "iss"]);
    let claims = match jsonwebtoken::decode::<Claims>(assertion, &account.public_key, &validation) {
        Ok(data) => data.claims,
        Err(e) => {
            use jsonwebtoken::errors::ErrorKind;
            let description = match e.kind() {
                ErrorKind::InvalidSignature => "Invalid JWT Signature.".to_string(),
                ErrorKind::ExpiredSignature => "Invalid JWT: Token must be a short-lived token \
                    (60 minutes) and in a reasonable timeframe. Check your iat and exp values in \
                    the JWT claim."
                    .to_string(),
                other => format!("Invalid JWT: {other:?}"),
            };
            return oauth_error("invalid_grant", &description);
        }
    };
    if claims.exp.saturating_sub(claims.iat) > 3600 {
        return oauth_error(
            "invalid_grant",
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable \
             timeframe. Check your iat and exp values in the JWT claim.",
        );
    }
    if !claims
        .scope
        .as_deref()
        .is_some_and(|s| s.split(' ').any(|x| x == SCOPE))
    {
        return oauth_error(
            "invalid_scope",
            "Invalid OAuth scope or ID token audience provided.",
        );
    }
    let token = format!(
        "ya29.mock-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    let expires = Instant::now() + Duration::from_secs(account.token_seconds);
    lock(&tokens.issued).insert(token.clone(), expires);
    Reply::ok(&json!({
        "access_token": token,
        "expires_in": account.token_seconds,
        "token_type": "Bearer",
    }))
}

/// Vertex AI's answer to a request without a token it issued (or with an expired one).
pub(crate) fn check_bearer(tokens: &Tokens, headers: &http::HeaderMap) -> Result<(), Reply> {
    let token = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let valid = token.is_some_and(|t| {
        lock(&tokens.issued)
            .get(t)
            .is_some_and(|expires| *expires > Instant::now())
    });
    if valid {
        return Ok(());
    }
    Err(Reply::json(
        StatusCode::UNAUTHORIZED,
        &json!({ "error": {
            "code": 401,
            "message": "Request had invalid authentication credentials. Expected OAuth 2 access \
                token, login cookie or other valid authentication credential. See \
                https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "status": "UNAUTHENTICATED",
        }}),
    ))
}
