//! Model parity with the CPU home (the oracle): greedy ids equal for 32 tokens, first-step
//! logits within relative L2 1e-2 (f16 mirror), with a control that must fail that bar.
//! Also, on the models cut to their first BLOCKS blocks (the home against itself): an N-row
//! step equals its rows run alone (bit for bit), two regions stay apart, the attention ropes
//! as the rope dispatch, a prewarmed home runs as one built on demand.

mod common;

use common::{argmax, rel_l2};

use std::sync::Arc;

use resin_core::{Counters, Home, KvCodec, Profile, RegionId, Row, Segment, StepAll};
use resin_cpu::{CpuHome, CpuOptions};
use resin_gguf::GgufFile;
use resin_model::ModelConfig;
use resin_vulkan::{VulkanHome, VulkanOptions};

fn homes_with(name: &str, n_ctx: usize, regions: usize, q8_activations: bool) -> Option<(CpuHome, VulkanHome)> {
    let gpu = common::gpu()?;
    let path = resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
    Some(homes_on(gpu, Arc::new(GgufFile::open(&path).unwrap()), n_ctx, regions, q8_activations))
}

fn cpu_home(file: Arc<GgufFile>, n_ctx: usize, regions: usize) -> CpuHome {
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    CpuHome::new(file, cfg, &CpuOptions { n_ctx: Some(n_ctx), regions, codec: KvCodec::F16, threads: None, progress: None }, Arc::new(Counters::default())).unwrap()
}

fn homes_on(gpu: Arc<resin_vulkan::Gpu>, file: Arc<GgufFile>, n_ctx: usize, regions: usize, q8_activations: bool) -> (CpuHome, VulkanHome) {
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let vk = VulkanHome::on(
        gpu,
        file.clone(),
        cfg,
        &VulkanOptions { n_ctx: Some(n_ctx), regions, codec: KvCodec::F16, q8_activations, progress: None, ..VulkanOptions::default() },
        Arc::new(Counters::default()),
    )
    .unwrap();
    (cpu_home(file, n_ctx, regions), vk)
}

const PROMPT: [u32; 12] = [1, 9690, 2683, 314, 253, 1691, 282, 2476, 28, 357, 4073, 30];

/// `bar`: the median over prompts of the relative L2 of all first-step logits, Vulkan (8-bit
/// activations, as the CPU home) against the CPU home. Both homes take the canonical product
/// for these prompts' rows, yet their logits part: each home's own float steps outside the
/// products (r's square root, exp, the attention) differ by a few ulps, which flips some
/// 8-bit activation roundings (a step of amax/127 each), and a prompt's first logits carry
/// those flips at full size. One prompt's figure is a draw from that spread: SmolLM2's fixed
/// prompt below moves from 9.7e-3 to 1.85e-2 when the CPU home's r alone moves by 1e-6 of
/// itself, and its 35 reference prompts part by 1.2e-2 to 9.4e-2. The median over the fixed
/// prompt and the first reference prompts (testdata/reference: `<name>.json`, then
/// `<name>-wide.json`; [`FIRST_STEP_PROMPTS`] in all) is steady, and a systematic difference (a home rounding coarser) moves
/// it; whether either home is farther from float32 is [`q8_no_farther_than_the_cpu_home`]'s
/// question.
const FIRST_STEP_PROMPTS: usize = 36;

/// A prompt whose greedy continuation has wide top-2 margins (counting), so 8-bit activation
/// noise (which moves these models' logits by up to ~0.2, see crates/cpu/tests/reference.rs)
/// cannot flip a near-tie within 32 tokens.
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";

fn margin(v: &[f32]) -> f32 {
    let top = argmax(v) as usize;
    let second = v.iter().enumerate().filter(|&(i, _)| i != top).map(|(_, &x)| x).fold(f32::NEG_INFINITY, f32::max);
    v[top] - second
}

/// Greedy ids and first-step logits of `name` on both homes; with `float32`, also whether the
/// Vulkan home is farther from the float32 reference than the CPU home
/// ([`q8_no_farther_than_the_cpu_home`]) on the same prompts' first steps.
fn greedy_parity(name: &str, steps: usize, bar: f64, float32: bool) {
    let Some(gpu) = common::gpu() else { return };
    let path = resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
    greedy_parity_on(gpu, name, name, Arc::new(GgufFile::open(&path).unwrap()), steps, bar, float32);
}

