//! gemma3 on a small synthetic model with f32 weights, against a plain f64 forward pass
//! written here (from common/f64_pass.rs), independently of the home's code: the embedding times sqrt(n_embd), q/k RMS
//! norms, NEOX rope with a base of its own on the sliding-window layers, a window of WINDOW
//! keys on every layer but the pattern's last, post-attention and post-FFN norms, GeGLU (tanh
//! GELU), tied embeddings and final logit soft-capping. The prompt and the decode steps run
//! past the window, so the window shows. Each feature has a control (the reference without
//! it) that must fail the bar the home meets.

mod common;

use std::sync::Arc;

use common::f64_pass::{attend, five_decode_steps, matvec, rel_l2, rms, rms_heads, rope_neox};
use resin_core::{Counters, Home, KvCodec, RegionId, Segment};
use resin_cpu::{CpuHome, CpuOptions};
use resin_gguf::synthetic::{Shape, Weights};
use resin_gguf::{GgufFile, Value};
use resin_model::{Arch, FfnAct, ModelConfig};

const D: usize = 64;
const H: usize = 2;
const HKV: usize = 1;
const HD: usize = 64;
const FF: usize = 96;
/// Three layers in a pattern of three: two sliding-window layers, then a global one.
const L: usize = 3;
const PATTERN: usize = 3;
const WINDOW: usize = 4;
const V: usize = 50;
const EPS: f64 = 1e-6;
const BASE: f64 = 1_000_000.0;
/// Not in the file: gemma3's default for the sliding-window layers.
const BASE_LOCAL: f64 = 10_000.0;
const SOFTCAP: f64 = 4.0;
const SHAPE: Shape = Shape { layers: L, d: D, heads: H, heads_kv: HKV, head_dim: HD, ff: FF };

fn synth() -> Weights {
    let mut w = Weights::new(0x0123_4567_89ab_cdef);
    // Small embeddings, as Gemma's are: the sqrt(n_embd) scale brings them to unit size.
    w.mat("token_embd.weight", V, D, 0.15);
    w.blocks(&SHAPE, &[("attn_norm", D), ("ffn_norm", D), ("post_attention_norm", D), ("post_ffw_norm", D), ("attn_q_norm", HD), ("attn_k_norm", HD)]);
    w
}

fn write(w: &Weights) -> Vec<u8> {
    let mut g = SHAPE.writer("gemma3", 128);
    let u = |v: usize| Value::U32(v as u32);
    g.set("gemma3.rope.freq_base", Value::F32(BASE as f32));
    g.set("gemma3.attention.layer_norm_rms_epsilon", Value::F32(EPS as f32));
    g.set("gemma3.attention.sliding_window", u(WINDOW));
    g.set("gemma3.attention.sliding_window_pattern", u(PATTERN));
    g.set("gemma3.final_logit_softcapping", Value::F32(SOFTCAP as f32));
    w.write(g)
}

/// What the reference leaves out: the real thing has none of these set.
#[derive(Clone, Copy, Default, Debug)]
struct Without {
    window: bool,
    local_base: bool,
    embd_scale: bool,
    post_norms: bool,
    gelu: bool,
    softcap: bool,
}

/// The reference: f64 throughout, one token at a time, keys and values kept in f64.
struct Reference<'a> {
    w: &'a Weights,
    without: Without,
    k: Vec<Vec<Vec<f64>>>,
    v: Vec<Vec<Vec<f64>>>,
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

impl<'a> Reference<'a> {
    fn new(w: &'a Weights, without: Without) -> Self {
        Reference { w, without, k: vec![Vec::new(); L], v: vec![Vec::new(); L] }
    }

