//! What a home refuses, and how it fails.

use crate::RegionId;

/// Why a home refused or failed a call.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error("region {0:?} does not exist (this home has {1} regions)")]
    NoSuchRegion(RegionId, usize),
    #[error("position {pos} is past the context length {n_ctx}")]
    ContextFull { pos: usize, n_ctx: usize },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("a step takes 1..={max} rows, got {got}")]
    BadRowCount { got: usize, max: usize },
    #[error("a step of {rows} rows needs one Need a row, got {needs}")]
    BadNeeds { needs: usize, rows: usize },
    #[error("empty prefill segment for region {0:?}")]
    EmptySegment(RegionId),
    #[error("a saved K/V snapshot does not fit: {0}")]
    BadSnapshot(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("device error: {0}")]
    Device(String),
    /// The home's device failed mid-run (lost, out of memory, a submission that never
    /// finished): the home cannot run again, and every later call would fail the same way.
    #[error("the device failed: {0}")]
    DeviceLost(String),
}

pub type Result<T> = std::result::Result<T, HomeError>;
