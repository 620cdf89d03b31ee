//! The mock's state: its settings, the requests it recorded, its counters, the failures
//! scripted for it, and the control endpoints (`/__mock/...`) that read and set them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::reply::{error_value, Reply};
use crate::request::Route;
use crate::tls;

/// Recorded bodies above this size are kept only as length + digest.
pub(crate) const MAX_RECORDED_BODY: usize = 1024 * 1024;

/// Settings the request handlers need, derived once from the CLI.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) chunks: usize,
    pub(crate) chunk_delay: Duration,
    pub(crate) latency: Duration,
    pub(crate) record: bool,
    pub(crate) fixtures: Option<std::path::PathBuf>,
    /// The credentials the clouds' paths check.
    pub(crate) clouds: crate::cloud::CloudCredentials,
}

/// One recorded request, as returned by `GET /__mock/requests`.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Record {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: Option<String>,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) body_len: usize,
    pub(crate) body_sha256: String,
    pub(crate) body: Option<String>,
    pub(crate) served_at_ms: u64,
}

/// Shared server state: configuration, request log and counters.
pub(crate) struct State {
    pub(crate) config: Config,
    pub(crate) records: Mutex<Vec<Record>>,
    pub(crate) served: AtomicU64,
    /// Connections accepted: tests check that the gateway reuses its provider connections.
    pub(crate) connections: AtomicU64,
    pub(crate) by_path: Mutex<HashMap<String, u64>>,
    /// Failures scripted through `/__mock/fail`, served before anything else.
    pub(crate) scripted: Mutex<Option<Scripted>>,
    /// The access tokens `POST /token` issued.
    pub(crate) google_tokens: crate::cloud::oauth::Tokens,
}

/// `POST /__mock/fail {"status":500,"count":1,"retry_after":2}`: the next `count` model
/// requests (default 1) are answered with `status`, with `retry-after: <retry_after>` when given;
/// `DELETE /__mock/fail` cancels. Lets a test make a provider fail a set number of times.
#[derive(Deserialize, Debug, Clone, Copy)]
pub(crate) struct Scripted {
    pub(crate) status: u16,
    #[serde(default = "one")]
    pub(crate) count: u64,
    pub(crate) retry_after: Option<u64>,
}

pub(crate) fn one() -> u64 {
    1
}

/// Lock a mutex even if a panicking thread poisoned it: the data (a log and
/// counters) stays usable and a mock must keep answering.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    pub(crate) fn new(config: Config) -> Self {
        State {
            config,
            records: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            by_path: Mutex::new(HashMap::new()),
            scripted: Mutex::new(None),
            google_tokens: Default::default(),
        }
    }

    /// The scripted failure for this request, if one is left.
    pub(crate) fn take_scripted(&self) -> Option<Scripted> {
        let mut scripted = lock(&self.scripted);
        let s = (*scripted)?;
        *scripted = (s.count > 1).then_some(Scripted {
            count: s.count - 1,
            ..s
        });
        Some(s)
    }

    /// Count an answered model request; called right before hyper writes the
    /// response head so cut streams are counted too.
    pub(crate) fn count_served(&self, path: &str) {
        self.served.fetch_add(1, Ordering::Relaxed);
        let mut by_path = lock(&self.by_path);
        match by_path.get_mut(path) {
            Some(n) => *n += 1,
            None => {
                by_path.insert(path.to_owned(), 1);
            }
        }
    }

    pub(crate) fn stats_json(&self) -> Value {
        let by_path = lock(&self.by_path).clone();
        json!({
            "served": self.served.load(Ordering::Relaxed),
            "connections": self.connections.load(Ordering::Relaxed),
            "by_path": by_path,
            "tls_server_names": tls::server_names(),
            "google_tokens_issued": self.google_tokens.count(),
        })
    }
}

pub(crate) fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn header_map(headers: &http::HeaderMap) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        out.entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    out
}

pub(crate) fn make_record(parts: &http::request::Parts, body: &Bytes, served_at_ms: u64) -> Record {
    let text = if body.len() <= MAX_RECORDED_BODY {
        std::str::from_utf8(body).ok().map(str::to_owned)
    } else {
        None
    };
    Record {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers: header_map(&parts.headers),
        body_len: body.len(),
        body_sha256: hex::encode(Sha256::digest(body)),
        body: text,
        served_at_ms,
    }
}

pub(crate) fn control_reply(route: Route, method: &Method, body: &[u8], state: &State) -> Reply {
    match (route, method) {
        (Route::MockFail, &Method::DELETE) => {
            *lock(&state.scripted) = None;
            Reply::ok(&json!({ "ok": true }))
        }
        (Route::MockFail, _) => match serde_json::from_slice::<Scripted>(body) {
            Ok(s) if StatusCode::from_u16(s.status).is_ok_and(|c| c.as_u16() >= 200) => {
                *lock(&state.scripted) = (s.count > 0).then_some(s);
                Reply::ok(&json!({ "ok": true }))
            }
            _ => Reply::json(
                StatusCode::BAD_REQUEST,
                &error_value(
                    "expected {\"status\":200..599,\"count\":n,\"retry_after\":secs}",
                    "invalid_request_error",
                ),
            ),
        },
        (Route::MockRequests, &Method::DELETE) => {
            lock(&state.records).clear();
            Reply::ok(&json!({ "ok": true }))
        }
        (Route::MockRequests, _) => {
            let records = lock(&state.records);
            match serde_json::to_vec(&*records) {
                Ok(body) => Reply::Json {
                    status: StatusCode::OK,
                    body: Bytes::from(body),
                    retry_after: None,
                },
                Err(_) => Reply::json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &error_value("cannot encode records", "server_error"),
                ),
            }
        }
        // An empty `ExportTraceServiceResponse`: every span accepted.
        (Route::Traces, _) => Reply::Raw {
            status: StatusCode::OK,
            headers: vec![(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-protobuf"),
            )],
            body: Bytes::new(),
        },
        _ => Reply::ok(&state.stats_json()),
    }
}
