//! Device start: the Vulkan loader opened at run time, the device picked (a discrete GPU first,
//! then any with a compute queue), its tiers read once and logged once ("device ready").
//!
//! Everything that can fail returns a [`VkError`] that says which step failed and why: no
//! loader, no driver (ICD), no device, or a Vulkan call's result.

use std::ffi::CStr;
use std::sync::{Arc, Once};

use ash::vk;

use crate::fault::{FaultSwitch, Lost};
use crate::VkError;

/// A memory heap of the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heap {
    pub bytes: u64,
    pub device_local: bool,
}

/// One cooperative-matrix shape the device offers (VK_KHR_cooperative_matrix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoopShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// "f16xf16->f32", "s8xs8->s32", ...
    pub types: String,
}

/// What the device offers: the tiers kernels choose between, and the limits plans respect.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub driver: String,
    /// "discrete", "integrated", "virtual", "cpu" or "other".
    pub kind: &'static str,
    pub api: (u32, u32, u32),
    pub subgroup_size: u32,
    /// Subgroup operations usable in compute shaders ("basic", "arithmetic", "shuffle", ...).
    pub subgroup_ops: Vec<&'static str>,
    pub f16_storage: bool,
    pub f16_arith: bool,
    pub int8_storage: bool,
    pub int8_arith: bool,
    /// The integer dot product feature (VK 1.3 / VK_KHR_shader_integer_dot_product).
    pub int_dot: bool,
    /// Whether 8-bit signed dot products are accelerated (not emulated).
    pub int_dot_accel: bool,
    /// VK_KHR_cooperative_matrix is present and enabled.
    pub coopmat: bool,
    pub coopmat_shapes: Vec<CoopShape>,
    /// The Vulkan memory model (core in 1.2) is enabled: modules glslang writes for
    /// cooperative matrices declare it.
    pub vulkan_memory_model: bool,
    pub shared_memory: u32,
    pub max_storage_range: u64,
    pub storage_align: u64,
    pub max_workgroup_invocations: u32,
    pub max_push_constants: u32,
    pub max_allocation: u64,
    /// Nanoseconds per timestamp tick; None when the compute queue has no timestamps.
    pub timestamp_period: Option<f32>,
    pub heaps: Vec<Heap>,
    /// Compute queues taken (up to QUEUES_MAX of the family's; 1 before the device starts).
    pub queues: u32,
    /// Workgroups a dispatch aims at to keep the device busy: on a GPU about twice the compute
    /// units of the large ones (an H100 has 132); on a processor (Mesa's lavapipe, which runs
    /// each workgroup on one of its threads, with a cost of its own even where the workgroup
    /// has little to do) two a thread.
    pub workgroup_spread: u32,
}

/// [`DeviceInfo::workgroup_spread`] on a GPU.
const GPU_WORKGROUP_SPREAD: u32 = 264;

impl DeviceInfo {
    /// Bytes of device-local memory (the largest device-local heap).
    pub fn device_local_bytes(&self) -> u64 {
        self.heaps.iter().filter(|h| h.device_local).map(|h| h.bytes).max().unwrap_or(0)
    }

    /// One line per capability with its state, for the "device ready" log and `resin inspect`.
    pub fn describe(&self) -> String {
        let yn = |b: bool| if b { "yes" } else { "no" };
        let heaps: Vec<String> = self.heaps.iter().map(|h| format!("{} MiB{}", h.bytes >> 20, if h.device_local { " device-local" } else { "" })).collect();
        let shapes: Vec<String> = self.coopmat_shapes.iter().map(|s| format!("{}x{}x{} {}", s.m, s.n, s.k, s.types)).collect();
        format!(
            "{} ({}, {}, Vulkan {}.{}.{}): subgroup {} [{}]; f16 storage {} arith {}; int8 storage {} arith {}; \
             integer dot {} (accelerated {}); cooperative matrix {}{}; shared memory {} KiB; \
             max storage range {} MiB; timestamps {}; compute queues {}; heaps [{}]",
            self.name,
            self.kind,
            self.driver,
            self.api.0,
            self.api.1,
            self.api.2,
            self.subgroup_size,
            self.subgroup_ops.join(" "),
            yn(self.f16_storage),
            yn(self.f16_arith),
            yn(self.int8_storage),
            yn(self.int8_arith),
            yn(self.int_dot),
            yn(self.int_dot_accel),
            yn(self.coopmat),
            if shapes.is_empty() { String::new() } else { format!(" ({})", shapes.join(", ")) },
            self.shared_memory / 1024,
            self.max_storage_range >> 20,
            match self.timestamp_period {
                Some(p) => format!("yes ({p} ns/tick)"),
                None => "no".into(),
            },
            self.queues,
            heaps.join(", ")
        )
    }
}

