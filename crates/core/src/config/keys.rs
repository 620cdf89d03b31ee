//! `[keys]`: how many API keys an account holds and rotates.

use super::file::KeysFile;

#[derive(Debug, Clone)]
pub struct KeysConfig {
    pub max_active_per_account: u32,
    pub rotations_per_hour: u32,
}

pub(super) fn validate(f: KeysFile) -> KeysConfig {
    KeysConfig {
        max_active_per_account: f.max_active_per_account.unwrap_or(5).max(1),
        rotations_per_hour: f.rotations_per_hour.unwrap_or(10).max(1),
    }
}
