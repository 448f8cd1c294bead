//! What a GGUF file says about its model: the architecture and its hyperparameters, the
//! tensor names a forward pass reads, the tokenizer and the chat template.

mod config;
pub mod chat;
pub mod tokenizer;

pub use config::{Arch, LayerNames, ModelConfig, RopeStyle, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
pub use chat::ChatTemplate;
pub use tokenizer::{StreamDecoder, TokenType, Tokenizer};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] resin_gguf::GgufError),
    #[error("unsupported architecture {0:?} (resin runs llama, qwen2 and qwen3)")]
    UnsupportedArch(String),
    #[error("model metadata: {0}")]
    Invalid(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;
