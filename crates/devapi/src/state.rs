//! The developer API's state: the services both front ends share, plus what only the request
//! path holds (the tokenizer, the upstream connections, the deployments' health).

use std::ops::Deref;
use std::sync::Arc;

use crate::cloud::TokenCache;
use crate::routing::Routing;
use crate::tokens::TokenCounter;
use crate::upstream::UpstreamPool;
use gateway_core::state::{AppState, SharedState};

pub struct ApiState {
    pub shared: SharedState,
    pub tokens: Arc<TokenCounter>,
    pub upstreams: UpstreamPool,
    pub routing: Routing,
    /// Vertex AI access tokens, per service account.
    pub google_tokens: TokenCache,
}

/// The shared services are read through the API state as if they were its own fields.
impl Deref for ApiState {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.shared
    }
}

pub type SharedApiState = Arc<ApiState>;
