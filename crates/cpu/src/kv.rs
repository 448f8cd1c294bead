//! The CPU home's K/V mirror: `regions` copies of the per-layer K/V layout, one codec.
//!
//! Layout per side (K, V): `[region][layer][position][kv_dim]`. The buffers are zeroed with
//! calloc-backed vectors, so untouched regions cost no resident memory.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use resin_core::KvCodec;
use resin_gguf::{formats, GgmlType};

use crate::home::CpuError;

enum Store {
    /// f16 bits: a `Vec<u16>` of zeros comes from calloc (untouched pages cost nothing), which a
    /// `Vec<f16>` does not.
    F16(Vec<u16>),
    F32(Vec<f32>),
    /// q8_0 blocks: 32 values as an f16 scale and 32 i8, 34 bytes.
    Q8(Vec<u8>),
}

pub struct KvCache {
    codec: KvCodec,
    n_layer: usize,
    n_ctx: usize,
    kv_dim: usize,
    k: Store,
    v: Store,
}

#[derive(Clone, Copy)]
pub enum Side {
    K,
    V,
}

impl KvCache {
    pub fn new(codec: KvCodec, regions: usize, n_layer: usize, n_ctx: usize, kv_dim: usize, head_dim: usize) -> Result<Self, CpuError> {
        if codec == KvCodec::Q8_0 && !head_dim.is_multiple_of(32) {
            return Err(CpuError::Model(format!("the q8_0 K/V codec needs a head dimension that is a multiple of 32, not {head_dim}")));
        }
        let n = regions
            .checked_mul(n_layer)
            .and_then(|x| x.checked_mul(n_ctx))
            .and_then(|x| x.checked_mul(kv_dim))
            .ok_or_else(|| CpuError::Model("K/V cache size overflows".into()))?;
        let make = || match codec {
            KvCodec::F16 => Store::F16(vec![0u16; n]),
            KvCodec::F32 => Store::F32(vec![0.0; n]),
            KvCodec::Q8_0 => Store::Q8(vec![0u8; n / 32 * 34]),
        };
        Ok(KvCache { codec, n_layer, n_ctx, kv_dim, k: make(), v: make() })
    }

    pub fn codec(&self) -> KvCodec {
        self.codec
    }

    /// Bytes the cache occupies when every region is full.
    pub fn bytes(&self) -> usize {
        2 * match &self.k {
            Store::F16(v) => v.len() * 2,
            Store::F32(v) => v.len() * 4,
            Store::Q8(v) => v.len(),
        }
    }

    fn index(&self, region: usize, layer: usize, pos: usize) -> usize {
        ((region * self.n_layer + layer) * self.n_ctx + pos) * self.kv_dim
    }

    /// Bytes of one position's K and V rows over every layer (a snapshot's row).
    pub fn row_bytes(&self) -> usize {
        2 * self.n_layer * self.codec.bytes_for(self.kv_dim)
    }

    /// Byte range of positions `0..rows` of (region, layer) in one side's store.
    fn span(&self, region: usize, layer: usize, rows: usize) -> std::ops::Range<usize> {
        let i = self.index(region, layer, 0);
        let n = rows * self.kv_dim;
        match self.codec {
            KvCodec::F16 => 2 * i..2 * (i + n),
            KvCodec::F32 => 4 * i..4 * (i + n),
            KvCodec::Q8_0 => i / 32 * 34..(i + n) / 32 * 34,
        }
    }

