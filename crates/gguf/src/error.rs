use crate::GgmlType;

pub type Result<T> = std::result::Result<T, GgufError>;

/// What is wrong with a GGUF file (or a request made of it). Each variant names the field.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("i/o error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file (magic {0:#010x}, expected 0x46554747 \"GGUF\")")]
    BadMagic(u32),
    #[error("unsupported GGUF version {0} (resin reads v2 and v3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: {what} needs {need} bytes at offset {offset}, file has {len}")]
    Truncated { what: String, offset: u64, need: u64, len: u64 },
    #[error("{what}: count {count} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge { what: String, count: u64, remaining: u64 },
    #[error("{what}: string is not valid UTF-8")]
    BadUtf8 { what: String },
    #[error("{what}: unknown metadata value type {ty}")]
    BadValueType { what: String, ty: u32 },
    #[error("metadata arrays nested deeper than {0} levels")]
    NestingTooDeep(usize),
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("metadata key {key:?}: {problem}")]
    BadMetadata { key: String, problem: String },
    #[error("tensor {name:?}: unknown or unsupported ggml type id {ty}")]
    UnknownTensorType { name: String, ty: u32 },
    #[error("tensor {name:?}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("no tensor named {0:?}")]
    MissingTensor(String),
    #[error("{ty:?}: {len} values is not a whole number of blocks of {block}")]
    PartialBlock { ty: GgmlType, len: usize, block: usize },
    #[error("{ty:?}: buffer of {got} bytes, expected {expected}")]
    WrongByteLength { ty: GgmlType, got: usize, expected: usize },
    #[error("format {0:?} cannot be quantized to (only dequantized)")]
    NoQuantizer(GgmlType),
}
