//! The GGUF container and the ggml block formats.
//!
//! Everything read from a file is checked before use: a truncated, corrupt or hostile file
//! gives a [`GgufError`] that names what is wrong, never a panic, an out-of-bounds read or an
//! allocation sized by an unchecked field.

mod cut;
mod error;
pub mod formats;
mod reader;
pub mod synthetic;
mod types;
mod value;
mod writer;

pub use cut::write_first_blocks;
pub use error::{GgufError, Result};
pub use reader::{GgufFile, TensorInfo, MAX_ARRAY_ELEMENTS};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use writer::GgufWriter;

/// "GGUF" as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's maximum tensor rank.
pub const MAX_DIMS: usize = 4;
