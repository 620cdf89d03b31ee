//! LLM gateway with an account service.
//!
//! A Pingora edge runs developer traffic (`proxy`) and carries site traffic to a co-hosted axum
//! account service (`site`). Both meet only in `storage`, `quota`, `identity` and `config`.

pub mod accesslog;
pub mod admin;
pub mod affinity;
pub mod apikey;
pub mod cli;
pub mod config;
pub mod conn_limits;
pub mod domain;
pub mod edge;
pub mod error;
pub mod identity;
pub mod journal;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod quota;
pub mod ready;
pub mod secrets;
pub mod site;
pub mod state;
pub mod storage;
pub mod translate;
pub mod usage;
pub mod util;
pub mod views;
