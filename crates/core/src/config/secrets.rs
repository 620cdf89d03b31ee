//! `[secrets]`: where the generated secrets live.

use std::path::PathBuf;

use super::file::SecretsFile;

#[derive(Debug, Clone)]
pub struct SecretsConfig {
    pub dev_generate: bool,
    pub dir: PathBuf,
}

pub(super) fn validate(f: SecretsFile) -> SecretsConfig {
    SecretsConfig {
        dev_generate: f.dev_generate.unwrap_or(false),
        dir: PathBuf::from(f.dir.unwrap_or_else(|| "data".into())),
    }
}
