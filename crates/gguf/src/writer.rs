use std::io::Write;

use crate::reader::{alignment_value, MAX_NESTING};
use crate::{GgmlType, GgufError, Result, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    size: u64,
}

/// Writes GGUF v3 files. Tensors are declared first (name, shape, format); their bytes are then
/// streamed in declaration order, so a multi-gigabyte model never has to sit in memory whole.
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { metadata: Vec::new(), tensors: Vec::new(), alignment: DEFAULT_ALIGNMENT }
    }

    /// Add (or replace) a metadata value. A `general.alignment` the reader would refuse (not an
    /// integer power of two up to 1 MiB) makes [`write`](Self::write) fail.
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if key == "general.alignment" {
            self.alignment = alignment_value(&value).unwrap_or(DEFAULT_ALIGNMENT);
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Declare a tensor; `dims` in ggml order (row length first).
    pub fn add_tensor(&mut self, name: impl Into<String>, dims: &[u64], ty: GgmlType) -> Result<()> {
        let name = name.into();
        if dims.is_empty() || dims.len() > crate::MAX_DIMS || dims.contains(&0) || !dims[0].is_multiple_of(ty.block_len() as u64) {
            return Err(GgufError::BadTensor { name, problem: format!("cannot store shape {dims:?} as {ty}") });
        }
        let overflow = || GgufError::BadTensor { name: name.clone(), problem: format!("size of {dims:?} overflows") };
        let n = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).ok_or_else(overflow)?;
        let size = ty.bytes_for(n).ok_or_else(overflow)?;
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.tensors.push(PendingTensor { name, dims: dims.to_vec(), ty, size });
        Ok(())
    }

    /// Write header, metadata and tensor table, then call `data(i, out)` for each tensor in
    /// declaration order; it must write exactly that tensor's bytes.
    pub fn write<W: Write>(&self, out: &mut W, mut data: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>) -> std::io::Result<()> {
        let invalid = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, msg);
        for (k, v) in &self.metadata {
            check_value(v, 0).map_err(|problem| invalid(format!("metadata {k:?}: {problem}")))?;
            if k == "general.alignment" {
                alignment_value(v).map_err(|problem| invalid(format!("metadata {k:?}: {problem}")))?;
            }
        }
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k);
            head.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = offset.checked_add(t.size).and_then(|end| align_up(end, self.alignment)).ok_or_else(|| invalid("total tensor size overflows".into()))?;
        }
        let pad = align_up(head.len() as u64, self.alignment).expect("alignment is at most 1 MiB") - head.len() as u64;
        head.resize(head.len() + pad as usize, 0);
        out.write_all(&head)?;
        let mut written = 0u64;
        for (i, t) in self.tensors.iter().enumerate() {
            let zeros = vec![0u8; (offsets[i] - written) as usize];
            out.write_all(&zeros)?;
            let mut counter = CountingWriter { inner: out, n: 0 };
            data(i, &mut counter)?;
            if counter.n != t.size {
                return Err(std::io::Error::other(format!("tensor {:?}: wrote {} bytes, expected {}", t.name, counter.n, t.size)));
            }
            written = offsets[i] + t.size;
        }
        Ok(())
    }

    /// Write a file whose tensor bytes are all in memory, in declaration order.
    pub fn write_all_to_vec(&self, tensor_bytes: &[&[u8]]) -> std::io::Result<Vec<u8>> {
        if tensor_bytes.len() != self.tensors.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} tensors declared, {} byte buffers given", self.tensors.len(), tensor_bytes.len())));
        }
        let mut out = Vec::new();
        self.write(&mut out, |i, w| w.write_all(tensor_bytes[i]))?;
        Ok(out)
    }
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

/// Refuse a value the reader could not read back: an array holding an element of another type
/// than it declares, or arrays nested deeper than the reader allows.
fn check_value(v: &Value, depth: usize) -> std::result::Result<(), String> {
    if let Value::Array(ty, items) = v {
        if depth >= MAX_NESTING {
            return Err(format!("arrays nested deeper than {MAX_NESTING} levels"));
        }
        for it in items {
            if it.value_type() != *ty {
                return Err(format!("array of {ty:?} holds a {:?}", it.value_type()));
            }
            if *ty == ValueType::Array {
                check_value(it, depth + 1)?;
            }
        }
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(ty, items) => {
            out.extend_from_slice(&(*ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
