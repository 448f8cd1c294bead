//! Prefill GEMM: the weights times a window of activation rows (see shaders/ops/gemm.comp).
//! Stand-in until the tiled kernel lands: the N-row GEMV over 8-row slices of the window.

use resin_gguf::GgmlType;

use crate::kernels::{GemvPush, Recorder};
use crate::pipelines::Bind;
use crate::VkError;

impl Recorder<'_> {
    /// y[c * y_stride + y_off + r] = W[r] . x[c * x_stride ..] for r < rows, c < n.
    pub fn gemm(&mut self, ty: GgmlType, n: u32, w: Bind<'_>, x: Bind<'_>, y: Bind<'_>, p: GemvPush) -> Result<(), VkError> {
        let mut c0 = 0u32;
        while c0 < n {
            let k = (n - c0).min(8);
            let xo = c0 as u64 * p.x_stride as u64 * 4;
            let yo = c0 as u64 * p.y_stride as u64 * 4;
            let xs = Bind { buf: x.buf, offset: x.offset + xo, range: x.range - xo };
            let ys = Bind { buf: y.buf, offset: y.offset + yo, range: y.range - yo };
            self.gemv(ty, k, w, xs, ys, p)?;
            c0 += k;
        }
        Ok(())
    }
}
