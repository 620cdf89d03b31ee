//! The developer-API surface: which paths exist, the style-B aliases, and which scope each
//! endpoint needs. Runs before the nine checks (CONTRACT §3).

/// An allowlisted developer endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Models,
    /// `GET /v1/models/{id}`: one model; the id is the rest of the path ([`model_id`]).
    Model,
    ModelInfo,
    ChatCompletions,
    Responses,
    Messages,
    CountTokens,
    Embeddings,
    Images,
    Speech,
    Search,
    WebFetch,
}

impl Endpoint {
    /// The scope name that grants this endpoint (CONTRACT §3).
    pub fn scope(self) -> &'static str {
        match self {
            Endpoint::Models | Endpoint::Model | Endpoint::ModelInfo => "models",
            Endpoint::ChatCompletions => "chat",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Images => "images",
            Endpoint::Speech => "audio",
            Endpoint::Search => "search",
            Endpoint::WebFetch => "web_fetch",
        }
    }

    /// The canonical path under `/v1`, also the path appended to a provider's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Models => "/v1/models",
            Endpoint::Model => "/v1/models/{model}",
            Endpoint::ModelInfo => "/v1/model/info",
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Images => "/v1/images/generations",
            Endpoint::Speech => "/v1/audio/speech",
            Endpoint::Search => "/v1/search",
            Endpoint::WebFetch => "/v1/web/fetch",
        }
    }

    pub fn is_get(self) -> bool {
        matches!(
            self,
            Endpoint::Models | Endpoint::Model | Endpoint::ModelInfo
        )
    }

    /// Endpoints whose body must name a `model` (a retrieval names it in its path).
    pub fn needs_model(self) -> bool {
        !matches!(
            self,
            Endpoint::Models
                | Endpoint::Model
                | Endpoint::ModelInfo
                | Endpoint::Search
                | Endpoint::WebFetch
        )
    }

    /// Endpoints that generate output (and so reserve output tokens).
    pub fn generates(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions | Endpoint::Responses | Endpoint::Messages
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Models => "models",
            Endpoint::Model => "model",
            Endpoint::ModelInfo => "model_info",
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Images => "images",
            Endpoint::Speech => "speech",
            Endpoint::Search => "search",
            Endpoint::WebFetch => "web_fetch",
        }
    }

    pub const ALL: [Endpoint; 12] = [
        Endpoint::Models,
        Endpoint::Model,
        Endpoint::ModelInfo,
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::Embeddings,
        Endpoint::Images,
        Endpoint::Speech,
        Endpoint::Search,
        Endpoint::WebFetch,
    ];
}

/// All scope names a key may carry.
pub const SCOPES: [&str; 11] = [
    "*",
    "models",
    "chat",
    "responses",
    "messages",
    "count_tokens",
    "embeddings",
    "images",
    "audio",
    "search",
    "web_fetch",
];

pub fn is_known_scope(s: &str) -> bool {
    SCOPES.contains(&s)
}

/// Where a request goes, decided from method and path alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /` and `GET /health`: `{ok:true}`, no key, touches nothing (liveness).
    Health,
    /// `GET /ready`: the database and Redis answer (readiness, CONTRACT §1), no key.
    Ready,
    /// Outside `/v1/*` and the `/alt` aliases.
    NotFound,
    /// Under the public surface. `endpoint` is `None` for a path that is not allowlisted
    /// (answered `endpoint_not_enabled` after the key checks); `method_ok` is false when the
    /// path exists but not for this method.
    Api {
        endpoint: Option<Endpoint>,
        method_ok: bool,
        /// Style B (`/v1/messages…`, `/alt…`): errors carry the top-level `"type":"error"`.
        style_b: bool,
    },
}

/// Normalizes the style-B aliases (whole segments only: `/altogether` is not one).
fn normalize(path: &str) -> Option<String> {
    if path == "/alt" || path == "/alt/" {
        return Some("/v1/messages".into());
    }
    if let Some(rest) = path.strip_prefix("/alt/") {
        if rest.starts_with("v1/") || rest == "v1" {
            return Some(format!("/{rest}"));
        }
        if rest == "messages" || rest.starts_with("messages/") {
            return Some(format!("/v1/{rest}"));
        }
        return None;
    }
    if path == "/v1" || path.starts_with("/v1/") {
        return Some(path.to_string());
    }
    None
}

/// The still-encoded id of a normalized retrieval path (`/v1/models/{id}`), when it names one.
fn retrieved_id(norm: &str) -> Option<&str> {
    norm.strip_prefix("/v1/models/").filter(|id| !id.is_empty())
}

