//! The GGUF container on valid and hostile input: writer -> reader round trips, v2 files, and
//! one test per way a file can be wrong, each asserting the error that names the problem.
//! A truncated, corrupt or hostile file must give a `GgufError`: never a panic, an
//! out-of-bounds read, or an allocation sized by an unchecked field.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use resin_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC};

// ---------------------------------------------------------------------------------------------
// An allocator that records, per thread, the largest single allocation (tests run in parallel
// threads, so a per-thread figure is what a test can assert on).

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: the thread-local may already be gone while a thread shuts down.
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size)
        }
    });
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// The largest single allocation `f` makes on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(|l| l.get()))
}

// ---------------------------------------------------------------------------------------------
// Building files by hand.

/// Little-endian GGUF bytes, built field by field.
#[derive(Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default().u32(GGUF_MAGIC).u32(version).u64(n_tensors).u64(n_kv)
    }
    fn u8(mut self, v: u8) -> Raw {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    /// A GGUF string: u64 length, then the bytes (not necessarily UTF-8).
    fn str(self, s: impl AsRef<[u8]>) -> Raw {
        let s = s.as_ref();
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(ValueType::U32 as u32).u32(v)
    }
    fn kv_str(self, key: &str, v: &str) -> Raw {
        self.str(key).u32(ValueType::String as u32).str(v)
    }
    fn tensor(self, name: impl AsRef<[u8]>, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero bytes up to a multiple of `align` (a power of two).
    fn pad_to(mut self, align: usize) -> Raw {
        while self.0.len() & (align - 1) != 0 {
            self.0.push(0);
        }
        self
    }
    fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn parse(self) -> resin_gguf::Result<GgufFile> {
        GgufFile::from_bytes(self.0)
    }
}

fn err(r: resin_gguf::Result<GgufFile>) -> GgufError {
    match r {
        Ok(f) => panic!("expected an error, the file parsed: {f:?}"),
        Err(e) => e,
    }
}

/// Deterministic pseudo-random bytes.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> u64 {
    ty.bytes_for(dims.iter().product()).unwrap()
}

/// A small valid file: a few metadata values (string, array, u32) and two tensors.
fn small_valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("llama.block_count", Value::U32(2));
    w.set("tokenizer.ggml.tokens", Value::Array(ValueType::String, vec![Value::String("a".into()), Value::String("".into())]));
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    w.add_tensor("a", &[4, 2], GgmlType::F32).unwrap();
    w.add_tensor("b", &[32], GgmlType::Q8_0).unwrap();
    let a = noise(32, 1);
    let b = noise(34, 2);
    w.write_all_to_vec(&[&a, &b]).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Round trips.

fn every_value() -> Vec<(String, Value)> {
    let s = |x: &str| Value::String(x.to_string());
    vec![
        ("u8".into(), Value::U8(200)),
        ("i8".into(), Value::I8(-100)),
        ("u16".into(), Value::U16(60000)),
        ("i16".into(), Value::I16(-30000)),
        ("u32".into(), Value::U32(4_000_000_000)),
        ("i32".into(), Value::I32(-2_000_000_000)),
        ("f32".into(), Value::F32(-1.5e-7)),
        ("f32.inf".into(), Value::F32(f32::INFINITY)),
        ("bool.t".into(), Value::Bool(true)),
        ("bool.f".into(), Value::Bool(false)),
        ("string".into(), s("hello")),
        ("string.empty".into(), s("")),
        ("string.unicode".into(), s("héllo wörld ✓ 你好 🦀 \u{0} \u{10FFFF}")),
        ("u64".into(), Value::U64(u64::MAX)),
        ("i64".into(), Value::I64(i64::MIN)),
        ("f64".into(), Value::F64(std::f64::consts::PI)),
        ("".into(), s("empty key")),
        ("ключ.🦀".into(), s("unicode key")),
        ("arr.u8".into(), Value::Array(ValueType::U8, vec![Value::U8(0), Value::U8(255)])),
        ("arr.i8".into(), Value::Array(ValueType::I8, vec![Value::I8(-128), Value::I8(127)])),
        ("arr.u16".into(), Value::Array(ValueType::U16, vec![Value::U16(1), Value::U16(65535)])),
        ("arr.i16".into(), Value::Array(ValueType::I16, vec![Value::I16(-1)])),
        ("arr.u32".into(), Value::Array(ValueType::U32, (0..100).map(Value::U32).collect())),
        ("arr.i32".into(), Value::Array(ValueType::I32, vec![Value::I32(-5), Value::I32(i32::MAX)])),
        ("arr.f32".into(), Value::Array(ValueType::F32, vec![Value::F32(0.5), Value::F32(-0.0)])),
        ("arr.bool".into(), Value::Array(ValueType::Bool, vec![Value::Bool(true), Value::Bool(false)])),
        ("arr.string".into(), Value::Array(ValueType::String, vec![s("a"), s(""), s("✓🦀"), s("<|im_end|>")])),
        ("arr.u64".into(), Value::Array(ValueType::U64, vec![Value::U64(u64::MAX)])),
        ("arr.i64".into(), Value::Array(ValueType::I64, vec![Value::I64(-1)])),
        ("arr.f64".into(), Value::Array(ValueType::F64, vec![Value::F64(1e300)])),
        ("arr.empty".into(), Value::Array(ValueType::U32, vec![])),
        ("arr.empty.string".into(), Value::Array(ValueType::String, vec![])),
        (
            "arr.nested".into(),
            Value::Array(
                ValueType::Array,
                vec![Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]), Value::Array(ValueType::String, vec![s("x"), s("")]), Value::Array(ValueType::F64, vec![])],
            ),
        ),
        (
            // Four levels: the most the reader accepts.
            "arr.nested4".into(),
            Value::Array(ValueType::Array, vec![Value::Array(ValueType::Array, vec![Value::Array(ValueType::Array, vec![Value::Array(ValueType::I8, vec![Value::I8(-7)])])])]),
        ),
    ]
}