    /// Positions `0..rows` of `region`, every layer: `[layer][K rows | V rows]`, in the codec's bytes.
    pub fn save(&self, region: usize, rows: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows * self.row_bytes());
        for layer in 0..self.n_layer {
            let r = self.span(region, layer, rows);
            for store in [&self.k, &self.v] {
                match store {
                    Store::F16(b) => out.extend(b[r.start / 2..r.end / 2].iter().flat_map(|x| x.to_le_bytes())),
                    Store::F32(b) => out.extend(b[r.start / 4..r.end / 4].iter().flat_map(|x| x.to_le_bytes())),
                    Store::Q8(b) => out.extend_from_slice(&b[r.clone()]),
                }
            }
        }
        out
    }

    /// Write the first `rows` positions of a snapshot of `saved` positions into `region`.
    pub fn load(&mut self, region: usize, rows: usize, saved: usize, snap: &[u8]) {
        let side = saved * self.codec.bytes_for(self.kv_dim);
        for layer in 0..self.n_layer {
            let r = self.span(region, layer, rows);
            let base = layer * 2 * side;
            for (k, store) in [&mut self.k, &mut self.v].into_iter().enumerate() {
                let src = &snap[base + k * side..base + k * side + r.len()];
                match store {
                    Store::F16(b) => {
                        for (d, c) in b[r.start / 2..r.end / 2].iter_mut().zip(src.chunks_exact(2)) {
                            *d = u16::from_le_bytes([c[0], c[1]]);
                        }
                    }
                    Store::F32(b) => {
                        for (d, c) in b[r.start / 4..r.end / 4].iter_mut().zip(src.chunks_exact(4)) {
                            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        }
                    }
                    Store::Q8(b) => b[r.clone()].copy_from_slice(src),
                }
            }
        }
    }

    /// Store one position's K and V rows (kv_dim values each).
    pub fn store(&mut self, region: usize, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let i = self.index(region, layer, pos);
        let d = self.kv_dim;
        for (store, src) in [(&mut self.k, k), (&mut self.v, v)] {
            match store {
                Store::F16(buf) => {
                    // Clamp to the half range so an outlier does not become infinity.
                    for (dst, &x) in buf[i..i + d].iter_mut().zip(src) {
                        *dst = f16::from_f32(x.clamp(-65504.0, 65504.0)).to_bits();
                    }
                }
                Store::F32(buf) => buf[i..i + d].copy_from_slice(src),
                Store::Q8(buf) => {
                    let b = i / 32 * 34;
                    formats::quantize_into(GgmlType::Q8_0, src, &mut buf[b..b + d / 32 * 34]).expect("kv_dim is a whole number of q8_0 blocks (checked in new)");
                }
            }
        }
    }

    /// The f16 bits of positions `0..n_ctx` of (region, layer) of one side (`[position][kv_dim]`),
    /// where the codec is f16: what attention reads in place.
    pub fn f16_rows(&self, side: Side, region: usize, layer: usize) -> Option<&[u16]> {
        let store = match side {
            Side::K => &self.k,
            Side::V => &self.v,
        };
        let i = self.index(region, layer, 0);
        match store {
            Store::F16(buf) => Some(&buf[i..i + self.n_ctx * self.kv_dim]),
            _ => None,
        }
    }

    /// Values between positions of one side's rows.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Read dims `lo..lo + out_dim` of positions `first..n` of one side into `out`
    /// ([n - first][out_dim]).
    #[allow(clippy::too_many_arguments)]
    pub fn read(&self, side: Side, region: usize, layer: usize, first: usize, n: usize, lo: usize, out_dim: usize, out: &mut [f32]) {
        let store = match side {
            Side::K => &self.k,
            Side::V => &self.v,
        };
        let base = self.index(region, layer, 0);
        for t in first..n {
            let i = base + t * self.kv_dim + lo;
            let dst = &mut out[(t - first) * out_dim..(t - first + 1) * out_dim];
            match store {
                Store::F16(buf) => buf[i..i + out_dim].reinterpret_cast::<f16>().convert_to_f32_slice(dst),
                Store::F32(buf) => dst.copy_from_slice(&buf[i..i + out_dim]),
                Store::Q8(buf) => {
                    let b = i / 32 * 34;
                    formats::dequantize(GgmlType::Q8_0, &buf[b..b + out_dim / 32 * 34], dst).expect("head_dim is a whole number of q8_0 blocks (checked in new)");
                }
            }
        }
    }
}
