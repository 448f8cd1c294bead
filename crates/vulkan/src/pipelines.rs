//! The variant table (every SPIR-V module, embedded) and compute pipelines made from it.
//!
//! One GLSL source body per operation (`shaders/ops/`), stamped per form and format by the
//! defines of its line in `shaders/variants.txt`; `scripts/build_shaders.sh` compiles the
//! table and build.rs embeds the result. Tuning knobs (workgroup size, N columns) are
//! specialization constants: constant 0 is the workgroup size, constant 1 the row count of an
//! N-row form.

use std::collections::HashMap;
use std::sync::Arc;

use ash::vk;

use crate::buffers::Buffer;
use crate::device::Gpu;
use crate::VkError;

/// One line of the variant table.
#[derive(Debug)]
pub struct Variant {
    pub name: &'static str,
    /// Source under shaders/.
    pub source: &'static str,
    pub defines: &'static [&'static str],
    pub spv: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/variants.rs"));

pub fn variant(name: &str) -> Option<&'static Variant> {
    VARIANTS.iter().find(|v| v.name == name)
}

/// A compute pipeline with its layouts: `bindings` storage buffers in set 0 and a push
/// constant block of `push` bytes.
pub struct Kernel {
    gpu: Arc<Gpu>,
    pub name: &'static str,
    pub bindings: u32,
    pub push: u32,
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    pub pipeline: vk::Pipeline,
}

impl Kernel {
    pub fn new(gpu: &Arc<Gpu>, name: &str, bindings: u32, push: u32, spec: &[u32]) -> Result<Kernel, VkError> {
        let v = variant(name).ok_or_else(|| VkError::Unsupported(format!("no shader variant {name}")))?;
        let code = ash::util::read_spv(&mut std::io::Cursor::new(v.spv)).map_err(|e| VkError::Model(format!("{name}.spv: {e}")))?;
        let d = &gpu.device;
        let binds: Vec<vk::DescriptorSetLayoutBinding> = (0..bindings)
            .map(|i| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(i)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let mut k = Kernel {
            gpu: gpu.clone(),
            name: v.name,
            bindings,
            push,
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
        };
        let err = |what| move |r| VkError::Vk { what, result: r };
        // SAFETY (all calls below): the device is live and every info struct outlives its call;
        // what was made so far is destroyed by Kernel's Drop if a later step fails.
        k.set_layout =
            unsafe { d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&binds), None) }.map_err(err("vkCreateDescriptorSetLayout"))?;
        let ranges = [vk::PushConstantRange { stage_flags: vk::ShaderStageFlags::COMPUTE, offset: 0, size: push }];
        let sets = [k.set_layout];
        let mut linfo = vk::PipelineLayoutCreateInfo::default().set_layouts(&sets);
        if push > 0 {
            linfo = linfo.push_constant_ranges(&ranges);
        }
        k.layout = unsafe { d.create_pipeline_layout(&linfo, None) }.map_err(err("vkCreatePipelineLayout"))?;
        let module = unsafe { d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&code), None) }.map_err(err("vkCreateShaderModule"))?;
        let entries: Vec<vk::SpecializationMapEntry> = (0..spec.len() as u32).map(|i| vk::SpecializationMapEntry { constant_id: i, offset: i * 4, size: 4 }).collect();
        let data: Vec<u8> = spec.iter().flat_map(|x| x.to_le_bytes()).collect();
        let sinfo = vk::SpecializationInfo::default().map_entries(&entries).data(&data);
        let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(c"main").specialization_info(&sinfo);
        let flags = if gpu.exec_stats.is_some() { vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR } else { vk::PipelineCreateFlags::empty() };
        let cinfo = [vk::ComputePipelineCreateInfo::default().flags(flags).stage(stage).layout(k.layout)];
        let made = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &cinfo, None) };
        unsafe { d.destroy_shader_module(module, None) };
        k.pipeline = made.map_err(|(_, r)| VkError::Vk { what: "vkCreateComputePipelines", result: r })?[0];
        if let Some(x) = &gpu.exec_stats {
            tracing::info!("pipeline {} {:?}: {}", k.name, spec, executable_stats(x, k.pipeline));
        }
        Ok(k)
    }

    /// Record a dispatch: bind the pipeline and `set`, push `push` bytes, dispatch `groups`.
    pub fn dispatch(&self, cmd: vk::CommandBuffer, set: vk::DescriptorSet, push: &[u8], groups: [u32; 3]) {
        let d = &self.gpu.device;
        debug_assert_eq!(push.len() as u32, self.push, "{}: push block size", self.name);
        // SAFETY: cmd is recording; set was allocated with this kernel's layout.
        unsafe {
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, self.pipeline);
            d.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, self.layout, 0, &[set], &[]);
            if !push.is_empty() {
                d.cmd_push_constants(cmd, self.layout, vk::ShaderStageFlags::COMPUTE, 0, push);
            }
            d.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
        }
    }
}