fn tensor_specs() -> Vec<(&'static str, Vec<u64>, GgmlType)> {
    vec![
        ("f32.rank1", vec![8], GgmlType::F32),
        ("f16.rank2", vec![4, 3], GgmlType::F16),
        ("bf16.rank3", vec![2, 2, 2], GgmlType::BF16),
        ("q4_0.rank2", vec![64, 2], GgmlType::Q4_0),
        ("q4_1", vec![32, 3], GgmlType::Q4_1),
        ("q5_0", vec![32], GgmlType::Q5_0),
        ("q5_1", vec![32], GgmlType::Q5_1),
        ("q8_0.rank4", vec![32, 1, 2, 3], GgmlType::Q8_0),
        ("q8_1", vec![32, 2], GgmlType::Q8_1),
        ("q2_k", vec![256], GgmlType::Q2_K),
        ("q3_k", vec![256], GgmlType::Q3_K),
        ("q4_k.rank2", vec![256, 2], GgmlType::Q4_K),
        ("q5_k", vec![256], GgmlType::Q5_K),
        ("q6_k", vec![256, 1], GgmlType::Q6_K),
        ("q8_k", vec![256], GgmlType::Q8_K),
        ("f32.single", vec![1], GgmlType::F32),
        ("名前.🦀", vec![3], GgmlType::F32),
    ]
}

/// Write every value type and tensors of every type, read back, compare everything.
fn round_trip(alignment: Option<Value>) -> (GgufFile, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    let values = every_value();
    for (k, v) in &values {
        w.set(k.clone(), v.clone());
    }
    if let Some(a) = &alignment {
        w.set("general.alignment", a.clone());
    }
    let specs = tensor_specs();
    let data: Vec<Vec<u8>> = specs.iter().enumerate().map(|(i, (_, dims, ty))| noise(tensor_bytes(*ty, dims) as usize, i as u64 + 10)).collect();
    for (name, dims, ty) in &specs {
        w.add_tensor(*name, dims, *ty).unwrap();
    }
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let bytes = w.write_all_to_vec(&refs).unwrap();

    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version, 3);
    let want_align = alignment.as_ref().map(|a| a.as_u64().unwrap()).unwrap_or(DEFAULT_ALIGNMENT);
    assert_eq!(f.alignment, want_align);
    assert_eq!(f.data_offset % want_align, 0);
    assert_eq!(f.file_len(), bytes.len() as u64);

    // Metadata: same keys, same order, same values.
    let mut expect = values.clone();
    if let Some(a) = alignment {
        expect.push(("general.alignment".into(), a));
    }
    assert_eq!(f.metadata().len(), expect.len());
    for ((k, v), (ek, ev)) in f.metadata().iter().zip(&expect) {
        assert_eq!(k, ek);
        assert_eq!(v, ev, "value of {k:?}");
        assert_eq!(f.get(k), Some(ev));
    }

    // Tensors: same table, data bytes identical, offsets aligned.
    assert_eq!(f.tensors().len(), specs.len());
    for (i, ((name, dims, ty), t)) in specs.iter().zip(f.tensors()).enumerate() {
        assert_eq!(&t.name, name);
        assert_eq!(&t.dims, dims);
        assert_eq!(t.ty, *ty);
        assert_eq!(t.size, tensor_bytes(*ty, dims));
        assert_eq!(t.offset % want_align, 0, "tensor {name} offset {}", t.offset);
        assert_eq!(f.tensor_data(t), data[i].as_slice(), "tensor {name} data");
        assert_eq!(f.tensor(name), Some(t));
        let (rows, cols) = t.rows_cols();
        assert_eq!(cols as u64, dims[0]);
        assert_eq!((rows * cols) as u64, t.n_elements());
        assert_eq!((t.row_bytes() * rows) as u64, t.size);
    }
    // Padding between header and data, and between tensors, is zeros.
    let mut covered = vec![false; bytes.len()];
    for t in f.tensors() {
        let s = (f.data_offset + t.offset) as usize;
        covered[s..s + t.size as usize].iter_mut().for_each(|c| *c = true);
    }
    for (i, &b) in bytes.iter().enumerate().skip(f.data_offset as usize) {
        if !covered[i] {
            assert_eq!(b, 0, "padding byte {i}");
        }
    }
    (f, data)
}

#[test]
fn round_trip_every_value_type_and_tensor_type() {
    let (f, _) = round_trip(None);
    assert_eq!(f.get_u64("u32").unwrap(), Some(4_000_000_000));
    assert_eq!(f.get_u64("u64").unwrap(), Some(u64::MAX));
    assert_eq!(f.get_str("string.unicode").unwrap(), Some("héllo wörld ✓ 你好 🦀 \u{0} \u{10FFFF}"));
    assert_eq!(f.get_str("string.empty").unwrap(), Some(""));
    assert_eq!(f.get_bool("bool.t").unwrap(), Some(true));
    assert_eq!(f.get_f64("f64").unwrap(), Some(std::f64::consts::PI));
    assert_eq!(f.get_u64("missing").unwrap(), None);
    // Typed getters name the key when the type is wrong.
    let e = f.get_u64("i8").unwrap_err();
    assert!(matches!(&e, GgufError::BadMetadata { key, .. } if key == "i8"), "{e}");
    let e = f.get_str("u8").unwrap_err();
    assert!(e.to_string().contains("not a string"), "{e}");
    let e = f.require("nope").unwrap_err();
    assert!(matches!(&e, GgufError::BadMetadata { key, problem } if key == "nope" && problem == "missing"), "{e}");
    assert!(f.tensor("nope").is_none());
}

#[test]
fn round_trip_custom_alignment() {
    for a in [Value::U32(1), Value::U32(8), Value::U8(16), Value::U64(64), Value::I32(128), Value::U32(4096), Value::U32(1 << 20)] {
        let (f, _) = round_trip(Some(a.clone()));
        assert_eq!(f.alignment, a.as_u64().unwrap());
    }
}

