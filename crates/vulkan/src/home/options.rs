//! How a Vulkan home is built: its options, and how it runs a step of more than NROW_MAX rows.

use std::sync::Arc;

use resin_core::{balanced_groups, KvCodec, NROW_MAX};

/// How a Vulkan home is built.
#[derive(Debug, Clone)]
pub struct VulkanOptions {
    /// Positions per region (defaults to the model's training context, capped at 4096).
    pub n_ctx: Option<usize>,
    pub regions: usize,
    pub codec: KvCodec,
    /// Round the activations of quantized GEMVs through 8-bit blocks as the CPU home's
    /// integer dot products do (the default), or keep them f32 (closer to a float32 pass).
    pub q8_activations: bool,
    /// Called as the weights go up with (bytes uploaded, bytes in all): the binary draws a
    /// progress bar with it. Without one, a log line every 10 %.
    pub progress: Option<UploadProgress>,
    /// How a step of more than NROW_MAX rows runs (default: `WideMode::Lanes`).
    pub wide: WideMode,
    /// How the device is started (which one, its queues, the fence wait's spin).
    pub gpu: crate::device::GpuOptions,
}

/// How the Vulkan home runs a step of more than NROW_MAX rows (a wide step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WideMode {
    /// Balanced groups of N-row token commands, each on a lane of its own (scratch, fence and
    /// one of the device's queues), submitted together: the groups' dependent dispatch chains
    /// overlap on the device, and each row's result is its N-row command's. Where the device
    /// has the int8 tiles, a step of CANON_WIDE_MIN_ROWS rows or more runs as `Canon` does:
    /// the same bits, the weights read once (`resin --wide-steps exact`).
    #[default]
    Lanes,
    /// One pass of all the rows, every matrix in the canonical product (mm.comp's int8 tiles
    /// where the device has them, mr.comp elsewhere): each row's bits are its own at any
    /// width, and the weights are read once a step.
    Canon,
    /// One pass of all the rows, its matrices through the window's GEMM.
    Gemm,
    /// The faster of the two by width (docs/lessons.md): lanes under FAST_GEMM_MIN_ROWS rows,
    /// one GEMM pass from there (it reads the weights once, not once a group). A row's result
    /// then depends on how wide its step was (within the CPU home's bar, as any GEMM row), so
    /// it is asked for by name (`--wide-steps fast`).
    Fast,
}

/// Rows from which `WideMode::Fast` takes one GEMM pass: at 32 rows the lanes still won on the
/// 3B, at 64 the GEMM pass won on both models (docs/lessons.md).
pub const FAST_GEMM_MIN_ROWS: usize = 40;

/// Rows from which `WideMode::Lanes` takes one canonical pass where the device has the int8
/// tiles: below, the lanes are faster (BENCHMARKS.md, docs/lessons.md).
pub const CANON_WIDE_MIN_ROWS: usize = 48;

impl WideMode {
    /// How a step of `rows` rows runs: (lane, rows) of each pass, in row order. `distinct`:
    /// every row has a region of its own (rows that share one take one pass: a row may attend
    /// to keys another row of the step stores). `canon_from`: rows from which `Lanes` takes one
    /// canonical pass (`usize::MAX` where it never does).
    pub fn passes(self, rows: usize, distinct: bool, canon_from: usize) -> Vec<(usize, usize)> {
        let lanes = rows > NROW_MAX
            && distinct
            && match self {
                WideMode::Lanes => rows < canon_from,
                WideMode::Gemm | WideMode::Canon => false,
                WideMode::Fast => rows < FAST_GEMM_MIN_ROWS,
            };
        if lanes {
            balanced_groups(rows, NROW_MAX).into_iter().enumerate().collect()
        } else {
            vec![(0, rows)]
        }
    }
}

/// An upload progress callback (see [`VulkanOptions::progress`]).
#[derive(Clone)]
pub struct UploadProgress(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl std::fmt::Debug for UploadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UploadProgress")
    }
}

