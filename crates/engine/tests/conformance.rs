//! One conformance suite for every home: the scheduler's scenarios, written once, run on the
//! CPU home (`cpu::`) and on the Vulkan home (`vulkan::`, on lavapipe in CI; skipped without
//! a device unless RESIN_REQUIRE_VULKAN=1), with the real SmolLM2-135M cut to its first four
//! blocks: the scenarios test the engine and the homes' machinery, not the model's depth, and
//! the cut runs them at a fraction of lavapipe's time.
//!
//! - parity at N-row widths and above 8 rows: streams at once get the tokens each gets alone;
//! - segments: prompts arriving together share prefill windows, and get the same tokens with
//!   one session a window;
//! - short prompts arriving at once take one prefill call, not a peel each;
//! - the peel: short prompts through the token step give the window chain's tokens;
//! - park/adopt: a second turn prefills only its new suffix and equals a fresh session;
//! - the host cache: a session displaced from its region comes back from host memory;
//! - chunks: a prompt cut under load gives the tokens it gives alone;
//! - continuous batching: prompts arriving while streams decode ride their steps, and every
//!   stream gets the tokens it gets alone;
//! - last-layer narrowing, and the decode attention's split following the rows (counters).
//!
//! Each scenario holds a control that fails when the property it checks is broken.

mod common;
#[path = "conformance/harness.rs"]
mod harness;

use resin_core::{RegionId, Row, Segment, StepAll, NROW_MAX};
use resin_engine::{Engine, EngineConfig, GenEvent, PrefillQuantum};
use resin_vulkan::WideMode;

use common::{collect, request};
use harness::{assert_distinct_starts, get, short_prompts, together, Hooked, Kind, Suite, N_CTX, TOKENS};

/// For each scenario `fn name(&Suite)`, the tests `cpu::name` and `vulkan::name`.
macro_rules! on_every_home {
    ($($scenario:ident),* $(,)?) => {
        mod cpu {
            $(#[test] fn $scenario() { super::run(super::Kind::Cpu, super::$scenario) })*
        }
        mod vulkan {
            $(#[test] fn $scenario() { super::run(super::Kind::Vulkan, super::$scenario) })*
        }
    };
}

on_every_home! {
    five_streams_at_once_equal_each_alone,
    twelve_streams_at_once_equal_each_alone,
    prompts_arriving_together_share_prefill_windows,
    short_prompts_arriving_at_once_take_one_window,
    the_peel_and_the_window_chain_agree,
    a_second_turn_prefills_only_its_suffix,
    a_session_displaced_to_host_memory_comes_back,
    a_prompt_cut_under_load_gives_the_tokens_it_gives_alone,
    prompts_arriving_while_streams_decode_ride_their_steps,
    prefill_narrows_the_last_layer_to_the_rows_with_logits,
    decode_attention_pieces_follow_the_rows,
}

fn run(kind: Kind, scenario: fn(&Suite)) {
    if let Some(s) = Suite::new(kind) {
        let t = std::time::Instant::now();
        scenario(&s);
        eprintln!("{kind:?} home: {:.1} s", t.elapsed().as_secs_f64());
    }
}

/// N-row: five streams at once, their decode steps of 2..=5 rows, each get the tokens they
/// get alone. Controls: the prompts lead to different tokens (so equality means something),
/// and the streams did decode together (fewer steps than rows).
fn five_streams_at_once_equal_each_alone(s: &Suite) {
    let ps = short_prompts(s, 5);
    let alone = s.alone(&ps, TOKENS);
    assert!(alone.iter().any(|a| *a != alone[0]), "control: the prompts lead to different tokens");
    let e = s.engine(ps.len(), EngineConfig::default());
    let got = together(&e, &ps, TOKENS);
    for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
        assert_eq!(g, a, "stream {i} of 5 differs from the same prompt alone");
    }
    let c = e.counters();
    let rows = (ps.len() * (TOKENS - 1)) as u64;
    assert!(get(&c.decode_steps) < rows, "the streams must decode together: {} steps for {rows} rows", get(&c.decode_steps));
    assert!(get(&c.nrow_steps) > 0);
    assert_eq!(get(&c.wide_steps) + get(&c.grouped_steps), 0, "five rows are one token command");
}

/// Above 8 rows: twelve streams at once each get the tokens they get alone, their rows
/// handed to the home in one step (the CPU home's wide pass, the Vulkan home's lanes).
/// Control: a step held more than NROW_MAX rows (a wide or a grouped step). On the CPU home,
/// also capped at NROW_MAX rows a step (a test double: the engine's own balanced calls, 6 + 6,
/// each an N-row step as any home runs them), with the control that the engine grouped its
/// calls and no step was wide.
fn twelve_streams_at_once_equal_each_alone(s: &Suite) {
    let ps = short_prompts(s, 12);
    let alone = s.alone(&ps, TOKENS);
    let caps: &[bool] = if s.kind == Kind::Cpu { &[false, true] } else { &[false] };
    for &capped in caps {
        let home = s.home(ps.len(), N_CTX);
        let home = if capped { Box::new(Hooked::capped(home, NROW_MAX)) } else { home };
        let e = Engine::start(home, s.tok.clone(), EngineConfig::default());
        let got = together(&e, &ps, TOKENS);
        for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert_eq!(g, a, "stream {i} of 12 (capped {capped}) differs from the same prompt alone");
        }
        let c = e.counters();
        let (wide, grouped) = (get(&c.wide_steps), get(&c.grouped_steps));
        if capped {
            assert!(grouped > 0 && wide == 0, "capped at NROW_MAX rows, twelve streams step in the engine's groups ({grouped} grouped, {wide} wide)");
        } else {
            assert!(wide + grouped > 0, "twelve streams must take steps of more than NROW_MAX rows");
        }
    }
}