/// The most queues the device is started with (the Vulkan home's lanes use one each).
pub const QUEUES_MAX: u32 = 8;

/// The started device: instance, logical device, its compute queues and their command pool.
/// Shared by every buffer and pipeline (they hold an `Arc`), so it is destroyed last.
pub struct Gpu {
    _entry: ash::Entry,
    pub instance: ash::Instance,
    pub physical: vk::PhysicalDevice,
    pub device: ash::Device,
    /// Every queue taken from the compute family (`info.queues` of them, at least one; the
    /// first is what single submissions use).
    pub queues: Vec<vk::Queue>,
    pub queue_family: u32,
    pub pool: vk::CommandPool,
    pub memory: vk::PhysicalDeviceMemoryProperties,
    pub info: DeviceInfo,
    /// How long a fence wait polls before it blocks ([`GpuOptions::spin`]; zero on a software
    /// device, which computes on the host's cores).
    pub spin: std::time::Duration,
    /// [`GpuOptions::pipeline_stats`] on a device with VK_KHR_pipeline_executable_properties: each
    /// pipeline's compiler statistics (registers, shared memory, spills: whatever the driver
    /// reports) are logged once when it is made, to see what bounds a kernel's occupancy.
    pub exec_stats: Option<ash::khr::pipeline_executable_properties::Device>,
    /// How long a fence wait may take before the device is given up ([`GpuOptions::fence_timeout`];
    /// None: no limit).
    pub fence_timeout: Option<std::time::Duration>,
    /// Failures a test injects ([`GpuOptions::faults`]).
    pub faults: FaultSwitch,
    /// Set once, by the first failure that ends the device's use (see [`crate::fault`]).
    lost: std::sync::OnceLock<Lost>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

static READY: Once = Once::new();

fn vkerr(what: &'static str) -> impl Fn(vk::Result) -> VkError {
    move |result| VkError::Vk { what, result }
}

/// Load the loader and create an instance; the errors say which of the two is missing.
fn start_instance() -> Result<(ash::Entry, ash::Instance), VkError> {
    // SAFETY: loading the system Vulkan loader runs its initialisers; that is what it is for.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| VkError::NoLoader(e.to_string()))?;
    // SAFETY: a plain query of the loader.
    let version = unsafe { entry.try_enumerate_instance_version() }.map_err(vkerr("vkEnumerateInstanceVersion"))?.unwrap_or(vk::API_VERSION_1_0);
    if version < vk::API_VERSION_1_1 {
        return Err(VkError::Unsupported(format!("the Vulkan loader is version {}.{}; resin needs 1.1 or later", vk::api_version_major(version), vk::api_version_minor(version))));
    }
    let app = vk::ApplicationInfo::default().application_name(c"resin").engine_name(c"resin").api_version(version.min(vk::API_VERSION_1_3));
    let exts = [ash::khr::portability_enumeration::NAME.as_ptr()];
    // SAFETY: a plain query of the loader.
    let have_portability = unsafe { entry.enumerate_instance_extension_properties(None) }
        .map(|v| v.iter().any(|e| e.extension_name_as_c_str() == Ok(ash::khr::portability_enumeration::NAME)))
        .unwrap_or(false);
    let mut info = vk::InstanceCreateInfo::default().application_info(&app);
    if have_portability {
        info = info.enabled_extension_names(&exts).flags(vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR);
    }
    // SAFETY: the create info and everything it points to outlive the call.
    let instance = unsafe { entry.create_instance(&info, None) }.map_err(|r| match r {
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => {
            VkError::NoDriver("the Vulkan loader found no driver (ICD); on Debian `apt-get install mesa-vulkan-drivers` gives the software one".into())
        }
        r => VkError::Vk { what: "vkCreateInstance", result: r },
    })?;
    Ok((entry, instance))
}

fn kind_name(t: vk::PhysicalDeviceType) -> &'static str {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
        vk::PhysicalDeviceType::CPU => "cpu",
        _ => "other",
    }
}

