//! The co-hosted account service (axum): `/api/auth`, `/api/account`, `/api/payment`,
//! `/api/content`. Pingora's site listener proxies to it over a private Unix socket, so it
//! shares the edge (and its graceful restarts) without a second public port.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod access;
pub mod account;
pub mod auth;
pub mod authkey;
pub mod captcha;
pub mod content;
pub mod csrf;
pub mod error;
pub mod extract;
pub mod hourly;
pub mod mail;
pub mod panel;
pub mod payment;
pub mod reply;
pub mod session;
pub mod trace;
pub mod twofactor;
pub mod views;

use std::path::Path;

use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use error::SiteError;
use gateway_core::state::SharedState;

/// A site answer's outcome as the sign-in metrics and the site's spans name it.
pub fn outcome(status: axum::http::StatusCode) -> &'static str {
    if status.is_server_error() {
        "failed"
    } else if status.is_client_error() {
        "rejected"
    } else {
        "ok"
    }
}

/// Every site route, merged in one place. The personal APIs (auth, account, payment) sit under
/// one layer that marks every answer private (`reply::private_headers`); the content API is
/// public and cacheable, and the panel sets its own headers.
pub fn router(state: SharedState) -> Router {
    let personal = Router::new()
        .nest(
            "/api/auth",
            auth::router().layer(axum::middleware::from_fn(count_signin)),
        )
        .nest("/api/payment", payment::router())
        .nest("/api/account", account::router())
        .layer(axum::middleware::map_response(reply::private_headers));
    let routes = Router::new()
        .route("/health", get(|| async { Json(reply::Done::OK) }))
        .merge(personal)
        .nest("/api/content", content::router())
        .merge(panel::router());
    // A span per routed request, only when telemetry is on.
    let routes = match gateway_telemetry::get() {
        Some(_) => routes.route_layer(axum::middleware::from_fn(trace::span)),
        None => routes,
    };
    routes
        .fallback(|| async { SiteError::NotFound.into_response() })
        .with_state(state)
}

/// Counts sign-in attempts by step and outcome for the metrics (`ok`, `rejected` for 4xx,
/// `failed` for 5xx). Only POSTs are attempts; the session and config reads are not.
async fn count_signin(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let step = (req.method() == axum::http::Method::POST).then(|| {
        req.uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string()
    });
    let resp = next.run(req).await;
    if let Some(step) = step {
        let step = match step.as_str() {
            "request-code" | "resend-code" | "verify-code" | "verify-link" | "signout" => step,
            _ => "other".to_string(),
        };
        gateway_core::metrics::signin(&step, outcome(resp.status()));
    }
    resp
}

/// Serves the router on a Unix socket until the process exits.
pub async fn serve_uds(state: SharedState, path: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    tokio::spawn(auth::purge_loop(state.clone()));
    tokio::spawn(payment::expire_loop(state.clone()));
    axum::serve(listener, router(state)).await
}
