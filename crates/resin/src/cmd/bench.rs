//! `resin bench`: prompt processing and generation speed in the style of llama-bench
//! (median of reps after a warm-up), or aggregate decode speed of N concurrent streams.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use resin_core::{Home, RegionId, Row, Segment, StepAll};
use resin_engine::{argmax, Engine, EngineConfig, GenEvent, GenHandle, GenRequest, PrefillQuantum, SamplingParams};
use serde_json::json;

use super::load::ModelArgs;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Concurrent streams: above 1, measures the engine's aggregate decode speed instead.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
    /// With --streams: prompts of --prompt-tokens that arrive together while the streams
    /// decode (once each stream has its first ARRIVE_AFTER tokens), one token each: the
    /// decoding streams' inter-token latency before and while they are prefilled, and their
    /// time to first token. Give the streams enough --gen-tokens to decode through it.
    #[arg(long, default_value_t = 0)]
    pub arrivals: usize,
    /// With --streams: sessions whose prompts may share a prefill window (1: one at a time).
    #[arg(long)]
    pub max_segments: Option<usize>,
    /// With --streams: prompt rows prefilled a tick while other streams decode (auto, pace,
    /// or 1..=512; default auto: what the home prefills in 25 ms, at least 128; pace: streams
    /// decoding before the waiting prompts came keep about half their token rate or more).
    #[arg(long, value_parser = parse_prefill_quantum)]
    pub prefill_quantum: Option<PrefillQuantum>,
    /// With --streams: each stream samples at this temperature (0: greedy, the default),
    /// seeded by its index, so the host's share of a sampled token is measured too.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// With --streams and a temperature: nucleus sampling's top_p.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// With --streams and a temperature: keep only the top_k most likely tokens (0: all). Up
    /// to 64 (and no penalties), a home that selects them on the device reads back only those.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// With --streams and a temperature: a repetition penalty (llama.cpp's repeat_penalty) for
    /// the first --penalty-streams streams. A penalty needs a stream's whole logits row, so a
    /// step holding such streams beside top-k ones measures reading back those rows alone.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// With --repeat-penalty: how many streams take it (default: all).
    #[arg(long)]
    pub penalty_streams: Option<usize>,
    /// With --streams: drive the home in lockstep, as llama-batched-bench does: every stream's
    /// prompt prefilled first (one segmented window chain), then every stream stepped together
    /// each step (greedy, argmax ids), so each step is N rows wide. Measures the home's
    /// decode rate at that width; without it the engine schedules the streams as a server
    /// would (prompts and decoding interleaved, streams starting and ending apart).
    #[arg(long)]
    pub lockstep: bool,
    /// Also time each stage of one prefill window and one token step on the device
    /// (timestamp queries; homes without a device clock report none).
    #[arg(long)]
    pub profile: bool,
    /// Keys already in the context before the measured prefill and decode (as `llama-bench
    /// -d N`): the prompt is prefilled after N tokens and decode runs from position N + 1.
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
}

/// `--prefill-quantum`: `auto` or `pace` (the engine sizes it: `PrefillQuantum`) or prompt
/// rows a tick, 1..=PF_WINDOW (a window is the most one prefill call runs at once).
pub fn parse_prefill_quantum(s: &str) -> Result<PrefillQuantum, String> {
    match s.parse::<usize>() {
        _ if s == "auto" => Ok(PrefillQuantum::Auto),
        _ if s == "pace" => Ok(PrefillQuantum::Pace),
        Ok(n) if (1..=resin_core::PF_WINDOW).contains(&n) => Ok(PrefillQuantum::Rows(n)),
        _ => Err(format!("{s:?}: auto, pace, or prompt rows a tick from 1 to {}", resin_core::PF_WINDOW)),
    }
}

/// Per-op totals (summed over layers) of a profiled pass, largest first, and the pass total.
fn by_op(stages: &[(String, f64)]) -> (Vec<(String, f64)>, f64) {
    let mut m: std::collections::BTreeMap<String, f64> = Default::default();
    for (label, us) in stages {
        *m.entry(label.split('.').next().unwrap_or(label).to_string()).or_default() += us;
    }
    let mut v: Vec<(String, f64)> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total = v.iter().map(|x| x.1).sum();
    (v, total)
}

/// A pass's stages by op: `[op, microseconds, GB/s]` each, GB/s where the op reads weights
/// (`bytes`: each op's weight bytes a pass; null elsewhere).
fn profile_json(stages: Option<Vec<(String, f64)>>, bytes: &[(&str, u64)]) -> serde_json::Value {
    match stages {
        None => serde_json::Value::Null,
        Some(st) => {
            let (ops, total) = by_op(&st);
            let gb_s = |op: &str, us: f64| bytes.iter().find(|(k, _)| *k == op).map(|&(_, b)| b as f64 / (us.max(1e-3) * 1e3));
            json!({ "total_us": total, "ops_us": ops.into_iter().map(|(k, v)| json!([k, v, gb_s(&k, v)])).collect::<Vec<_>>() })
        }
    }
}