/// (family index, timestamp bits, queues in the family) of the compute family to use.
fn compute_family(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Option<(u32, u32, u32)> {
    // SAFETY: pd came from this instance.
    let fams = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    // Prefer a compute queue family without graphics (dedicated compute), then any.
    let pick = |want_no_gfx: bool| {
        fams.iter().enumerate().find(|(_, f)| f.queue_flags.contains(vk::QueueFlags::COMPUTE) && (!want_no_gfx || !f.queue_flags.contains(vk::QueueFlags::GRAPHICS)))
    };
    pick(true).or_else(|| pick(false)).map(|(i, f)| (i as u32, f.timestamp_valid_bits, f.queue_count))
}

fn has_ext(instance: &ash::Instance, pd: vk::PhysicalDevice, name: &CStr) -> bool {
    // SAFETY: pd came from this instance.
    unsafe { instance.enumerate_device_extension_properties(pd) }.map(|v| v.iter().any(|e| e.extension_name_as_c_str() == Ok(name))).unwrap_or(false)
}

fn subgroup_op_names(ops: vk::SubgroupFeatureFlags) -> Vec<&'static str> {
    let table = [
        (vk::SubgroupFeatureFlags::BASIC, "basic"),
        (vk::SubgroupFeatureFlags::VOTE, "vote"),
        (vk::SubgroupFeatureFlags::ARITHMETIC, "arithmetic"),
        (vk::SubgroupFeatureFlags::BALLOT, "ballot"),
        (vk::SubgroupFeatureFlags::SHUFFLE, "shuffle"),
        (vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE, "shuffle-relative"),
        (vk::SubgroupFeatureFlags::CLUSTERED, "clustered"),
        (vk::SubgroupFeatureFlags::QUAD, "quad"),
    ];
    table.iter().filter(|(f, _)| ops.contains(*f)).map(|(_, n)| *n).collect()
}

fn component_name(t: vk::ComponentTypeKHR) -> &'static str {
    match t {
        vk::ComponentTypeKHR::FLOAT16 => "f16",
        vk::ComponentTypeKHR::FLOAT32 => "f32",
        vk::ComponentTypeKHR::SINT8 => "s8",
        vk::ComponentTypeKHR::UINT8 => "u8",
        vk::ComponentTypeKHR::SINT32 => "s32",
        vk::ComponentTypeKHR::UINT32 => "u32",
        _ => "?",
    }
}