/// `greedy_parity` on a model file already open (`name` labels the messages; `refs` names the
/// reference prompts' files).
fn greedy_parity_on(gpu: Arc<resin_vulkan::Gpu>, name: &str, refs: &str, file: Arc<GgufFile>, steps: usize, bar: f64, float32: bool) {
    let (mut cpu, mut vk) = homes_on(gpu, file.clone(), 256, 1, true);
    let tok = resin_model::Tokenizer::from_gguf(&file).unwrap();
    let prompt = tok.encode(COUNTING, true, false).unwrap();
    // First-step logits on the fixed-id prompt (led by BOS where the model wants one: Gemma's
    // activations run wild without it), then greedy on the counting prompt.
    let mut fixed = PROMPT;
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos()) {
        fixed[0] = bos;
    }
    let cases = reference_and_wide_cases(refs);
    let mut prompts = vec![fixed.to_vec()];
    prompts.extend(cases.iter().map(|c| c.prompt.clone()).take(FIRST_STEP_PROMPTS - 1));
    let mut lv = None;
    let mut firsts = Vec::new();
    let mut es: Vec<f64> = prompts
        .iter()
        .map(|p| {
            let seg = [Segment { region: RegionId(0), start: 0, tokens: p }];
            let (c, v) = (cpu.prefill(&seg).unwrap(), vk.prefill(&seg).unwrap());
            let e = rel_l2(v.row(0), c.row(0));
            if lv.is_none() {
                lv = Some(v);
            } else {
                firsts.push((v, c));
            }
            e
        })
        .collect();
    let lv = lv.unwrap();
    if float32 {
        assert_eq!(firsts.len(), cases.len(), "every reference case's first step");
        q8_no_farther_than_the_cpu_home(name, &cases, &firsts);
    }
    eprintln!("{name}: fixed prompt's first-step logits relative L2 {:.2e}", es[0]);
    es.sort_by(|a, b| a.total_cmp(b));
    let e = es[es.len() / 2];
    eprintln!("{name}: first-step logits relative L2 over {} prompts: median {e:.2e} (bar {bar:.1e}), least {:.2e}, most {:.2e}", es.len(), es[0], es[es.len() - 1]);
    assert!(e < bar, "{name}: first-step logits relative L2 median {e} >= {bar}");
    // Control: the CPU logits of a prompt with one token changed must fail the bar.
    let mut other = fixed;
    other[10] = 1000;
    let mut cpu2 = cpu_home(file.clone(), 256, 1);
    let lo = cpu2.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &other }]).unwrap();
    let control = rel_l2(lv.row(0), lo.row(0));
    eprintln!("{name}: control (one prompt token changed): relative L2 {control:.2e}");
    assert!(control >= bar, "control: another prompt's logits must fail the bar");

    let seg = [Segment { region: RegionId(0), start: 0, tokens: &prompt }];
    let lc = cpu.prefill(&seg).unwrap();
    let lv = vk.prefill(&seg).unwrap();
    let mut min_margin = margin(lc.row(0));
    let (mut tc, mut tv) = (argmax(lc.row(0)), argmax(lv.row(0)));
    let mut ids_c = vec![tc];
    let mut ids_v = vec![tv];
    let mut vk_time = std::time::Duration::ZERO;
    for i in 0..steps - 1 {
        let pos = (prompt.len() + i) as u32;
        let c = cpu.step_logits(&[Row { region: RegionId(0), token: tc, pos }]).unwrap();
        let t0 = std::time::Instant::now();
        let v = vk.step_logits(&[Row { region: RegionId(0), token: tv, pos }]).unwrap();
        vk_time += t0.elapsed();
        tc = argmax(c.row(0));
        min_margin = min_margin.min(margin(c.row(0)));
        tv = argmax(v.row(0));
        // The device's argmax agrees with the host's over the logits it returned.
        assert_eq!(vk.last_ids(1).unwrap()[0], tv, "on-device argmax");
        ids_c.push(tc);
        ids_v.push(tv);
    }
    eprintln!("{name}: cpu    {ids_c:?}\n{name}: vulkan {ids_v:?}");
    eprintln!("{name}: vulkan step {:.1} ms a token on {}", vk_time.as_secs_f64() * 1e3 / (steps - 1) as f64, vk.device().info.name);
    eprintln!("{name}: smallest CPU top-2 margin over the {steps} steps: {min_margin:.3}");
    assert_eq!(ids_v, ids_c, "{name}: greedy ids differ (smallest CPU top-2 margin {min_margin:.3})");
}

