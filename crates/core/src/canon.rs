//! The canonical order of a matrix product (docs/canonical-order.md): how a row of `K` values
//! is cut into blocks and chunks, and the pairwise tree that adds the chunks. Both homes and
//! every kernel that claims the order read these, so the shape of a sum follows from `K`
//! alone, never from the row count or a tuning switch.

/// Values a block: activations are quantized in int8 blocks of this many.
pub const BLOCK: usize = 32;
/// Chunks a row is cut into at most: one subgroup of 32 lanes holds a row's tree.
pub const CHUNKS_MAX: usize = 32;
/// Blocks a chunk takes at least (256 values: a K-quant super-block is never split).
pub const CHUNK_BLOCKS_MIN: usize = 8;

/// How a row of `k` values (a multiple of [`BLOCK`]) is cut: `blocks` blocks in `chunks`
/// chunks of `chunk_blocks` (the last one may be short), and `lanes`, the chunk count rounded
/// up to a power of two (the tree's width: lanes past `chunks` add +0.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub blocks: usize,
    pub chunk_blocks: usize,
    pub chunks: usize,
    pub lanes: usize,
}

impl Cut {
    /// The cut of a row of `k` values, None where `k` is not a positive multiple of [`BLOCK`].
    pub fn of(k: usize) -> Option<Cut> {
        if k == 0 || !k.is_multiple_of(BLOCK) {
            return None;
        }
        let blocks = k / BLOCK;
        let mut chunk_blocks = CHUNK_BLOCKS_MIN;
        while blocks.div_ceil(chunk_blocks) > CHUNKS_MAX {
            chunk_blocks *= 2;
        }
        let chunks = blocks.div_ceil(chunk_blocks);
        Some(Cut { blocks, chunk_blocks, chunks, lanes: chunks.next_power_of_two() })
    }

    /// The blocks of chunk `c`.
    pub fn chunk(&self, c: usize) -> std::ops::Range<usize> {
        let b0 = (c * self.chunk_blocks).min(self.blocks);
        b0..(b0 + self.chunk_blocks).min(self.blocks)
    }

    /// The sum of per-block values `f` in the canonical order: each chunk left to right from
    /// +0.0, then the pairwise tree over `lanes` partials (+0.0 past the last chunk).
    pub fn sum(&self, f: impl Fn(usize) -> f32) -> f32 {
        let mut parts = [0f32; CHUNKS_MAX];
        for (c, p) in parts.iter_mut().enumerate().take(self.chunks) {
            let mut acc = 0f32;
            for b in self.chunk(c) {
                acc += f(b);
            }
            *p = acc;
        }
        tree(&mut parts[..self.lanes])
    }
}

/// The pairwise tree over `v` (a power of two long): level by level, t_j = t_2j + t_2j+1.
/// What a butterfly of subgroupShuffleXor(1, 2, 4, ...) leaves on every lane.
pub fn tree(v: &mut [f32]) -> f32 {
    debug_assert!(v.len().is_power_of_two());
    let mut d = 1;
    while d < v.len() {
        for i in (0..v.len()).step_by(2 * d) {
            v[i] += v[i + d];
        }
        d *= 2;
    }
    v[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_follow_the_spec_examples() {
        let c = |k| Cut::of(k).map(|c| (c.blocks, c.chunk_blocks, c.chunks, c.lanes));
        assert_eq!(c(576), Some((18, 8, 3, 4)));
        assert_eq!(c(2048), Some((64, 8, 8, 8)));
        assert_eq!(c(3072), Some((96, 8, 12, 16)));
        assert_eq!(c(8192), Some((256, 8, 32, 32)));
        assert_eq!(c(14336), Some((448, 16, 28, 32)));
        assert_eq!(c(32), Some((1, 8, 1, 1)));
        assert_eq!(c(0), None);
        assert_eq!(c(48), None);
        let cut = Cut::of(576).unwrap();
        assert_eq!((cut.chunk(0), cut.chunk(2)), (0..8, 16..18));
    }

    #[test]
    fn the_tree_pairs_neighbours_first() {
        // The tree's pairs lose both 1s to rounding ((1e8 + 1) + (-1e8 + 1) = 0 in f32); left
        // to right keeps the last one: the order is part of the result.
        let v = [1e8f32, 1.0, -1e8, 1.0];
        assert_eq!(tree(&mut v.clone()), 0.0);
        assert_eq!(v.iter().fold(0f32, |a, b| a + b), 1.0);
        let mut v = [1.0f32, 1e8, 1.0, -1e8];
        assert_eq!(tree(&mut v), (1.0f32 + 1e8) + (1.0 + -1e8));
        let cut = Cut::of(2048).unwrap();
        let seq: f32 = (0..64).map(|b| 0.1 * b as f32).sum();
        let canon = cut.sum(|b| 0.1 * b as f32);
        assert!((seq - canon).abs() < 1e-3);
    }
}