/// Read the tiers of one physical device (no logical device needed).
fn read_info(entry: &ash::Entry, instance: &ash::Instance, pd: vk::PhysicalDevice, ts_bits: u32) -> (DeviceInfo, Features) {
    let mut sub = vk::PhysicalDeviceSubgroupProperties::default();
    let mut dotp = vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
    let mut drv = vk::PhysicalDeviceDriverProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut sub).push_next(&mut dotp).push_next(&mut drv);
    // SAFETY: pd came from this instance; the chain's structs live across the call.
    unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    let props = props2.properties;
    let mut f = Features::default();
    {
        let mut f11 = vk::PhysicalDevice16BitStorageFeatures::default();
        let mut f8 = vk::PhysicalDevice8BitStorageFeatures::default();
        let mut fh = vk::PhysicalDeviceShaderFloat16Int8Features::default();
        let mut fd = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        let mut fc = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut fm = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
        let coop_ext = has_ext(instance, pd, ash::khr::cooperative_matrix::NAME);
        let dot_ext = has_ext(instance, pd, ash::khr::shader_integer_dot_product::NAME);
        let mut feats = vk::PhysicalDeviceFeatures2::default().push_next(&mut f11).push_next(&mut f8).push_next(&mut fh).push_next(&mut fd);
        if coop_ext {
            feats = feats.push_next(&mut fc);
        }
        if props.api_version >= vk::API_VERSION_1_2 {
            feats = feats.push_next(&mut fm);
        }
        // SAFETY: as above.
        unsafe { instance.get_physical_device_features2(pd, &mut feats) };
        f.int64 = feats.features.shader_int64 == vk::TRUE;
        f.storage16 = f11.storage_buffer16_bit_access == vk::TRUE;
        f.storage8 = f8.storage_buffer8_bit_access == vk::TRUE;
        f.float16 = fh.shader_float16 == vk::TRUE;
        f.int8 = fh.shader_int8 == vk::TRUE;
        f.int_dot = fd.shader_integer_dot_product == vk::TRUE && (dot_ext || props.api_version >= vk::API_VERSION_1_3);
        f.int_dot_ext = dot_ext && props.api_version < vk::API_VERSION_1_3;
        f.coopmat = coop_ext && fc.cooperative_matrix == vk::TRUE;
        f.memory_model = props.api_version >= vk::API_VERSION_1_2 && fm.vulkan_memory_model == vk::TRUE;
    }
    let mut shapes = Vec::new();
    if f.coopmat {
        let coop = ash::khr::cooperative_matrix::Instance::new(entry, instance);
        // SAFETY: the extension is present on this device.
        if let Ok(list) = unsafe { coop.get_physical_device_cooperative_matrix_properties(pd) } {
            for p in list.iter().filter(|p| p.scope == vk::ScopeKHR::SUBGROUP) {
                shapes.push(CoopShape {
                    m: p.m_size,
                    n: p.n_size,
                    k: p.k_size,
                    types: format!("{}x{}->{}", component_name(p.a_type), component_name(p.b_type), component_name(p.result_type)),
                });
            }
        }
    }
    // SAFETY: pd came from this instance.
    let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
    let heaps =
        mem.memory_heaps[..mem.memory_heap_count as usize].iter().map(|h| Heap { bytes: h.size, device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL) }).collect();
    let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m3);
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
    let lim = props.limits;
    let compute_sub = sub.supported_stages.contains(vk::ShaderStageFlags::COMPUTE);
    let info = DeviceInfo {
        name: props.device_name_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        driver: drv.driver_name_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        kind: kind_name(props.device_type),
        api: (vk::api_version_major(props.api_version), vk::api_version_minor(props.api_version), vk::api_version_patch(props.api_version)),
        subgroup_size: sub.subgroup_size,
        subgroup_ops: if compute_sub { subgroup_op_names(sub.supported_operations) } else { Vec::new() },
        f16_storage: f.storage16,
        f16_arith: f.float16,
        int8_storage: f.storage8,
        int8_arith: f.int8,
        int_dot: f.int_dot,
        int_dot_accel: f.int_dot && dotp.integer_dot_product4x8_bit_packed_signed_accelerated == vk::TRUE,
        coopmat: f.coopmat,
        coopmat_shapes: shapes,
        vulkan_memory_model: f.memory_model,
        shared_memory: lim.max_compute_shared_memory_size,
        max_storage_range: lim.max_storage_buffer_range as u64,
        storage_align: lim.min_storage_buffer_offset_alignment,
        max_workgroup_invocations: lim.max_compute_work_group_invocations,
        max_push_constants: lim.max_push_constants_size,
        max_allocation: m3.max_memory_allocation_size,
        timestamp_period: (ts_bits > 0 && lim.timestamp_period > 0.0).then_some(lim.timestamp_period),
        heaps,
        queues: 1,
        workgroup_spread: if props.device_type == vk::PhysicalDeviceType::CPU {
            2 * std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
        } else {
            GPU_WORKGROUP_SPREAD
        },
    };
    (info, f)
}

