//! The quality meter: how well a model, a format or a home predicts a text.
//!
//! - [`Plan`]: the windows `llama-perplexity` cuts a tokenized text into (n_ctx tokens each, BOS
//!   in the first slot where the model adds one, the second half of each window scored).
//! - [`Meter`]: the running sums: perplexity, and against a base, the KL divergence and the
//!   top-1 agreement ([`kl_divergence`] says how KL is taken from a top-64 base).
//! - [`BaseFile`]: the saved base (each scored position's 64 largest logits and its
//!   log-sum-exp), a small versioned binary file whose header names the model and the tokens,
//!   so that a base of another text, context or vocabulary is refused.
//! - [`evaluate`]: the whole measurement over any [`resin_core::Home`].

mod base;
mod eval;
mod meter;
mod plan;

pub use base::{BaseFile, BaseHeader, BASE_MAGIC, BASE_VERSION};
pub use eval::{evaluate, Evaluation};
pub use meter::{kl_divergence, percentile, token_nll, Meter, Report, TopRecord};
pub use plan::Plan;

/// Why a measurement cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    #[error("a context of {ctx} leaves no position to score (it takes at least 3)")]
    ContextTooSmall { ctx: usize },
    #[error("the text tokenizes to {tokens} tokens; a context of {ctx} needs at least {} (two windows)", 2 * ctx)]
    TextTooShort { tokens: usize, ctx: usize },
    #[error("--chunks must be at least 1")]
    NoChunks,
    #[error("token id {token} is outside the model's vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("a logits row has {got} values, the vocabulary {vocab}")]
    BadRow { got: usize, vocab: usize },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}")]
    BadBase(String),
    #[error("the base does not match this run: {0}")]
    BaseMismatch(String),
    #[error(transparent)]
    Home(#[from] resin_core::HomeError),
}

pub type Result<T> = std::result::Result<T, QualityError>;
