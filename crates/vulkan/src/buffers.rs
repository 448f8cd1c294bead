//! Buffers, one-shot command submission and timestamp queries.
//!
//! Every object holds an `Arc<Gpu>`, so the device outlives what was made from it and the
//! `Drop`s run in reverse order of creation: a buffer frees its memory, then the last owner
//! of the device waits for it and destroys it.

use std::sync::Arc;

use ash::vk;

use crate::device::Gpu;
use crate::fault::Fault;
use crate::VkError;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Device-local memory (mapped too when the device offers host-visible device memory, as
    /// lavapipe and resizable-BAR GPUs do); filled through a staging buffer otherwise.
    Device,
    /// Host-visible, coherent memory: per-step metadata and read-back.
    Host,
}

/// A storage buffer and its own memory.
pub struct Buffer {
    gpu: Arc<Gpu>,
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub size: u64,
    mapped: Option<*mut u8>,
}

// SAFETY: the mapped pointer is only touched through &self / &mut self methods that copy
// bytes; Vulkan handles are plain identifiers.
unsafe impl Send for Buffer {}
// SAFETY: as above; reads through &self copy out, writes need &mut self.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("size", &self.size).field("mapped", &self.mapped.is_some()).finish()
    }
}

fn find_memory(gpu: &Gpu, bits: u32, want: &[vk::MemoryPropertyFlags]) -> Option<u32> {
    let m = &gpu.memory;
    for flags in want {
        for i in 0..m.memory_type_count {
            if bits & (1 << i) != 0 && m.memory_types[i as usize].property_flags.contains(*flags) {
                return Some(i);
            }
        }
    }
    None
}

impl Buffer {
    /// A buffer of `size` bytes (at least 4) usable as a storage buffer and a transfer source
    /// and destination.
    pub fn new(gpu: &Arc<Gpu>, size: u64, loc: Location) -> Result<Buffer, VkError> {
        let size = size.max(4).next_multiple_of(4);
        gpu.live()?;
        if gpu.faults.take(Fault::OutOfMemory) {
            return Err(VkError::Vk { what: "vkAllocateMemory (injected)", result: vk::Result::ERROR_OUT_OF_DEVICE_MEMORY });
        }
        if size > gpu.info.max_allocation && gpu.info.max_allocation > 0 {
            return Err(VkError::TooLarge(format!("a buffer of {size} bytes is past the device's allocation limit of {}", gpu.info.max_allocation)));
        }
        let d = &gpu.device;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: the device is live; the info is valid.
        let buffer = unsafe { d.create_buffer(&info, None) }.map_err(|r| VkError::Vk { what: "vkCreateBuffer", result: r })?;
        // SAFETY: buffer was made from this device.
        let req = unsafe { d.get_buffer_memory_requirements(buffer) };
        use vk::MemoryPropertyFlags as F;
        let want: &[F] = match loc {
            Location::Device => &[F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT, F::DEVICE_LOCAL, F::HOST_VISIBLE | F::HOST_COHERENT],
            Location::Host => &[F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED, F::HOST_VISIBLE | F::HOST_COHERENT],
        };
        let Some(ty) = find_memory(gpu, req.memory_type_bits, want) else {
            // SAFETY: unused buffer of this device.
            unsafe { d.destroy_buffer(buffer, None) };
            return Err(VkError::Unsupported("no memory type fits a storage buffer".into()));
        };
        let alloc = vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(ty);
        // SAFETY: valid allocate info.
        let memory = match unsafe { d.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(r) => {
                // SAFETY: unused buffer of this device.
                unsafe { d.destroy_buffer(buffer, None) };
                return Err(VkError::Vk { what: "vkAllocateMemory", result: r });
            }
        };
        let host = gpu.memory.memory_types[ty as usize].property_flags.contains(F::HOST_VISIBLE);
        let mut b = Buffer { gpu: gpu.clone(), buffer, memory, size, mapped: None };
        // SAFETY: memory fits the buffer's requirements (it was sized by them).
        unsafe { d.bind_buffer_memory(buffer, memory, 0) }.map_err(|r| VkError::Vk { what: "vkBindBufferMemory", result: r })?;
        if host {
            // SAFETY: host-visible memory, mapped whole once for the buffer's life.
            let p = unsafe { d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }.map_err(|r| VkError::Vk { what: "vkMapMemory", result: r })?;
            b.mapped = Some(p.cast());
        }
        Ok(b)
    }