#[test]
fn smollm2_greedy_32_and_first_logits() {
    // Median measured 2.32e-2 over 36 prompts (lavapipe against the CPU home's canonical
    // tiles, which give the same bits on AVX-512 and AVX2). The one-prompt bar before it, 1e-2,
    // sat inside that prompt's own spread (above).
    greedy_parity("smollm2-135m", 32, 3e-2, true);
}

#[test]
fn qwen25_coder_greedy_32_and_first_logits() {
    // Median measured 1.07e-2 over 36 prompts; the one-prompt bar before it was 5e-2.
    greedy_parity("qwen2.5-coder-0.5b", 32, 2e-2, true);
}

#[test]
fn gemma3_270m_greedy_32_and_first_logits() {
    greedy_parity("gemma3-270m", 32, GEMMA_BAR, false);
}

/// Gemma 3 270M, Vulkan against the CPU home, both with 8-bit activations: its post-norms
/// carry each rounding difference to the residual at full size (crates/cpu/tests/reference.rs).
/// Median measured 2.27e-2 over 36 prompts (the one-prompt bar before it was 5e-2).
const GEMMA_BAR: f64 = 3.5e-2;
/// Gemma 3 270M with f32 activations against the float32 reference: the bar the other files
/// meet (the device's own arithmetic has nothing gemma-specific to lose).
const GEMMA_F32_BAR: f64 = 2e-3;

/// `name`'s file with every matrix (2-D tensor) quantized again as `ty` from its values (the
/// norms and biases as they were): a model in a format none of the fetched files has.
fn requantized(name: &str, ty: resin_gguf::GgmlType) -> Arc<GgufFile> {
    use resin_gguf::{formats, GgufWriter};
    let path = resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
    let src = GgufFile::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.set(k.clone(), v.clone());
    }
    let mut data: Vec<Vec<u8>> = Vec::new();
    for t in src.tensors() {
        let bytes = src.tensor_data(t);
        if t.dims.len() == 2 && t.ty != ty {
            let mut vals = vec![0f32; t.n_elements() as usize];
            formats::dequantize(t.ty, bytes, &mut vals).unwrap();
            w.add_tensor(t.name.clone(), &t.dims, ty).unwrap();
            data.push(formats::quantize(ty, &vals).unwrap());
        } else {
            w.add_tensor(t.name.clone(), &t.dims, t.ty).unwrap();
            data.push(bytes.to_vec());
        }
    }
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    Arc::new(GgufFile::from_bytes(w.write_all_to_vec(&refs).unwrap()).unwrap())
}

#[test]
fn smollm2_as_q8_0_greedy_32_and_first_logits() {
    // Q8_0 is the benchmarks' format (the 1B synth on the GPU machine) and one of the two the
    // device holds in a layout of its own (src/layout.rs: a row's quants, then its scales);
    // none of the fetched models is Q8_0, so SmolLM2 requantized.
    // Bar 3e-2: measured 1.06e-2 against the CPU home's AVX-512 kernels (an Intel Xeon), the
    // same to the bit as with the GGUF layout before it (the layout moves bytes, not
    // arithmetic), and as the Q4_1 file's float subgroup tier; 1.89e-2 against its AVX2 ones
    // (an AMD EPYC: other float sums, so other 8-bit activation roundings flip apart; the
    // Qwen2.5-Coder file's homes part by 2.8e-2 to 3.6e-2 the same way, while each home with
    // f32 activations sits within 5e-4 of float32, `*_match_float32_reference`). The control
    // (one prompt token changed) measured 2.8e-1.
    let Some(gpu) = common::gpu() else { return };
    let file = requantized("smollm2-135m", resin_gguf::GgmlType::Q8_0);
    assert!(file.tensors().iter().filter(|t| t.dims.len() == 2).all(|t| t.ty == resin_gguf::GgmlType::Q8_0));
    greedy_parity_on(gpu, "smollm2-135m as Q8_0", "smollm2-135m", file, 32, 3e-2, false);
}

