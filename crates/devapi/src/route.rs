//! The developer-API surface: which paths exist, the style-B aliases, and which scope each
//! endpoint needs. Runs before the nine checks (CONTRACT §3).

/// An allowlisted developer endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Models,
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
            Endpoint::Models | Endpoint::ModelInfo => "models",
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
        matches!(self, Endpoint::Models | Endpoint::ModelInfo)
    }

    /// Endpoints whose body must name a `model`.
    pub fn needs_model(self) -> bool {
        !matches!(
            self,
            Endpoint::Models | Endpoint::ModelInfo | Endpoint::Search | Endpoint::WebFetch
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

    pub const ALL: [Endpoint; 11] = [
        Endpoint::Models,
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
    let style_b = path.starts_with("/alt") || norm.starts_with("/v1/messages");
    let endpoint = Endpoint::ALL.into_iter().find(|e| e.path() == norm);
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
}
