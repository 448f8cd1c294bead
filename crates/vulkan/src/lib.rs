//! The Vulkan home: a resident driver. Weights (in their GGUF block formats), norms, biases,
//! the K/V mirror and every scratch buffer live on the device; per step only a small per-row
//! metadata block goes up and the logits come back.
//!
//! Modules: [`device`] (start, pick, tiers), [`buffers`] (buffers, one-shot submits,
//! timestamps), [`pipelines`] (the variant table of embedded SPIR-V and pipeline creation),
//! [`kernels`] (push-constant blocks and dispatch recording of each operation), [`layout`]
//! (how weight rows lie on the device), [`home`]
//! (the residency plan, the token command and `resin_core::Home`).

pub mod attn_window;
pub mod buffers;
pub mod device;
pub mod gemm;
pub mod gemv_dot;
pub mod home;
pub mod kernels;
pub mod layout;
pub mod pipelines;

pub use device::{probe, DeviceInfo, Gpu, GpuOptions};
pub use home::{UploadProgress, VulkanHome, VulkanOptions, WideMode};

/// Why the Vulkan home cannot start or run.
#[derive(Debug, thiserror::Error)]
pub enum VkError {
    #[error("no Vulkan loader: {0} (on Debian: apt-get install libvulkan1)")]
    NoLoader(String),
    #[error("no Vulkan driver: {0}")]
    NoDriver(String),
    #[error("no Vulkan device: {0}")]
    NoDevice(String),
    #[error("{what} failed: {result}")]
    Vk { what: &'static str, result: ash::vk::Result },
    #[error("not supported on this device: {0}")]
    Unsupported(String),
    #[error("too large for this device: {0}")]
    TooLarge(String),
    #[error("out of range: {0}")]
    OutOfRange(String),
    #[error("model: {0}")]
    Model(String),
}

impl From<VkError> for resin_core::HomeError {
    fn from(e: VkError) -> Self {
        resin_core::HomeError::Device(e.to_string())
    }
}
