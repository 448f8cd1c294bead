//! What a GGUF file says about its model: the architecture and its hyperparameters, the
//! tensor names a forward pass reads, the tokenizer and the chat template.

pub mod chat;
mod config;
mod error;
pub mod tokenizer;

pub use chat::ChatTemplate;
pub use config::{Arch, FfnAct, LayerNames, ModelConfig, Moe, RopeStyle, SlidingWindow, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
pub use error::{ModelError, Result};
pub use tokenizer::{StreamDecoder, TokenType, Tokenizer};
