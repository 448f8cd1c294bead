//! The ggml block formats against an independent implementation (the `gguf` PyPI package's
//! numpy codecs, vectors made by scripts/gen_format_vectors.py), round-trip error budgets per
//! format, and the error cases.

use resin_gguf::formats::{dequantize, quantize, quantize_into};
use resin_gguf::{GgmlType, GgufError};

/// Round-trip budget: relative RMS error ||x - x'|| / ||x|| of quantize-then-dequantize on
/// 4096 standard Gaussian values ([`gaussian`]). Each bound is about 1.3x the value measured
/// with the ggml reference quantizers (in the comment), so a quantizer that gets about 30% worse
/// fails; [`q4_0_fails_q8_0_budget`] shows a bound can fail at all.
const ROUND_TRIP_BOUNDS: [(GgmlType, f64); 15] = [
    (GgmlType::F32, 0.0),     // measured 0 (exact)
    (GgmlType::F16, 2.7e-4),  // measured 2.05e-4
    (GgmlType::BF16, 2.2e-3), // measured 1.70e-3
    (GgmlType::Q8_0, 7.0e-3), // measured 5.37e-3
    (GgmlType::Q8_1, 7.0e-3), // measured 5.37e-3
    (GgmlType::Q8_K, 8.9e-3), // measured 6.82e-3
    (GgmlType::Q6_K, 2.3e-2), // measured 1.80e-2
    (GgmlType::Q5_0, 5.5e-2), // measured 4.26e-2
    (GgmlType::Q5_1, 4.9e-2), // measured 3.79e-2
    (GgmlType::Q5_K, 4.7e-2), // measured 3.65e-2
    (GgmlType::Q4_0, 1.1e-1), // measured 8.56e-2
    (GgmlType::Q4_1, 1.0e-1), // measured 7.90e-2
    (GgmlType::Q4_K, 9.4e-2), // measured 7.24e-2
    (GgmlType::Q3_K, 2.0e-1), // measured 1.52e-1
    (GgmlType::Q2_K, 3.8e-1), // measured 2.94e-1
];

/// The 13 formats with dequantization vectors from gguf-py.
const NUMPY_DEQUANT: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The formats gguf-py can quantize (checked byte for byte).
const NUMPY_QUANT: [GgmlType; 7] = [GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/formats/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e} (run scripts/gen_format_vectors.py)"))
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Deterministic standard Gaussian values (splitmix64 + Box-Muller); no rand crate.
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (next().max(1e-300), next());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn round_trip_error(ty: GgmlType) -> f64 {
    let x = gaussian(4096, 0x5eed);
    let q = quantize(ty, &x).unwrap();
    assert_eq!(q.len(), 4096 / ty.block_len() * ty.block_bytes());
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    rel_rms(&x, &y)
}

fn bound(ty: GgmlType) -> f64 {
    ROUND_TRIP_BOUNDS.iter().find(|(t, _)| *t == ty).expect("every type has a bound").1
}

/// Bit-exact: our dequantizers perform the same f32 operations in the same order as ggml's C
/// and gguf-py's numpy (f16 -> f32 is exact, then d * sc, then * q, then - m), so no tolerance
/// is needed; a mismatch is a layout or arithmetic bug, not rounding noise.
#[test]
fn dequantize_matches_gguf_numpy() {
    let manifest: serde_json::Value = serde_json::from_slice(&data("manifest.json")).expect("manifest.json");
    eprintln!("vectors from gguf {}", manifest["gguf_version"]);
    for ty in NUMPY_DEQUANT {
        let src = data(&format!("{ty}.bin"));
        let want = floats(&data(&format!("{ty}.f32")));
        assert!(!want.is_empty(), "{ty}: no vectors");
        let mut got = vec![f32::NAN; want.len()];
        dequantize(ty, &src, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.to_bits() == w.to_bits(), "{ty}: value {i} (block {}): got {g:e}, gguf-py {w:e}", i / ty.block_len());
        }
    }
}

/// Byte-exact against gguf-py's quantizers (which reproduce ggml's reference C ones).
#[test]
fn quantize_matches_gguf_numpy() {
    let x = floats(&data("quant_input.f32"));
    for ty in NUMPY_QUANT {
        let want = data(&format!("{ty}.q.bin"));
        let got = quantize(ty, &x).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("{ty}: byte {i} (block {}) differs: {} vs gguf-py {}", i / ty.block_bytes(), got[i], want[i]);
        }
    }
}