    fn step(&mut self, token: u32, pos: usize) -> Vec<f64> {
        let (w, wo) = (self.w, self.without);
        let emb = w.get("token_embd.weight");
        let scale = if wo.embd_scale { 1.0 } else { (D as f32).sqrt() as f64 };
        let mut x: Vec<f64> = emb[token as usize * D..(token as usize + 1) * D].iter().map(|&v| v as f64 * scale).collect();
        for l in 0..L {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let local = l % PATTERN < PATTERN - 1;
            let h = rms(&x, w.get(&n("attn_norm")), EPS);
            let mut q = matvec(w.get(&n("attn_q")), H * HD, D, &h);
            let mut k = matvec(w.get(&n("attn_k")), HKV * HD, D, &h);
            let v = matvec(w.get(&n("attn_v")), HKV * HD, D, &h);
            rms_heads(&mut q, w.get(&n("attn_q_norm")), EPS, HD);
            rms_heads(&mut k, w.get(&n("attn_k_norm")), EPS, HD);
            let base = if local && !wo.local_base { BASE_LOCAL } else { BASE };
            rope_neox(&mut q, pos, base, HD);
            rope_neox(&mut k, pos, base, HD);
            self.k[l].push(k);
            self.v[l].push(v);
            // Keys this row sees: its last WINDOW on a sliding-window layer, else all.
            let first = if local && !wo.window { (pos + 1).saturating_sub(WINDOW) } else { 0 };
            let att = attend(&q, &self.k[l][first..], &self.v[l][first..], H, HKV, HD);
            let mut o = matvec(w.get(&n("attn_output")), D, H * HD, &att);
            if !wo.post_norms {
                o = rms(&o, w.get(&n("post_attention_norm")), EPS);
            }
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms(&x, w.get(&n("ffn_norm")), EPS);
            let gt = matvec(w.get(&n("ffn_gate")), FF, D, &h);
            let up = matvec(w.get(&n("ffn_up")), FF, D, &h);
            let act: Vec<f64> = gt.iter().zip(&up).map(|(&g, u)| if wo.gelu { g / (1.0 + (-g).exp()) } else { gelu_tanh(g) } * u).collect();
            let mut dn = matvec(w.get(&n("ffn_down")), D, FF, &act);
            if !wo.post_norms {
                dn = rms(&dn, w.get(&n("post_ffw_norm")), EPS);
            }
            x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
        }
        let logits = matvec(w.get("token_embd.weight"), V, D, &rms(&x, w.get("output_norm.weight"), EPS));
        if wo.softcap {
            logits
        } else {
            logits.iter().map(|v| SOFTCAP * (v / SOFTCAP).tanh()).collect()
        }
    }
}

/// f32 arithmetic against f64 through three small layers, with an f16 K/V mirror; every
/// control lands far above it (printed by the test).
const BAR: f64 = 2e-3;

#[test]
fn gemma3_matches_an_f64_reference_and_needs_each_of_its_features() {
    let w = synth();
    let file = Arc::new(GgufFile::from_bytes(write(&w)).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(cfg.arch, Arch::Gemma3);
    assert!(cfg.qk_norm && cfg.post_norms && cfg.tied_output && cfg.ffn_act == FfnAct::GeluTanh);
    assert_eq!((0..L).map(|l| cfg.layer_window(l)).collect::<Vec<_>>(), [Some(WINDOW), Some(WINDOW), None]);
    assert_eq!((0..L).map(|l| cfg.layer_rope_base(l)).collect::<Vec<_>>(), [BASE_LOCAL as f32, BASE_LOCAL as f32, BASE as f32]);
    assert_eq!(cfg.logit_softcap, Some(SOFTCAP as f32));
    let mut home = CpuHome::new(file, cfg, &CpuOptions { n_ctx: Some(64), regions: 1, codec: KvCodec::F16, threads: None, progress: None }, Arc::new(Counters::default())).unwrap();

    // Past the window: the prompt alone is longer than it.
    let prompt = [3u32, 17, 42, 8, 25, 11, 30, 2, 49];
    let controls = [
        Without { window: true, ..Without::default() },
        Without { local_base: true, ..Without::default() },
        Without { embd_scale: true, ..Without::default() },
        Without { post_norms: true, ..Without::default() },
        Without { gelu: true, ..Without::default() },
        Without { softcap: true, ..Without::default() },
    ];
    let mut reference = Reference::new(&w, Without::default());
    let mut off: Vec<Reference> = controls.iter().map(|&c| Reference::new(&w, c)).collect();
    let (mut want, mut offs) = (Vec::new(), vec![Vec::new(); controls.len()]);
    for (p, &t) in prompt.iter().enumerate() {
        want = reference.step(t, p);
        for (o, r) in offs.iter_mut().zip(off.iter_mut()) {
            *o = r.step(t, p);
        }
    }
    let got = home.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &prompt }]).unwrap().data;
    let err = rel_l2(&got, &want);
    eprintln!("gemma3 synthetic: prefill logits relative L2 {err:.2e}");
    assert!(err < BAR, "prefill logits: relative L2 {err:.3e} >= {BAR}");
    for (c, o) in controls.iter().zip(&offs) {
        let ctl = rel_l2(&got, o);
        eprintln!("  against the reference {c:?}: {ctl:.2e}");
        assert!(ctl >= BAR, "the control {c:?} passed the bar ({ctl:.3e}): the bar cannot fail");
    }

    // Five decode steps, greedy, against the reference step by step.
    five_decode_steps(&mut home, |t, pos| reference.step(t, pos), &want, prompt.len(), BAR);
}
