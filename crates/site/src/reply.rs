//! How the site answers: JSON bodies from `Serialize` response types with the site's content
//! type, cookies, and the one layer that marks every API answer private.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The content type of every JSON answer of the site.
const JSON: &str = "application/json; charset=utf-8";

/// `body` as a JSON answer with `status`. Serializing a response type cannot fail (no maps with
/// non-string keys, no failing `Serialize` impls); if it ever did, the answer is a bare 500.
pub fn json(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut resp = (status, bytes).into_response();
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
            resp
        }
        Err(e) => {
            log::error!("site answer not serializable: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A 200 JSON answer of a response type: what handlers return.
pub struct Reply<T>(pub T);

impl<T: Serialize> IntoResponse for Reply<T> {
    fn into_response(self) -> Response {
        json(StatusCode::OK, &self.0)
    }
}

/// `{ok: true}` and nothing else.
#[derive(Serialize)]
pub struct Done {
    pub ok: bool,
}

impl Done {
    pub const OK: Done = Done { ok: true };
}

/// A response with `Set-Cookie` lines appended.
pub fn with_cookies(
    resp: impl IntoResponse,
    cookies: impl IntoIterator<Item = HeaderValue>,
) -> Response {
    let mut resp = resp.into_response();
    for c in cookies {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    resp
}

/// What the one layer over the API routers (`site::router`) does to every answer, errors and
/// framework rejections included: each is personal, so it is never cached, and it varies with
/// the cookie and the origin the checks looked at.
pub async fn private_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Origin, Cookie"));
    resp
}