#[test]
fn nrow_step_equals_rows_alone_and_regions_stay_apart() {
    let Some(mut vk) = vk_home("smollm2-135m", 64, 3, KvCodec::F16) else { return };
    // Three regions with different prompts.
    let prompts: [&[u32]; 3] = [&PROMPT[..5], &PROMPT[3..9], &PROMPT[6..]];
    for (r, p) in prompts.iter().enumerate() {
        vk.prefill(&[Segment { region: RegionId(r as u32), start: 0, tokens: p }]).unwrap();
    }
    let rows: Vec<Row> = (0..3).map(|r| Row { region: RegionId(r), token: 42 + r, pos: prompts[r as usize].len() as u32 }).collect();
    let together = vk.step_logits(&rows).unwrap();
    // Each row alone, at the same positions (rewrites the same K/V rows with the same values).
    for (i, row) in rows.iter().enumerate() {
        let alone = vk.step_logits(&[*row]).unwrap();
        let same = alone.row(0).iter().zip(together.row(i)).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "row {i} of the 3-row step differs from the row alone");
    }
    // Control: different regions give different logits for the same token.
    let a = vk.step_logits(&[Row { region: RegionId(0), token: 7, pos: 5 }]).unwrap();
    let b = vk.step_logits(&[Row { region: RegionId(1), token: 7, pos: 5 }]).unwrap();
    assert!(rel_l2(a.row(0), b.row(0)) > 1e-3, "regions must not share keys");
}

/// Blocks of a model the tests of the home against itself run on (rows together and alone,
/// prewarming, the profile): their subject is the machinery, not the model's depth.
const BLOCKS: usize = 4;

/// A Vulkan home alone (no CPU home) on `name` cut to BLOCKS blocks, with its mirror codec.
fn vk_home(name: &str, n_ctx: usize, regions: usize, codec: KvCodec) -> Option<VulkanHome> {
    let gpu = common::gpu()?;
    // RESIN_TEST_GGUF (common::model_cut) names another file, as on the GPU machine.
    let common::Model { file, cfg, .. } = common::model_cut(name, BLOCKS);
    let opts = VulkanOptions { n_ctx: Some(n_ctx), regions, codec, q8_activations: true, progress: None, ..VulkanOptions::default() };
    Some(VulkanHome::on(gpu, file, cfg, &opts, Arc::new(Counters::default())).unwrap())
}

