//! Why the Vulkan home cannot start or run.

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
