//! Why the CPU home cannot load a model.

use resin_core::HomeError;

/// Why the CPU home cannot load or run a model.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error(transparent)]
    Gguf(#[from] resin_gguf::GgufError),
    #[error("model: {0}")]
    Model(String),
}

impl From<CpuError> for HomeError {
    fn from(e: CpuError) -> Self {
        HomeError::Unsupported(e.to_string())
    }
}
