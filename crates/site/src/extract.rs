//! The checks every site request starts with, as axum extractors, so a handler's signature
//! says what it needs and its body starts after them:
//!
//! - [`SameOrigin`]: the request provably comes from the site (`invalid_origin`).
//! - [`Session`] / [`MaybeSession`]: the signed-in user (`unauthorized` without one).
//! - [`Mutation`]: origin, session and CSRF token, in that order, then the JSON body it read
//!   to find the token (`csrfToken` may be in the body).
//! - [`Member`]: wraps a `Session` or `Mutation` and adds the private-beta gate
//!   (`private_beta_only`), asked on every request.
//! - [`LenientJson`]: the body as JSON, where anything unparsable reads as `null` so each
//!   endpoint answers its own code for a missing field.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use crate::access::check_beta;
use crate::authkey::AuthKey;
use crate::csrf::check_token;
use crate::error::SiteError;
use crate::session::{current_session, SessionInfo};
use gateway_core::config::Config;
use gateway_core::state::SharedState;

/// Same-origin check (CONTRACT §3): `Origin` equal to `server.site_origin`, or, when a browser
/// sent no `Origin`, `Sec-Fetch-Site: same-origin`.
pub fn check_origin(cfg: &Config, headers: &HeaderMap) -> Result<(), SiteError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let ok = match header("origin") {
        Some(origin) => origin
            .trim_end_matches('/')
            .eq_ignore_ascii_case(&cfg.server.site_origin),
        None => header("sec-fetch-site").is_some_and(|v| v.eq_ignore_ascii_case("same-origin")),
    };
    if ok {
        Ok(())
    } else {
        Err(SiteError::InvalidOrigin)
    }
}

/// The request comes from the site's own origin.
pub struct SameOrigin;

impl FromRequestParts<SharedState> for SameOrigin {
    type Rejection = SiteError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<SameOrigin, SiteError> {
        check_origin(&state.config(), &parts.headers)?;
        Ok(SameOrigin)
    }
}

/// The signed-in user, if any (no cookie, an ended session or no session secret: `None`).
pub struct MaybeSession(pub Option<SessionInfo>);

impl FromRequestParts<SharedState> for MaybeSession {
    type Rejection = SiteError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<MaybeSession, SiteError> {
        Ok(MaybeSession(current_session(state, &parts.headers).await?))
    }
}

/// The signed-in user: `unauthorized` (401) without one.
pub struct Session(pub SessionInfo);

impl FromRequestParts<SharedState> for Session {
    type Rejection = SiteError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Session, SiteError> {
        current_session(state, &parts.headers)
            .await?
            .map(Session)
            .ok_or(SiteError::Unauthorized)
    }
}

/// The body as JSON; unparsable reads as `null`. A body over the route's limit is refused
/// (413) before anything else.
pub struct LenientJson(pub Value);

impl<S: Send + Sync> FromRequest<S> for LenientJson {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<LenientJson, Response> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(LenientJson(
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }
}

/// A signed-in mutation: the body is read (413 when over the limit), then the origin
/// (`invalid_origin`), the session (`unauthorized`) and its CSRF token (`invalid_csrf`, from
/// `x-csrf-token` or the body's `csrfToken`) are checked in that order.
pub struct Mutation {
    pub session: SessionInfo,
    pub body: Value,
}

impl FromRequest<SharedState> for Mutation {
    type Rejection = Response;

    async fn from_request(req: Request, state: &SharedState) -> Result<Mutation, Response> {
        let headers = req.headers().clone();
        let LenientJson(body) = LenientJson::from_request(req, state).await?;
        let checked = async {
            check_origin(&state.config(), &headers)?;
            let session = current_session(state, &headers)
                .await?
                .ok_or(SiteError::Unauthorized)?;
            let key = AuthKey::from_state(state)?;
            check_token(&key, &session.id_hash, &headers, &body)?;
            Ok::<_, SiteError>(session)
        };
        match checked.await {
            Ok(session) => Ok(Mutation { session, body }),
            Err(e) => Err(e.into_response()),
        }
    }
}

/// A `Session` or `Mutation` whose address may use the site now: while the private beta is
/// closed, it must still be on the allowlist (`private_beta_only`), asked after the checks of
/// what it wraps.
pub struct Member<T>(pub T);

impl Member<Session> {
    pub fn session(&self) -> &SessionInfo {
        &self.0 .0
    }
}

impl FromRequestParts<SharedState> for Member<Session> {
    type Rejection = SiteError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &SharedState,
    ) -> Result<Member<Session>, SiteError> {
        let session = Session::from_request_parts(parts, state).await?;
        check_beta(&state.config().auth, &session.0.email)?;
        Ok(Member(session))
    }
}

impl FromRequest<SharedState> for Member<Mutation> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &SharedState) -> Result<Member<Mutation>, Response> {
        let mutation = Mutation::from_request(req, state).await?;
        check_beta(&state.config().auth, &mutation.session.email)
            .map_err(IntoResponse::into_response)?;
        Ok(Member(mutation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::path::Path;

    fn cfg() -> Config {
        Config::from_str(
            Path::new("t.toml"),
            "[server]\nsite_origin = \"https://gw.example.com\"\n",
        )
        .expect("config")
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origin_rules() {
        let c = cfg();
        let ok = |h: &[(&'static str, &'static str)]| check_origin(&c, &headers(h)).is_ok();
        assert!(ok(&[("origin", "https://gw.example.com")]));
        assert!(ok(&[("origin", "HTTPS://GW.EXAMPLE.COM")]));
        assert!(!ok(&[("origin", "https://evil.example.com")]));
        assert!(!ok(&[("origin", "null")]));
        assert!(!ok(&[("origin", "http://gw.example.com")]));
        // A mismatching Origin is not rescued by Sec-Fetch-Site.
        assert!(!ok(&[
            ("origin", "https://evil.example.com"),
            ("sec-fetch-site", "same-origin")
        ]));
        assert!(ok(&[("sec-fetch-site", "same-origin")]));
        assert!(!ok(&[("sec-fetch-site", "cross-site")]));
        assert!(!ok(&[]));
    }
}