/// Segments: prompts submitted together share prefill windows (the peel off, so that short
/// prompts take windows) and each gets the tokens it gets alone; with `max_segments` 1 each
/// takes a window of its own, with the same tokens. Controls: the shared windows are counted
/// (at least two of the four prompts arrive in one tick), and with one session a window none
/// is.
fn prompts_arriving_together_share_prefill_windows(s: &Suite) {
    let ps = short_prompts(s, 4);
    let alone = s.alone(&ps, TOKENS);
    for max_segments in [usize::MAX, 1] {
        let e = s.engine(ps.len(), EngineConfig { max_segments, prefill_peel: false, ..EngineConfig::default() });
        let got = together(&e, &ps, TOKENS);
        for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert_eq!(g, a, "stream {i} (max_segments {max_segments}) differs from the same prompt alone");
        }
        let c = e.counters();
        let (windows, shared) = (get(&c.prefill_windows), get(&c.prefill_segment_windows));
        if max_segments == 1 {
            assert_eq!((windows, shared), (ps.len() as u64, 0), "max_segments 1: a window each, none shared");
        } else {
            assert!(shared >= 1 && windows < ps.len() as u64, "prompts arriving together share a window ({windows} windows, {shared} shared)");
        }
    }
}

/// Short prompts arriving at once take one prefill call, not a peel each: twelve prompts of
/// seven tokens (each short enough for the peel, 84 rows together) that arrive while the home
/// is busy go to the home as one prefill of twelve segments, and each gives the tokens it
/// gives alone (there through the peel). The CPU home runs the twelve as one window. The
/// Vulkan home still runs segments under its 16-row windows apart (`exact_groups`: alone they
/// take the token kernels, whose sums differ from the window's GEMM), until one matrix path
/// serves every row count (issue 29). Controls: one prompt alone takes the peel (so the one
/// call is the scheduler's choice for the prompts together), and the twelve were all queued
/// before it (the gate holds the home until they are).
fn short_prompts_arriving_at_once_take_one_window(s: &Suite) {
    let subjects = ["Cats", "Dogs", "Birds", "Trees", "Fish", "Books", "Children", "People", "Students", "Doctors", "Teachers", "Winter"];
    let ps: Vec<Vec<u32>> = subjects.iter().map(|x| s.encode(&format!("{x} are the best friends of every family in town"))[..7].to_vec()).collect();
    assert!(ps.len() * ps[0].len() > NROW_MAX, "together they do not fit one peel");
    let alone = s.alone(&ps, TOKENS);
    assert!(alone.iter().any(|a| *a != alone[0]), "control: the prompts lead to different tokens");
    let one = s.engine(1, EngineConfig::default());
    collect(one.submit(request(ps[0].clone(), 1)).unwrap());
    assert_eq!((get(&one.counters().peel_steps), get(&one.counters().prefill_windows)), (1, 0), "control: one such prompt alone takes the peel");
    drop(one);

    let (home, entered, open, calls) = Hooked::gated(s.home(ps.len() + 1, N_CTX));
    let e = Engine::start(Box::new(home), s.tok.clone(), EngineConfig::default());
    let opener = s.encode("Owls")[..1].to_vec();
    assert!(ps.iter().all(|p| p[0] != opener[0]), "the opener shares no first token with the prompts");
    let first = e.submit(request(opener, 1)).unwrap();
    entered.recv().unwrap();
    let handles: Vec<_> = ps.iter().map(|p| e.submit(request(p.clone(), TOKENS)).unwrap()).collect();
    open.send(()).unwrap();
    collect(first);
    let got: Vec<Vec<u32>> = handles.into_iter().map(|h| collect(h).0).collect();
    for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
        assert_eq!(g, a, "prompt {i} of 12 differs from the same prompt alone");
    }
    let calls = calls.lock().unwrap().clone();
    assert_eq!(&calls[..2], &[("step", 1), ("prefill", 12)], "the opener's peel, then one prefill of the twelve prompts");
    assert!(calls[2..].iter().all(|&(c, _)| c == "step"), "then only decode steps: {calls:?}");
    let c = e.counters();
    assert_eq!(get(&c.peel_steps), 1, "the opener's peel alone");
    if s.kind == Kind::Cpu {
        assert_eq!((get(&c.prefill_windows), get(&c.prefill_segment_windows)), (1, 1), "(windows, shared windows) on the CPU home");
    }
}

