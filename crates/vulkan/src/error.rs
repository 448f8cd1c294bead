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
    /// The device failed mid-run and was given up (see [`crate::fault`]).
    #[error("the device failed: {0}")]
    Lost(String),
}

impl VkError {
    /// Whether the device cannot go on after this error (see [`crate::fault`]).
    pub fn is_fatal(&self) -> bool {
        match self {
            VkError::Lost(_) => true,
            VkError::Vk { result, .. } => crate::fault::is_fatal(*result),
            _ => false,
        }
    }

    /// What failed, without the "device failed" prefix a lost device's error carries.
    pub fn reason(&self) -> String {
        match self {
            VkError::Lost(r) => r.clone(),
            e => e.to_string(),
        }
    }
}

impl From<VkError> for resin_core::HomeError {
    fn from(e: VkError) -> Self {
        if e.is_fatal() {
            resin_core::HomeError::DeviceLost(e.reason())
        } else {
            resin_core::HomeError::Device(e.to_string())
        }
    }
}