/// A token command's attention ropes and stores q, k and v itself (one row, the 3-row command
/// of three regions, a peel's rows of one region): rows stepped together give each row's
/// one-row logits bit for bit, and store the same K/V (the steps after read them back),
/// on NORM rope (SmolLM2) and NEOX rope with q/k/v bias (Qwen2.5), the f16 mirror. Control:
/// the next position's logits differ. The profile says which path ran: no rope_store dispatch
/// in any of them, and one where a region's rows are not one run (not in position order).
#[test]
fn the_attention_ropes_and_stores_as_the_rope_dispatch() {
    // The f32 mirror's form is covered by tests/kernels.rs (attention_that_ropes_...).
    for (name, codec) in [("smollm2-135m", KvCodec::F16), ("qwen2.5-coder-0.5b", KvCodec::F16)] {
        let Some(mut h) = vk_home(name, 64, 3, codec) else { return };
        let what = format!("{name} {codec:?}");
        for r in 0..3u32 {
            let start = r as usize * 2;
            h.prefill(&[Segment { region: RegionId(r), start: 0, tokens: &PROMPT[start..start + 6] }]).unwrap();
        }
        // Each region's row alone, then the three together at the next position, alone again
        // at the one after (each reads the K/V the other path stored).
        let mut prev: Vec<f32> = Vec::new();
        for pos in [6u32, 7, 8] {
            let rows: Vec<Row> = (0..3u32).map(|r| Row { region: RegionId(r), token: 40 + r + pos, pos }).collect();
            let alone: Vec<Vec<f32>> = rows.iter().map(|r| h.step_logits(std::slice::from_ref(r)).unwrap().data).collect();
            let together = h.step_logits(&rows).unwrap();
            for (i, a) in alone.iter().enumerate() {
                let x = together.row(i);
                let differ = x.iter().zip(a).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                assert!(differ == 0, "{what}: row {i} at {pos}: the attention's own rope differs from the dispatch ({differ} of {} logits)", x.len());
            }
            assert!(alone[0] != prev, "control {what}: the next position's logits must differ");
            prev = alone[0].clone();
        }
        // Which path ran.
        let rope_stages = |h: &mut VulkanHome, rows: &[Row]| h.profile_step(rows).unwrap().map(|st| st.iter().filter(|(l, _)| l.starts_with("rope_store")).count());
        let pos = 9u32;
        let row = [Row { region: RegionId(1), token: 9, pos }];
        if let Some(o) = rope_stages(&mut h, &row) {
            assert_eq!(o, 0, "{what}: the one-row command ropes in its attention");
            let own = [Row { region: RegionId(0), token: 9, pos }, Row { region: RegionId(1), token: 9, pos: pos + 1 }];
            assert_eq!(rope_stages(&mut h, &own).unwrap(), 0, "{what}: rows of their own regions rope in their attention");
            let peel = [Row { region: RegionId(2), token: 9, pos }, Row { region: RegionId(2), token: 9, pos: pos + 1 }];
            assert_eq!(rope_stages(&mut h, &peel).unwrap(), 0, "{what}: a peel's rows rope in their attention");
            let unordered = [Row { region: RegionId(2), token: 9, pos: pos + 1 }, Row { region: RegionId(2), token: 9, pos }];
            assert!(rope_stages(&mut h, &unordered).unwrap() > 0, "{what}: rows of a region out of order take rope_store");
        }
        // A peel (three rows of region 0 and two of region 1, each run in position order)
        // against the same rows stepped one at a time.
        let peel: Vec<Row> = [(0u32, 11u32), (0, 12), (0, 13), (1, 11), (1, 12)].iter().map(|&(r, pos)| Row { region: RegionId(r), token: 60 + r + pos, pos }).collect();
        let alone: Vec<Vec<f32>> = peel.iter().map(|r| h.step_logits(std::slice::from_ref(r)).unwrap().data).collect();
        let together = h.step_logits(&peel).unwrap();
        for (i, a) in alone.iter().enumerate() {
            let differ = together.row(i).iter().zip(a).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
            assert!(differ == 0, "{what}: row {i} of the peel differs from the row alone ({differ} logits)");
        }
    }
}

/// A home whose commands and window pipelines were built ahead (`prewarm`, what the binary
/// does at load) steps and prefills bit for bit as one that builds them on first use.
#[test]
fn a_prewarmed_home_runs_as_one_built_on_demand() {
    // 10 regions: prewarm builds the token commands of 1..8 rows and a 10-row wide step's.
    let Some(mut lazy) = vk_home("smollm2-135m", 64, 10, KvCodec::F16) else { return };
    let Some(mut warm) = vk_home("smollm2-135m", 64, 10, KvCodec::F16) else { return };
    let took = warm.prewarm(10).unwrap();
    assert!(took.as_nanos() > 0);
    let mut out = Vec::new();
    for vk in [&mut lazy, &mut warm] {
        let first = vk.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &PROMPT }]).unwrap();
        let rows: Vec<Row> = (0..3).map(|r| Row { region: RegionId(r), token: 42 + r, pos: 0 }).collect();
        let step = vk.step_logits(&rows).unwrap();
        let wide_rows: Vec<Row> = (0..10).map(|r| Row { region: RegionId(r), token: 7 + r, pos: 0 }).collect();
        let wide = vk.step_logits(&wide_rows).unwrap();
        let flat = |l: &resin_core::Logits| (0..l.rows()).flat_map(|i| l.row(i).to_vec()).collect::<Vec<f32>>();
        out.push((first.row(0).to_vec(), flat(&step), flat(&wide)));
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert_eq!(bits(&out[0].0), bits(&out[1].0), "the prefill's logits differ");
    assert_eq!(bits(&out[0].1), bits(&out[1].1), "the 3-row step's logits differ");
    assert_eq!(bits(&out[0].2), bits(&out[1].2), "the 10-row wide step's logits differ");
}

/// A case of testdata/reference/<name>.json (the independent float32 numpy forward pass): its
/// prompt, the first step's top-200 ids and their logits, the greedy ids.
struct RefCase {
    label: String,
    prompt: Vec<u32>,
    top_ids: Vec<u32>,
    top: Vec<f64>,
    greedy: Vec<u32>,
}