/// The peel: a prompt of at most NROW_MAX tokens through the token step gives the tokens of
/// the same prompt through the window chain. Controls: each took its path (peel steps,
/// windows).
fn the_peel_and_the_window_chain_agree(s: &Suite) {
    let prompt = s.encode("Once upon a time");
    assert!(prompt.len() <= NROW_MAX);
    let peel = s.engine(1, EngineConfig::default());
    let (a, _) = collect(peel.submit(request(prompt.clone(), TOKENS)).unwrap());
    let c = peel.counters().clone();
    drop(peel);
    assert_eq!((get(&c.peel_steps), get(&c.prefill_windows)), (1, 0), "the peel: (peel steps, windows)");
    let chain = s.engine(1, EngineConfig { prefill_peel: false, ..EngineConfig::default() });
    let (b, _) = collect(chain.submit(request(prompt, TOKENS)).unwrap());
    let c = chain.counters();
    assert_eq!((get(&c.peel_steps), get(&c.prefill_windows)), (0, 1), "the chain: (peel steps, windows)");
    assert_eq!(a, b, "the peel and the window chain must give the same tokens");
}

/// A conversation: its first prompt, and the text its second turn adds to the transcript.
/// Short, so that every prompt, the second turn's whole transcript among them, takes the peel:
/// a fresh session's rows then take the arithmetic of the turns' rows on every home.
fn conversation(s: &Suite) -> (Vec<u32>, Vec<u32>) {
    let (first, suffix) = (s.encode("Primary colors are"), s.encode(" and secondary"));
    assert!(first.len() + FIRST_TURN + suffix.len() <= NROW_MAX, "the second turn's transcript fits the peel");
    (first, suffix)
}
/// Tokens of a conversation's first turn.
const FIRST_TURN: usize = 3;

/// Park/adopt: a second turn adopts the rows its first turn left in its parked region,
/// prefills only its new suffix, and gives the tokens of a fresh session on the whole
/// transcript. Control: the fresh session adopts nothing (`Suite::alone`).
fn a_second_turn_prefills_only_its_suffix(s: &Suite) {
    let (first, suffix) = conversation(s);
    let e = s.engine(2, EngineConfig::default());
    let (out1, f1) = collect(e.submit(request(first.clone(), FIRST_TURN)).unwrap());
    assert_eq!(f1.reused_tokens, 0);
    let second = [first.as_slice(), &out1, &suffix].concat();
    let c = e.counters().clone();
    let before = get(&c.prompt_tokens_prefilled);
    let (out2, f2) = collect(e.submit(request(second.clone(), TOKENS)).unwrap());
    drop(e);
    // The region holds the first prompt and every generated token but the last (never fed).
    let held = first.len() + out1.len() - 1;
    assert_eq!(f2.reused_tokens, held, "the second turn adopts the parked rows");
    assert_eq!((get(&c.prompt_tokens_prefilled) - before) as usize, second.len() - held, "only the new suffix is prefilled");
    assert_eq!(out2, s.alone(&[second], TOKENS)[0], "an adopted continuation equals a fresh session on the whole transcript");
}

