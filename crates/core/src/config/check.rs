//! The shape of every configuration error: the file, the key, the problem.

use std::fmt;

/// A configuration problem: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Collects errors with the file name so every message has the same shape.
pub(super) struct Checker {
    pub(super) file: String,
}

impl Checker {
    pub(super) fn err(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            key: key.into(),
            message: message.into(),
        }
    }
}
