//! The co-hosted account service (axum): `/api/auth`, `/api/account`, `/api/payment`,
//! `/api/content`. Pingora's site listener proxies to it over a private Unix socket, so it
//! shares the edge (and its graceful restarts) without a second public port.

pub mod account;
pub mod auth;
pub mod captcha;
pub mod content;
pub mod csrf;
pub mod error;
pub mod mail;
pub mod panel;
pub mod payment;
pub mod session;
pub mod twofactor;

use std::path::Path;

use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::state::SharedState;
use error::SiteError;

/// Every site route, merged in one place.
pub fn router(state: SharedState) -> Router {
    Router::new()
        .route(
            "/health",
            get(|| async { Json(serde_json::json!({"ok": true})) }),
        )
        .nest("/api/auth", auth::router())
        .nest("/api/payment", payment::router())
        .nest("/api/content", content::router())
        .nest("/api/account", account::router())
        .merge(panel::router())
        .fallback(|| async { SiteError::NotFound.into_response() })
        .with_state(state)
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