/// The host cache: on one region, a second conversation displaces the first, whose rows go
/// to host memory; the first's next turn gets them back, prefills only its suffix and gives
/// a fresh session's tokens. Control: with no host memory, nothing is saved and the next
/// turn reuses nothing.
fn a_session_displaced_to_host_memory_comes_back(s: &Suite) {
    let (first, suffix) = conversation(s);
    let other = s.encode("Write a haiku");
    assert_ne!(other[0], first[0], "the other conversation must not adopt the first's rows");
    let turns = |e: &Engine, second_tokens: usize| {
        let (out1, _) = collect(e.submit(request(first.clone(), FIRST_TURN)).unwrap());
        collect(e.submit(request(other.clone(), FIRST_TURN)).unwrap());
        let saved = get(&e.counters().sessions_saved_to_host);
        let second = [first.as_slice(), &out1, &suffix].concat();
        let before = get(&e.counters().prompt_tokens_prefilled);
        let (out2, f2) = collect(e.submit(request(second.clone(), second_tokens)).unwrap());
        let prefilled = (get(&e.counters().prompt_tokens_prefilled) - before) as usize;
        (second, out1.len(), saved, out2, f2.reused_tokens, prefilled)
    };
    let e = s.engine(1, EngineConfig::default());
    let (second, out1_len, saved, out2, reused, prefilled) = turns(&e, TOKENS);
    let c = e.counters().clone();
    drop(e);
    assert_eq!(saved, 1, "the parked first conversation was saved to host memory");
    assert_eq!(get(&c.sessions_restored_from_host), 1, "the second turn was restored from host memory");
    let held = first.len() + out1_len - 1;
    assert_eq!(reused, held, "the restored rows are reused");
    assert_eq!(prefilled, second.len() - held, "only the new suffix is prefilled");
    assert_eq!(get(&c.sessions_saved_to_host), 2, "the other conversation's rows were displaced in turn");
    assert_eq!(out2, s.alone(&[second], TOKENS)[0], "a restored session continues exactly as a fresh one on the whole transcript");

    let off = s.engine(1, EngineConfig { host_cache_bytes: 0, ..EngineConfig::default() });
    let (_, _, saved, _, reused, _) = turns(&off, 1);
    assert_eq!((saved, reused, get(&off.counters().sessions_restored_from_host)), (0, 0, 0), "control: no host memory, no restore");
}

/// A long prompt: the lighthouse keeper's story.
fn lighthouse(s: &Suite) -> Vec<u32> {
    s.encode(
        "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a tin of oil, \
        a rag and a small notebook in which he wrote down the colour of the sky, the height of the waves, \
        the ships that passed and the birds that rested on the railing.",
    )
}

/// A prompt cut into prefill chunks under load (a prefill quantum of 16 rows a tick while
/// another stream decodes) gives the tokens it gives alone: 40 rows as windows of 16 and 16
/// and a peel of 8 on the CPU home, windows of 24 and 16 on the Vulkan home (no chunk under
/// its 16-row windows). Controls: alone it is one window, under load more than one chunk.
fn a_prompt_cut_under_load_gives_the_tokens_it_gives_alone(s: &Suite) {
    const ROWS: usize = 40;
    let long = lighthouse(s)[..ROWS].to_vec();
    let short = s.encode("Owls:")[..2].to_vec();
    assert_ne!(short[0], long[0], "no shared first token (no adoption between the two)");
    let config = EngineConfig { prefill_quantum_busy: PrefillQuantum::Rows(16), ..EngineConfig::default() };
    let windows = |e: &Engine| get(&e.counters().prefill_windows);
    // A chunk is a window, or a peel where its rows are few.
    let chunks = |e: &Engine| windows(e) + get(&e.counters().peel_steps);

    let one = s.engine(1, config.clone());
    let (alone, _) = collect(one.submit(request(long.clone(), TOKENS)).unwrap());
    assert_eq!(windows(&one), 1, "alone, the prompt is one window");
    drop(one);

    // A short stream decodes while the long prompt prefills, so each tick's prefill quantum
    // is the busy one and the engine cuts the prompt. It decodes on past the long prompt's
    // end (its handle is dropped then), however fast the home.
    let e = s.engine(2, config);
    let mut busy = e.submit(request(short, N_CTX - 8)).unwrap();
    assert!(matches!(busy.blocking_next(), Some(GenEvent::Delta { .. })), "the short stream must start decoding first");
    let c0 = chunks(&e);
    let (got, _) = collect(e.submit(request(long, TOKENS)).unwrap());
    let cut = chunks(&e) - c0;
    let live = e.stats().active.load(std::sync::atomic::Ordering::Relaxed);
    drop(busy);
    assert_eq!(live, 1, "the short stream must still be decoding when the long prompt is done");
    assert!(cut >= 2, "under load the {ROWS}-row prompt must be prefilled in chunks ({cut})");
    assert_eq!(got, alone, "the prompt cut under load must give the tokens it gives alone");
}