impl Default for VulkanOptions {
    fn default() -> Self {
        VulkanOptions { n_ctx: None, regions: 1, codec: KvCodec::F16, q8_activations: true, progress: None, wide: WideMode::Lanes, gpu: crate::device::GpuOptions::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{canon_rows, extra_lanes};
    use super::*;

    #[test]
    fn wide_modes_choose_lanes_or_one_pass_by_width() {
        const NEVER: usize = usize::MAX;
        let groups = |m: WideMode, n: usize, d: bool, c: usize| m.passes(n, d, c).into_iter().map(|(_, r)| r).collect::<Vec<_>>();
        // Up to NROW_MAX rows: one token command in every mode.
        for m in [WideMode::Lanes, WideMode::Canon, WideMode::Gemm, WideMode::Fast] {
            for c in [NEVER, CANON_WIDE_MIN_ROWS] {
                assert_eq!(m.passes(8, true, c), vec![(0, 8)]);
                assert_eq!(m.passes(1, true, c), vec![(0, 1)]);
            }
        }
        // Lanes: balanced groups on lanes 0, 1, ...; rows sharing a region: one pass.
        assert_eq!(WideMode::Lanes.passes(17, true, NEVER), vec![(0, 6), (1, 6), (2, 5)]);
        assert_eq!(groups(WideMode::Lanes, 64, true, NEVER), vec![8; 8]);
        assert_eq!(WideMode::Lanes.passes(17, false, NEVER), vec![(0, 17)]);
        // With the int8 tiles: one canonical pass from CANON_WIDE_MIN_ROWS, lanes below.
        let c = CANON_WIDE_MIN_ROWS;
        assert_eq!(groups(WideMode::Lanes, c - 1, true, c), balanced_groups(c - 1, NROW_MAX));
        assert_eq!(WideMode::Lanes.passes(c, true, c), vec![(0, c)]);
        assert_eq!(WideMode::Lanes.passes(64, true, c), vec![(0, 64)]);
        // Canon and Gemm: always one pass.
        assert_eq!(WideMode::Canon.passes(12, true, NEVER), vec![(0, 12)]);
        assert_eq!(WideMode::Gemm.passes(12, true, NEVER), vec![(0, 12)]);
        // Fast: lanes below FAST_GEMM_MIN_ROWS, one pass from there.
        assert_eq!(groups(WideMode::Fast, FAST_GEMM_MIN_ROWS - 1, true, NEVER), balanced_groups(FAST_GEMM_MIN_ROWS - 1, NROW_MAX));
        assert_eq!(WideMode::Fast.passes(FAST_GEMM_MIN_ROWS, true, NEVER), vec![(0, FAST_GEMM_MIN_ROWS)]);
        assert_eq!(WideMode::Fast.passes(64, true, NEVER), vec![(0, 64)]);
        // Lanes a home plans for its widest step: Fast never more than for 39 rows, Lanes with
        // the tiles never more than for CANON_WIDE_MIN_ROWS - 1.
        assert_eq!(extra_lanes(WideMode::Fast, 64, NEVER), (FAST_GEMM_MIN_ROWS - 1).div_ceil(NROW_MAX) - 1);
        assert_eq!(extra_lanes(WideMode::Fast, 16, NEVER), 1);
        assert_eq!(extra_lanes(WideMode::Lanes, 64, NEVER), 7);
        assert_eq!(extra_lanes(WideMode::Lanes, 64, c), (c - 1).div_ceil(NROW_MAX) - 1);
        assert_eq!(extra_lanes(WideMode::Lanes, 16, c), 1);
        assert_eq!(extra_lanes(WideMode::Gemm, 64, NEVER), 0);
        // Rows a pass takes the canonical product for: the widest step's where a step may be
        // one canonical pass, a token command's elsewhere.
        assert_eq!(canon_rows(WideMode::Lanes, 64, NEVER), NROW_MAX);
        assert_eq!(canon_rows(WideMode::Lanes, 64, c), 64);
        assert_eq!(canon_rows(WideMode::Lanes, 32, c), NROW_MAX);
        assert_eq!(canon_rows(WideMode::Canon, 32, NEVER), 32);
        assert_eq!(canon_rows(WideMode::Gemm, 64, c), NROW_MAX);
    }
}
