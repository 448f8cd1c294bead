//! How the device's failures are told apart, and a switch that makes them happen on purpose.
//!
//! A device that fails mid-run is lost for good: a `VK_ERROR_DEVICE_LOST`, an allocation that
//! finds no device memory while the home runs, or a fence that does not signal within
//! [`GpuOptions::fence_timeout`](crate::GpuOptions::fence_timeout). The first such failure is
//! recorded on the [`Gpu`](crate::Gpu) ([`Gpu::lost`](crate::Gpu::lost)); from then on every
//! submit and wait on it fails at once with the same reason, and the home reports
//! `HomeError::DeviceLost`, which the engine takes as the end of its home.
//!
//! [`FaultSwitch`] injects each failure where the real one would arise (the queue submit, the
//! fence wait, a buffer's allocation or upload), so the whole path up to the server's 503s runs
//! in tests on any device, lavapipe included. It is data in [`GpuOptions`](crate::GpuOptions),
//! off unless a test arms it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use ash::vk;

/// A failure the switch injects at the next matching operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next queue submit fails with `VK_ERROR_DEVICE_LOST` (nothing is submitted).
    DeviceLost,
    /// The next queue submit is dropped: its fence never signals, so the wait runs into
    /// [`GpuOptions::fence_timeout`](crate::GpuOptions::fence_timeout).
    Hang,
    /// The next upload to the device (a buffer's allocation or a write into one) fails with
    /// `VK_ERROR_OUT_OF_DEVICE_MEMORY`.
    OutOfMemory,
}

const NONE: u8 = 0;

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::DeviceLost => 1,
            Fault::Hang => 2,
            Fault::OutOfMemory => 3,
        }
    }
}

/// A shared switch that arms one [`Fault`] at a time; the operation it targets takes it (once).
/// Clones share the switch, so a test keeps one and hands the other to `GpuOptions`.
#[derive(Clone, Default)]
pub struct FaultSwitch(Arc<AtomicU8>);

impl FaultSwitch {
    /// Arm `fault`: the next operation it targets fails that way.
    pub fn arm(&self, fault: Fault) {
        self.0.store(fault.code(), Ordering::SeqCst);
    }

    /// Whether a fault is armed and not yet taken.
    pub fn armed(&self) -> bool {
        self.0.load(Ordering::SeqCst) != NONE
    }

    /// Take the armed fault when it is `fault` (the caller then fails that way).
    pub(crate) fn take(&self, fault: Fault) -> bool {
        self.0.compare_exchange(fault.code(), NONE, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }
}

impl std::fmt::Debug for FaultSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.armed() { "FaultSwitch(armed)" } else { "FaultSwitch" })
    }
}

/// Switches compare equal when they are the same switch.
impl PartialEq for FaultSwitch {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for FaultSwitch {}

/// Whether a Vulkan result means the device cannot go on: lost, or out of device memory
/// mid-run (what a step needs cannot be placed, and what it left half written cannot be
/// trusted).
pub(crate) fn is_fatal(r: vk::Result) -> bool {
    matches!(r, vk::Result::ERROR_DEVICE_LOST | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY)
}

/// Why the device was given up.
#[derive(Debug, Clone)]
pub struct Lost {
    /// What failed, for logs and the server's answers.
    pub reason: String,
    /// Work may still be running on the device (a fence timed out): nothing it uses may be
    /// freed or destroyed, so the home leaks what it holds rather than wait for it.
    pub pending: bool,
}
