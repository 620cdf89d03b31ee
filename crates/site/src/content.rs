//! `/api/content`: public documents for the site (spec §4.5). Today one: the terms of service,
//! `GET /api/content/tos`, from the markdown file named by `content.tos_path`.
//!
//! The markdown is rendered with pulldown-cmark and the HTML sanitised with ammonia (no
//! scripts, event handlers, `javascript:` URLs or other active content), so the panel can insert
//! it as is. The rendered answer is cached and keyed by the file's path, modification time and
//! length: editing the file shows on the next request, and an unchanged file is never
//! rendered twice. Answers may be cached by browsers and proxies for a minute.
//!
//! A missing file (or no `tos_path`) is not an error for the reader: the answer is the empty
//! document, `markdown` and `html` empty and `updatedAt` null, and a warning is logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use parking_lot::Mutex;
use serde::Serialize;

use gateway_core::state::SharedState;
use gateway_core::util::iso;

/// Larger files are not served (a misconfigured path must not fill memory).
const MAX_DOCUMENT: u64 = 4 * 1024 * 1024;
const CACHE_CONTROL: &str = "public, max-age=60";

/// The `/api/content` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new().route("/tos", get(tos))
}

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    path: PathBuf,
    modified: Option<SystemTime>,
    len: u64,
}

/// The last rendered answer and the file version it came from.
struct Rendered {
    stamp: Stamp,
    body: Arc<String>,
}

static TOS: LazyLock<Mutex<Option<Rendered>>> = LazyLock::new(|| Mutex::new(None));

async fn tos(State(state): State<SharedState>) -> Response {
    let path = state.config().content.tos_path.clone();
    let body = document("tos", path.as_deref(), &TOS).await;
    let mut resp = (StatusCode::OK, body.as_str().to_owned()).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL),
    );
    resp
}

/// The JSON answer for `slug`: from the cache when the file is unchanged, else read, rendered,
/// and cached.
async fn document(slug: &str, path: Option<&Path>, cache: &Mutex<Option<Rendered>>) -> Arc<String> {
    let Some(path) = path else {
        return Arc::new(empty(slug));
    };
    let meta = match tokio::fs::metadata(path).await {
        Ok(m) if m.is_file() => m,
        Ok(_) | Err(_) => {
            log::warn!("content {slug}: {} is missing", path.display());
            *cache.lock() = None;
            return Arc::new(empty(slug));
        }
    };
    let stamp = Stamp {
        path: path.to_path_buf(),
        modified: meta.modified().ok(),
        len: meta.len(),
    };
    if let Some(hit) = cache.lock().as_ref().filter(|r| r.stamp == stamp) {
        return hit.body.clone();
    }
    if meta.len() > MAX_DOCUMENT {
        log::warn!("content {slug}: {} is larger than 4 MiB", path.display());
        return Arc::new(empty(slug));
    }
    // Read after the stamp: if the file changes in between, the next request sees a new stamp
    // and renders again, so a stale render never outlives the change.
    let markdown = match tokio::fs::read_to_string(path).await {
        Ok(m) => m,
        Err(e) => {
            log::warn!("content {slug}: cannot read {}: {e}", path.display());
            return Arc::new(empty(slug));
        }
    };
    let updated_at = stamp
        .modified
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .map(iso);
    let body = Arc::new(serialize(&Document {
        ok: true,
        slug,
        html: render(&markdown),
        markdown: &markdown,
        updated_at,
    }));
    *cache.lock() = Some(Rendered {
        stamp,
        body: body.clone(),
    });
    body
}

/// The answer of `GET /api/content/<slug>`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    ok: bool,
    slug: &'a str,
    markdown: &'a str,
    html: String,
    updated_at: Option<String>,
}

fn serialize(doc: &Document<'_>) -> String {
    serde_json::to_string(doc).unwrap_or_default()
}

fn empty(slug: &str) -> String {
    serialize(&Document {
        ok: true,
        slug,
        markdown: "",
        html: String::new(),
        updated_at: None,
    })
}

/// Markdown to safe HTML: CommonMark plus tables, strikethrough and footnotes, then ammonia's
/// default allowlist (links get `rel="noopener noreferrer"`).
pub fn render(markdown: &str) -> String {
    use pulldown_cmark::{html, Options, Parser};
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_FOOTNOTES;
    let mut out = String::with_capacity(markdown.len() * 3 / 2);
    html::push_html(&mut out, Parser::new_ext(markdown, opts));
    ammonia::clean(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_markdown_is_defused() {
        let html = render(
            "# T\n\n<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n\
             [click](javascript:alert(3)) <a href=\"javascript:alert(4)\">x</a>\n\n**ok**",
        );
        assert!(html.contains("<h1>T</h1>"), "{html}");
        assert!(html.contains("<strong>ok</strong>"), "{html}");
        for bad in ["<script", "alert(1)", "onerror", "javascript:"] {
            assert!(!html.contains(bad), "{bad} in {html}");
        }
    }
}
