use std::io::Write;

use crate::{GgmlType, GgufError, Result, Value, DEFAULT_ALIGNMENT, GGUF_MAGIC};

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

    /// Add (or replace) a metadata value.
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if key == "general.alignment" {
            if let Some(a) = value.as_u64().filter(|a| a.is_power_of_two()) {
                self.alignment = a;
            }
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
        let n: u64 = dims.iter().product();
        if dims.is_empty() || dims.len() > crate::MAX_DIMS || dims[0] % ty.block_len() as u64 != 0 {
            return Err(GgufError::BadTensor { name, problem: format!("cannot store shape {dims:?} as {ty}") });
        }
        let size = ty.bytes_for(n).ok_or_else(|| GgufError::BadTensor { name: name.clone(), problem: "size overflows".into() })?;
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.tensors.push(PendingTensor { name, dims: dims.to_vec(), ty, size });
        Ok(())
    }

    /// Write header, metadata and tensor table, then call `data(i, out)` for each tensor in
    /// declaration order; it must write exactly that tensor's bytes.
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        mut data: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
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
            offset = (offset + t.size).div_ceil(self.alignment) * self.alignment;
        }
        let pad = (head.len() as u64).div_ceil(self.alignment) * self.alignment - head.len() as u64;
        head.resize(head.len() + pad as usize, 0);
        out.write_all(&head)?;
        let mut written = 0u64;
        for (i, t) in self.tensors.iter().enumerate() {
            let zeros = vec![0u8; (offsets[i] - written) as usize];
            out.write_all(&zeros)?;
            let mut counter = CountingWriter { inner: out, n: 0 };
            data(i, &mut counter)?;
            if counter.n != t.size {
                return Err(std::io::Error::other(format!(
                    "tensor {:?}: wrote {} bytes, expected {}",
                    t.name, counter.n, t.size
                )));
            }
            written = offsets[i] + t.size;
        }
        Ok(())
    }

    /// Write a file whose tensor bytes are all in memory, in declaration order.
    pub fn write_all_to_vec(&self, tensor_bytes: &[&[u8]]) -> std::io::Result<Vec<u8>> {
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