/// Feature bits read from the device, enabled at device creation where present.
#[derive(Debug, Default, Clone, Copy)]
struct Features {
    storage16: bool,
    storage8: bool,
    float16: bool,
    int8: bool,
    int_dot: bool,
    int_dot_ext: bool,
    coopmat: bool,
    int64: bool,
    memory_model: bool,
}

/// How the device is started: the binary fills these from its flags and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOptions {
    /// The device's index in the driver's enumeration order; None: a discrete GPU first, then
    /// integrated, virtual, cpu (lavapipe).
    pub device: Option<usize>,
    /// The most compute queues taken (the lanes of a wide step submit to them at once); None:
    /// QUEUES_MAX.
    pub queues: Option<u32>,
    /// Log each pipeline's compiler statistics (registers, shared memory, spills) once when it
    /// is made, where the device has VK_KHR_pipeline_executable_properties.
    pub pipeline_stats: bool,
    /// How long a fence wait polls before it sleeps: a token step is about a millisecond, and
    /// a sleeping wait wakes tens of microseconds late; longer waits (a prefill window's)
    /// sleep after it. Zero sleeps at once and spares a host core.
    pub spin: std::time::Duration,
    /// How long one fence wait may take before the device is taken as lost (a submission that
    /// never finishes: a hung GPU or driver). None: [`FENCE_TIMEOUT_DEFAULT`] on a hardware
    /// device, no limit on a software one (its submissions run on the host's cores for as long
    /// as the host's load makes them, and it does not hang as a GPU can). Zero: no limit.
    pub fence_timeout: Option<std::time::Duration>,
    /// Failures injected on purpose (tests); unarmed it changes nothing.
    pub faults: FaultSwitch,
}

/// [`GpuOptions::fence_timeout`]'s default on a hardware device: far above any one
/// submission's time, so only a device that stopped trips it.
pub const FENCE_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(120);

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions { device: None, queues: None, pipeline_stats: false, spin: std::time::Duration::from_micros(5000), fence_timeout: None, faults: FaultSwitch::default() }
    }
}

/// The device the picker takes: `forced` (an index into the enumeration order), else a
/// discrete GPU first, then integrated, virtual, cpu (lavapipe).
fn pick(instance: &ash::Instance, forced: Option<usize>) -> Result<(vk::PhysicalDevice, u32, u32, u32), VkError> {
    // SAFETY: a plain query of the instance.
    let pds = unsafe { instance.enumerate_physical_devices() }.map_err(vkerr("vkEnumeratePhysicalDevices"))?;
    if pds.is_empty() {
        return Err(VkError::NoDevice("the Vulkan driver reports no physical device".into()));
    }
    let rank = |pd: vk::PhysicalDevice| {
        // SAFETY: pd came from this instance.
        let p = unsafe { instance.get_physical_device_properties(pd) };
        let r = match p.device_type {
            vk::PhysicalDeviceType::DISCRETE_GPU => 0,
            vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
            vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
            vk::PhysicalDeviceType::CPU => 3,
            _ => 4,
        };
        (r, p.api_version < vk::API_VERSION_1_1)
    };
    let mut order: Vec<usize> = (0..pds.len()).collect();
    order.sort_by_key(|&i| rank(pds[i]));
    if let Some(i) = forced {
        if i >= pds.len() {
            return Err(VkError::NoDevice(format!("device {i} was asked for but the driver lists {} devices", pds.len())));
        }
        order = vec![i];
    }
    for i in order {
        let pd = pds[i];
        if rank(pd).1 {
            continue;
        }
        if let Some((fam, bits, count)) = compute_family(instance, pd) {
            return Ok((pd, fam, bits, count));
        }
    }
    Err(VkError::NoDevice(format!("none of the {} Vulkan devices has Vulkan 1.1 and a compute queue", pds.len())))
}