/// Continuous batching: prompts that arrive while streams decode have their chunks carried
/// by the decoding streams' steps (`Home::step_and_prefill`, a 16-row quantum a tick), and a
/// short continuation arriving then rides their token command (its peel's rows after theirs);
/// every stream, decoding or arriving, gets the tokens it gets alone. The CPU home runs each
/// chunked call as one pass (`mixed_steps`). Controls: the prompts lead to different tokens;
/// the engine made such calls (its call log: the chunks' calls, and a step of the two decoding
/// rows and the continuation's), all while the decoding streams were still live.
fn prompts_arriving_while_streams_decode_ride_their_steps(s: &Suite) {
    const DECODE: usize = 32;
    let decoders = short_prompts(s, 2);
    let long = lighthouse(s);
    let arrivals = vec![long[..40].to_vec(), s.encode("Somewhere beyond the northern mountains there lived a family of foxes who kept a library of stolen maps")];
    assert!(arrivals.iter().all(|p| p.len() > NROW_MAX), "the arrivals are too long for the peel");
    assert_distinct_starts(&decoders.iter().chain(&arrivals).collect::<Vec<_>>());
    let (alone_d, alone_a) = (s.alone(&decoders, DECODE), s.alone(&arrivals, TOKENS));
    assert_ne!(alone_a[0], alone_a[1], "control: the arrivals lead to different tokens");
    assert_ne!(alone_d[0], alone_d[1], "control: the decoding prompts lead to different tokens");
    let short = s.encode("Quietly, the owl")[..4].to_vec();
    assert!(decoders.iter().chain(&arrivals).all(|p| p[0] != short[0]), "the continuation shares no first token");
    let alone_short = s.alone(std::slice::from_ref(&short), TOKENS).remove(0);

    let (home, entered, open, calls) = Hooked::gated(s.home(4, N_CTX));
    let config = EngineConfig { prefill_quantum_busy: PrefillQuantum::Rows(16), ..EngineConfig::default() };
    let e = Engine::start(Box::new(home), s.tok.clone(), config);
    let mut hd: Vec<_> = decoders.iter().map(|p| e.submit(request(p.clone(), DECODE)).unwrap()).collect();
    entered.recv().unwrap();
    open.send(()).unwrap();
    // Each decoding stream's first token: from here they decode.
    let firsts: Vec<Vec<u32>> = hd
        .iter_mut()
        .map(|h| match h.blocking_next() {
            Some(GenEvent::Delta { ids, .. }) => ids,
            other => panic!("a decoding stream's first event: {other:?}"),
        })
        .collect();
    let got_a: Vec<Vec<u32>> = arrivals.iter().map(|p| e.submit(request(p.clone(), TOKENS)).unwrap()).collect::<Vec<_>>().into_iter().map(|h| collect(h).0).collect();
    let got_short = collect(e.submit(request(short.clone(), TOKENS)).unwrap()).0;
    let live = e.stats().active.load(std::sync::atomic::Ordering::Relaxed);
    let got_d: Vec<Vec<u32>> = hd.into_iter().zip(firsts).map(|(h, first)| [first, collect(h).0].concat()).collect();
    for (i, (g, a)) in got_a.iter().zip(&alone_a).enumerate() {
        assert_eq!(g, a, "arriving prompt {i} differs from the same prompt alone");
    }
    for (i, (g, a)) in got_d.iter().zip(&alone_d).enumerate() {
        assert_eq!(g, a, "decoding stream {i} differs from the same prompt alone");
    }
    assert_eq!(got_short, alone_short, "the continuation differs from the same prompt alone");
    assert_eq!(live, 2, "the decoding streams must outlive the arrivals");
    let calls = calls.lock().unwrap().clone();
    assert!(calls.contains(&("step", decoders.len() + short.len())), "the continuation's peel must ride the decoding rows' token command: {calls:?}");
    let mixed = calls.iter().filter(|&&(c, _)| c == "step_and_prefill").count() as u64;
    assert!(mixed >= 2, "the arrivals' chunks must ride the decoding steps ({mixed} such calls)");
    if s.kind == Kind::Cpu {
        assert_eq!(get(&e.counters().mixed_steps), mixed, "the CPU home runs each such call as one pass");
    }
}

