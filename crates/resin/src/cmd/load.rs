//! Opening a model and choosing its home: shared by run, chat, serve and bench.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use resin_core::{Counters, Home, KvCodec};
use resin_cpu::{CpuHome, CpuOptions, PackProgress};
use resin_gguf::GgufFile;
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_vulkan::{GpuOptions, UploadProgress, VulkanHome, VulkanOptions, WideMode};

/// Which home serves the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Gpu {
    /// The CPU home.
    Off,
    /// The GPU when there is one, else the CPU (saying why).
    Auto,
    /// The Vulkan home, or an error.
    Vulkan,
}

/// Options every model-loading command shares.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// A GGUF file, or a model name from the registry (fetched on first use).
    #[arg(long, short = 'm', env = "RESIN_MODEL")]
    pub model: Option<String>,
    /// Which home runs the model.
    #[arg(long, value_enum, default_value = "auto", env = "RESIN_GPU")]
    pub gpu: Gpu,
    /// Context length (positions per session); default: the model's, capped at 4096.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// K/V cache codec: f16, f32 or q8_0.
    #[arg(long, default_value = "f16", value_parser = parse_codec)]
    pub kv: KvCodec,
    /// CPU threads (default: all cores).
    #[arg(long, short = 't', env = "RESIN_THREADS")]
    pub threads: Option<usize>,
    /// How the Vulkan home steps more than 8 sessions at once: `exact` (groups of 8-row
    /// token commands on several queues, and from 48 sessions, where the GPU has int8 tensor
    /// cores, one pass over the weights in the canonical order: each session's tokens exactly
    /// what it gets stepped alone), `canon` (that canonical pass at every width, for
    /// measuring), `fast` (from 40 sessions one GEMM pass: faster, a session's logits then
    /// depend slightly on how many others shared its step) or `gemm` (the GEMM pass at every
    /// width, for measuring). The CPU home is exact either way.
    #[arg(long, value_enum, default_value = "exact", env = "RESIN_WIDE_STEPS")]
    pub wide_steps: WideSteps,
    /// The Vulkan device to use, as an index into the driver's list (default: a discrete GPU
    /// first, then integrated, virtual, software).
    #[arg(long, env = "RESIN_VK_DEVICE")]
    pub vk_device: Option<usize>,
    /// The most compute queues the Vulkan home takes (a wide step's groups submit to them at
    /// once; default: up to 8).
    #[arg(long, env = "RESIN_VK_QUEUES")]
    pub vk_queues: Option<u32>,
    /// Microseconds a wait for the GPU polls before it sleeps (a sleeping wait wakes tens of
    /// microseconds late; 0 sleeps at once and spares a CPU core).
    #[arg(long, env = "RESIN_VK_SPIN_US", default_value_t = 5000)]
    pub vk_spin_us: u64,
    /// Seconds one wait for the GPU may take before the device is taken as hung: the Vulkan
    /// home is then down, its requests get 503 and `/health` says why (0: no limit; default:
    /// 120 on a GPU, no limit on a software device).
    #[arg(long, env = "RESIN_VK_FENCE_TIMEOUT")]
    pub vk_fence_timeout: Option<f64>,
    /// Log each GPU pipeline's compiler statistics (registers, shared memory, spills).
    #[arg(long, env = "RESIN_VK_PIPELINE_STATS")]
    pub vk_pipeline_stats: bool,
}

/// `--wide-steps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WideSteps {
    Exact,
    Canon,
    Fast,
    Gemm,
}

/// The model cache and fetcher, with the settings the environment gives: `RESIN_CACHE` (the
/// cache root), `RESIN_PIP` (the pip command) and `RESIN_VERBOSE` (pip's own output shown).
pub fn hub() -> resin_hub::Hub {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    resin_hub::Hub::new(resin_hub::HubSettings {
        cache_root: var("RESIN_CACHE").map(PathBuf::from),
        pip: var("RESIN_PIP"),
        verbose: var("RESIN_VERBOSE").is_some_and(|v| v != "0"),
    })
}

fn parse_codec(s: &str) -> Result<KvCodec, String> {
    KvCodec::parse(s).ok_or_else(|| format!("unknown K/V codec {s:?} (f16, f32, q8_0)"))
}

pub struct Loaded {
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    pub cfg: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub home: Box<dyn Home>,
}