#[test]
fn round_trip_within_budget() {
    let mut report = String::new();
    for ty in GgmlType::ALL {
        let err = round_trip_error(ty);
        report += &format!("{ty}: {err:.3e} (bound {:.1e})\n", bound(ty));
        assert!(err.is_finite() && err <= bound(ty), "{ty}: round-trip error {err:.3e} > {:.1e}", bound(ty));
    }
    eprint!("{report}");
}

/// Negative control: a 4-bit format cannot pass the 8-bit budget, so the budgets can fail.
#[test]
fn q4_0_fails_q8_0_budget() {
    let err = round_trip_error(GgmlType::Q4_0);
    assert!(err > bound(GgmlType::Q8_0), "Q4_0 error {err:.3e} passed the Q8_0 bound");
}

/// Requantizing dequantized values is stable for the simple formats: the same bytes come back.
#[test]
fn q8_0_requantize_is_identity() {
    let q = quantize(GgmlType::Q8_0, &gaussian(1024, 7)).unwrap();
    let mut y = vec![0f32; 1024];
    dequantize(GgmlType::Q8_0, &q, &mut y).unwrap();
    assert_eq!(quantize(GgmlType::Q8_0, &y).unwrap(), q);
}

#[test]
fn zero_input_gives_zero_output() {
    for ty in GgmlType::ALL {
        let x = vec![0f32; 512];
        let q = quantize(ty, &x).unwrap();
        let mut y = vec![1f32; 512];
        dequantize(ty, &q, &mut y).unwrap();
        assert!(y.iter().all(|v| *v == 0.0), "{ty}");
    }
}

#[test]
fn length_errors_never_panic() {
    for ty in GgmlType::ALL {
        let (bl, bb) = (ty.block_len(), ty.block_bytes());
        let n = 2 * 256;
        let good = vec![0u8; n / bl * bb];

        // Too many / too few bytes for whole blocks.
        for bad in [good.len() + 1, good.len() - 1, 0] {
            let mut y = vec![0f32; n];
            match dequantize(ty, &vec![0u8; bad], &mut y) {
                Err(GgufError::WrongByteLength { ty: t, got, expected }) => {
                    assert_eq!((t, got, expected), (ty, bad, good.len()), "{ty}")
                }
                other => panic!("{ty}: dequantize with {bad} bytes gave {other:?}"),
            }
            let mut dst = vec![0u8; bad];
            match quantize_into(ty, &vec![0f32; n], &mut dst) {
                Err(GgufError::WrongByteLength { got, expected, .. }) => {
                    assert_eq!((got, expected), (bad, good.len()), "{ty}")
                }
                other => panic!("{ty}: quantize_into with {bad} bytes gave {other:?}"),
            }
        }

        // A value count that is not whole blocks (only possible for block formats).
        if bl > 1 {
            let mut y = vec![0f32; n + 1];
            assert!(matches!(dequantize(ty, &good, &mut y), Err(GgufError::PartialBlock { len, block, .. }) if len == n + 1 && block == bl), "{ty}: dequantize partial block");
            let x = vec![0f32; bl / 2];
            assert!(matches!(quantize(ty, &x), Err(GgufError::PartialBlock { .. })), "{ty}: quantize partial block");
            let mut dst = vec![0u8; bb];
            assert!(matches!(quantize_into(ty, &x, &mut dst), Err(GgufError::PartialBlock { .. })), "{ty}: quantize_into partial block");
        }

        // Empty input is fine.
        assert_eq!(quantize(ty, &[]).unwrap(), Vec::<u8>::new());
        dequantize(ty, &[], &mut []).unwrap();
    }
}

/// Dequantizing arbitrary bytes never panics (all bit patterns are valid blocks).
#[test]
fn any_bytes_dequantize() {
    for ty in GgmlType::ALL {
        let n = 512;
        let bytes: Vec<u8> = (0..n / ty.block_len() * ty.block_bytes()).map(|i| (i * 131 + 7) as u8).collect();
        let mut y = vec![0f32; n];
        dequantize(ty, &bytes, &mut y).unwrap();
    }
}