impl RefCase {
    /// The reference's logits of `l`'s first row at the top-200 ids.
    fn pick(&self, l: &resin_core::Logits) -> Vec<f64> {
        self.top_ids.iter().map(|&i| l.row(0)[i as usize] as f64).collect()
    }
    /// Sum of (k * got - want)^2 over the top 200, and of want^2.
    fn sq(&self, got: &[f64], k: f64) -> (f64, f64) {
        (got.iter().zip(&self.top).map(|(a, b)| (k * a - b).powi(2)).sum(), self.top.iter().map(|b| b * b).sum())
    }
}

/// `name`'s reference cases, then its `-wide` file's (the parity tests' spread of prompts).
fn reference_and_wide_cases(name: &str) -> Vec<RefCase> {
    let mut cases = reference_cases(name);
    cases.extend(reference_cases(&format!("{name}-wide")));
    cases
}

fn reference_cases(name: &str) -> Vec<RefCase> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/reference").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let cases = reference["cases"].as_array().unwrap();
    cases
        .iter()
        .map(|case| RefCase {
            label: format!("{:?}", case["prompt"].as_str().unwrap_or("")),
            prompt: ids(&case["prompt_ids"]),
            top_ids: ids(&case["top_logits"]["ids"]),
            top: case["top_logits"]["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect(),
            greedy: ids(&case["greedy_ids"]),
        })
        .collect()
}

/// The Vulkan home with f32 activations against the float32 reference: the first step's
/// top-200 logits of every case. This measures the device's own accuracy, without the 8-bit
/// activations that put the CPU home 1-2e-2 from float32 (see crates/cpu/tests/reference.rs).
fn reference_top200(name: &str, bar: f64) {
    let Some((_, mut vk)) = homes_with(name, 256, 1, false) else { return };
    let mut worst = 0f64;
    let mut control = f64::INFINITY;
    for case in reference_cases(name) {
        let l = vk.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &case.prompt }]).unwrap();
        let got = case.pick(&l);
        let err = |k: f64| {
            let (d, n) = case.sq(&got, k);
            (d / n).sqrt()
        };
        let e = err(1.0);
        eprintln!("{name}: {}: top-200 relative L2 {e:.2e} (bar {bar:.0e})", case.label);
        worst = worst.max(e);
        // Control: logits off by 3% (a perturbed final norm would do this) must fail.
        control = control.min(err(1.03));
        assert_eq!(argmax(l.row(0)), case.greedy[0], "{name}: first greedy id");
    }
    assert!(worst < bar, "{name}: top-200 relative L2 {worst:.3e} >= {bar}");
    assert!(control >= bar, "control: 3% scaled logits passed the bar ({control:.3e})");
}

/// How much farther than the CPU home the Vulkan home may be, as the geometric mean over the
/// cases of each case's ratio of distances. Both homes follow the canonical order, so neither
/// rounds coarser by design; what parts them is each home's own float steps outside the
/// products flipping some 8-bit roundings, and a case's ratio is a draw from that spread
/// (SmolLM2's cases: its logarithm has a standard deviation of 0.35, so the mean over 35 cases
/// one of 0.06). A home that rounds coarser (the 256-value K-quant blocks before the canonical
/// order, say) moves every case the same way.
const Q8_NOISE: f64 = 0.10;