/// An instance kept for the life of the process, made at the first device start. Without it a
/// process whose threads drop a second device crashed on the H200 (docs/lessons.md; test
/// `engines_on_a_device_each_start_and_drop_in_turn`): the loader unloads a driver when its
/// last instance is destroyed, while that driver's threads for the dropped device may still
/// run. With this instance alive, no device's end is the last instance's.
/// Never destroyed: the process's exit frees it.
static KEEPER: std::sync::OnceLock<Option<(ash::Entry, ash::Instance)>> = std::sync::OnceLock::new();

impl Gpu {
    /// Start the device with the default options.
    pub fn start() -> Result<Arc<Gpu>, VkError> {
        Self::start_with(&GpuOptions::default())
    }

    /// Start the device: loader, instance, pick, logical device, queue, command pool.
    pub fn start_with(opts: &GpuOptions) -> Result<Arc<Gpu>, VkError> {
        KEEPER.get_or_init(|| start_instance().ok());
        let (entry, instance) = start_instance()?;
        match Self::start_on(entry, &instance, opts) {
            Ok(g) => Ok(g),
            Err((entry, e)) => {
                // SAFETY: nothing created from the instance survives the failed start.
                unsafe { instance.destroy_instance(None) };
                drop(entry);
                Err(e)
            }
        }
    }

    fn start_on(entry: ash::Entry, instance: &ash::Instance, opts: &GpuOptions) -> Result<Arc<Gpu>, (ash::Entry, VkError)> {
        let (pd, fam, ts_bits, fam_queues) = match pick(instance, opts.device) {
            Ok(x) => x,
            Err(e) => return Err((entry, e)),
        };
        let (mut info, f) = read_info(&entry, instance, pd, ts_bits);
        // Several queues of the family where it has them: the Vulkan home's lanes submit
        // independent token commands to them at once (GpuOptions::queues caps the count).
        let want = opts.queues.filter(|&v| v > 0).unwrap_or(QUEUES_MAX);
        info.queues = fam_queues.clamp(1, want.min(QUEUES_MAX));
        let prio = vec![1.0f32; info.queues as usize];
        let qinfo = [vk::DeviceQueueCreateInfo::default().queue_family_index(fam).queue_priorities(&prio)];
        let mut exts: Vec<*const std::ffi::c_char> = Vec::new();
        if f.coopmat {
            exts.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        }
        if f.int_dot_ext {
            exts.push(ash::khr::shader_integer_dot_product::NAME.as_ptr());
        }
        let stats_asked = opts.pipeline_stats;
        let want_stats = stats_asked && has_ext(instance, pd, ash::khr::pipeline_executable_properties::NAME);
        if stats_asked && !want_stats {
            tracing::warn!("pipeline statistics: this device lacks VK_KHR_pipeline_executable_properties");
        }
        if want_stats {
            exts.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
        }
        let mut fx = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
        let mut f11 = vk::PhysicalDevice16BitStorageFeatures::default().storage_buffer16_bit_access(f.storage16);
        let mut f8 = vk::PhysicalDevice8BitStorageFeatures::default().storage_buffer8_bit_access(f.storage8);
        let mut fh = vk::PhysicalDeviceShaderFloat16Int8Features::default().shader_float16(f.float16).shader_int8(f.int8);
        let mut fd = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default().shader_integer_dot_product(f.int_dot);
        let mut fc = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut fm = vk::PhysicalDeviceVulkanMemoryModelFeatures::default().vulkan_memory_model(true);
        let base = vk::PhysicalDeviceFeatures::default().shader_int64(f.int64);
        let mut feats = vk::PhysicalDeviceFeatures2::default().features(base).push_next(&mut f11).push_next(&mut f8).push_next(&mut fh);
        if f.int_dot {
            feats = feats.push_next(&mut fd);
        }
        if f.coopmat {
            feats = feats.push_next(&mut fc);
        }
        if f.memory_model {
            feats = feats.push_next(&mut fm);
        }
        if want_stats {
            feats = feats.push_next(&mut fx);
        }
        let dinfo = vk::DeviceCreateInfo::default().queue_create_infos(&qinfo).enabled_extension_names(&exts).push_next(&mut feats);
        // SAFETY: the create info chain lives across the call; pd came from this instance.
        let device = match unsafe { instance.create_device(pd, &dinfo, None) } {
            Ok(d) => d,
            Err(r) => return Err((entry, VkError::Vk { what: "vkCreateDevice", result: r })),
        };
        // SAFETY: family `fam` was requested with info.queues queues.
        let queues: Vec<vk::Queue> = (0..info.queues).map(|i| unsafe { device.get_device_queue(fam, i) }).collect();
        let pinfo = vk::CommandPoolCreateInfo::default().queue_family_index(fam).flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: the device is live.
        let pool = match unsafe { device.create_command_pool(&pinfo, None) } {
            Ok(p) => p,
            Err(r) => {
                // SAFETY: nothing else was created from the device.
                unsafe { device.destroy_device(None) };
                return Err((entry, VkError::Vk { what: "vkCreateCommandPool", result: r }));
            }
        };
        // SAFETY: pd came from this instance.
        let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
        READY.call_once(|| tracing::info!("device ready: {}", info.describe()));
        let exec_stats = want_stats.then(|| ash::khr::pipeline_executable_properties::Device::new(instance, &device));
        let spin = if info.kind == "cpu" { std::time::Duration::ZERO } else { opts.spin };
        let fence_timeout = match opts.fence_timeout {
            None if info.kind == "cpu" => None,
            None => Some(FENCE_TIMEOUT_DEFAULT),
            Some(t) => (!t.is_zero()).then_some(t),
        };
        Ok(Arc::new(Gpu {
            _entry: entry,
            instance: instance.clone(),
            physical: pd,
            device,
            queues,
            queue_family: fam,
            pool,
            memory,
            info,
            spin,
            exec_stats,
            fence_timeout,
            faults: opts.faults.clone(),
            lost: std::sync::OnceLock::new(),
        }))
    }