fn profile_text(what: &str, p: &serde_json::Value, copy_gb_s: Option<f64>) -> String {
    let Some(total) = p["total_us"].as_f64() else { return format!("{what}: no device timestamps\n") };
    let mut s = format!("{what}: {:.0} us on the device\n", total);
    for op in p["ops_us"].as_array().into_iter().flatten() {
        let us = op[1].as_f64().unwrap_or(0.0);
        let bw = match (op[2].as_f64(), copy_gb_s) {
            (Some(g), Some(c)) => format!(" {g:>8.0} GB/s ({:.0}% of the copy's {c:.0})", 100.0 * g / c),
            (Some(g), None) => format!(" {g:>8.0} GB/s"),
            _ => String::new(),
        };
        s += &format!("  {:<12} {:>10.1} us {:>5.1}%{bw}\n", op[0].as_str().unwrap_or("?"), us, 100.0 * us / total.max(1e-9));
    }
    s
}

/// Deterministic prompt ids spread over the vocabulary (skipping the first 256 ids).
fn prompt_ids(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ salt;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (256 + x % (vocab as u64 - 256)) as u32
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The q-quantile (0..=1) of `v` by the nearest rank; None when `v` is empty.
fn percentile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(rank - 1).copied()
}

/// Tokens each decoding stream has before `--arrivals` come.
const ARRIVE_AFTER: usize = 16;

/// The decoding streams' inter-token gaps (seconds, from their token arrivals): those that end
/// by `at` once every stream had its first token (quiet), and those that end after `at`, up
/// to `until` (while the arrivals were prefilled; a gap spanning `at` held a stall of theirs).
fn gaps_around(streams: &[Vec<(f64, usize)>], at: f64, until: f64) -> (Vec<f64>, Vec<f64>) {
    let all_in = streams.iter().map(|a| a.first().map_or(f64::INFINITY, |x| x.0)).fold(0.0, f64::max);
    let (mut quiet, mut busy) = (Vec::new(), Vec::new());
    for a in streams {
        for w in a.windows(2) {
            let (start, end) = (w[0].0, w[1].0);
            if end <= at && start >= all_in {
                quiet.push(end - start);
            } else if end > at && end <= until {
                busy.push(end - start);
            }
        }
    }
    (quiet, busy)
}

fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Rows of the wide step `--profile` times: one pass of them (the Vulkan home's profile is of
/// the GEMM pass `--wide-steps gemm` runs; its lanes run token commands, timed above).
const WIDE_PROFILE_ROWS: usize = 32;

pub fn bench(args: BenchArgs) -> Result<()> {
    if args.reps == 0 || args.prompt_tokens == 0 || args.gen_tokens == 0 {
        bail!("--reps, --prompt-tokens and --gen-tokens must be at least 1");
    }
    if args.lockstep {
        if args.streams < 2
            || args.arrivals > 0
            || args.temperature != 0.0
            || args.top_p != 1.0
            || args.top_k != 0
            || args.repeat_penalty != 1.0
            || args.penalty_streams.is_some()
            || args.profile
        {
            bail!("--lockstep takes --streams of 2 or more, greedy (no --arrivals, --temperature, --top-p, --top-k, --repeat-penalty, --penalty-streams or --profile)");
        }
        return bench_lockstep(args);
    }
    if args.streams > 1 || args.arrivals > 0 {
        let params = SamplingParams { temperature: args.temperature, top_p: args.top_p, top_k: args.top_k, ..SamplingParams::default() };
        params.validate().map_err(anyhow::Error::msg)?;
        let penalized = SamplingParams { repetition_penalty: args.repeat_penalty, ..params.clone() };
        penalized.validate().map_err(anyhow::Error::msg)?;
        if (args.repeat_penalty != 1.0 || args.penalty_streams.is_some()) && args.temperature == 0.0 {
            bail!("--repeat-penalty and --penalty-streams apply to sampled streams (a --temperature above 0)");
        }
        if args.penalty_streams.is_some() && args.repeat_penalty == 1.0 {
            bail!("--penalty-streams takes a --repeat-penalty other than 1");
        }
        return bench_streams(args, params, penalized);
    }
    if args.temperature != 0.0 || args.top_p != 1.0 || args.top_k != 0 || args.repeat_penalty != 1.0 || args.penalty_streams.is_some() {
        bail!("--temperature, --top-p, --top-k and --repeat-penalty apply with --streams above 1 (a single stream's tg128 takes each step's argmax, as llama-bench's figure compares)");
    }
    if args.depth > 0 && args.streams > 1 {
        bail!("--depth applies to the single-stream pp/tg figures");
    }
    let depth = args.depth;
    let mut model = args.model.clone();
    // Room for the depth, the run and the warm-up (64 prompt rows, 4 steps).
    model.ctx = Some(model.ctx.unwrap_or(0).max(depth + args.prompt_tokens.max(64) + args.gen_tokens.max(resin_core::NROW_MAX) + 1));
    // --profile also times a wide step of WIDE_PROFILE_ROWS rows, one a region.
    let loaded = model.load(if args.profile { WIDE_PROFILE_ROWS } else { 1 })?;
    let file_bytes = loaded.file.file_len();
    let row_bytes = row_weight_bytes(&loaded.file, &loaded.cfg);
    let mut home = loaded.home;
    let vocab = home.spec().vocab;
    let region = RegionId(0);
    let prompt = prompt_ids(args.prompt_tokens, vocab, 1);
    // The keys before the measured work (--depth), prefilled once: every measured prefill and
    // step writes positions past them, so they stay.
    if depth > 0 {
        let keys = prompt_ids(depth, vocab, 2);
        let t = Instant::now();
        for (i, w) in keys.chunks(resin_core::PF_WINDOW).enumerate() {
            home.prefill(&[Segment { region, start: (i * resin_core::PF_WINDOW) as u32, tokens: w }])?;
        }
        tracing::info!(depth, secs = t.elapsed().as_secs_f64(), "context filled");
    }
    let at = depth as u32;

    let pp = |home: &mut Box<dyn Home>, toks: &[u32]| -> Result<f64> {
        let t = Instant::now();
        home.prefill(&[Segment { region, start: at, tokens: toks }])?;
        Ok(toks.len() as f64 / t.elapsed().as_secs_f64())
    };
    // Decode n tokens from the first prompt token. `greedy` false: each step's logits read
    // back and their argmax taken here (llama-bench's figure includes the logits' copy);
    // true: only each step's argmax id, computed by the home (on the GPU, on the device), as
    // a greedy stream runs it.
    let tg = |home: &mut Box<dyn Home>, n: usize, greedy: bool| -> Result<f64> {
        let t = Instant::now();
        let mut tok = prompt[0];
        for pos in 0..n {
            let row = [Row { region, token: tok, pos: at + pos as u32 }];
            tok = if greedy { home.step_ids(&row)?[0] } else { argmax(home.step_logits(&row)?.row(0)) };
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    };
    // Warm-up: page the weights in and settle the thread pool.
    pp(&mut home, &prompt[..prompt.len().min(64)])?;
    tg(&mut home, 4, false)?;
    tg(&mut home, 4, true)?;
    let mut pps = Vec::new();
    let mut tgs = Vec::new();
    let mut greedy = Vec::new();
    for _ in 0..args.reps {
        pps.push(pp(&mut home, &prompt)?);
        tgs.push(tg(&mut home, args.gen_tokens, false)?);
        greedy.push(tg(&mut home, args.gen_tokens, true)?);
    }
    let (pp_tps, tg_tps) = (median(pps.clone()), median(tgs.clone()));
    let tg_greedy_tps = Some(median(greedy));
    let spec = home.spec().clone();
    // The token command's shape at one row and at NROW_MAX rows.
    let (shape, shape_n) = match home.profiler() {
        Some(p) => (p.step_shape(1)?, p.step_shape(resin_core::NROW_MAX)?),
        None => (None, None),
    };
    let mut copy_gb_s = None;
    let profile = if let (true, Some(home)) = (args.profile, home.profiler()) {
        copy_gb_s = home.copy_bandwidth()?.map(|b| b / 1e9);
        let bytes = home.stage_weight_bytes();
        let window = home.profile_window(&Segment { region, start: at, tokens: &prompt })?;
        let row = Row { region, token: prompt[0], pos: at + prompt.len() as u32 };
        let step = home.profile_step(&[row])?;
        // An N-row step: NROW_MAX rows (one region's next positions, as the peel runs them).
        let rows: Vec<Row> = (0..resin_core::NROW_MAX).map(|i| Row { region, token: prompt[i % prompt.len()], pos: at + (prompt.len() + i) as u32 }).collect();
        let step_n = if rows.last().is_some_and(|r| (r.pos as usize) < spec.n_ctx) { home.profile_step(&rows)? } else { None };
        // A wide step: one row in each region at the prompt's length (the other regions' K/V
        // rows hold whatever is there: a timing, not a result).
        let wide: Vec<Row> = (0..WIDE_PROFILE_ROWS).map(|r| Row { region: RegionId(r as u32), token: prompt[r % prompt.len()], pos: prompt.len() as u32 }).collect();
        let step_w = if spec.step_rows_max >= wide.len() { home.profile_step(&wide)? } else { None };
        json!({ "window": profile_json(window, &bytes), "step": profile_json(step, &bytes), "step_nrow": profile_json(step_n, &bytes), "step_wide": profile_json(step_w, &bytes), "copy_gb_s": copy_gb_s })
    } else {
        serde_json::Value::Null
    };
    let out = json!({
        "model": loaded.path.file_name().map(|s| s.to_string_lossy().to_string()),
        "home": spec.kind,
        "threads": model.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
        "simd": resin_cpu::kernels::simd_level(),
        "kv": spec.codec.name(),
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "pp_tps": pp_tps,
        "tg_tps": tg_tps,
        "pp_tps_all": pps,
        "tg_tps_all": tgs,
        "tg_greedy_tps": tg_greedy_tps,
        "file_bytes": file_bytes,
        "row_weight_bytes": row_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
        "counters": counters_json(home.counters()),
        "weights_gb_s_at_tg": row_bytes as f64 * tg_tps / 1e9,
        "depth": depth,
        "layers": loaded.cfg.n_layer,
        "step_stages": shape.map(|s| s.stages),
        "step_dispatches": shape.map(|s| s.dispatches),
        "step_barriers": shape.map(|s| s.barriers),
        "step_nrow_stages": shape_n.map(|s| s.stages),
        "step_nrow_dispatches": shape_n.map(|s| s.dispatches),
        "step_nrow_barriers": shape_n.map(|s| s.barriers),
        "profile": profile,
    });
    let mut text = String::new();
    if args.profile {
        text += &profile_text(&format!("prefill window of {} rows", prompt.len().min(resin_core::PF_WINDOW)), &out["profile"]["window"], copy_gb_s);
        text += &profile_text("token step (1 row)", &out["profile"]["step"], copy_gb_s);
        text += &profile_text(&format!("token step ({} rows)", resin_core::NROW_MAX), &out["profile"]["step_nrow"], copy_gb_s);
        text += &profile_text(&format!("wide step ({WIDE_PROFILE_ROWS} rows)"), &out["profile"]["step_wide"], copy_gb_s);
    }
    print_result(
        &args.format,
        &out,
        &(format!(
            "{text}{} on {} ({} threads, {}): pp{} {:.1} t/s, tg{} {:.1} t/s{} (median of {})",
            out["model"].as_str().unwrap_or("?"),
            spec.kind,
            out["threads"],
            out["simd"].as_str().unwrap_or("?"),
            args.prompt_tokens,
            pp_tps,
            args.gen_tokens,
            tg_tps,
            tg_greedy_tps.map_or(String::new(), |g| format!(" ({g:.1} t/s greedy: argmax ids only)")),
            args.reps
        ) + &shape.map_or(String::new(), |s| {
            format!("\none-row token command: {} dependent stages, {} dispatches, {} barriers ({} layers)", s.stages, s.dispatches, s.barriers, loaded.cfg.n_layer)
        }) + &if depth > 0 { format!("\nat depth {depth}") } else { String::new() }),
    );
    Ok(())
}

/// The weight bytes one decode row reads: every tensor, but of the token embedding one row
/// where the output matrix is its own, and of each mixture-of-experts stack its chosen
/// experts' share (used / n_expert). `weights_gb_s_at_tg` is this at the tg rate: what a
/// dense and a routed model are compared on.
fn row_weight_bytes(file: &resin_gguf::GgufFile, cfg: &resin_model::ModelConfig) -> u64 {
    file.tensors()
        .iter()
        .map(|t| {
            if t.name.ends_with("_exps.weight") {
                cfg.moe.map_or(t.size, |m| t.size * m.n_expert_used as u64 / m.n_expert.max(1) as u64)
            } else if t.name == resin_model::TOKEN_EMBD && !cfg.tied_output {
                t.size / cfg.vocab.max(1) as u64
            } else {
                t.size
            }
        })
        .sum()
}

fn counters_json(c: &resin_core::Counters) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (k, v) in c.snapshot() {
        m.insert(k.to_string(), v.into());
    }
    m.insert("declines".into(), json!(c.declines()));
    serde_json::Value::Object(m)
}

fn print_result(format: &str, out: &serde_json::Value, text: &str) {
    if format == "json" {
        println!("{out}");
    } else {
        println!("{text}");
    }
}

/// One run of N streams, from each stream's token arrivals (seconds since the requests went
/// in, tokens).
struct StreamsRun {
    /// Tokens that arrived after every stream had its first, over that span: the streams that
    /// started early decoded while later prompts were still prefilling, and those tokens (and
    /// that time) are left out.
    decode_tps: f64,
    /// Tokens over the span where every stream was decoding (after the last first token,
    /// before the first stream finished), the figure comparable to a lockstep batch's decode
    /// rate; None when the streams never all decoded at once.
    full_width_tps: Option<f64>,
    ttft_p50: f64,
    ttft_max: f64,
    wall: f64,
}

impl StreamsRun {
    fn from_arrivals(streams: &[Vec<(f64, usize)>], wall: f64) -> StreamsRun {
        let firsts: Vec<f64> = streams.iter().map(|a| a.first().map_or(wall, |x| x.0)).collect();
        let last_first = firsts.iter().cloned().fold(0.0, f64::max);
        let first_done = streams.iter().map(|a| a.last().map_or(wall, |x| x.0)).fold(f64::INFINITY, f64::min);
        let end = streams.iter().map(|a| a.last().map_or(0.0, |x| x.0)).fold(last_first, f64::max);
        let tokens_in = |lo: f64, hi: f64| -> usize { streams.iter().flatten().filter(|(t, _)| *t > lo && *t <= hi).map(|x| x.1).sum() };
        let decode_tps = tokens_in(last_first, end) as f64 / (end - last_first).max(1e-9);
        let full = tokens_in(last_first, first_done);
        let full_width_tps = (first_done > last_first && full >= streams.len()).then(|| full as f64 / (first_done - last_first));
        StreamsRun { decode_tps, full_width_tps, ttft_p50: median(firsts), ttft_max: last_first, wall }
    }
}

/// A stream's token arrivals (seconds since `t0`, tokens), `count` kept at the tokens so far.
fn token_arrivals(mut h: GenHandle, t0: Instant, count: &AtomicUsize) -> Result<Vec<(f64, usize)>> {
    let mut arrivals = Vec::new();
    while let Some(ev) = h.blocking_next() {
        match ev {
            GenEvent::Delta { ids, .. } if !ids.is_empty() => {
                arrivals.push((t0.elapsed().as_secs_f64(), ids.len()));
                count.fetch_add(ids.len(), Ordering::Relaxed);
            }
            GenEvent::Delta { .. } => {}
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => bail!(e),
        }
    }
    Ok(arrivals)
}

/// One run's `--arrivals`: the decoding streams' inter-token gaps before and while the
/// arrivals were prefilled, and each arrival's time to first token (seconds from submission).
struct ArrivalsRun {
    quiet: Vec<f64>,
    busy: Vec<f64>,
    ttft: Vec<f64>,
}

/// One lockstep run's figures and each stream's generated ids.
struct Lockstep {
    prefill_tps: f64,
    decode_tps: f64,
    step_secs: Vec<f64>,
    ids: Vec<Vec<u32>>,
}

/// One lockstep run: stream i's prompt prefilled in region i (all in one call), then `gen`
/// steps of one row a stream, each row's token the previous step's greedy id.
fn lockstep_run(home: &mut dyn Home, prompts: &[Vec<u32>], gen: usize) -> Result<Lockstep> {
    let n = prompts.len();
    let segs: Vec<Segment> = prompts.iter().enumerate().map(|(i, p)| Segment { region: RegionId(i as u32), start: 0, tokens: p }).collect();
    let t = Instant::now();
    let logits = home.prefill(&segs)?;
    let pp = prompts.iter().map(|p| p.len()).sum::<usize>() as f64 / t.elapsed().as_secs_f64();
    let mut toks: Vec<u32> = (0..n).map(|i| argmax(logits.row(i))).collect();
    let mut ids = vec![Vec::with_capacity(gen + 1); n];
    let mut steps = Vec::with_capacity(gen);
    let t = Instant::now();
    for k in 0..gen {
        for (i, &tok) in toks.iter().enumerate() {
            ids[i].push(tok);
        }
        let rows: Vec<Row> = (0..n).map(|i| Row { region: RegionId(i as u32), token: toks[i], pos: (prompts[i].len() + k) as u32 }).collect();
        let s = Instant::now();
        toks = home.step_ids(&rows)?;
        steps.push(s.elapsed().as_secs_f64());
    }
    for (i, &tok) in toks.iter().enumerate() {
        ids[i].push(tok);
    }
    Ok(Lockstep { prefill_tps: pp, decode_tps: (n * gen) as f64 / t.elapsed().as_secs_f64(), step_secs: steps, ids })
}

/// N streams in lockstep through the home (`--lockstep`): the figure llama-batched-bench's
/// S_PP and S_TG measure (all prompts, then N-wide decode steps). A warm-up run of 4 tokens
/// first (the device's pipelines for N rows are built on first use).
fn bench_lockstep(args: BenchArgs) -> Result<()> {
    let mut model = args.model.clone();
    model.ctx = Some(model.ctx.unwrap_or(0).max(args.prompt_tokens + args.gen_tokens + 1));
    let loaded = model.load(args.streams)?;
    let mut home = loaded.home;
    let spec = home.spec().clone();
    if spec.regions < args.streams {
        bail!("the home has {} regions for {} streams", spec.regions, args.streams);
    }
    let n = args.streams;
    if n > spec.step_rows_max {
        bail!("{n} streams in lockstep, but the home steps at most {} rows at once", spec.step_rows_max);
    }
    let prompts: Vec<Vec<u32>> = (0..n).map(|i| prompt_ids(args.prompt_tokens, spec.vocab, i as u64 + 7)).collect();
    let warm = lockstep_run(home.as_mut(), &prompts, 4)?;
    let (mut pps, mut tgs, mut step_ms) = (Vec::new(), Vec::new(), Vec::new());
    // Whether every run's streams began with the warm-up's ids (the same prompts, greedy).
    let mut repeatable = true;
    for _ in 0..args.reps {
        let run = lockstep_run(home.as_mut(), &prompts, args.gen_tokens)?;
        repeatable &= run.ids.iter().zip(&warm.ids).all(|(a, w)| a.iter().zip(w).all(|(x, y)| x == y));
        pps.push(run.prefill_tps);
        tgs.push(run.decode_tps);
        step_ms.push(1e3 * median(run.step_secs));
    }
    let (pp, tg, ms) = (median(pps.clone()), median(tgs.clone()), median(step_ms));
    let out = json!({
        "model": loaded.path.file_name().map(|s| s.to_string_lossy().to_string()),
        "home": spec.kind,
        "lockstep": true,
        "streams": n,
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "prefill_tps": pp,
        "decode_tps": tg,
        "prefill_tps_all": pps,
        "decode_tps_all": tgs,
        "step_ms_median": ms,
        "repeatable": repeatable,
        "counters": counters_json(home.counters()),
    });
    print_result(
        &args.format,
        &out,
        &format!(
            "{} streams in lockstep on {}: prefill {pp:.1} t/s ({} prompts of {}), decode {tg:.1} t/s ({} steps of {n} rows, median {ms:.2} ms; median of {}){}",
            n,
            spec.kind,
            n,
            args.prompt_tokens,
            args.gen_tokens,
            args.reps,
            if repeatable { "" } else { "; the runs' ids differed from the warm-up's" }
        ),
    );
    Ok(())
}

/// N streams at once through the engine: aggregate decode tokens/s, time to first token.
/// `params`: each stream's sampling (validated), stream i seeded with i; `penalized`: the
/// sampling of the first `--penalty-streams` streams (all by default).
fn bench_streams(args: BenchArgs, params: SamplingParams, penalized: SamplingParams) -> Result<()> {
    let penalty_streams = args.penalty_streams.unwrap_or(args.streams).min(args.streams);
    let mut model = args.model.clone();
    model.ctx = Some(model.ctx.unwrap_or(0).max(args.prompt_tokens + args.gen_tokens + 1));
    // A region for each stream and each arrival, so that none waits for one.
    let loaded = model.load(args.streams + args.arrivals)?;
    let vocab = loaded.home.spec().vocab;
    let kind = loaded.home.spec().kind;
    let mut config = EngineConfig::default();
    if let Some(m) = args.max_segments {
        config.max_segments = m.max(1);
    }
    if let Some(q) = args.prefill_quantum {
        config.prefill_quantum_busy = q;
    }
    let engine = Engine::start(loaded.home, loaded.tokenizer.clone(), config);
    let mut results = Vec::new();
    let mut arrival_runs = Vec::new();
    for rep in 0..args.reps {
        let t0 = Instant::now();
        // Tokens each stream has had (usize::MAX once it ended), for when the arrivals come.
        let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..args.streams).map(|_| AtomicUsize::new(0)).collect());
        let handles: Vec<_> = (0..args.streams)
            .map(|i| {
                let mut req = GenRequest::new(prompt_ids(args.prompt_tokens, vocab, (rep * 1000 + i) as u64 + 7), args.gen_tokens);
                req.stop_ids = Some(Vec::new()); // generate exactly gen_tokens
                let p = if i < penalty_streams { &penalized } else { &params };
                req.params = SamplingParams { seed: Some(i as u64), ..p.clone() };
                engine.submit(req)
            })
            .collect::<Result<_, _>>()?;
        // Each stream's (seconds since t0, tokens) arrivals.
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                let counts = counts.clone();
                std::thread::spawn(move || {
                    let got = token_arrivals(h, t0, &counts[i]);
                    counts[i].store(usize::MAX, Ordering::Relaxed);
                    got
                })
            })
            .collect();
        // The arrivals: submitted together once every stream has decoded ARRIVE_AFTER tokens.
        let mut arrived = None;
        if args.arrivals > 0 {
            let after = ARRIVE_AFTER.min(args.gen_tokens);
            while counts.iter().any(|c| c.load(Ordering::Relaxed) < after) {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            let at = t0.elapsed().as_secs_f64();
            let handles: Vec<_> = (0..args.arrivals)
                .map(|i| {
                    let mut req = GenRequest::new(prompt_ids(args.prompt_tokens, vocab, (rep * 1000 + 500 + i) as u64 + 7), 1);
                    req.stop_ids = Some(Vec::new());
                    engine.submit(req)
                })
                .collect::<Result<_, _>>()?;
            let waits: Vec<_> = handles.into_iter().map(|h| std::thread::spawn(move || token_arrivals(h, t0, &AtomicUsize::new(0)))).collect();
            let mut firsts = Vec::new();
            for w in waits {
                let a = w.join().map_err(|_| anyhow::anyhow!("arrival thread panicked"))??;
                firsts.push(a.first().map(|x| x.0).ok_or_else(|| anyhow::anyhow!("an arrival ended without a token"))?);
            }
            arrived = Some((at, firsts));
        }
        let mut streams = Vec::new();
        for t in threads {
            streams.push(t.join().map_err(|_| anyhow::anyhow!("stream thread panicked"))??);
        }
        if let Some((at, firsts)) = arrived {
            let until = firsts.iter().cloned().fold(at, f64::max);
            let (quiet, busy) = gaps_around(&streams, at, until);
            arrival_runs.push(ArrivalsRun { ttft: firsts.iter().map(|t| t - at).collect(), quiet, busy });
        }
        results.push(StreamsRun::from_arrivals(&streams, t0.elapsed().as_secs_f64()));
    }
    let decode = median(results.iter().map(|r| r.decode_tps).collect());
    let ttft_p50 = median(results.iter().map(|r| r.ttft_p50).collect());
    let full: Vec<f64> = results.iter().filter_map(|r| r.full_width_tps).collect();
    let full_width = (!full.is_empty()).then(|| median(full));
    // Where a decode step's time went (every rep): in the home's step, and on the host around it.
    let c = engine.counters();
    let steps = c.decode_steps.load(Ordering::Relaxed).max(1) as f64;
    let ms = |us: &std::sync::atomic::AtomicU64| us.load(Ordering::Relaxed) as f64 / 1000.0 / steps;
    let step_ms = json!({ "home": ms(&c.decode_home_microseconds), "host": ms(&c.decode_host_microseconds), "steps": steps });
    // --arrivals: the median over runs of each run's figure (milliseconds, seconds).
    let over_runs = |f: &dyn Fn(&ArrivalsRun) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = arrival_runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    let arrivals = (args.arrivals > 0).then(|| {
        json!({
            "prompts": args.arrivals,
            "itl_p50_ms_quiet": over_runs(&|r| percentile(r.quiet.clone(), 0.5).map(|s| 1e3 * s)),
            "itl_p99_ms_quiet": over_runs(&|r| percentile(r.quiet.clone(), 0.99).map(|s| 1e3 * s)),
            "itl_p50_ms_arrivals": over_runs(&|r| percentile(r.busy.clone(), 0.5).map(|s| 1e3 * s)),
            "itl_p99_ms_arrivals": over_runs(&|r| percentile(r.busy.clone(), 0.99).map(|s| 1e3 * s)),
            "gaps_quiet": over_runs(&|r| Some(r.quiet.len() as f64)),
            "gaps_arrivals": over_runs(&|r| Some(r.busy.len() as f64)),
            "ttft_p50_s": over_runs(&|r| percentile(r.ttft.clone(), 0.5)),
            "ttft_max_s": over_runs(&|r| percentile(r.ttft.clone(), 1.0)),
        })
    });
    let out = json!({
        "home": kind,
        "streams": args.streams,
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "decode_tps": decode,
        "ttft_p50_s": ttft_p50,
        "full_width_decode_tps": full_width,
        "ttft_max_s": median(results.iter().map(|r| r.ttft_max).collect()),
        "wall_s": median(results.iter().map(|r| r.wall).collect()),
        "max_segments": args.max_segments,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "repeat_penalty": args.repeat_penalty,
        "penalty_streams": if args.repeat_penalty != 1.0 { penalty_streams } else { 0 },
        "counters": counters_json(engine.counters()),
        "decode_step_ms": step_ms,
        "arrivals": arrivals,
    });
    // The home is dropped on the engine thread before the process exits.
    engine.shutdown();
    print_result(
        &args.format,
        &out,
        &(format!(
            "{} streams on {kind}: aggregate decode {decode:.1} t/s ({}), median TTFT {ttft_p50:.3} s; a decode step {:.2} ms in the home + {:.2} ms on the host",
            args.streams,
            match full_width {
                Some(f) => format!("{f:.1} t/s while all {} decode", args.streams),
                None => format!("never all {} decoding at once", args.streams),
            },
            step_ms["home"].as_f64().unwrap_or(0.0),
            step_ms["host"].as_f64().unwrap_or(0.0),
        ) + &arrivals.as_ref().map_or(String::new(), |a| {
            let ms = |k: &str| a[k].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
            let s = |k: &str| a[k].as_f64().map_or("-".to_string(), |v| format!("{v:.3}"));
            format!(
                "\n{} prompts of {} arriving while they decode: the decoding streams' inter-token latency p50 / p99 {} / {} ms before, {} / {} ms while they are prefilled; their time to first token median {} s, last {} s",
                args.arrivals,
                args.prompt_tokens,
                ms("itl_p50_ms_quiet"),
                ms("itl_p99_ms_quiet"),
                ms("itl_p50_ms_arrivals"),
                ms("itl_p99_ms_arrivals"),
                s("ttft_p50_s"),
                s("ttft_max_s"),
            )
        })),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{gaps_around, lockstep_run, percentile, row_weight_bytes, StreamsRun};
    use resin_core::{Counters, Home, HomeSpec, KvCodec, Logits, Result, Row, Segment};
    use std::sync::Arc;

    /// A home whose next token is (token + pos + 3 region) mod 16, one-hot logits; it records
    /// what it was asked.
    struct Echo {
        spec: HomeSpec,
        counters: Arc<Counters>,
        prefills: Vec<Vec<(u32, u32, usize)>>,
        steps: Vec<Vec<(u32, u32, u32)>>,
    }
    fn one_hot(next: &[u32]) -> Logits {
        let mut data = vec![0.0; 16 * next.len()];
        for (i, &t) in next.iter().enumerate() {
            data[i * 16 + t as usize] = 1.0;
        }
        Logits { vocab: 16, data }
    }
    fn next(region: u32, token: u32, pos: u32) -> u32 {
        (token + pos + 3 * region) % 16
    }
    impl Home for Echo {
        fn spec(&self) -> &HomeSpec {
            &self.spec
        }
        fn prefill(&mut self, segments: &[Segment<'_>]) -> Result<Logits> {
            self.prefills.push(segments.iter().map(|s| (s.region.0, s.start, s.tokens.len())).collect());
            Ok(one_hot(&segments.iter().map(|s| next(s.region.0, *s.tokens.last().unwrap(), s.start + s.tokens.len() as u32 - 1)).collect::<Vec<_>>()))
        }
        fn step(&mut self, rows: &[Row], needs: &[resin_core::Need]) -> Result<resin_core::StepOut> {
            self.steps.push(rows.iter().map(|r| (r.region.0, r.token, r.pos)).collect());
            let l = one_hot(&rows.iter().map(|r| next(r.region.0, r.token, r.pos)).collect::<Vec<_>>());
            Ok(resin_core::StepOut { rows: needs.iter().enumerate().map(|(i, &n)| resin_core::RowOut::from_logits(n, l.row(i))).collect() })
        }
        fn counters(&self) -> &Arc<Counters> {
            &self.counters
        }
        fn save_region(&mut self, _: resin_core::RegionId, _: usize) -> Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn load_region(&mut self, _: resin_core::RegionId, _: usize, _: &[u8]) -> Result<()> {
            Ok(())
        }
    }

    /// Lockstep: every prompt in one prefill call (stream i in region i), then each step one
    /// row a stream at its next position, fed its previous greedy id: the ids each stream
    /// would generate alone.
    #[test]
    fn lockstep_steps_every_stream_together_at_its_own_position() {
        let spec = HomeSpec { kind: "echo", vocab: 16, n_ctx: 64, regions: 3, codec: KvCodec::F16, step_rows_max: 8, chunk_rows_min: 1 };
        let mut home = Echo { spec, counters: Arc::new(Counters::default()), prefills: Vec::new(), steps: Vec::new() };
        let prompts = vec![vec![1, 2, 3], vec![4, 5, 6, 7, 8], vec![9]];
        let run = lockstep_run(&mut home, &prompts, 4).unwrap();
        assert_eq!(home.prefills, vec![vec![(0, 0, 3), (1, 0, 5), (2, 0, 1)]]);
        assert_eq!(home.steps.len(), 4);
        for (i, p) in prompts.iter().enumerate() {
            let r = i as u32;
            let mut want = vec![next(r, *p.last().unwrap(), p.len() as u32 - 1)];
            for k in 0..4 {
                let pos = (p.len() + k) as u32;
                assert_eq!(home.steps[k][i], (r, want[k], pos), "stream {i} step {k}");
                want.push(next(r, want[k], pos));
            }
            assert_eq!(run.ids[i], want, "stream {i}");
        }
        assert_eq!(run.step_secs.len(), 4);
        assert!(run.decode_tps > 0.0 && run.prefill_tps > 0.0);
    }

    /// Two streams: A's first token at 1 s, then one a second to 10 s; B's first at 5 s, then
    /// one a second to 14 s. After the last first token (5 s): A's 5 (6..10) and B's 9
    /// (6..14) over 9 s; while both decode (5 s to A's last at 10 s): 10 tokens over 5 s.
    /// A's tokens before 5 s are left out (the old figure counted them: 18 / 9 s).
    #[test]
    fn streams_rates_leave_out_what_decoded_while_others_prefilled() {
        let a: Vec<(f64, usize)> = (1..=10).map(|t| (t as f64, 1)).collect();
        let b: Vec<(f64, usize)> = (5..=14).map(|t| (t as f64, 1)).collect();
        let r = StreamsRun::from_arrivals(&[a.clone(), b.clone()], 14.5);
        assert_eq!(r.decode_tps, 14.0 / 9.0);
        assert_eq!(r.full_width_tps, Some(10.0 / 5.0));
        assert_eq!((r.ttft_p50, r.ttft_max), (5.0, 5.0));
        // A finishing before B starts: never both decoding at once.
        let early: Vec<(f64, usize)> = (1..=4).map(|t| (t as f64, 1)).collect();
        let r = StreamsRun::from_arrivals(&[early, b], 14.5);
        assert_eq!(r.full_width_tps, None);
        assert_eq!(r.decode_tps, 9.0 / 9.0);
    }

    /// Nearest-rank quantiles: p50 of 1..=10 is 5, p99 and p100 are 10, p0 the least.
    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=10).rev().map(|x| x as f64).collect();
        assert_eq!(percentile(v.clone(), 0.5), Some(5.0));
        assert_eq!(percentile(v.clone(), 0.99), Some(10.0));
        assert_eq!(percentile(v.clone(), 1.0), Some(10.0));
        assert_eq!(percentile(v, 0.0), Some(1.0));
        assert_eq!(percentile(Vec::new(), 0.5), None);
    }

    /// Stream A decodes a token every 1 s from 1 s, B every 1 s from 2.5 s; the arrivals come
    /// at 5 s and are done at 8 s, A's gap 5 -> 7 holding their stall. Quiet gaps are those
    /// ending by 5 s that start once both decode (from 2.5 s): A's 3 -> 4 and 4 -> 5, B's
    /// 2.5 -> 3.5 and 3.5 -> 4.5; A's 2 -> 3 began before B's first token and is left out.
    #[test]
    fn gaps_part_at_the_arrivals() {
        let a = vec![(1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1), (5.0, 1), (7.0, 1), (8.0, 1), (9.0, 1)];
        let b = vec![(2.5, 1), (3.5, 1), (4.5, 1), (7.5, 1), (8.5, 1)];
        let (quiet, busy) = gaps_around(&[a, b], 5.0, 8.0);
        assert_eq!(quiet, vec![1.0, 1.0, 1.0, 1.0]);
        assert_eq!(busy, vec![2.0, 1.0, 3.0]);
        assert_eq!(percentile(busy, 0.99), Some(3.0));
    }

    /// A routed row reads its experts' share of each stack and one embedding row (its output
    /// matrix its own); a tied model reads its embedding whole (it is the classifier).
    #[test]
    fn a_row_reads_its_experts_share() {
        use resin::synth::{synth, SynthShape, SynthType, SynthVocab};
        let d = std::env::temp_dir().join(format!("resin-rowbytes-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for (shape, tied) in [(SynthShape::Qwen3MoeTiny, false), (SynthShape::MixtralTiny, true)] {
            let path = d.join(format!("{shape}.gguf"));
            synth(shape, SynthType::Q8_0, SynthVocab::ByteLevel, &path, 1, false).unwrap();
            let f = resin_gguf::GgufFile::open(&path).unwrap();
            let cfg = resin_model::ModelConfig::from_gguf(&f).unwrap();
            assert_eq!(cfg.tied_output, tied);
            let size = |pred: &dyn Fn(&str) -> bool| f.tensors().iter().filter(|t| pred(&t.name)).map(|t| t.size).sum::<u64>();
            let exps = size(&|n| n.ends_with("_exps.weight"));
            let embd = size(&|n| n == resin_model::TOKEN_EMBD);
            let rest = size(&|n| !n.ends_with("_exps.weight") && n != resin_model::TOKEN_EMBD);
            // 2 of 8 experts a row.
            let want = rest + exps / 4 + if tied { embd } else { embd / cfg.vocab as u64 };
            assert!(exps > 0 && embd > 0);
            assert_eq!(row_weight_bytes(&f, &cfg), want, "{shape}");
        }
        std::fs::remove_dir_all(&d).ok();
    }
}