#[test]
fn round_trip_empty_file() {
    let bytes = GgufWriter::new().write_all_to_vec(&[]).unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert!(f.metadata().is_empty());
    assert!(f.tensors().is_empty());
}

#[test]
fn round_trip_through_a_memory_mapped_file() {
    let bytes = small_valid_file();
    let path = temp_path("mapped.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let g = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.metadata(), g.metadata());
    assert_eq!(f.tensors(), g.tensors());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t), g.tensor_data(t));
    }
    drop(f);
    std::fs::remove_file(&path).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(&e, GgufError::Io { path: p, .. } if p.contains("mapped.gguf")), "{e}");
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("resin-gguf-container-{}-{name}", std::process::id()))
}

#[test]
fn streaming_writer_matches_in_memory_writer() {
    let mut w = GgufWriter::new();
    w.set("k", Value::U8(1));
    w.add_tensor("t", &[32, 2], GgmlType::Q4_0).unwrap();
    let data = noise(36, 3);
    let whole = w.write_all_to_vec(&[&data]).unwrap();
    let mut streamed = Vec::new();
    w.write(&mut streamed, |_, out| {
        for chunk in data.chunks(5) {
            out.write_all(chunk)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(whole, streamed);
}

#[test]
fn v2_file_written_by_hand_reads() {
    // v2 has the same layout as v3 (u64 counts and lengths); resin reads both.
    let data = noise(32 + 18 * 2, 4);
    let head = Raw::header(2, 2, 3)
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 1)
        .str("tokenizer.ggml.scores")
        .u32(ValueType::Array as u32)
        .u32(ValueType::F32 as u32)
        .u64(2)
        .u32(1.0f32.to_bits())
        .u32((-2.5f32).to_bits())
        .tensor("w", &[8], GgmlType::F32 as u32, 0)
        .tensor("q", &[64], GgmlType::Q4_0 as u32, 32)
        .pad_to(32);
    let data_offset = head.len();
    let f = head.bytes(&data).parse().unwrap();
    assert_eq!(f.version, 2);
    assert_eq!(f.data_offset, data_offset as u64);
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_u64("llama.block_count").unwrap(), Some(1));
    assert_eq!(f.get("tokenizer.ggml.scores"), Some(&Value::Array(ValueType::F32, vec![Value::F32(1.0), Value::F32(-2.5)])));
    assert_eq!(f.tensor_data(f.tensor("w").unwrap()), &data[..32]);
    assert_eq!(f.tensor_data(f.tensor("q").unwrap()), &data[32..]);

    // The writer's v3 output with the version patched to 2 reads identically.
    let mut v2 = small_valid_file();
    let v3 = GgufFile::from_bytes(v2.clone()).unwrap();
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes(v2).unwrap();
    assert_eq!(f.version, 2);
    assert_eq!(f.metadata(), v3.metadata());
    assert_eq!(f.tensors(), v3.tensors());
}

#[test]
fn metadata_only_file_without_padding_reads() {
    // With no tensors there is no data section; a file that ends right after the metadata
    // (no alignment padding) is accepted, as llama.cpp does.
    let raw = Raw::header(3, 0, 1).kv_str("general.name", "x");
    assert_ne!(raw.len() % 32, 0);
    let f = raw.parse().unwrap();
    assert_eq!(f.get_str("general.name").unwrap(), Some("x"));
}

// ---------------------------------------------------------------------------------------------
// Header.

#[test]
fn bad_magic() {
    let e = err(Raw::default().bytes(b"GGML").u32(3).u64(0).u64(0).parse());
    assert!(matches!(e, GgufError::BadMagic(0x4c4d_4747)), "{e}");
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    // Big-endian magic.
    let e = err(Raw::default().bytes(b"FUGG").u32(3).u64(0).u64(0).parse());
    assert!(matches!(e, GgufError::BadMagic(_)), "{e}");
    // A real file's first bytes with one changed.
    let mut f = small_valid_file();
    f[0] = b'g';
    assert!(matches!(err(GgufFile::from_bytes(f)), GgufError::BadMagic(_)));
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 5, 0x0300_0000, u32::MAX] {
        let e = err(Raw::header(v, 0, 0).parse());
        assert!(matches!(e, GgufError::UnsupportedVersion(x) if x == v), "version {v}: {e}");
        assert!(e.to_string().contains(&format!("version {v}")), "{e}");
    }
    // v1 used u32 counts: a real v1 header is refused on the version, not misread.
    let v1 = Raw::default().u32(GGUF_MAGIC).u32(1).u32(0).u32(0);
    assert!(matches!(err(v1.parse()), GgufError::UnsupportedVersion(1)));
    // v2 and v3 with an empty body are fine.
    for v in [2, 3] {
        let f = Raw::header(v, 0, 0).parse().unwrap();
        assert_eq!(f.version, v);
    }
}

