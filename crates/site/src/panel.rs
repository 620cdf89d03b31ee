//! The first-party web panel (`/panel/*`): a few static pages embedded in the binary (plain
//! HTML, CSS and one ES module, no build step, no third-party hosts) that talk only to the
//! account, auth, payment and content APIs, plus `POST /panel/qr`, which draws a QR code as SVG
//! (the two-factor `otpauth://` URL, the VietQR transfer payload) so no image ever comes from
//! elsewhere.
//!
//! `/` redirects to `/panel`, so the site's own address opens the panel; any other `/panel/…`
//! path answers the panel's own "page not found" page (HTML, 404), not the API's JSON.
//!
//! Every panel answer carries a strict Content-Security-Policy (no inline script or style),
//! `nosniff` and `no-referrer`. Pages are `no-store`; assets are cacheable for five minutes.

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use qrcode::render::svg;
use qrcode::{EcLevel, QrCode};
use serde_json::Value;

use crate::error::SiteError;
use crate::extract::Mutation;
use gateway_core::state::SharedState;

/// The policy of every panel response.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
form-action 'self'";

/// Longest text `POST /panel/qr` encodes.
pub const QR_MAX_CHARS: usize = 1024;
const QR_BODY_LIMIT: usize = 8 * 1024;

const SHELL: &str = include_str!("../assets/panel/index.html");
const APP_JS: &str = include_str!("../assets/panel/app.js");
const PANEL_CSS: &str = include_str!("../assets/panel/panel.css");
const ICON_SVG: &str = include_str!("../assets/panel/icon.svg");

/// Every page of the panel is the same shell; `app.js` renders the page for the path.
const PAGES: [&str; 9] = [
    "/panel",
    "/panel/",
    "/panel/signin",
    "/panel/keys",
    "/panel/usage",
    "/panel/security",
    "/panel/billing",
    "/panel/terms",
    "/panel/account",
];

/// The shell's placeholder, which the 404 page replaces with its message.
const LOADING: &str = r#"<p class="muted">Loading…</p>"#;

/// The shell with a "page not found" message in place of the loading line, so it reads right
/// before (and without) the script; `app.js` keeps it for paths it does not know.
static NOT_FOUND_PAGE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    SHELL.replace(
        LOADING,
        r#"<section class="card" id="not-found"><h1>Page not found</h1><p>There is no panel page at this address.</p><p><a href="/panel">Go to the panel</a></p></section>"#,
    )
});

/// The `/panel` routes and the `/` redirect; `site::router` merges them.
pub fn router() -> Router<SharedState> {
    let mut r = Router::new();
    for page in PAGES {
        r = r.route(page, get(shell));
    }
    r.route("/", get(|| async { Redirect::temporary("/panel") }))
        .route("/panel/{*rest}", get(not_found))
        .route(
            "/panel/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/panel/assets/panel.css",
            get(|| async { asset("text/css; charset=utf-8", PANEL_CSS) }),
        )
        .route(
            "/panel/assets/icon.svg",
            get(|| async { asset("image/svg+xml", ICON_SVG) }),
        )
        .route(
            "/panel/qr",
            post(qr).layer(DefaultBodyLimit::max(QR_BODY_LIMIT)),
        )
        .layer(map_response(security_headers))
}

/// CSP and friends on every panel answer, errors included.
async fn security_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

async fn shell() -> Response {
    let mut resp = (StatusCode::OK, SHELL).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn not_found() -> Response {
    let mut resp = (StatusCode::NOT_FOUND, NOT_FOUND_PAGE.as_str()).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    resp
}

/// `POST /panel/qr {text}`: the QR code of `text` as SVG. Needs a session, the same origin and
/// the CSRF token, like any mutation, so it cannot be used as a free QR service.
async fn qr(Mutation { body, .. }: Mutation) -> Result<Response, SiteError> {
    let text = body
        .get("text")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty() && t.chars().count() <= QR_MAX_CHARS)
        .ok_or(SiteError::InvalidText)?;
    let svg = qr_svg(text).ok_or(SiteError::InvalidText)?;
    let mut resp = (StatusCode::OK, svg).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("image/svg+xml"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// The QR code of `text` as a standalone SVG document (medium error correction, quiet zone
/// included), or `None` when the text does not fit in a QR code.
pub fn qr_svg(text: &str) -> Option<String> {
    let code = QrCode::with_error_correction_level(text.as_bytes(), EcLevel::M).ok()?;
    Some(
        code.render::<svg::Color<'_>>()
            .min_dimensions(220, 220)
            .dark_color(svg::Color("#111827"))
            .light_color(svg::Color("#ffffff"))
            .quiet_zone(true)
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qr_is_svg() {
        let s = qr_svg("otpauth://totp/Gateway:a@b.c?secret=JBSWY3DPEHPK3PXP").unwrap_or_default();
        assert!(s.contains("<svg"), "{s}");
        assert!(s.contains("<path"), "{s}");
        assert!(qr_svg(&"x".repeat(5000)).is_none());
    }

    #[test]
    fn not_found_page_replaces_the_loading_line() {
        assert!(SHELL.contains(LOADING));
        assert!(NOT_FOUND_PAGE.contains(r#"id="not-found""#));
        assert!(!NOT_FOUND_PAGE.contains(LOADING));
    }

    #[test]
    fn csp_is_strict() {
        assert!(!CSP.contains("unsafe"));
        assert!(CSP.contains("frame-ancestors 'none'"));
    }
}
