//! How a Vulkan home is built: its options.

use std::sync::Arc;

use resin_core::KvCodec;

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
    /// How the device is started (which one, the fence wait's spin).
    pub gpu: crate::device::GpuOptions,
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
        VulkanOptions { n_ctx: None, regions: 1, codec: KvCodec::F16, q8_activations: true, progress: None, gpu: crate::device::GpuOptions::default() }
    }
}
