//! Why the CPU home cannot load a model, and why a weight matrix has no kernel.

use resin_core::HomeError;
use resin_gguf::GgmlType;

/// Why the CPU home cannot load or run a model.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error(transparent)]
    Gguf(#[from] resin_gguf::GgufError),
    #[error("model: {0}")]
    Model(String),
    #[error("kernel: {0}")]
    Kernel(#[from] KernelError),
}

impl From<CpuError> for HomeError {
    fn from(e: CpuError) -> Self {
        HomeError::Unsupported(e.to_string())
    }
}

/// Why a weight matrix cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// The format has no kernel (Q8_1 and Q8_K are activation formats).
    Unsupported(GgmlType),
    /// `cols` is not a whole number of blocks of the format.
    PartialBlock { ty: GgmlType, cols: usize },
    /// The data length does not match `rows x cols` of the format.
    WrongByteLength { ty: GgmlType, rows: usize, cols: usize, got: usize, expected: usize },
    /// A SIMD path this machine cannot run.
    Unavailable(&'static str),
    /// Activations, weights or outputs of shapes that do not fit together.
    Shape(String),
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelError::Unsupported(ty) => write!(f, "no matmul kernel for {ty} weights"),
            KernelError::PartialBlock { ty, cols } => write!(f, "{cols} columns is not a whole number of {ty} blocks ({} values)", ty.block_len()),
            KernelError::WrongByteLength { ty, rows, cols, got, expected } => write!(f, "{ty} matrix {rows} x {cols} needs {expected} bytes, got {got}"),
            KernelError::Unavailable(simd) => write!(f, "SIMD path {simd} is not available on this machine"),
            KernelError::Shape(what) => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for KernelError {}