impl ModelArgs {
    /// Resolve, open and check the model, and build its home with `regions` sessions.
    pub fn load(&self, regions: usize) -> Result<Loaded> {
        init_threads(self.threads)?;
        let path = hub().resolve(self.model.as_deref(), true)?;
        let file = Arc::new(GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?);
        let cfg = ModelConfig::from_gguf(&file).with_context(|| format!("{} is not a model resin can run", path.display()))?;
        let tokenizer = Arc::new(Tokenizer::from_gguf(&file).context("building the tokenizer")?);
        let template = ChatTemplate::from_gguf(&file).context("reading the chat template")?;
        let home = self.home(&file, &cfg, regions)?;
        tracing::info!(
            model = %path.display(),
            arch = cfg.arch.name(),
            layers = cfg.n_layer,
            home = home.spec().kind,
            ctx = home.spec().n_ctx,
            regions,
            simd = resin_cpu::kernels::simd_level(),
            "model ready"
        );
        Ok(Loaded { path, file, cfg, tokenizer, template, home })
    }

    fn home(&self, file: &Arc<GgufFile>, cfg: &ModelConfig, regions: usize) -> Result<Box<dyn Home>> {
        let counters = Arc::new(Counters::default());
        serving_home(
            self.gpu,
            || self.vulkan(file, cfg, regions, counters.clone()),
            || {
                let bar = progress_bar("laying the weights out for the CPU");
                let shown = bar.clone();
                let progress = PackProgress(Arc::new(move |done, total| {
                    shown.set_length(total);
                    shown.set_position(done);
                }));
                let opts = CpuOptions { n_ctx: self.ctx, regions, codec: self.kv, threads: self.threads, progress: Some(progress) };
                let home = CpuHome::new(file.clone(), cfg.clone(), &opts, counters.clone());
                bar.finish_and_clear();
                Ok(Box::new(home?))
            },
        )
    }

    /// The Vulkan home. `auto` takes only a hardware device: a software one (lavapipe) is slower
    /// than the CPU home, so it is used when asked for by name (`--gpu vulkan`).
    fn vulkan(&self, file: &Arc<GgufFile>, cfg: &ModelConfig, regions: usize, counters: Arc<Counters>) -> Result<Box<dyn Home>> {
        let fence_timeout = self.vk_fence_timeout.map(|s| std::time::Duration::try_from_secs_f64(s).map_err(|e| anyhow::anyhow!("--vk-fence-timeout {s}: {e}"))).transpose()?;
        let gpu_opts = GpuOptions {
            device: self.vk_device,
            queues: self.vk_queues,
            pipeline_stats: self.vk_pipeline_stats,
            spin: std::time::Duration::from_micros(self.vk_spin_us),
            fence_timeout,
            ..GpuOptions::default()
        };
        let gpu = resin_vulkan::Gpu::start_with(&gpu_opts)?;
        if self.gpu == Gpu::Auto && gpu.info.kind == "cpu" {
            bail!("the only Vulkan device, {}, is a software rasterizer (use --gpu vulkan to take it anyway)", gpu.info.name);
        }
        let bar = progress_bar(&format!("uploading to {}", gpu.info.name));
        let shown = bar.clone();
        let progress = UploadProgress(Arc::new(move |done, total| {
            shown.set_length(total);
            shown.set_position(done);
        }));
        let wide = match self.wide_steps {
            WideSteps::Exact => WideMode::Lanes,
            WideSteps::Canon => WideMode::Canon,
            WideSteps::Fast => WideMode::Fast,
            WideSteps::Gemm => WideMode::Gemm,
        };
        let opts = VulkanOptions { n_ctx: self.ctx, regions, codec: self.kv, progress: Some(progress), wide, gpu: gpu_opts, ..VulkanOptions::default() };
        let home = VulkanHome::on(gpu, file.clone(), cfg.clone(), &opts, counters);
        bar.finish_and_clear();
        let mut home = home?;
        // The pipelines of every step the regions can run, built now rather than in the
        // first requests' time to first token.
        match home.prewarm(regions) {
            Ok(took) => tracing::info!(ms = took.as_millis() as u64, rows = regions, "pipelines ready"),
            Err(e) => tracing::warn!("pipelines not built ahead (the first steps build them): {e}"),
        }
        Ok(Box::new(home))
    }
}

