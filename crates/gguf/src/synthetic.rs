//! Small synthetic models for tests: f32 tensors drawn from a fixed xorshift generator in the
//! order they are declared, written after the caller's metadata. The same seed and the same
//! calls give the same bytes, so a test can hold a home to a reference of its own written
//! against [`Weights::get`], or two homes to each other.

use crate::{GgmlType, GgufWriter, Value};

/// A llama-family model's shape: `layers` blocks of width `d`, `heads` query heads and
/// `heads_kv` key/value heads of `head_dim`, a gated feed-forward of width `ff`.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub layers: usize,
    pub d: usize,
    pub heads: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub ff: usize,
}

impl Shape {
    /// A writer holding `general.architecture` = `arch` and the shape under `arch.`: block
    /// count, embedding length, head counts, key and value lengths, feed-forward length, and
    /// `context` as the context length. The caller adds what its architecture needs besides.
    pub fn writer(&self, arch: &str, context: usize) -> GgufWriter {
        let mut g = GgufWriter::new();
        g.set("general.architecture", Value::String(arch.into()));
        for (k, v) in [
            ("block_count", self.layers),
            ("embedding_length", self.d),
            ("attention.head_count", self.heads),
            ("attention.head_count_kv", self.heads_kv),
            ("attention.key_length", self.head_dim),
            ("attention.value_length", self.head_dim),
            ("feed_forward_length", self.ff),
            ("context_length", context),
        ] {
            g.set(format!("{arch}.{k}"), Value::U32(v as u32));
        }
        g
    }
}

/// Named f32 tensors (dims in ggml order, row length first) and the generator that fills them.
pub struct Weights {
    seed: u64,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

impl Weights {
    /// No tensors yet; `seed` starts the generator (it must not be 0).
    pub fn new(seed: u64) -> Self {
        Weights { seed, tensors: Vec::new() }
    }

    /// The generator's next number, uniform in [-scale, scale).
    pub fn rnd(&mut self, scale: f32) -> f32 {
        let s = &mut self.seed;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        ((*s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
    }

    /// A `rows` by `cols` matrix (row-major), entries uniform in [-scale, scale).
    pub fn mat(&mut self, name: impl Into<String>, rows: usize, cols: usize, scale: f32) {
        let v = (0..rows * cols).map(|_| self.rnd(scale)).collect();
        self.tensors.push((name.into(), vec![cols as u64, rows as u64], v));
    }

    /// A norm weight of `n` entries near 1 but not 1 (1 ± 0.5), so a skipped norm shows.
    pub fn norm(&mut self, name: impl Into<String>, n: usize) {
        let v = (0..n).map(|_| 1.0 + self.rnd(0.5)).collect();
        self.tensors.push((name.into(), vec![n as u64], v));
    }

    /// The blocks of `shape`: first every block's matrices (attention q, k, v and output, then
    /// the FFN's gate, up and down; output projections at ±0.2, the rest at ±0.3), then
    /// `output_norm.weight`, then each block's `norms` (`blk.{l}.{name}.weight` of `n` entries).
    pub fn blocks(&mut self, shape: &Shape, norms: &[(&str, usize)]) {
        let Shape { d, heads, heads_kv, head_dim, ff, .. } = *shape;
        for l in 0..shape.layers {
            self.mat(format!("blk.{l}.attn_q.weight"), heads * head_dim, d, 0.3);
            self.mat(format!("blk.{l}.attn_k.weight"), heads_kv * head_dim, d, 0.3);
            self.mat(format!("blk.{l}.attn_v.weight"), heads_kv * head_dim, d, 0.3);
            self.mat(format!("blk.{l}.attn_output.weight"), d, heads * head_dim, 0.2);
            self.mat(format!("blk.{l}.ffn_gate.weight"), ff, d, 0.3);
            self.mat(format!("blk.{l}.ffn_up.weight"), ff, d, 0.3);
            self.mat(format!("blk.{l}.ffn_down.weight"), d, ff, 0.2);
        }
        self.norm("output_norm.weight", d);
        for l in 0..shape.layers {
            for &(name, n) in norms {
                self.norm(format!("blk.{l}.{name}.weight"), n);
            }
        }
    }

    /// The tensor called `name`; panics naming it when there is none.
    pub fn get(&self, name: &str) -> &[f32] {
        &self.tensors.iter().find(|t| t.0 == name).unwrap_or_else(|| panic!("{name}")).2
    }

    /// The file's bytes: `meta`'s metadata, then every tensor as F32 in the order made.
    pub fn write(&self, mut meta: GgufWriter) -> Vec<u8> {
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        for (name, dims, v) in &self.tensors {
            meta.add_tensor(name.clone(), dims, GgmlType::F32).unwrap();
            bytes.push(v.iter().flat_map(|x| x.to_le_bytes()).collect());
        }
        let refs: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
        meta.write_all_to_vec(&refs).unwrap()
    }
}
