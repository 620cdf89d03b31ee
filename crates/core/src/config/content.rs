//! `[content]`: operator-provided pages.

use std::path::PathBuf;

use super::file::ContentFile;

#[derive(Debug, Clone)]
pub struct ContentConfig {
    pub tos_path: Option<PathBuf>,
}

pub(super) fn validate(f: ContentFile) -> ContentConfig {
    ContentConfig {
        tos_path: f.tos_path.filter(|s| !s.is_empty()).map(PathBuf::from),
    }
}