/// The home that serves a model: the Vulkan home when `vulkan` builds one (not asked under
/// `--gpu off`); where it cannot (a decline: the Vulkan home counts it and says it once with
/// its reason; or no device), the CPU home under `--gpu auto`, saying why, and an error that
/// says why under `--gpu vulkan`. Never a silent fallback.
pub fn serving_home(gpu: Gpu, vulkan: impl FnOnce() -> Result<Box<dyn Home>>, cpu: impl FnOnce() -> Result<Box<dyn Home>>) -> Result<Box<dyn Home>> {
    if gpu != Gpu::Off {
        match vulkan() {
            Ok(home) => return Ok(home),
            Err(e) if gpu == Gpu::Vulkan => return Err(e.context("--gpu vulkan")),
            Err(e) => tracing::info!("the CPU home serves: {e:#}"),
        }
    }
    cpu()
}

/// Size rayon's global pool once (the CPU home's threads).
fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    if n == 0 {
        bail!("--threads must be at least 1");
    }
    // A second call (tests, repeated loads) keeps the first pool.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    Ok(())
}

/// A load's progress in bytes (the upload to the device, the CPU home's weight layout) as a bar
/// on stderr (hidden when stderr is not a terminal, as indicatif does).
fn progress_bar(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use resin_gguf::{formats, GgmlType, GgufWriter, Value};
    use resin_vulkan::VkError;

    /// A one-layer llama whose matrices are Q5_1, a format the CPU home multiplies and the
    /// Vulkan home has no kernel for.
    fn q5_1_model() -> Arc<GgufFile> {
        let (d, ff, v) = (64usize, 64usize, 32usize);
        let mut g = GgufWriter::new();
        g.set("general.architecture", Value::String("llama".into()));
        for (k, x) in [("block_count", 1), ("embedding_length", d), ("attention.head_count", 2), ("feed_forward_length", ff), ("context_length", 64)] {
            g.set(format!("llama.{k}"), Value::U32(x as u32));
        }
        let mut seed = 7u32;
        let mut vals = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        let mut data: Vec<Vec<u8>> = Vec::new();
        let mats = [
            ("token_embd.weight", v, d),
            ("blk.0.attn_q.weight", d, d),
            ("blk.0.attn_k.weight", d, d),
            ("blk.0.attn_v.weight", d, d),
            ("blk.0.attn_output.weight", d, d),
            ("blk.0.ffn_gate.weight", ff, d),
            ("blk.0.ffn_up.weight", ff, d),
            ("blk.0.ffn_down.weight", d, ff),
        ];
        for (name, rows, cols) in mats {
            g.add_tensor(name.to_string(), &[cols as u64, rows as u64], GgmlType::Q5_1).unwrap();
            data.push(formats::quantize(GgmlType::Q5_1, &vals(rows * cols)).unwrap());
        }
        for name in ["output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"] {
            g.add_tensor(name.to_string(), &[d as u64], GgmlType::F32).unwrap();
            data.push(vec![1f32; d].iter().flat_map(|x| x.to_le_bytes()).collect());
        }
        let refs: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
        Arc::new(GgufFile::from_bytes(g.write_all_to_vec(&refs).unwrap()).unwrap())
    }

    /// A model the Vulkan home cannot serve: under `--gpu auto` the CPU home serves it, the
    /// decline counted once a refusal with its reason; under `--gpu vulkan` the refusal is an
    /// error that gives the reason; under `--gpu off` the Vulkan home is not asked.
    #[test]
    fn a_model_the_vulkan_home_declines_is_served_by_the_cpu_home() {
        declined_model_is_served_by_the_cpu_home(q5_1_model(), "vulkan: Q5_1 weights have no kernel");
    }

    /// A mixture-of-experts model (here `resin synth`'s tiny qwen3moe) is served by the Vulkan
    /// home under `--gpu auto`, with no decline; read as more experts than its kernels take, the
    /// Vulkan home declines it with its reason.
    #[test]
    fn a_moe_model_is_served_by_the_vulkan_home() {
        let path = std::env::temp_dir().join(format!("resin-load-moe-{}.gguf", std::process::id()));
        let shape = resin::synth::SynthShape::Qwen3MoeTiny;
        resin::synth::synth(shape, resin::synth::SynthType::Q8_0, resin::synth::SynthVocab::ByteLevel, &path, 1, false).unwrap();
        let file = Arc::new(GgufFile::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let Some(gpu) = device_or_skip() else { return };
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        let counters = Arc::new(Counters::default());
        let opts = VulkanOptions { n_ctx: Some(64), ..VulkanOptions::default() };
        let home_for = |cfg: ModelConfig| {
            let (file, counters, gpu, opts) = (file.clone(), counters.clone(), gpu.clone(), opts.clone());
            let cpu = {
                let (file, cfg, counters) = (file.clone(), cfg.clone(), counters.clone());
                move || -> Result<Box<dyn Home>> {
                    Ok(Box::new(CpuHome::new(file.clone(), cfg.clone(), &CpuOptions { n_ctx: Some(64), ..CpuOptions::default() }, counters.clone())?))
                }
            };
            let vulkan = move || -> Result<Box<dyn Home>> { Ok(Box::new(VulkanHome::on(gpu.clone(), file.clone(), cfg.clone(), &opts, counters.clone())?)) };
            serving_home(Gpu::Auto, vulkan, cpu).unwrap()
        };
        let mut home = home_for(cfg.clone());
        assert_eq!(home.spec().kind, "vulkan");
        let logits = home.prefill(&[resin_core::Segment { region: resin_core::RegionId(0), start: 0, tokens: &[1, 2, 3] }]).unwrap();
        assert!(logits.data.iter().all(|x| x.is_finite()) && logits.data.iter().any(|&x| x != 0.0), "the Vulkan home serves the model");
        assert!(counters.declines().is_empty(), "{:?}", counters.declines());
        drop(home);
        // Past the kernels' limits (a config only: the CPU home would refuse it against the
        // file's tensors), the Vulkan home declines with its reason.
        let wide = ModelConfig { moe: Some(resin_model::Moe { n_expert: 300, n_expert_used: 9 }), ..cfg };
        let reason = "vulkan: mixture-of-experts models of 300 experts, 9 a row (kernels take up to 256, 8 a row)";
        match VulkanHome::on(gpu.clone(), file.clone(), wide, &opts, counters.clone()) {
            Err(VkError::Unsupported(r)) => assert_eq!(r, reason),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the Vulkan home took 9 experts a row"),
        }
        assert_eq!(counters.declines().get(reason), Some(&1), "{:?}", counters.declines());
    }

    /// The Vulkan device, or None with a SKIP line (a failure when RESIN_REQUIRE_VULKAN=1).
    fn device_or_skip() -> Option<Arc<resin_vulkan::Gpu>> {
        match resin_vulkan::Gpu::start() {
            Ok(g) => Some(g),
            Err(e) => {
                assert!(std::env::var("RESIN_REQUIRE_VULKAN").as_deref() != Ok("1"), "RESIN_REQUIRE_VULKAN=1 but there is no Vulkan device: {e}");
                eprintln!("SKIP: no Vulkan device ({e})");
                None
            }
        }
    }

    fn declined_model_is_served_by_the_cpu_home(file: Arc<GgufFile>, reason: &str) {
        let Some(gpu) = device_or_skip() else { return };
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        let counters = Arc::new(Counters::default());
        let vulkan = || -> Result<Box<dyn Home>> {
            let opts = VulkanOptions { n_ctx: Some(64), ..VulkanOptions::default() };
            Ok(Box::new(VulkanHome::on(gpu.clone(), file.clone(), cfg.clone(), &opts, counters.clone())?))
        };
        let cpu =
            || -> Result<Box<dyn Home>> { Ok(Box::new(CpuHome::new(file.clone(), cfg.clone(), &CpuOptions { n_ctx: Some(64), ..CpuOptions::default() }, counters.clone())?)) };
        let mut home = serving_home(Gpu::Auto, vulkan, cpu).unwrap();
        assert_eq!(home.spec().kind, "cpu");
        let logits = home.prefill(&[resin_core::Segment { region: resin_core::RegionId(0), start: 0, tokens: &[1, 2, 3] }]).unwrap();
        assert!(logits.data.iter().all(|x| x.is_finite()) && logits.data.iter().any(|&x| x != 0.0), "the CPU home serves the model");
        assert_eq!(counters.declines().get(reason), Some(&1), "{:?}", counters.declines());

        let e = serving_home(Gpu::Vulkan, vulkan, cpu).err().expect("--gpu vulkan refuses a model it declines");
        assert!(format!("{e:#}").contains(reason), "{e:#}");
        assert!(e.chain().any(|c| matches!(c.downcast_ref::<VkError>(), Some(VkError::Unsupported(_)))), "{e:#}");
        assert_eq!(counters.declines().get(reason), Some(&2));

        let home = serving_home(Gpu::Off, || panic!("--gpu off asks no Vulkan home"), cpu).unwrap();
        assert_eq!(home.spec().kind, "cpu");
        assert_eq!(counters.declines().len(), 1, "one reason, counted each time it was met");
    }
}