/// The driver's statistics of a pipeline made with CAPTURE_STATISTICS, as `name=value` pairs
/// (each executable's, joined by " | "), or why there are none.
fn executable_stats(x: &ash::khr::pipeline_executable_properties::Device, pipeline: vk::Pipeline) -> String {
    // SAFETY: the pipeline is live and was made with CAPTURE_STATISTICS on a device that has
    // the extension and its feature enabled.
    let execs = match unsafe { x.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline)) } {
        Ok(v) => v.len() as u32,
        Err(r) => return format!("no statistics ({r})"),
    };
    let mut out = Vec::new();
    for i in 0..execs {
        let info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i);
        // SAFETY: as above; i is below the executable count.
        let stats = match unsafe { x.get_pipeline_executable_statistics(&info) } {
            Ok(v) => v,
            Err(r) => return format!("no statistics ({r})"),
        };
        let pairs: Vec<String> = stats
            .iter()
            .map(|s| {
                let name = s.name_as_c_str().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
                // SAFETY: the union member read is the one `format` names.
                let value = unsafe {
                    match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
                        _ => "?".into(),
                    }
                };
                format!("{name}={value}")
            })
            .collect();
        out.push(pairs.join(", "));
    }
    out.join(" | ")
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let d = &self.gpu.device;
        // SAFETY: no command using the pipeline is pending (owners wait on their fences);
        // destroying null handles is a no-op.
        unsafe {
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

/// Pipelines by (variant, specialization), made on first use.
pub struct Pipelines {
    gpu: Arc<Gpu>,
    made: HashMap<(String, Vec<u32>), Arc<Kernel>>,
}

impl Pipelines {
    pub fn new(gpu: &Arc<Gpu>) -> Self {
        Pipelines { gpu: gpu.clone(), made: HashMap::new() }
    }

    pub fn get(&mut self, name: &str, bindings: u32, push: u32, spec: &[u32]) -> Result<Arc<Kernel>, VkError> {
        let key = (name.to_string(), spec.to_vec());
        if let Some(k) = self.made.get(&key) {
            return Ok(k.clone());
        }
        let k = Arc::new(Kernel::new(&self.gpu, name, bindings, push, spec)?);
        self.made.insert(key, k.clone());
        Ok(k)
    }
}

/// A storage buffer range bound to one binding.
#[derive(Clone, Copy)]
pub struct Bind<'a> {
    pub buf: &'a Buffer,
    pub offset: u64,
    pub range: u64,
}

impl<'a> From<&'a Buffer> for Bind<'a> {
    fn from(buf: &'a Buffer) -> Self {
        Bind { buf, offset: 0, range: buf.size }
    }
}

/// Descriptor sets for recorded commands: allocated from pools that grow as needed and are
/// destroyed (with every set) on drop.
pub struct Descriptors {
    gpu: Arc<Gpu>,
    pools: Vec<vk::DescriptorPool>,
    left: u32,
}

const SETS_PER_POOL: u32 = 512;

impl Descriptors {
    pub fn new(gpu: &Arc<Gpu>) -> Self {
        Descriptors { gpu: gpu.clone(), pools: Vec::new(), left: 0 }
    }

    /// A set for `k` with `binds[i]` at binding i.
    pub fn set(&mut self, k: &Kernel, binds: &[Bind<'_>]) -> Result<vk::DescriptorSet, VkError> {
        if binds.len() as u32 != k.bindings {
            return Err(VkError::Model(format!("{} takes {} buffers, got {}", k.name, k.bindings, binds.len())));
        }
        let d = &self.gpu.device;
        if self.left == 0 {
            let sizes = [vk::DescriptorPoolSize { ty: vk::DescriptorType::STORAGE_BUFFER, descriptor_count: SETS_PER_POOL * 12 }];
            let info = vk::DescriptorPoolCreateInfo::default().max_sets(SETS_PER_POOL).pool_sizes(&sizes);
            // SAFETY: the device is live.
            let pool = unsafe { d.create_descriptor_pool(&info, None) }.map_err(|r| VkError::Vk { what: "vkCreateDescriptorPool", result: r })?;
            self.pools.push(pool);
            self.left = SETS_PER_POOL;
        }
        let layouts = [k.set_layout];
        let info = vk::DescriptorSetAllocateInfo::default().descriptor_pool(*self.pools.last().unwrap_or(&vk::DescriptorPool::null())).set_layouts(&layouts);
        // SAFETY: the pool has room (counted by `left`; each set takes at most 12 buffers).
        let set = unsafe { d.allocate_descriptor_sets(&info) }.map_err(|r| VkError::Vk { what: "vkAllocateDescriptorSets", result: r })?[0];
        self.left -= 1;
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = binds.iter().map(|b| [vk::DescriptorBufferInfo { buffer: b.buf.buffer, offset: b.offset, range: b.range }]).collect();
        let writes: Vec<vk::WriteDescriptorSet> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| vk::WriteDescriptorSet::default().dst_set(set).dst_binding(i as u32).descriptor_type(vk::DescriptorType::STORAGE_BUFFER).buffer_info(info))
            .collect();
        // SAFETY: the set is fresh and the buffers are live.
        unsafe { d.update_descriptor_sets(&writes, &[]) };
        Ok(set)
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: no command using these sets is pending.
        unsafe {
            for p in &self.pools {
                self.gpu.device.destroy_descriptor_pool(*p, None);
            }
        }
    }
}
