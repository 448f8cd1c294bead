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
mod error;
pub mod fault;
pub mod gemm;
pub mod home;
pub mod kernels;
pub mod layout;
pub mod mv;
pub mod pipelines;

pub use device::{probe, DeviceInfo, Gpu, GpuOptions, FENCE_TIMEOUT_DEFAULT};
pub use error::VkError;
pub use fault::{Fault, FaultSwitch};
pub use home::{UploadProgress, VulkanHome, VulkanOptions, WideMode};