#[test]
fn empty_and_tiny_inputs() {
    for n in 0..4 {
        let e = err(GgufFile::from_bytes(vec![b'G'; n]));
        assert!(matches!(&e, GgufError::Truncated { what, offset: 0, need: 4, len } if what == "magic" && *len == n as u64), "{n} bytes: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Truncation.

/// Every prefix of `bytes` that cuts into the header or into tensor data must be refused with
/// a truncation or count error. (Padding after the last tensor, which gguf-py writes, is not
/// needed; prefixes that drop only that parse.)
fn assert_every_prefix_fails(bytes: &[u8]) {
    let f = GgufFile::from_bytes(bytes.to_vec()).unwrap();
    let end = f.tensors().iter().map(|t| f.data_offset + t.offset + t.size).max().unwrap() as usize;
    assert!(end > f.data_offset as usize);
    for n in end..=bytes.len() {
        GgufFile::from_bytes(bytes[..n].to_vec()).unwrap();
    }
    for n in 0..end {
        match GgufFile::from_bytes(bytes[..n].to_vec()) {
            Ok(_) => panic!("prefix of {n} of {} bytes parsed", bytes.len()),
            Err(GgufError::Truncated { offset, need, len, what }) => {
                assert_eq!(len, n as u64, "prefix {n}: {what}");
                assert!(offset.saturating_add(need) > len, "prefix {n}: {what} at {offset} needs {need}");
            }
            Err(GgufError::CountTooLarge { count, remaining, .. }) => {
                assert!(count > 0 && remaining < n as u64, "prefix {n}")
            }
            Err(e) => panic!("prefix {n}: unexpected error {e}"),
        }
    }
}

#[test]
fn truncation_at_every_byte_offset() {
    let bytes = small_valid_file();
    assert_every_prefix_fails(&bytes);
    // And what the errors say at a few known places.
    let e = err(GgufFile::from_bytes(bytes[..6].to_vec()));
    assert!(matches!(&e, GgufError::Truncated { what, offset: 4, need: 4, len: 6 } if what == "version"), "{e}");
    let e = err(GgufFile::from_bytes(bytes[..20].to_vec()));
    assert!(matches!(&e, GgufError::Truncated { what, offset: 16, .. } if what == "metadata count"), "{e}");
    let e = err(GgufFile::from_bytes(bytes[..bytes.len() - 1].to_vec()));
    assert!(matches!(&e, GgufError::Truncated { what, .. } if what.contains("tensor \"b\" data")), "{e}");
}

#[test]
fn truncation_at_every_byte_offset_of_the_round_trip_file() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.set(k, v);
    }
    w.set("general.alignment", Value::U32(8));
    w.add_tensor("x", &[32, 2], GgmlType::Q4_1).unwrap();
    w.add_tensor("y", &[3], GgmlType::F16).unwrap();
    let bytes = w.write_all_to_vec(&[&noise(40, 5), &noise(6, 6)]).unwrap();
    assert_every_prefix_fails(&bytes);
}

// ---------------------------------------------------------------------------------------------
// Counts and lengths.

#[test]
fn tensor_count_too_large() {
    for n in [u64::MAX, u64::MAX / 24 + 1, 1 << 40] {
        let e = err(Raw::header(3, n, 0).zeros(100).parse());
        assert!(matches!(&e, GgufError::CountTooLarge { what, count, remaining: 100 } if what == "tensor count" && *count == n), "{n}: {e}");
    }
    // Just over what fits: an entry takes at least 32 bytes (name length, rank, one dim, type,
    // offset), so 101 bytes left hold at most 3 entries.
    let e = err(Raw::header(3, 4, 0).zeros(101).parse());
    assert!(matches!(&e, GgufError::CountTooLarge { what, count: 4, remaining: 101 } if what == "tensor count"), "{e}");
    // 3 passes the count check and then fails on the (zero-length-named, rank 0) entry itself.
    let e = err(Raw::header(3, 3, 0).zeros(101).parse());
    assert!(matches!(&e, GgufError::BadTensor { problem, .. } if problem.contains("rank 0")), "{e}");
    // The count is checked again against what is left after the metadata.
    let raw = Raw::header(3, 2, 1).kv_str("k", &"x".repeat(40)).zeros(40);
    let e = err(raw.parse());
    assert!(matches!(&e, GgufError::CountTooLarge { what, count: 2, remaining: 40 } if what == "tensor count"), "{e}");
}

#[test]
fn metadata_count_too_large() {
    for n in [u64::MAX, u64::MAX / 13 + 1, 1 << 40] {
        let e = err(Raw::header(3, 0, n).zeros(64).parse());
        assert!(matches!(&e, GgufError::CountTooLarge { what, count, remaining: 64 } if what == "metadata count" && *count == n), "{n}: {e}");
        assert!(e.to_string().contains("cannot fit"), "{e}");
    }
    // A pair takes at least 13 bytes: 130 bytes hold at most 10.
    let e = err(Raw::header(3, 0, 11).zeros(130).parse());
    assert!(matches!(&e, GgufError::CountTooLarge { count: 11, remaining: 130, .. }), "{e}");
    // Exactly 10 one-byte pairs with empty keys fit (then fail as duplicate keys, not on count).
    let mut raw = Raw::header(3, 0, 10);
    for _ in 0..10 {
        raw = raw.str("").u32(ValueType::U8 as u32).u8(1);
    }
    assert_eq!(raw.len(), 24 + 130);
    assert!(matches!(err(raw.parse()), GgufError::DuplicateKey(k) if k.is_empty()));
}

fn array_header(key: &str, ety: ValueType, n: u64) -> Raw {
    Raw::header(3, 0, 1).str(key).u32(ValueType::Array as u32).u32(ety as u32).u64(n)
}

#[test]
fn array_length_too_large() {
    for (ety, min) in [(ValueType::U8, 1u64), (ValueType::Bool, 1), (ValueType::U16, 2), (ValueType::F32, 4), (ValueType::U64, 8), (ValueType::String, 8), (ValueType::Array, 12)] {
        for n in [u64::MAX, (u64::MAX / min).saturating_add(1), 1 << 40] {
            let e = err(array_header("arr", ety, n).zeros(48).parse());
            assert!(matches!(&e, GgufError::CountTooLarge { what, count, remaining: 48 } if what == "array \"arr\"" && *count == n), "{ety:?} x {n}: {e}");
        }
        // Just over: 48 bytes hold at most 48 / min elements.
        let e = err(array_header("arr", ety, 48 / min + 1).zeros(48).parse());
        assert!(matches!(&e, GgufError::CountTooLarge { .. }), "{ety:?}: {e}");
    }
    // Exactly what fits parses.
    let f = array_header("arr", ValueType::U32, 12).zeros(48).parse().unwrap();
    assert_eq!(f.get("arr").unwrap().as_array().unwrap().len(), 12);
    let e = err(array_header("arr", ValueType::U32, 13).zeros(48).parse());
    assert!(matches!(&e, GgufError::CountTooLarge { count: 13, remaining: 48, .. }), "{e}");
}

#[test]
fn string_length_too_large() {
    // Key length.
    // 15 bytes follow the length (10 + type 4 + value 1): 16 is just over.
    for n in [u64::MAX, 1 << 40, 16] {
        let e = err(Raw::header(3, 0, 1).u64(n).bytes(b"abcdefghij").u32(0).u8(0).parse());
        assert!(matches!(&e, GgufError::Truncated { what, need, offset: 32, .. } if what == "metadata key #0" && *need == n), "{n}: {e}");
    }
    // String value: just over the 5 bytes that are left.
    let raw = Raw::header(3, 0, 1).str("k").u32(ValueType::String as u32).u64(6).bytes(b"hello");
    let e = err(raw.parse());
    assert!(matches!(&e, GgufError::Truncated { what, need: 6, len, .. } if what == "value of \"k\"" && *len == 50), "{e}");
    let raw = Raw::header(3, 0, 1).str("k").u32(ValueType::String as u32).u64(u64::MAX).bytes(b"hello");
    assert!(matches!(err(raw.parse()), GgufError::Truncated { need: u64::MAX, .. }));
    // Exactly 5 fits.
    let raw = Raw::header(3, 0, 1).str("k").u32(ValueType::String as u32).u64(5).bytes(b"hello");
    assert_eq!(raw.parse().unwrap().get_str("k").unwrap(), Some("hello"));
    // A string inside an array.
    let raw = array_header("a", ValueType::String, 1).u64(u64::MAX).zeros(8);
    assert!(matches!(err(raw.parse()), GgufError::Truncated { what, need: u64::MAX, .. } if what == "value of \"a\""));
    // Tensor name.
    let raw = Raw::header(3, 1, 0).u64(u64::MAX).zeros(40);
    assert!(matches!(err(raw.parse()), GgufError::Truncated { what, need: u64::MAX, .. } if what == "tensor #0 name"));
    let raw = Raw::header(3, 1, 0).u64(33).zeros(32);
    assert!(matches!(err(raw.parse()), GgufError::Truncated { what, need: 33, .. } if what == "tensor #0 name"));
}

#[test]
fn huge_claims_allocate_nothing_large() {
    // The reader bounds every count by the bytes left before allocating: a file claiming a 2^40
    // element array (or 2^40 entries, or a 2^40-byte string) errors without a large allocation.
    const LIMIT: usize = 64 << 10;
    let claims: Vec<(&str, Raw)> = vec![
        ("u8 array", array_header("a", ValueType::U8, 1 << 40).zeros(4096)),
        ("string array", array_header("a", ValueType::String, 1 << 40).zeros(4096)),
        ("nested array", array_header("a", ValueType::Array, 1 << 40).zeros(4096)),
        ("inner array", array_header("a", ValueType::Array, 1).u32(ValueType::U64 as u32).u64(1 << 40).zeros(4096)),
        ("metadata count", Raw::header(3, 0, 1 << 40).zeros(4096)),
        ("tensor count", Raw::header(3, 1 << 40, 0).zeros(4096)),
        ("key length", Raw::header(3, 0, 1).u64(1 << 40).zeros(4096)),
        ("string length", Raw::header(3, 0, 1).str("k").u32(8).u64(1 << 40).zeros(4096)),
        ("tensor name length", Raw::header(3, 1, 0).u64(1 << 40).zeros(4096)),
        ("tensor dims", Raw::header(3, 1, 0).tensor("t", &[1 << 40, 1 << 20], 0, 0).zeros(4096)),
    ];
    for (what, raw) in claims {
        let bytes = raw.0;
        let n = bytes.len();
        let (r, largest) = largest_allocation(move || GgufFile::from_bytes(bytes).map(|_| ()));
        assert!(r.is_err(), "{what}: parsed");
        // The input itself (moved in, not copied) is the only thing near its size.
        assert!(largest <= LIMIT.max(n), "{what}: largest allocation {largest} bytes");
    }
}

#[test]
fn allocation_is_bounded_by_the_bytes_present() {
    // A legitimate 64 Ki-element u8 array: allocations stay within a fixed multiple (the size
    // of a parsed `Value`) of the bytes the array takes in the file.
    let n = 64 << 10;
    let bytes = array_header("a", ValueType::U8, n as u64).zeros(n).0;
    let (r, largest) = largest_allocation(move || GgufFile::from_bytes(bytes).map(|f| f.metadata().len()));
    assert_eq!(r.unwrap(), 1);
    assert!(largest <= n * std::mem::size_of::<Value>(), "largest allocation {largest}");
}

#[test]
fn total_array_elements_are_capped() {
    // Two arrays that together pass the cap: refused, naming the key, before the second is read.
    let cap = resin_gguf::MAX_ARRAY_ELEMENTS;
    let half = cap / 2 + 1;
    let mut raw = Raw(Vec::new());
    raw.0.extend_from_slice(b"GGUF");
    raw.0.extend_from_slice(&3u32.to_le_bytes());
    raw.0.extend_from_slice(&0u64.to_le_bytes());
    raw.0.extend_from_slice(&2u64.to_le_bytes());
    for key in ["a", "b"] {
        raw.0.extend_from_slice(&(key.len() as u64).to_le_bytes());
        raw.0.extend_from_slice(key.as_bytes());
        raw.0.extend_from_slice(&(ValueType::Array as u32).to_le_bytes());
        raw.0.extend_from_slice(&(ValueType::U8 as u32).to_le_bytes());
        raw.0.extend_from_slice(&half.to_le_bytes());
        raw.0.resize(raw.0.len() + half as usize, 0);
    }
    match GgufFile::from_bytes(raw.0) {
        Err(resin_gguf::GgufError::BadMetadata { key, problem }) => {
            assert_eq!(key, "b");
            assert!(problem.contains("array elements"), "{problem}");
        }
        other => panic!("expected the element cap, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor table.

fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Raw {
    Raw::header(3, 1, 0).tensor("t", dims, ty, offset).pad_to(32).zeros(data)
}

fn bad_tensor(r: Raw) -> String {
    match err(r.parse()) {
        GgufError::BadTensor { name, problem } => {
            assert_eq!(name, "t");
            problem
        }
        e => panic!("expected BadTensor, got {e}"),
    }
}

#[test]
fn rank_out_of_range() {
    for rank in [0u32, 5, 64, u32::MAX] {
        let raw = Raw::header(3, 1, 0).str("t").u32(rank).zeros(128);
        let p = bad_tensor(raw);
        assert!(p.contains(&format!("rank {rank}")) && p.contains("1..=4"), "{p}");
    }
    // 1..=4 are fine.
    for rank in 1..=4usize {
        let dims = vec![1u64; rank];
        one_tensor(&dims, 0, 0, 4).parse().unwrap();
    }
}

#[test]
fn zero_dimension() {
    for dims in [vec![0u64], vec![4, 0], vec![0, 4], vec![4, 4, 4, 0]] {
        let p = bad_tensor(one_tensor(&dims, 0, 0, 256));
        assert!(p.contains("zero dimension"), "{dims:?}: {p}");
    }
}

#[test]
fn dimension_product_overflows() {
    for dims in [vec![1u64 << 32, 1 << 32], vec![u64::MAX, 2], vec![1 << 16, 1 << 16, 1 << 16, 1 << 16]] {
        let p = bad_tensor(one_tensor(&dims, 0, 0, 64));
        assert!(p.contains("element count") && p.contains("overflows"), "{dims:?}: {p}");
    }
    // The element count fits but the byte size does not.
    let p = bad_tensor(one_tensor(&[1 << 62, 2], GgmlType::F32 as u32, 0, 64));
    assert!(p.contains("byte size") && p.contains("overflows"), "{p}");
    // Row length not a whole number of blocks.
    let p = bad_tensor(one_tensor(&[33, 1], GgmlType::Q8_0 as u32, 0, 64));
    assert!(p.contains("row length 33") && p.contains("block of 32"), "{p}");
    let p = bad_tensor(one_tensor(&[128], GgmlType::Q4_K as u32, 0, 1024));
    assert!(p.contains("row length 128"), "{p}");
}

#[test]
fn tensor_data_past_end() {
    // 8 F32 values need 32 bytes; 31 are there.
    let e = err(one_tensor(&[8], 0, 0, 31).parse());
    assert!(matches!(&e, GgufError::Truncated { what, need: 32, offset: 64, len: 95 } if what.contains("tensor \"t\" data")), "{e}");
    one_tensor(&[8], 0, 0, 32).parse().unwrap();
    // An offset that puts the data past the end.
    let e = err(one_tensor(&[8], 0, 32, 32).parse());
    assert!(matches!(&e, GgufError::Truncated { offset: 96, need: 32, .. }), "{e}");
    // Offsets and sizes that overflow when added.
    let top = u64::MAX / 32 * 32;
    let p = bad_tensor(one_tensor(&[8], 0, top, 32));
    assert!(p.contains("offset + size overflows"), "{p}");
    let p = bad_tensor(one_tensor(&[8], 0, u64::MAX - 31 - 32, 32));
    assert!(p.contains("offset + size overflows"), "{p}");
    let e = err(one_tensor(&[1 << 61], 0, 0, 32).parse());
    assert!(matches!(&e, GgufError::Truncated { need, .. } if *need == 1 << 63), "{e}");
    // Huge but representable sizes are refused on the file length, not allocated.
    let e = err(one_tensor(&[1 << 40, 1 << 10], GgmlType::Q4_0 as u32, 0, 32).parse());
    assert!(matches!(&e, GgufError::Truncated { .. }), "{e}");
}

#[test]
fn misaligned_offset() {
    for off in [1u64, 4, 16, 31, 33] {
        let p = bad_tensor(one_tensor(&[8], 0, off, 128));
        assert!(p.contains(&format!("offset {off} is not aligned to 32")), "{p}");
    }
    // With general.alignment 8, offset 8 is fine and 4 is not.
    let mk = |off| Raw::header(3, 1, 1).kv_u32("general.alignment", 8).tensor("t", &[2], 0, off).pad_to(8).zeros(32);
    let f = mk(8).parse().unwrap();
    assert_eq!(f.alignment, 8);
    assert_eq!(f.data_offset % 8, 0);
    let p = bad_tensor(mk(4));
    assert!(p.contains("not aligned to 8"), "{p}");
}

#[test]
fn duplicate_keys_and_tensor_names() {
    let raw = Raw::header(3, 0, 3).kv_u32("a", 1).kv_u32("b", 2).kv_str("a", "again");
    assert!(matches!(err(raw.parse()), GgufError::DuplicateKey(k) if k == "a"));
    let raw = Raw::header(3, 2, 0).tensor("w", &[8], 0, 0).tensor("w", &[8], 0, 32).pad_to(32).zeros(64);
    let e = err(raw.parse());
    assert!(matches!(&e, GgufError::DuplicateTensor(n) if n == "w"), "{e}");
    assert!(e.to_string().contains("duplicate tensor name \"w\""), "{e}");
}

#[test]
fn invalid_utf8() {
    let bad: &[u8] = b"ab\xff\xfe";
    let e = err(Raw::header(3, 0, 1).str(bad).u32(4).u32(0).parse());
    assert!(matches!(&e, GgufError::BadUtf8 { what } if what == "metadata key #0"), "{e}");
    let e = err(Raw::header(3, 0, 1).str("k").u32(8).str(bad).parse());
    assert!(matches!(&e, GgufError::BadUtf8 { what } if what == "value of \"k\""), "{e}");
    let e = err(array_header("k", ValueType::String, 2).str("ok").str(b"\xc3").parse());
    assert!(matches!(&e, GgufError::BadUtf8 { what } if what == "value of \"k\""), "{e}");
    let e = err(Raw::header(3, 1, 0).tensor(bad, &[8], 0, 0).pad_to(32).zeros(32).parse());
    assert!(matches!(&e, GgufError::BadUtf8 { what } if what == "tensor #0 name"), "{e}");
    // Overlong encodings and surrogates are invalid too.
    for s in [&b"\xc0\x80"[..], b"\xed\xa0\x80", b"\xf4\x90\x80\x80"] {
        let e = err(Raw::header(3, 0, 1).str("k").u32(8).str(s).parse());
        assert!(matches!(e, GgufError::BadUtf8 { .. }), "{s:?}: {e}");
    }
}

#[test]
fn unknown_value_type() {
    for ty in [13u32, 14, 255, u32::MAX] {
        let e = err(Raw::header(3, 0, 1).str("k").u32(ty).zeros(16).parse());
        assert!(matches!(&e, GgufError::BadValueType { what, ty: t } if what == "metadata \"k\"" && *t == ty), "{e}");
        let e = err(Raw::header(3, 0, 1).str("k").u32(ValueType::Array as u32).u32(ty).u64(1).zeros(16).parse());
        assert!(matches!(&e, GgufError::BadValueType { what, ty: t } if what == "array \"k\"" && *t == ty), "{e}");
    }
}

#[test]
fn unknown_tensor_type() {
    // 4 and 5 (Q4_2, Q4_3) were removed from ggml; 16.. are types resin does not read.
    for ty in [4u32, 5, 16, 20, 29, 31, 99, u32::MAX] {
        let e = err(one_tensor(&[32], ty, 0, 1024).parse());
        assert!(matches!(&e, GgufError::UnknownTensorType { name, ty: t } if name == "t" && *t == ty), "{e}");
    }
}

#[test]
fn bool_byte_not_0_or_1() {
    for b in [2u8, 0x80, 0xff] {
        let e = err(Raw::header(3, 0, 1).str("flag").u32(ValueType::Bool as u32).u8(b).parse());
        assert!(matches!(&e, GgufError::BadMetadata { key, problem } if key == "flag" && problem.contains(&format!("bool byte {b}"))), "{e}");
        let e = err(array_header("flags", ValueType::Bool, 2).u8(1).u8(b).parse());
        assert!(matches!(&e, GgufError::BadMetadata { key, .. } if key == "flags"), "{e}");
    }
}

fn nested(depth: usize) -> Raw {
    // `depth` levels of arrays, each holding one array, the innermost holding one u8.
    let mut raw = Raw::header(3, 0, 1).str("deep").u32(ValueType::Array as u32);
    for _ in 1..depth {
        raw = raw.u32(ValueType::Array as u32).u64(1);
    }
    raw.u32(ValueType::U8 as u32).u64(1).u8(7)
}

#[test]
fn deeply_nested_arrays() {
    let f = nested(4).parse().unwrap();
    let mut v = f.get("deep").unwrap();
    for _ in 0..4 {
        v = &v.as_array().unwrap()[0];
    }
    assert_eq!(v, &Value::U8(7));
    for depth in [5, 6, 100, 100_000] {
        let e = err(nested(depth).parse());
        assert!(matches!(e, GgufError::NestingTooDeep(4)), "{depth}: {e}");
    }
}

#[test]
fn bad_alignment_values() {
    let with = |v: Raw| Raw::header(3, 0, 1).str("general.alignment").bytes(&v.0);
    let cases: Vec<(Raw, &str)> = vec![
        (Raw::default().u32(4).u32(0), "alignment 0"),
        (Raw::default().u32(4).u32(3), "alignment 3"),
        (Raw::default().u32(4).u32(48), "alignment 48"),
        (Raw::default().u32(10).u64(1 << 21), "alignment 2097152"),
        (Raw::default().u32(10).u64(1 << 63), "alignment 9223372036854775808"),
        (Raw::default().u32(6).u32(32.0f32.to_bits()), "F32"),
        (Raw::default().u32(12).u64(32.0f64.to_bits()), "F64"),
        (Raw::default().u32(8).str("32"), "String"),
        (Raw::default().u32(7).u8(1), "Bool"),
        (Raw::default().u32(5).u32((-32i32) as u32), "I32"),
        (Raw::default().u32(9).u32(4).u64(1).u32(32), "Array"),
    ];
    for (value, expect) in cases {
        let e = err(with(value).parse());
        assert!(matches!(&e, GgufError::BadMetadata { key, problem } if key == "general.alignment" && problem.contains(expect)), "{expect}: {e}");
    }
    // Any non-negative integer type holding a power of two up to 1 MiB is accepted.
    for v in [Raw::default().u32(0).u8(64), Raw::default().u32(5).u32(16), Raw::default().u32(10).u64(1 << 20)] {
        with(v).parse().unwrap();
    }
}

#[test]
fn single_byte_corruption_never_panics() {
    // Every byte of a small valid file set to a few hostile values: each result is Ok or an
    // error, and any file that still parses has its tensors inside the file.
    let bytes = small_valid_file();
    for i in 0..bytes.len() {
        for b in [0u8, 1, 2, 0x7f, 0x80, 0xff, bytes[i] ^ 1] {
            let mut c = bytes.clone();
            c[i] = b;
            if let Ok(f) = GgufFile::from_bytes(c) {
                for t in f.tensors() {
                    assert!(f.data_offset + t.offset + t.size <= f.file_len());
                    assert_eq!(f.tensor_data(t).len() as u64, t.size);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The writer refuses what the reader would refuse, and never panics.

#[test]
fn writer_refuses_bad_tensors() {
    let mut w = GgufWriter::new();
    let bad = |r: resin_gguf::Result<()>| match r {
        Err(GgufError::BadTensor { name, problem }) => {
            assert_eq!(name, "t");
            problem
        }
        other => panic!("expected BadTensor, got {other:?}"),
    };
    assert!(bad(w.add_tensor("t", &[], GgmlType::F32)).contains("cannot store shape"));
    assert!(bad(w.add_tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32)).contains("cannot store shape"));
    assert!(bad(w.add_tensor("t", &[0], GgmlType::F32)).contains("cannot store shape"));
    assert!(bad(w.add_tensor("t", &[4, 0], GgmlType::F32)).contains("cannot store shape"));
    assert!(bad(w.add_tensor("t", &[33], GgmlType::Q8_0)).contains("cannot store shape"));
    // Element counts and byte sizes that overflow are errors, not arithmetic panics.
    assert!(bad(w.add_tensor("t", &[u64::MAX, 2], GgmlType::F32)).contains("overflows"));
    assert!(bad(w.add_tensor("t", &[1 << 32, 1 << 32], GgmlType::F32)).contains("overflows"));
    assert!(bad(w.add_tensor("t", &[1 << 62, 2], GgmlType::F32)).contains("overflows"));
    w.add_tensor("t", &[8], GgmlType::F32).unwrap();
    assert!(matches!(w.add_tensor("t", &[8], GgmlType::F32), Err(GgufError::DuplicateTensor(n)) if n == "t"));
}

fn invalid_input(r: std::io::Result<Vec<u8>>) -> String {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => e.to_string(),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn writer_refuses_what_the_reader_would_refuse() {
    for a in [Value::U32(0), Value::U32(3), Value::U64(1 << 63), Value::U64(1 << 21), Value::F32(32.0), Value::Bool(true)] {
        let mut w = GgufWriter::new();
        w.set("general.alignment", a.clone());
        w.add_tensor("t", &[4], GgmlType::F32).unwrap();
        let msg = invalid_input(w.write_all_to_vec(&[&[0; 16]]));
        assert!(msg.contains("general.alignment"), "{a:?}: {msg}");
    }
    // An array holding an element of another type than it declares.
    let mut w = GgufWriter::new();
    w.set("a", Value::Array(ValueType::U32, vec![Value::U32(1), Value::U8(2)]));
    assert!(invalid_input(w.write_all_to_vec(&[])).contains("array of U32 holds a U8"));
    let mut w = GgufWriter::new();
    w.set("a", Value::Array(ValueType::Array, vec![Value::Array(ValueType::U8, vec![Value::I8(1)])]));
    assert!(invalid_input(w.write_all_to_vec(&[])).contains("holds a I8"));
    // Nesting deeper than the reader reads.
    let mut v = Value::Array(ValueType::U8, vec![]);
    for _ in 0..4 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", v);
    assert!(invalid_input(w.write_all_to_vec(&[])).contains("nested deeper than 4"));
    // Fewer (or more) buffers than tensors.
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[4], GgmlType::F32).unwrap();
    assert!(invalid_input(w.write_all_to_vec(&[])).contains("1 tensors declared, 0 byte buffers"));
    assert!(invalid_input(w.write_all_to_vec(&[&[0; 16], &[0; 16]])).contains("2 byte buffers"));
    // A callback writing the wrong number of bytes.
    let e = w.write_all_to_vec(&[&[0; 15]]).unwrap_err();
    assert!(e.to_string().contains("wrote 15 bytes, expected 16"), "{e}");
    // A later valid alignment replaces an invalid one.
    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(3));
    w.set("general.alignment", Value::U32(16));
    w.add_tensor("t", &[4], GgmlType::F32).unwrap();
    let f = GgufFile::from_bytes(w.write_all_to_vec(&[&[1; 16]]).unwrap()).unwrap();
    assert_eq!(f.alignment, 16);
}

// ---------------------------------------------------------------------------------------------
// The fuzz corpus seeds (small rewrites of real models, scripts/make_fuzz_seeds.py) are valid,
// and every prefix of the small ones is refused.

fn seeds() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf_reader");
    let mut v: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.map(|e| e.unwrap().path()).filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("seed-")).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[test]
fn fuzz_seeds_are_valid_files() {
    for p in seeds() {
        let f = GgufFile::from_bytes(std::fs::read(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.contains("qwen") {
            assert_eq!(f.get_str("general.architecture").unwrap(), Some("qwen2"), "{name}");
            assert_eq!(f.get_u64("qwen2.block_count").unwrap(), Some(24), "{name}");
            assert!(f.tensor("token_embd.weight").is_some(), "{name}");
        }
        if name.contains("smollm2") {
            assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"), "{name}");
            assert!(f.get("tokenizer.ggml.tokens").unwrap().as_array().is_some(), "{name}");
        }
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.size);
        }
    }
}

#[test]
fn every_prefix_of_small_real_headers_fails() {
    for p in seeds() {
        let bytes = std::fs::read(&p).unwrap();
        if bytes.len() <= 8 << 10 && GgufFile::from_bytes(bytes.clone()).unwrap().tensors().iter().any(|t| t.size > 0) {
            assert_every_prefix_fails(&bytes);
        }
    }
}

/// Regenerate the writer-made fuzz seeds (`seed-writer-*`):
/// `RESIN_WRITE_FUZZ_SEEDS=1 cargo test -p resin-gguf --test container -- --ignored write_fuzz_seeds`
#[test]
#[ignore]
fn write_fuzz_seeds() {
    if std::env::var_os("RESIN_WRITE_FUZZ_SEEDS").is_none() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf_reader");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("seed-writer-small"), small_valid_file()).unwrap();
    for (name, align) in [("seed-writer-all-types", None), ("seed-writer-align8", Some(Value::U32(8)))] {
        let mut w = GgufWriter::new();
        for (k, v) in every_value() {
            w.set(k, v);
        }
        if let Some(a) = align {
            w.set("general.alignment", a);
        }
        let specs = tensor_specs();
        let data: Vec<Vec<u8>> = specs.iter().enumerate().map(|(i, (_, d, ty))| noise(tensor_bytes(*ty, d) as usize, i as u64)).collect();
        for (n, d, ty) in &specs {
            w.add_tensor(*n, d, *ty).unwrap();
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        std::fs::write(dir.join(name), w.write_all_to_vec(&refs).unwrap()).unwrap();
    }
}
