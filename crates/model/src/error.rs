//! Why a model cannot be read.

/// Why a model file's architecture, metadata, tokenizer or template cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] resin_gguf::GgufError),
    #[error("unsupported architecture {0:?} (resin runs llama, qwen2, qwen3, qwen3moe and gemma3)")]
    UnsupportedArch(String),
    #[error("model metadata: {0}")]
    Invalid(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;
