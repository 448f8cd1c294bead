//! Recording, submitting and reading back: the token commands of each lane by (rows, read-
//! back), the prefill windows, a step's passes on lanes, what comes back.

use resin_core::{count_window, plan_chain, Counters, HomeError, Logits, Need, Row, Segment, NROW_MAX, PF_WINDOW};

use crate::buffers::{Commands, Fence};
use crate::kernels::*;
use crate::pipelines::Descriptors;
use crate::VkError;

use super::*;

/// One recorded token command (N rows) and the descriptor sets it uses.
pub(super) struct TokenCommand {
    pub(super) cmds: Commands,
    pub(super) _desc: Descriptors,
    /// The key pieces a row and head of its decode attention takes (`record_pass`).
    pub(super) pieces: u32,
    /// Its stages, dispatches and barriers.
    pub(super) counts: StepCounts,
}

/// What one pass in flight needs of its own: scratch, the token commands recorded over it and
/// a fence. Lane 0 serves every pass (its scratch holds a window); with `WideMode::Lanes` a
/// wide step's groups run on lanes 0, 1, ... at once, lane i submitting to queue i (modulo the
/// device's queues).
pub(super) struct Lane {
    // Field order is drop order: the commands before the buffers they use.
    /// Token commands by (rows, what comes back to the host, how the rows share regions),
    /// recorded on first use.
    pub(super) commands: std::collections::HashMap<(usize, ReadBack, Regions), TokenCommand>,
    pub(super) fence: Fence,
    pub(super) scratch: Scratch,
}

/// What a token command reads back besides the argmax ids (which every pass computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ReadBack {
    /// The logits rows.
    Logits,
    /// Only the argmax ids.
    Ids,
    /// Each row's TOP_CANDIDATES largest logits (`Recorder::topk`), not the logits.
    Top,
    /// `Top`, and the whole logits rows the lane's `Scratch::rows_list` names (the streams of
    /// a top step whose draws need them).
    TopRows,
    /// The argmax ids and the whole logits rows `Scratch::rows_list` names.
    Rows,
}

impl ReadBack {
    pub(super) const ALL: [ReadBack; 5] = [ReadBack::Ids, ReadBack::Logits, ReadBack::Top, ReadBack::TopRows, ReadBack::Rows];

    /// The least a step must read back for rows that need `needs`.
    pub(super) fn for_needs(needs: &[Need]) -> ReadBack {
        let (top, logits) = (needs.contains(&Need::Top), needs.iter().filter(|&&n| n == Need::Logits).count());
        match (top, logits) {
            (_, l) if l == needs.len() => ReadBack::Logits,
            (false, 0) => ReadBack::Ids,
            (true, 0) => ReadBack::Top,
            (true, _) => ReadBack::TopRows,
            (false, _) => ReadBack::Rows,
        }
    }

    /// Whether the pass selects each row's top candidates.
    pub(super) fn top(self) -> bool {
        matches!(self, ReadBack::Top | ReadBack::TopRows)
    }

    /// Whether the pass copies the listed rows' logits for the host.
    pub(super) fn listed(self) -> bool {
        matches!(self, ReadBack::TopRows | ReadBack::Rows)
    }
}

const _: () = assert!(resin_core::TOP_CANDIDATES == crate::kernels::TOPK_MAX as usize);

const _: () = assert!(crate::kernels::TOPK_MAX <= crate::kernels::TOPK_SLICES);

/// The decline said (once) when segments of one prefill cannot share a window chain exactly.
pub(super) const APART: &str =
    "segments whose rows would take other kernels in a shared window than in windows of their own (under 16 rows: the GEMV or the decode attention) run in windows of their own";

/// Which kernels a window of `n` rows takes, which decide its rows' bits: the GEMV (up to
/// NROW_MAX rows) or the GEMM, then the decode attention (under WINDOW_ATTN_MIN_ROWS rows) or
/// the flash-attention tiles.
pub(super) fn window_kernels(n: usize) -> u8 {
    if n <= NROW_MAX {
        0
    } else if n < WINDOW_ATTN_MIN_ROWS {
        1
    } else {
        2
    }
}

