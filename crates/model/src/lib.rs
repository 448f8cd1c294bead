//! What a GGUF file says about its model: the architecture and its hyperparameters, the
//! tensor names a forward pass reads, the tokenizer and the chat template.

mod config;
mod error;
pub mod chat;
pub mod tokenizer;

pub use config::{Arch, LayerNames, ModelConfig, RopeStyle, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
pub use chat::ChatTemplate;
pub use error::{ModelError, Result};
pub use tokenizer::{StreamDecoder, TokenType, Tokenizer};