/// Both homes with 8-bit activations (the default) against the float32 reference, over every
/// case's first-step top-200 logits (`<name>.json` and `<name>-wide.json`, 35 prompts of up to
/// 9 tokens; `firsts`: each case's (Vulkan, CPU) logits, which the greedy parity test has
/// taken already): the Vulkan home is no farther than the CPU home, within Q8_NOISE, in the
/// geometric mean of the per-case ratios; each case's two distances and the pooled ones are
/// printed. Control: the Vulkan home's logits off by 3% are farther.
fn q8_no_farther_than_the_cpu_home(name: &str, cases: &[RefCase], firsts: &[(resin_core::Logits, resin_core::Logits)]) {
    // Sums of squared differences (Vulkan, CPU) and of the reference's squares; the sums of the
    // per-case log ratios (Vulkan, scaled Vulkan) to the CPU home's distance.
    let (mut dv, mut dc, mut norm) = (0f64, 0f64, 0f64);
    let (mut lr, mut ls) = (Vec::new(), Vec::new());
    for (case, (lv, lc)) in cases.iter().zip(firsts) {
        let (gv, gc) = (case.pick(lv), case.pick(lc));
        let ((v, n), (c, _), (sv, _)) = (case.sq(&gv, 1.0), case.sq(&gc, 1.0), case.sq(&gv, 1.03));
        eprintln!("{name}: {}: top-200 relative L2 to float32: vulkan {:.3e}, cpu {:.3e}", case.label, (v / n).sqrt(), (c / n).sqrt());
        (dv, dc, norm) = (dv + v, dc + c, norm + n);
        lr.push(0.5 * (v / c).ln());
        ls.push(0.5 * (sv / c).ln());
    }
    let gmean = |l: &[f64]| (l.iter().sum::<f64>() / l.len() as f64).exp();
    let (ratio, scaled) = (gmean(&lr), gmean(&ls));
    eprintln!("{name}: {} cases pooled: vulkan {:.3e}, cpu {:.3e}; per-case ratio vulkan / cpu, geometric mean {ratio:.3}", lr.len(), (dv / norm).sqrt(), (dc / norm).sqrt());
    assert!(ratio <= 1.0 + Q8_NOISE, "{name}: the Vulkan home's 8-bit path is farther from float32 than the CPU home's: {ratio:.3} times in the geometric mean");
    assert!(scaled > 1.0 + Q8_NOISE, "control: the Vulkan home's logits scaled by 1.03 were {scaled:.3} times the CPU home's distance");
}

#[test]
fn smollm2_f32_activations_match_float32_reference() {
    reference_top200("smollm2-135m", 2e-3);
}

#[test]
fn qwen25_coder_f32_activations_match_float32_reference() {
    reference_top200("qwen2.5-coder-0.5b", 2e-3);
}

#[test]
fn gemma3_f32_activations_match_float32_reference() {
    reference_top200("gemma3-270m", GEMMA_F32_BAR);
}

#[test]
fn declines_are_counted_once_with_their_reason() {
    let Some(gpu) = common::gpu() else { return };
    let path = resin_hub::ensure("smollm2-135m", false).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let counters = Arc::new(Counters::default());
    let opts = VulkanOptions { n_ctx: Some(64), regions: 1, codec: KvCodec::Q8_0, q8_activations: true, progress: None, ..VulkanOptions::default() };
    // The q8_0 mirror stores whole 32-value blocks a head: a head dim of 48 (the model's
    // config edited; the plan declines before anything is read with it) is declined.
    let odd = ModelConfig { head_dim: 48, ..cfg.clone() };
    for _ in 0..2 {
        let e = VulkanHome::on(gpu.clone(), file.clone(), odd.clone(), &opts, counters.clone()).err().expect("the q8_0 mirror at head dim 48 is declined");
        assert!(e.to_string().contains("q8_0 K/V mirror"), "{e}");
    }
    let d = counters.declines();
    assert_eq!(d.get("vulkan: the q8_0 K/V mirror needs a head dimension that is a multiple of 32, not 48"), Some(&2), "{d:?}");
    // Control: the q8_0 mirror at the model's head dim (64) is served (no new decline reason).
    let home = VulkanHome::on(gpu, file, cfg, &opts, counters.clone()).unwrap();
    assert_eq!(counters.declines().len(), 1);
    assert_eq!(home.plan().n_ctx, 64);
}

#[test]
fn profile_step_times_every_stage() {
    let Some(mut vk) = vk_home("smollm2-135m", 64, 1, KvCodec::F16) else { return };
    vk.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &PROMPT[..4] }]).unwrap();
    let Some(stages) = vk.profile_step(&[Row { region: RegionId(0), token: 42, pos: 4 }]).unwrap() else { return };
    let total: f64 = stages.iter().map(|(_, us)| us).sum();
    let mut by_op: std::collections::BTreeMap<&str, f64> = Default::default();
    for (l, us) in &stages {
        assert!(us.is_finite() && *us >= 0.0, "{l}: {us}");
        *by_op.entry(l.split('.').next().unwrap()).or_default() += us;
    }
    eprintln!("profile: {} stages, {total:.0} us in all: {by_op:.0?}", stages.len());
    let last = format!("attention.{}", BLOCKS - 1);
    assert!(stages.iter().any(|(l, _)| *l == last) && stages.iter().any(|(l, _)| l.ends_with("classifier.0")));
    assert!(total > 0.0);
}