    /// A device buffer filled with `bytes`.
    pub fn with_data(gpu: &Arc<Gpu>, bytes: &[u8], loc: Location) -> Result<Buffer, VkError> {
        let mut b = Buffer::new(gpu, bytes.len() as u64, loc)?;
        b.write(0, bytes)?;
        Ok(b)
    }

    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), VkError> {
        if offset.checked_add(len as u64).is_none_or(|end| end > self.size) {
            return Err(VkError::OutOfRange(format!("{len} bytes at {offset} in a buffer of {}", self.size)));
        }
        Ok(())
    }

    /// Copy `bytes` into the buffer at `offset` (mapped memory directly, else via staging).
    pub fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), VkError> {
        self.check(offset, bytes.len())?;
        // What a device without host-visible memory meets here: its staging allocation fails.
        if self.gpu.faults.take(Fault::OutOfMemory) {
            return Err(VkError::Vk { what: "vkAllocateMemory (staging, injected)", result: vk::Result::ERROR_OUT_OF_DEVICE_MEMORY });
        }
        if let Some(p) = self.mapped {
            // SAFETY: range checked above; the mapping covers the whole buffer and the
            // device does not use it while we hold &mut self (callers wait on fences).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(offset as usize), bytes.len()) };
            return Ok(());
        }
        // Staging in pieces of at most 64 MiB.
        for (i, chunk) in bytes.chunks(64 << 20).enumerate() {
            let mut st = Buffer::new(&self.gpu, chunk.len() as u64, Location::Host)?;
            st.write(0, chunk)?;
            let dst = offset + (i as u64) * (64 << 20);
            let region = [vk::BufferCopy { src_offset: 0, dst_offset: dst, size: chunk.len() as u64 }];
            submit_once(&self.gpu, |cmd| {
                // SAFETY: both buffers are live and the region is in range.
                unsafe { self.gpu.device.cmd_copy_buffer(cmd, st.buffer, self.buffer, &region) };
            })?;
        }
        Ok(())
    }

    /// Copy `out.len()` bytes at `offset` out of the buffer.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), VkError> {
        self.check(offset, out.len())?;
        if let Some(p) = self.mapped {
            // SAFETY: range checked; the device is done with the buffer (callers wait).
            unsafe { std::ptr::copy_nonoverlapping(p.add(offset as usize), out.as_mut_ptr(), out.len()) };
            return Ok(());
        }
        let st = Buffer::new(&self.gpu, out.len() as u64, Location::Host)?;
        let region = [vk::BufferCopy { src_offset: offset, dst_offset: 0, size: out.len() as u64 }];
        submit_once(&self.gpu, |cmd| {
            // SAFETY: both buffers are live and the region is in range.
            unsafe { self.gpu.device.cmd_copy_buffer(cmd, self.buffer, st.buffer, &region) };
        })?;
        st.read(0, out)
    }

    pub fn write_f32(&mut self, offset_elems: usize, v: &[f32]) -> Result<(), VkError> {
        self.write((offset_elems * 4) as u64, &f32_bytes(v))
    }

    /// `n` f32 values from element `offset_elems`.
    pub fn read_f32(&self, offset_elems: usize, n: usize) -> Result<Vec<f32>, VkError> {
        let mut v = Vec::with_capacity(n);
        self.read_f32_into(offset_elems, n, &mut v)?;
        Ok(v)
    }

    /// `n` f32 values from element `offset_elems`, appended to `out` with one copy (logits:
    /// megabytes a step, each row of a grouped step's lanes straight into the step's rows).
    pub fn read_f32_into(&self, offset_elems: usize, n: usize, out: &mut Vec<f32>) -> Result<(), VkError> {
        if cfg!(target_endian = "little") {
            if let Some(p) = self.mapped {
                let offset = offset_elems * 4;
                self.check(offset as u64, n * 4)?;
                // SAFETY: the range is checked; the mapping starts at least 4-byte aligned
                // (minMemoryMapAlignment) and the offset is whole floats, so the view is an
                // aligned [f32]; the device is done with the buffer (callers wait).
                out.extend_from_slice(unsafe { std::slice::from_raw_parts(p.add(offset).cast::<f32>(), n) });
                return Ok(());
            }
        }
        let start = out.len();
        out.resize(start + n, 0.0);
        if cfg!(target_endian = "little") {
            // SAFETY: the f32 storage viewed as its n * 4 bytes; every bit pattern is an f32.
            let bytes = unsafe { std::slice::from_raw_parts_mut(out[start..].as_mut_ptr().cast::<u8>(), n * 4) };
            return self.read((offset_elems * 4) as u64, bytes);
        }
        let mut b = vec![0u8; n * 4];
        self.read((offset_elems * 4) as u64, &mut b)?;
        for (x, c) in out[start..].iter_mut().zip(b.chunks_exact(4)) {
            *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    pub fn read_u32(&self, offset_elems: usize, n: usize) -> Result<Vec<u32>, VkError> {
        let mut b = vec![0u8; n * 4];
        self.read((offset_elems * 4) as u64, &mut b)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// Fill the whole buffer with one 32-bit pattern (NaN poisoning in tests).
    pub fn fill_u32(&mut self, pattern: u32) -> Result<(), VkError> {
        let words = (self.size / 4) as usize;
        let bytes: Vec<u8> = std::iter::repeat_n(pattern.to_le_bytes(), words).flatten().collect();
        self.write(0, &bytes)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the buffer and memory were made from this device; whoever submitted work
        // using them waited on it (the home waits on its fence before returning).
        unsafe {
            if self.mapped.is_some() {
                self.gpu.device.unmap_memory(self.memory);
            }
            self.gpu.device.destroy_buffer(self.buffer, None);
            self.gpu.device.free_memory(self.memory, None);
        }
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A fence, destroyed on drop.
pub struct Fence {
    gpu: Arc<Gpu>,
    pub fence: vk::Fence,
}

impl Fence {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Fence, VkError> {
        // SAFETY: the device is live.
        let fence = unsafe { gpu.device.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(|r| VkError::Vk { what: "vkCreateFence", result: r })?;
        Ok(Fence { gpu: gpu.clone(), fence })
    }

    /// Submit `cmd` and wait for it; the fence is reset for the next use.
    pub fn submit_wait(&self, cmd: vk::CommandBuffer) -> Result<(), VkError> {
        self.submit(self.gpu.queues[0], cmd)?;
        self.wait()
    }

    /// Submit `cmd` to `queue` (one of the device's) signalling this fence; `wait` before the
    /// next submit and before anything the command uses is touched.
    ///
    /// A lost device takes no more work; a submit that finds the device lost gives it up.
    pub fn submit(&self, queue: vk::Queue, cmd: vk::CommandBuffer) -> Result<(), VkError> {
        let gpu = &self.gpu;
        gpu.live()?;
        if gpu.faults.take(Fault::DeviceLost) {
            return Err(gpu.give_up(format!("vkQueueSubmit failed: {:?} (injected)", vk::Result::ERROR_DEVICE_LOST), false));
        }
        if gpu.faults.take(Fault::Hang) {
            // Nothing goes to the queue, so the fence never signals: the wait meets its limit.
            return Ok(());
        }
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: cmd is a recorded command buffer of this device, queue one of its queues
        // (used from the home's one thread); the fence is unsignalled.
        unsafe { gpu.device.queue_submit(queue, &submit, self.fence) }.map_err(|r| match r {
            vk::Result::ERROR_DEVICE_LOST => gpu.give_up(format!("vkQueueSubmit failed: {r:?}"), false),
            r => VkError::Vk { what: "vkQueueSubmit", result: r },
        })
    }

    /// Wait for the submission that signals this fence, then reset it for the next use.
    /// The wait polls the fence for up to `Gpu::spin` before it blocks (a GPU's: a token
    /// step is about a millisecond, and a blocking wait's wake-up adds tens of microseconds to
    /// each; a software device's wait blocks at once).
    ///
    /// The wait is bounded by `Gpu::fence_timeout`: past it the device is given up as hung
    /// (its work may still be pending, see `fault::Lost`). A device already given up for that
    /// reason is not waited on again (each wait would take the whole limit); one lost another
    /// way is (it answers at once, and a fault injected on a working device leaves the other
    /// lanes' work running, which must end before anything it uses is freed).
    pub fn wait(&self) -> Result<(), VkError> {
        let gpu = &self.gpu;
        if let Some(l) = gpu.lost().filter(|l| l.pending) {
            return Err(VkError::Lost(l.reason.clone()));
        }
        let d = &gpu.device;
        let fail = |what: &'static str, r: vk::Result| match r {
            vk::Result::ERROR_DEVICE_LOST => gpu.give_up(format!("{what} failed: {r:?}"), false),
            r => VkError::Vk { what, result: r },
        };
        // A software device (lavapipe) runs on the host's cores: polling would take one of them.
        let budget = gpu.spin;
        let started = std::time::Instant::now();
        // SAFETY (both blocks): the fence belongs to this device.
        let mut done = false;
        while !done && started.elapsed() < budget {
            done = unsafe { d.get_fence_status(self.fence) }.map_err(|r| fail("vkGetFenceStatus", r))?;
            std::hint::spin_loop();
        }
        unsafe {
            if !done {
                let limit = gpu.fence_timeout.map(|t| t.saturating_sub(started.elapsed()));
                let ns = limit.map_or(u64::MAX, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX));
                match d.wait_for_fences(&[self.fence], true, ns) {
                    Ok(()) => {}
                    Err(vk::Result::TIMEOUT) => {
                        let waited = gpu.fence_timeout.unwrap_or_default().as_secs_f64();
                        return Err(gpu.give_up(format!("a submission did not finish within the fence timeout ({waited} s)"), true));
                    }
                    Err(r) => return Err(fail("vkWaitForFences", r)),
                }
            }
            d.reset_fences(&[self.fence]).map_err(|r| fail("vkResetFences", r))?;
        }
        Ok(())
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // SAFETY: the fence is not in use (submit_wait waits before returning).
        unsafe { self.gpu.device.destroy_fence(self.fence, None) };
    }
}

/// A primary command buffer from the device's pool, freed on drop.
pub struct Commands {
    gpu: Arc<Gpu>,
    pub cmd: vk::CommandBuffer,
}

impl Commands {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Commands, VkError> {
        let info = vk::CommandBufferAllocateInfo::default().command_pool(gpu.pool).level(vk::CommandBufferLevel::PRIMARY).command_buffer_count(1);
        // SAFETY: the pool belongs to this device. The home uses the pool from one thread.
        let cmd = unsafe { gpu.device.allocate_command_buffers(&info) }.map_err(|r| VkError::Vk { what: "vkAllocateCommandBuffers", result: r })?[0];
        Ok(Commands { gpu: gpu.clone(), cmd })
    }

    /// Record into the buffer (replacing what it held): begin, `f`, end.
    pub fn record(&self, one_time: bool, f: impl FnOnce(vk::CommandBuffer)) -> Result<(), VkError> {
        let d = &self.gpu.device;
        let flags = if one_time { vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT } else { vk::CommandBufferUsageFlags::empty() };
        // SAFETY: the buffer is not pending (callers wait on its fence before re-recording).
        unsafe {
            d.reset_command_buffer(self.cmd, vk::CommandBufferResetFlags::empty()).map_err(|r| VkError::Vk { what: "vkResetCommandBuffer", result: r })?;
            d.begin_command_buffer(self.cmd, &vk::CommandBufferBeginInfo::default().flags(flags)).map_err(|r| VkError::Vk { what: "vkBeginCommandBuffer", result: r })?;
        }
        f(self.cmd);
        // SAFETY: recording was begun above.
        unsafe { d.end_command_buffer(self.cmd) }.map_err(|r| VkError::Vk { what: "vkEndCommandBuffer", result: r })
    }
}

impl Drop for Commands {
    fn drop(&mut self) {
        // SAFETY: not pending (every submit is waited on).
        unsafe { self.gpu.device.free_command_buffers(self.gpu.pool, &[self.cmd]) };
    }
}

/// Record `f` into a fresh command buffer, submit it and wait.
pub fn submit_once(gpu: &Arc<Gpu>, f: impl FnOnce(vk::CommandBuffer)) -> Result<(), VkError> {
    let c = Commands::new(gpu)?;
    c.record(true, f)?;
    Fence::new(gpu)?.submit_wait(c.cmd)
}

/// A compute-to-compute memory barrier: shader writes before it are visible to shader reads
/// and writes after it. The token command's layers use only this one (a barrier that also
/// waits on the transfer stage costs more on some drivers).
pub fn barrier(gpu: &Gpu, cmd: vk::CommandBuffer) {
    stage_barrier(gpu, cmd, vk::PipelineStageFlags::COMPUTE_SHADER, vk::AccessFlags::SHADER_WRITE, vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE);
}

/// A barrier between compute and transfer commands either way (copies of results, gathers).
pub fn transfer_barrier(gpu: &Gpu, cmd: vk::CommandBuffer) {
    stage_barrier(
        gpu,
        cmd,
        vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
        vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE,
        vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_READ,
    );
}

fn stage_barrier(gpu: &Gpu, cmd: vk::CommandBuffer, stages: vk::PipelineStageFlags, src: vk::AccessFlags, dst: vk::AccessFlags) {
    let mb = [vk::MemoryBarrier::default().src_access_mask(src).dst_access_mask(dst)];
    // SAFETY: cmd is recording.
    unsafe { gpu.device.cmd_pipeline_barrier(cmd, stages, stages, vk::DependencyFlags::empty(), &mb, &[], &[]) };
}

/// A timestamp query pool for profiling: `write(cmd, i)` between dispatches, `read()` after
/// the submit finished gives nanoseconds.
pub struct Timestamps {
    gpu: Arc<Gpu>,
    pool: vk::QueryPool,
    pub count: u32,
    period: f64,
}

impl Timestamps {
    /// None when the device's compute queue has no timestamps.
    pub fn new(gpu: &Arc<Gpu>, count: u32) -> Result<Option<Timestamps>, VkError> {
        let Some(period) = gpu.info.timestamp_period else { return Ok(None) };
        let info = vk::QueryPoolCreateInfo::default().query_type(vk::QueryType::TIMESTAMP).query_count(count);
        // SAFETY: the device is live.
        let pool = unsafe { gpu.device.create_query_pool(&info, None) }.map_err(|r| VkError::Vk { what: "vkCreateQueryPool", result: r })?;
        Ok(Some(Timestamps { gpu: gpu.clone(), pool, count, period: period as f64 }))
    }

    /// Reset every query (record before the first `write` of a submission).
    pub fn reset(&self, cmd: vk::CommandBuffer) {
        // SAFETY: cmd is recording; the range is the pool's.
        unsafe { self.gpu.device.cmd_reset_query_pool(cmd, self.pool, 0, self.count) };
    }

    /// Write timestamp `i` once all earlier work finished.
    pub fn write(&self, cmd: vk::CommandBuffer, i: u32) {
        // SAFETY: cmd is recording; i < count (checked by the query pool's validation).
        unsafe { self.gpu.device.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, self.pool, i.min(self.count - 1)) };
    }

    /// Nanoseconds of timestamps 0..n (relative to an arbitrary origin); each must have been
    /// written by a finished submission.
    pub fn read(&self, n: u32) -> Result<Vec<f64>, VkError> {
        let mut raw = vec![0u64; n.min(self.count) as usize];
        // SAFETY: the submission that wrote the queries was waited on.
        unsafe { self.gpu.device.get_query_pool_results(self.pool, 0, &mut raw, vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT) }
            .map_err(|r| VkError::Vk { what: "vkGetQueryPoolResults", result: r })?;
        Ok(raw.iter().map(|&t| t as f64 * self.period).collect())
    }
}

impl Drop for Timestamps {
    fn drop(&mut self) {
        // SAFETY: not in use after the waited submission.
        unsafe { self.gpu.device.destroy_query_pool(self.pool, None) };
    }
}