/// Last-layer narrowing: a window's rows that land no logits skip the last layer's attention
/// output, FFN and classifier. A prompt of P rows in one window narrows exactly P - 1 rows,
/// again on a second prefill (counted a pass, not a recording); two segments in one window
/// narrow all their rows but their two last, in a short window (under 16 rows: on the Vulkan
/// home the token step's kernels) as in a long one (the window's GEMM and tiled attention);
/// a token step narrows none. The control is the count itself: a home that stopped
/// narrowing counts 0 where P - 1 > 0 is asserted.
fn prefill_narrows_the_last_layer_to_the_rows_with_logits(s: &Suite) {
    fn seg(region: u32, tokens: &[u32]) -> Segment<'_> {
        Segment { region: RegionId(region), start: 0, tokens }
    }
    let ids = lighthouse(s);
    let mut home = s.home(3, N_CTX);
    let c = home.counters().clone();
    let narrowed = || get(&c.prefill_rows_narrowed);
    let short = &ids[..6];
    for region in [0, 1] {
        let n0 = narrowed();
        let l = home.prefill(&[seg(region, short)]).unwrap();
        assert_eq!(l.rows(), 1);
        assert_eq!(narrowed() - n0, short.len() as u64 - 1, "a prompt of {} rows in one window narrows all but its last", short.len());
    }
    for (a, b) in [(&ids[..4], &ids[4..7]), (&ids[..16], &ids[16..33])] {
        let (n0, w0, sw0) = (narrowed(), get(&c.prefill_windows), get(&c.prefill_segment_windows));
        let l = home.prefill(&[seg(1, a), seg(2, b)]).unwrap();
        assert_eq!(l.rows(), 2);
        let rows = a.len() + b.len();
        assert_eq!((get(&c.prefill_windows) - w0, get(&c.prefill_segment_windows) - sw0), (1, 1), "segments of {rows} rows share one window");
        assert_eq!(narrowed() - n0, rows as u64 - 2, "two segments in a window of {rows} rows narrow all but their last rows");
    }
    let n0 = narrowed();
    home.step_ids(&[Row { region: RegionId(0), token: short[0], pos: short.len() as u32 }]).unwrap();
    assert_eq!(narrowed(), n0, "a token step lands every row's logits: nothing narrowed");
}

/// The decode attention's split follows the pass's rows: a pass of few rows spreads each
/// row's keys over more pieces than a pass of many (`decode_attention_pieces`, the Vulkan
/// home's: added once a token pass). On a Vulkan home whose wide steps are one pass (GEMM),
/// a 1-row step adds more pieces than a 16-row step, and no fewer than an 8-row step: a
/// piece count fixed instead of following the rows fails. The CPU home has no split: 0.
fn decode_attention_pieces_follow_the_rows(s: &Suite) {
    const ROWS: usize = 16;
    let mut home = s.home_wide(ROWS, 64, WideMode::Gemm);
    let c = home.counters().clone();
    let mut pieces = |rows: usize| {
        let before = get(&c.decode_attention_pieces);
        let step: Vec<Row> = (0..rows).map(|i| Row { region: RegionId(i as u32), token: 100 + i as u32, pos: 0 }).collect();
        assert_eq!(home.step_ids(&step).unwrap().len(), rows);
        get(&c.decode_attention_pieces) - before
    };
    let (one, eight, sixteen) = (pieces(1), pieces(NROW_MAX), pieces(ROWS));
    match s.kind {
        Kind::Cpu => assert_eq!((one, eight, sixteen), (0, 0, 0), "the CPU home's attention is not split"),
        Kind::Vulkan => {
            let slots = resin_vulkan::kernels::ATTN_SLOTS as u64;
            assert!((1..=slots).contains(&one) && (1..=slots).contains(&sixteen), "pieces (1 row, 16 rows) = ({one}, {sixteen}): each 1..={slots}");
            assert!(sixteen < one, "a 16-row pass must split each row into fewer pieces than a 1-row pass ({sixteen} against {one})");
            assert!(sixteen <= eight && eight <= one, "pieces fall as rows grow: 1 row {one}, 8 rows {eight}, 16 rows {sixteen}");
        }
    }
}
