use std::collections::HashMap;
use std::path::Path;

use crate::{GgmlType, GgufError, Result, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};

/// Nested metadata arrays deeper than this are refused (the format allows nesting; no model
/// needs more than one level, and unbounded nesting is a stack-overflow vector).
pub(crate) const MAX_NESTING: usize = 4;

/// The fewest bytes a tensor-table entry takes: 8 (name length) + 4 (rank) + 8 (one dim, rank
/// is at least 1) + 4 (type) + 8 (offset).
const MIN_TENSOR_ENTRY: u64 = 32;

/// The largest `general.alignment` accepted (1 MiB).
pub(crate) const MAX_ALIGNMENT: u64 = 1 << 20;

/// The data alignment a `general.alignment` value asks for, or what is wrong with it: it must be
/// an integer (any integer type; not a bool, float or string) that is a power of two up to 1 MiB.
pub(crate) fn alignment_value(v: &Value) -> std::result::Result<u64, String> {
    let a = match v {
        Value::Bool(_) => None,
        v => v.as_u64(),
    }
    .ok_or_else(|| format!("alignment must be a non-negative integer, found {:?}", v.value_type()))?;
    if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
        return Err(format!("alignment {a} is not a power of two up to 1 MiB"));
    }
    Ok(a)
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the row count, ...
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data (checked: whole blocks, inside the file).
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (values) and row count, treating dims past the first as rows.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (rows, cols)
    }
    pub fn row_bytes(&self) -> usize {
        let (_, cols) = self.rows_cols();
        (cols / self.ty.block_len()) * self.ty.block_bytes()
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: metadata and tensor table read and checked, tensor data mapped.
pub struct GgufFile {
    storage: Storage,
    pub version: u32,
    pub alignment: u64,
    /// Offset of the data section in the file.
    pub data_offset: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile").field("version", &self.version).field("metadata", &self.metadata.len()).field("tensors", &self.tensors.len()).finish()
    }
}

impl GgufFile {
    /// Memory-map and parse a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; resin never writes model files while serving them.
        // A file truncated by another process underneath us is outside what we can defend.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Storage::Mapped(map))
    }

    /// Parse a file held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self> {
        let (version, alignment, data_offset, metadata, tensors) = {
            let mut c = Cursor { buf: storage.bytes(), pos: 0, elements: 0 };
            let magic = c.u32("magic")?;
            if magic != GGUF_MAGIC {
                return Err(GgufError::BadMagic(magic));
            }
            let version = c.u32("version")?;
            if version != 2 && version != 3 {
                return Err(GgufError::UnsupportedVersion(version));
            }
            let n_tensors = c.u64("tensor count")?;
            let n_kv = c.u64("metadata count")?;
            // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
            c.check_count("metadata count", n_kv, 13)?;
            c.check_count("tensor count", n_tensors, MIN_TENSOR_ENTRY)?;

            let mut metadata = Vec::with_capacity(n_kv as usize);
            for i in 0..n_kv {
                let key = c.string(&format!("metadata key #{i}"))?;
                let ty_id = c.u32(&format!("type of metadata {key:?}"))?;
                let ty = ValueType::from_id(ty_id).ok_or_else(|| GgufError::BadValueType { what: format!("metadata {key:?}"), ty: ty_id })?;
                let value = c.value(ty, &key, 0)?;
                metadata.push((key, value));
            }

            let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
                None => DEFAULT_ALIGNMENT,
                Some((k, v)) => alignment_value(v).map_err(|problem| GgufError::BadMetadata { key: k.clone(), problem })?,
            };

            // Checked again now that the metadata is consumed: the table must fit in what is left.
            c.check_count("tensor count", n_tensors, MIN_TENSOR_ENTRY)?;
            let mut tensors = Vec::with_capacity(n_tensors as usize);
            for i in 0..n_tensors {
                let name = c.string(&format!("tensor #{i} name"))?;
                let rank = c.u32(&format!("tensor {name:?} rank"))?;
                if rank == 0 || rank as usize > MAX_DIMS {
                    return Err(GgufError::BadTensor { name, problem: format!("rank {rank} (must be 1..={MAX_DIMS})") });
                }
                let mut dims = Vec::with_capacity(rank as usize);
                for d in 0..rank {
                    dims.push(c.u64(&format!("tensor {name:?} dim {d}"))?);
                }
                let ty_id = c.u32(&format!("tensor {name:?} type"))?;
                let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownTensorType { name: name.clone(), ty: ty_id })?;
                let offset = c.u64(&format!("tensor {name:?} offset"))?;
                tensors.push((name, dims, ty, offset));
            }
            let data_offset = align_up(c.pos as u64, alignment).ok_or_else(|| GgufError::Truncated {
                what: "data section".into(),
                offset: c.pos as u64,
                need: alignment,
                len: c.buf.len() as u64,
            })?;
            (version, alignment, data_offset, metadata, tensors)
        };

        let file_len = storage.bytes().len() as u64;
        let mut meta_index = HashMap::with_capacity(metadata.len());
        for (i, (k, _)) in metadata.iter().enumerate() {
            if meta_index.insert(k.clone(), i).is_some() {
                return Err(GgufError::DuplicateKey(k.clone()));
            }
        }
        let mut infos = Vec::with_capacity(tensors.len());
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        for (name, dims, ty, offset) in tensors {
            let bad = |problem: String| GgufError::BadTensor { name: name.clone(), problem };
            let mut n: u64 = 1;
            for &d in &dims {
                if d == 0 {
                    return Err(bad(format!("zero dimension in {dims:?}")));
                }
                n = n.checked_mul(d).ok_or_else(|| bad(format!("element count of {dims:?} overflows")))?;
            }
            if dims[0] % ty.block_len() as u64 != 0 {
                return Err(bad(format!("row length {} is not a multiple of the {ty} block of {}", dims[0], ty.block_len())));
            }
            let size = ty.bytes_for(n).ok_or_else(|| bad(format!("byte size of {dims:?} overflows")))?;
            if offset % alignment != 0 {
                return Err(bad(format!("offset {offset} is not aligned to {alignment}")));
            }
            let end = data_offset.checked_add(offset).and_then(|s| s.checked_add(size)).ok_or_else(|| bad("offset + size overflows".into()))?;
            if end > file_len {
                return Err(GgufError::Truncated { what: format!("tensor {name:?} data ({size} bytes)"), offset: data_offset.saturating_add(offset), need: size, len: file_len });
            }
            if tensor_index.insert(name.clone(), infos.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            infos.push(TensorInfo { name, dims, ty, offset, size });
        }
        Ok(GgufFile { storage, version, alignment, data_offset, metadata, meta_index, tensors: infos, tensor_index })
    }

    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A required metadata value, or an error naming the key.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::BadMetadata { key: key.into(), problem: "missing".into() })
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|v| typed(key, v.as_u64(), "an unsigned integer")).transpose()
    }
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| typed(key, v.as_f64(), "a number")).transpose()
    }
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|v| typed(key, v.as_str(), "a string")).transpose()
    }
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| typed(key, v.as_bool(), "a boolean")).transpose()
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor (bounds were checked when the file was opened).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.storage.bytes()[start..start + t.size as usize]
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Tell the OS that bytes `start..start + len` are not needed now (a home that copied them
    /// into a layout of its own): a mapped file's pages there leave the process's memory and
    /// are read from the file again if anything touches them. Nothing for a file held in
    /// memory; advice the OS refuses is ignored, as it changes no byte.
    pub fn release(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if let Storage::Mapped(m) = &self.storage {
            if start.checked_add(len).is_some_and(|end| end <= m.len()) {
                // SAFETY: the map is shared and read-only: dropped pages are the file's bytes
                // when they are read again, so no reader sees a change.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
            }
        }
        #[cfg(not(unix))]
        let _ = (start, len);
    }

    pub fn file_len(&self) -> u64 {
        self.storage.bytes().len() as u64
    }
}