/// The model id a retrieval path names (`/v1/models/{id}`, `/alt/v1/models/{id}`), decoded: SDKs
/// send an id such as `openai/gpt-4o` percent-encoded (`openai%2Fgpt-4o`), other clients with
/// the slash as it is; both name the same model. An id that is not UTF-8 once decoded keeps
/// replacement characters, so it names no model.
pub fn model_id(raw_path: &str) -> Option<String> {
    let path = raw_path.split('?').next().unwrap_or("");
    let norm = normalize(path)?;
    let id = retrieved_id(&norm)?;
    Some(
        percent_encoding::percent_decode_str(id)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// Whether a path is a style-B one (`/alt…` as whole segments, `/v1/messages…`), whatever it
/// routes to: its answers, a 404 included, take style B's shape and headers.
pub fn style_b_path(raw_path: &str) -> bool {
    let path = raw_path.split('?').next().unwrap_or("");
    path == "/alt"
        || path.starts_with("/alt/")
        || path == "/v1/messages"
        || path.starts_with("/v1/messages/")
}

pub fn classify(method: &str, raw_path: &str) -> Route {
    let path = raw_path.split('?').next().unwrap_or("");
    if (path == "/" || path == "/health") && (method == "GET" || method == "HEAD") {
        return Route::Health;
    }
    if path == "/ready" && (method == "GET" || method == "HEAD") {
        return Route::Ready;
    }
    // Agents (Claude Code) check that their base URL answers with a keyless HEAD before the
    // first request; the bare API bases are liveness probes for them.
    if method == "HEAD"
        && matches!(
            path,
            "/v1" | "/v1/" | "/alt" | "/alt/" | "/alt/v1" | "/alt/v1/"
        )
    {
        return Route::Health;
    }
    let Some(norm) = normalize(path) else {
        return Route::NotFound;
    };
    let style_b = style_b_path(path);
    let endpoint = if retrieved_id(&norm).is_some() {
        Some(Endpoint::Model)
    } else {
        Endpoint::ALL.into_iter().find(|e| e.path() == norm)
    };
    let method_ok = match endpoint {
        Some(e) if e.is_get() => method == "GET",
        Some(_) => method == "POST",
        None => true,
    };
    Route::Api {
        endpoint,
        method_ok,
        style_b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(method: &str, p: &str) -> Option<Endpoint> {
        match classify(method, p) {
            Route::Api { endpoint, .. } => endpoint,
            _ => None,
        }
    }

    #[test]
    fn aliases() {
        assert_eq!(ep("POST", "/alt"), Some(Endpoint::Messages));
        assert_eq!(ep("POST", "/alt/v1/messages"), Some(Endpoint::Messages));
        assert_eq!(
            ep("POST", "/alt/v1/messages/count_tokens"),
            Some(Endpoint::CountTokens)
        );
        assert_eq!(ep("POST", "/alt/messages"), Some(Endpoint::Messages));
        assert_eq!(
            ep("POST", "/alt/messages/count_tokens"),
            Some(Endpoint::CountTokens)
        );
        assert_eq!(classify("POST", "/altogether"), Route::NotFound);
        assert_eq!(classify("POST", "/alt/other"), Route::NotFound);
    }

    #[test]
    fn surface() {
        assert_eq!(classify("GET", "/"), Route::Health);
        assert_eq!(classify("GET", "/health?x=1"), Route::Health);
        assert_eq!(classify("GET", "/ready"), Route::Ready);
        assert_eq!(classify("POST", "/ready"), Route::NotFound);
        for base in ["/v1", "/alt", "/alt/", "/alt/v1/"] {
            assert_eq!(classify("HEAD", base), Route::Health, "{base}");
        }
        assert_eq!(ep("POST", "/alt"), Some(Endpoint::Messages));
        assert_eq!(ep("HEAD", "/v1/models"), Some(Endpoint::Models));
        assert_eq!(classify("GET", "/v2/models"), Route::NotFound);
        assert_eq!(
            classify("POST", "/v1/files"),
            Route::Api {
                endpoint: None,
                method_ok: true,
                style_b: false
            }
        );
        assert_eq!(ep("GET", "/v1/models?x=1"), Some(Endpoint::Models));
        assert!(matches!(
            classify("GET", "/v1/chat/completions"),
            Route::Api {
                method_ok: false,
                ..
            }
        ));
        assert!(matches!(
            classify("POST", "/v1/messages"),
            Route::Api { style_b: true, .. }
        ));
    }

    #[test]
    fn model_retrieval_paths() {
        assert_eq!(ep("GET", "/v1/models/mock-gpt"), Some(Endpoint::Model));
        assert_eq!(ep("GET", "/alt/v1/models/claude"), Some(Endpoint::Model));
        assert!(matches!(
            classify("GET", "/alt/v1/models/claude"),
            Route::Api { style_b: true, .. }
        ));
        assert!(matches!(
            classify("POST", "/v1/models/x"),
            Route::Api {
                endpoint: Some(Endpoint::Model),
                method_ok: false,
                ..
            }
        ));
        assert_eq!(ep("GET", "/v1/models/"), None);
        assert_eq!(ep("GET", "/v1/models"), Some(Endpoint::Models));
        assert_eq!(
            model_id("/v1/models/mock-gpt?x=1").as_deref(),
            Some("mock-gpt")
        );
        assert_eq!(
            model_id("/v1/models/openai%2Fgpt-4o").as_deref(),
            Some("openai/gpt-4o")
        );
        assert_eq!(
            model_id("/alt/v1/models/openai/gpt-4o").as_deref(),
            Some("openai/gpt-4o")
        );
        assert_eq!(
            model_id("/v1/models/llama3%3A8b").as_deref(),
            Some("llama3:8b")
        );
        assert_eq!(model_id("/v1/models/a:b").as_deref(), Some("a:b"));
        assert_eq!(model_id("/v1/models/%FF").as_deref(), Some("\u{fffd}"));
        assert_eq!(model_id("/v1/models"), None);
        assert_eq!(model_id("/v1/chat/completions"), None);
    }

    #[test]
    fn style_b_paths() {
        for p in [
            "/alt",
            "/alt/",
            "/alt/other",
            "/alt/v1/models/x",
            "/v1/messages",
            "/v1/messages/count_tokens?x",
        ] {
            assert!(style_b_path(p), "{p}");
        }
        for p in ["/altogether", "/v1/models", "/v1/messagesx", "/"] {
            assert!(!style_b_path(p), "{p}");
        }
    }
}