/// The segments of one prefill in chains that give each segment the logits of a chain of its
/// own, bit for bit: one shared chain of every segment whose rows take the same kernels there
/// as alone (`window_kernels` of each row's window); the others apart, those of at most
/// NROW_MAX rows packed into chains of at most NROW_MAX rows (one-window chains that take the
/// GEMV and the decode attention, as each does alone), the rest alone. Indices ascending.
pub(super) fn exact_groups(segments: &[Segment<'_>], out_rows: usize) -> Vec<Vec<usize>> {
    let mut shared: Vec<usize> = (0..segments.len()).collect();
    let mut apart = Vec::new();
    while shared.len() > 1 {
        let segs: Vec<Segment<'_>> = shared.iter().map(|&i| segments[i]).collect();
        let (_, windows) = plan_chain(&segs, PF_WINDOW, out_rows);
        let kernels: Vec<u8> = windows.iter().flat_map(|w| std::iter::repeat_n(window_kernels(w.end - w.start), w.end - w.start)).collect();
        let mut off = 0;
        let mut misfits = Vec::new();
        for (k, sg) in segs.iter().enumerate() {
            let len = sg.tokens.len();
            // Alone, the segment's row i lies in the window of PF_WINDOW rows that holds it.
            let own = |i: usize| window_kernels((len - i / PF_WINDOW * PF_WINDOW).min(PF_WINDOW));
            if (0..len).any(|i| kernels[off + i] != own(i)) {
                misfits.push(k);
            }
            off += len;
        }
        if misfits.is_empty() {
            break;
        }
        for &k in misfits.iter().rev() {
            apart.push(shared.remove(k));
        }
    }
    apart.sort_unstable();
    let mut groups = vec![shared];
    let mut small: (Vec<usize>, usize) = (Vec::new(), 0);
    for i in apart {
        let len = segments[i].tokens.len();
        if len > NROW_MAX {
            groups.push(vec![i]);
            continue;
        }
        if small.1 + len > NROW_MAX {
            groups.push(std::mem::take(&mut small.0));
            small.1 = 0;
        }
        small.0.push(i);
        small.1 += len;
    }
    groups.push(small.0);
    groups.retain(|g| !g.is_empty());
    groups
}

/// A step's rows as the (region, position, token) triples the passes take.
pub(super) fn triples(rows: &[Row]) -> Vec<(u32, u32, u32)> {
    rows.iter().map(|r| (r.region.0, r.pos, r.token)).collect()
}

impl VulkanHome {
    /// Make sure lanes 0..count exist (the ones past the first hold NROW_MAX-row scratch).
    pub(super) fn ensure_lanes(&mut self, count: usize) -> Result<(), VkError> {
        while self.lanes.len() < count {
            let scratch = Scratch::new(&self.gpu, &self.cfg, self.plan.q8_activations, NROW_MAX, NROW_MAX, NROW_MAX)?;
            self.lanes.push(Lane { commands: std::collections::HashMap::new(), fence: Fence::new(&self.gpu)?, scratch });
        }
        Ok(())
    }

    /// Lane `lane`'s token command for `n` rows (1..=NROW_MAX; on lane 0 up to step_rows_max,
    /// above NROW_MAX a GEMM pass), recorded on first use and kept; `back`: what comes back to
    /// the host besides the argmax ids.
    pub(super) fn command(&mut self, lane: usize, n: usize, back: ReadBack, regions: Regions) -> Result<&TokenCommand, VkError> {
        // One row always has a region of its own.
        let key = (n, back, if n == 1 { Regions::Own } else { regions });
        if !self.lanes[lane].commands.contains_key(&key) {
            let c =
                self.record_shape(lane, false, PassShape { n, narrow: None, to_host: back == ReadBack::Logits, top: back.top(), listed: back.listed(), regions: key.2 }, None)?;
            self.lanes[lane].commands.insert(key, c);
        }
        self.lanes[lane].commands.get(&key).ok_or_else(|| VkError::Model("no token command".into()))
    }

    /// Record one pass of `shape` over lane `lane`'s scratch into a command buffer of its own
    /// (`one_time`: submitted once), with a timestamp after every stage when `clock` is given.
    pub(super) fn record_shape(&mut self, lane: usize, one_time: bool, shape: PassShape<'_>, mut clock: Option<&mut StageClock<'_>>) -> Result<TokenCommand, VkError> {
        let cmds = Commands::new(&self.gpu)?;
        let mut desc = Descriptors::new(&self.gpu);
        let mut res = Ok((0, StepCounts::default()));
        cmds.record(one_time, |cmd| {
            if let Some(c) = clock.as_deref_mut() {
                c.ts.reset(cmd);
                c.mark(cmd, "start");
            }
            let mut rec = Recorder::new(&self.gpu, &mut self.pipes, &mut desc, cmd);
            let ctx = PassCtx { cfg: &self.cfg, codec: self.spec.codec, w: &self.weights, s: &self.lanes[lane].scratch, counters: &self.counters };
            res = record_pass(&mut rec, shape, &ctx, clock).map(|p| (p, rec.tally.get()));
        })?;
        let (pieces, counts) = res?;
        Ok(TokenCommand { cmds, _desc: desc, pieces, counts })
    }

    pub(super) fn profile_pass(&mut self, rows: &[(u32, u32, u32)], narrow: Option<&[u32]>) -> Result<Option<Vec<(String, f64)>>, VkError> {
        let Some(ts) = crate::buffers::Timestamps::new(&self.gpu, (16 * self.cfg.n_layer + 16) as u32)? else { return Ok(None) };
        self.write_meta(0, rows)?;
        let mut clock = StageClock { ts: &ts, labels: Vec::new() };
        let c = self.record_shape(0, true, PassShape { n: rows.len(), narrow, to_host: true, top: false, listed: false, regions: Regions::of(rows) }, Some(&mut clock))?;
        self.lanes[0].fence.submit_wait(c.cmds.cmd)?;
        let labels = clock.labels;
        let t = ts.read(labels.len() as u32)?;
        Ok(Some(labels.iter().enumerate().skip(1).map(|(i, l)| (l.clone(), (t[i] - t[i - 1]) / 1e3)).collect()))
    }

    /// Write the metadata block of `rows` (region, position, token) into lane `lane`'s scratch.
    pub(super) fn write_meta(&mut self, lane: usize, rows: &[(u32, u32, u32)]) -> Result<(), VkError> {
        let region_elems = (self.plan.n_ctx * self.cfg.kv_dim()) as u32;
        let meta: Vec<RowMeta> = rows.iter().map(|&(region, pos, token)| RowMeta { token, pos, kv_base: region * region_elems, keys: pos + 1 }).collect();
        self.lanes[lane].scratch.meta.write(0, &RowMeta::words(&meta))
    }

    /// The segments as one window chain (the caller made sure each takes the kernels it takes
    /// in a chain of its own: `exact_groups`), one logits row a segment.
    pub(super) fn prefill_chain(&mut self, segments: &[Segment<'_>]) -> resin_core::Result<Logits> {
        let (chain, windows) = plan_chain(segments, PF_WINDOW, self.plan.out_rows);
        let vocab = self.spec.vocab;
        let mut data = Vec::with_capacity(segments.len() * vocab);
        for w in &windows {
            count_window(&self.counters, w);
            let rows: Vec<(u32, u32, u32)> = chain[w.start..w.end].iter().map(|r| (r.region, r.pos, r.token)).collect();
            let keep: Vec<u32> = w.logit_rows.iter().map(|&i| i as u32).collect();
            data.extend(self.run_window(&rows, &keep).map_err(HomeError::from)?);
        }
        Counters::add(&self.counters.prompt_tokens_prefilled, chain.len() as u64);
        Ok(Logits { vocab, data })
    }

    /// One prefill window (up to PF_WINDOW rows, already checked), recorded for its shape and
    /// submitted; returns the logits of the rows in `keep`.
    pub(super) fn run_window(&mut self, rows: &[(u32, u32, u32)], keep: &[u32]) -> Result<Vec<f32>, VkError> {
        self.write_meta(0, rows)?;
        let c = self.record_shape(0, true, PassShape { n: rows.len(), narrow: Some(keep), to_host: true, top: false, listed: false, regions: Regions::of(rows) }, None)?;
        self.lanes[0].fence.submit_wait(c.cmds.cmd)?;
        if keep.is_empty() {
            return Ok(Vec::new());
        }
        self.lanes[0].scratch.logits_host.read_f32(0, keep.len() * self.cfg.vocab)
    }

    /// Run a step over `rows` (already checked), recording its commands on first use: one
    /// pass on lane 0, or with `WideMode::Lanes` and more than NROW_MAX rows of distinct
    /// regions, balanced groups of N-row token commands on lanes 0, 1, ..., all submitted
    /// before any is waited for. (Rows that share a region take one pass: a row may attend to
    /// keys another row of the step stores.) `listed`: with a read-back that lists rows, the rows
    /// (ascending indices into `rows`) whose whole logits come back, each pass's in its lane's
    /// `rows_list`. Returns (lane, rows) of each pass in row order; its results are in that
    /// lane's scratch.
    pub(super) fn run_step(&mut self, rows: &[(u32, u32, u32)], back: ReadBack, listed: &[usize]) -> Result<Vec<(usize, usize)>, VkError> {
        let regions = Regions::of(rows);
        let groups: Vec<usize> = self.wide.passes(rows.len(), regions == Regions::Own, self.plan.canon_from).into_iter().map(|(_, n)| n).collect();
        self.ensure_lanes(groups.len())?;
        let mut cmds = Vec::with_capacity(groups.len());
        let mut at = 0;
        for (lane, &n) in groups.iter().enumerate() {
            let (cmd, pieces) = self.command(lane, n, back, regions).map(|c| (c.cmds.cmd, c.pieces))?;
            Counters::add(&self.counters.decode_attention_pieces, pieces as u64);
            cmds.push(cmd);
            self.write_meta(lane, &rows[at..at + n])?;
            if back.listed() {
                let list: Vec<u32> = listed.iter().filter(|&&i| (at..at + n).contains(&i)).map(|&i| (i - at) as u32).collect();
                self.lanes[lane].scratch.rows_list.write(0, &crate::kernels::rows_copy_list(&list))?;
            }
            at += n;
        }
        // Wait for every submitted pass even when a later submit fails: nothing a pass uses
        // may be touched while it is in flight.
        let queues = &self.gpu.queues;
        let mut res = Ok(());
        let mut sent = 0;
        for (lane, &cmd) in cmds.iter().enumerate() {
            match self.lanes[lane].fence.submit(queues[lane % queues.len()], cmd) {
                Ok(()) => sent += 1,
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        for lane in &self.lanes[..sent] {
            let waited = lane.fence.wait();
            if res.is_ok() {
                res = waited;
            }
        }
        res.map(|()| groups.into_iter().enumerate().collect())
    }

    /// Count a step by what ran: one pass (a token command, or a wide GEMM pass), or groups of
    /// token commands on lanes (a grouped step, each group an N-row step).
    pub(super) fn count_passes(&self, passes: &[(usize, usize)]) {
        if passes.len() > 1 {
            Counters::add(&self.counters.grouped_steps, 1);
        }
        for &(_, n) in passes {
            self.counters.count_step(n);
        }
    }

    /// Bytes a second a shader copy between two device-local buffers reads and writes (see
    /// `Profile::copy_bandwidth`); None without timestamps.
    pub(super) fn shader_copy_bandwidth(&mut self) -> Result<Option<f64>, VkError> {
        use crate::buffers::{Buffer, Location, Timestamps};
        let bytes: u64 = (if self.gpu.info.kind == "cpu" { 64 } else { 256 }) << 20;
        let words = (bytes / 16) as u32;
        let Some(ts) = Timestamps::new(&self.gpu, 2)? else { return Ok(None) };
        let (src, dst) = (Buffer::new(&self.gpu, bytes, Location::Device)?, Buffer::new(&self.gpu, bytes, Location::Device)?);
        // Enough workgroups to fill any device many times over; each invocation strides on.
        let groups = words.div_ceil(256 * 16).min(65_535);
        let mut best: Option<f64> = None;
        for _ in 0..2 {
            let cmds = Commands::new(&self.gpu)?;
            let mut desc = Descriptors::new(&self.gpu);
            let mut res = Ok(());
            cmds.record(true, |cmd| {
                ts.reset(cmd);
                ts.write(cmd, 0);
                let mut rec = Recorder::new(&self.gpu, &mut self.pipes, &mut desc, cmd);
                res = rec.copy16(words, groups, (&src).into(), (&dst).into());
                ts.write(cmd, 1);
            })?;
            res?;
            self.lanes[0].fence.submit_wait(cmds.cmd)?;
            let t = ts.read(2)?;
            let rate = 2.0 * bytes as f64 / ((t[1] - t[0]).max(1.0) * 1e-9);
            best = Some(best.map_or(rate, |b| b.max(rate)));
        }
        Ok(best)
    }
}