    /// Block until the queue is idle.
    pub fn wait_idle(&self) -> Result<(), VkError> {
        self.live()?;
        // SAFETY: the device is live.
        unsafe { self.device.device_wait_idle() }.map_err(vkerr("vkDeviceWaitIdle"))
    }

    /// Why the device was given up, once it has been.
    pub fn lost(&self) -> Option<&Lost> {
        self.lost.get()
    }

    /// Ok while the device has not been given up; else the reason, as the error.
    pub fn live(&self) -> Result<(), VkError> {
        match self.lost.get() {
            Some(l) => Err(VkError::Lost(l.reason.clone())),
            None => Ok(()),
        }
    }

    /// Give the device up for `reason` (`pending`: work may still run on it). The first call
    /// decides and logs; every call returns the error that names the first reason.
    pub fn give_up(&self, reason: String, pending: bool) -> VkError {
        let mut first = false;
        let l = self.lost.get_or_init(|| {
            first = true;
            Lost { reason, pending }
        });
        if first {
            tracing::error!(device = %self.info.name, reason = %l.reason, "the Vulkan device failed; its home is down for good");
        }
        VkError::Lost(l.reason.clone())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // Work that may still run (a fence timed out) keeps the device: waiting for it might
        // never end, and destroying what it uses is undefined. The process's exit frees it.
        if self.lost.get().is_some_and(|l| l.pending) {
            return;
        }
        // SAFETY: every object made from this device holds an Arc<Gpu>, so all are gone by now;
        // wait for the queue (a lost device answers at once), then destroy in reverse order of
        // creation.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_command_pool(self.pool, None);
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// Read the tiers of the device [`Gpu::start`] would pick, without keeping it.
pub fn probe() -> Result<DeviceInfo, VkError> {
    Gpu::start().map(|g| g.info.clone())
}
