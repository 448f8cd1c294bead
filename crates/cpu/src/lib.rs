//! The CPU home: every model and format resin serves, the parity oracle for the GPU, and the
//! home that serves whatever the GPU declines.
//!
//! One pass ([`forward`]) serves both the token command (rows of different sessions) and the
//! prefill window chain (segments): a row is (region, position, token) either way, so N rows
//! and one row run the same code and give bit-identical results.

mod attention;
mod error;
mod forward;
mod home;
pub mod kernels;
mod kv;
mod moe;
mod ops;
mod weights;

pub use error::CpuError;
pub use home::{CpuHome, CpuOptions};
pub use kv::KvCache;
pub use moe::route;
pub use weights::PackProgress;