fn typed<T>(key: &str, v: Option<T>, want: &str) -> Result<T> {
    v.ok_or_else(|| GgufError::BadMetadata { key: key.into(), problem: format!("not {want}") })
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Metadata array elements read so far (bounded by MAX_ARRAY_ELEMENTS).
    elements: u64,
}

/// Metadata array elements a file may hold in all. A parsed value takes ~32 bytes however few
/// it took in the file, so without a cap a hostile 1 GB byte array would cost 32 GB. The
/// largest real vocabularies hold well under a million tokens (plus scores, types, merges).
pub const MAX_ARRAY_ELEMENTS: u64 = 16 << 20;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { what: what.into(), offset: self.pos as u64, need: n, len: self.buf.len() as u64 });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn check_count(&self, what: &str, count: u64, min_each: u64) -> Result<()> {
        if count.checked_mul(min_each).is_none_or(|need| need > self.remaining()) {
            return Err(GgufError::CountTooLarge { what: what.into(), count, remaining: self.remaining() });
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 { what: what.into() })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(&what())?),
            ValueType::I8 => Value::I8(self.u8(&what())? as i8),
            ValueType::U16 => Value::U16(self.u16(&what())?),
            ValueType::I16 => Value::I16(self.u16(&what())? as i16),
            ValueType::U32 => Value::U32(self.u32(&what())?),
            ValueType::I32 => Value::I32(self.u32(&what())? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(&what())?)),
            ValueType::U64 => Value::U64(self.u64(&what())?),
            ValueType::I64 => Value::I64(self.u64(&what())? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(&what())?)),
            ValueType::Bool => match self.u8(&what())? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(GgufError::BadMetadata { key: key.into(), problem: format!("bool byte {b} is not 0 or 1") }),
            },
            ValueType::String => Value::String(self.string(&what())?),
            ValueType::Array => {
                if depth >= MAX_NESTING {
                    return Err(GgufError::NestingTooDeep(MAX_NESTING));
                }
                let ety_id = self.u32(&format!("array type of {key:?}"))?;
                let ety = ValueType::from_id(ety_id).ok_or_else(|| GgufError::BadValueType { what: format!("array {key:?}"), ty: ety_id })?;
                let n = self.u64(&format!("array length of {key:?}"))?;
                self.check_count(&format!("array {key:?}"), n, ety.min_bytes())?;
                self.elements = self.elements.saturating_add(n);
                if self.elements > MAX_ARRAY_ELEMENTS {
                    return Err(GgufError::BadMetadata { key: key.into(), problem: format!("more than {MAX_ARRAY_ELEMENTS} array elements in all") });
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(ety, key, depth + 1)?);
                }
                Value::Array(ety, items)
            }
        })
    }
}
