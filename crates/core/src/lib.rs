//! The gateway's core: the domain words, the config model and its validation, storage, quota,
//! identity and the other services both front ends (the developer API and the account
//! service) share. It depends on neither of them.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod apikey;
pub mod config;
pub mod credential_mask;
pub mod domain;
pub mod identity;
pub mod journal;
pub mod logging;
pub mod metrics;
pub mod pricing;
pub mod quota;
pub mod response_items;
pub mod secrets;
pub mod state;
pub mod storage;
pub mod usage;
pub mod util;
