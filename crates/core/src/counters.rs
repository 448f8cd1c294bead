use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Engine and home counters (exported on /metrics and by `resin bench`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Token commands of 2..=NROW_MAX rows (each group of a grouped step counts).
    pub nrow_steps: AtomicU64,
    /// Steps of more than NROW_MAX rows run as balanced groups of N-row token commands: the
    /// engine's groups one after another, or the Vulkan home's lanes at once.
    pub grouped_steps: AtomicU64,
    /// Steps of more than NROW_MAX rows in one pass (the CPU home's wide step, the Vulkan
    /// home's GEMM pass).
    pub wide_steps: AtomicU64,
    pub prefill_windows: AtomicU64,
    pub prefill_segment_windows: AtomicU64,
    pub peel_steps: AtomicU64,
    /// Steps whose decoding rows and waiting prompts' chunks ran in one pass over the weights
    /// (`Home::step_and_prefill`, where the home runs it as one pass).
    pub mixed_steps: AtomicU64,
    /// Prefill rows that skipped the last layer's attention output, FFN and classifier (a
    /// window's rows that land no logits: last-layer narrowing), counted where a pass narrows.
    pub prefill_rows_narrowed: AtomicU64,
    /// Key pieces a row and head of the decode attention was split into, summed over the
    /// token passes run (the Vulkan home's; the split follows the rows a pass holds).
    pub decode_attention_pieces: AtomicU64,
    pub prompt_tokens_prefilled: AtomicU64,
    pub decode_rows: AtomicU64,
    /// The engine's decode steps (a home call each: every group of a grouped step counts),
    /// and their time: in the home's step (the device's work and the read-back), and on the
    /// host around it (rows, the draws of sampled streams, stop checks, detokenizing, sending).
    /// Where a step's time goes, so a slow sampled stream shows its host share.
    pub decode_steps: AtomicU64,
    /// Decode steps whose rows came back as argmax ids alone (every stream plain greedy), and
    /// steps with top candidates (any stream with a top_k up to TOP_CANDIDATES and no
    /// penalties; the others' argmax ids or whole rows with them): see `Need`.
    pub decode_argmax_steps: AtomicU64,
    pub decode_top_steps: AtomicU64,
    /// Decode rows whose whole logits row came back (`Need::Logits`: penalties, a constraint,
    /// a larger or no top_k).
    pub decode_logits_rows: AtomicU64,
    pub decode_home_microseconds: AtomicU64,
    pub decode_host_microseconds: AtomicU64,
    /// Parked sessions whose K/V rows were copied to host memory when their region was reused.
    pub sessions_saved_to_host: AtomicU64,
    /// Sessions whose K/V rows came back from host memory instead of being prefilled again.
    pub sessions_restored_from_host: AtomicU64,
    declines: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Count a step of `rows` rows: an N-row step when 2..=NROW_MAX, a wide step above.
    pub fn count_step(&self, rows: usize) {
        Counters::add(&self.decode_rows, rows as u64);
        if rows > crate::NROW_MAX {
            Counters::add(&self.wide_steps, 1);
        } else if rows > 1 {
            Counters::add(&self.nrow_steps, 1);
        }
    }

    /// Count a decline; returns true the first time this reason is seen (log it then, once).
    pub fn decline(&self, reason: &str) -> bool {
        let mut d = self.declines.lock().unwrap_or_else(|e| e.into_inner());
        let n = d.entry(reason.to_string()).or_insert(0);
        *n += 1;
        *n == 1
    }

    pub fn declines(&self) -> BTreeMap<String, u64> {
        self.declines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// (name, value) pairs of the plain counters, in a stable order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("nrow_steps", g(&self.nrow_steps)),
            ("grouped_steps", g(&self.grouped_steps)),
            ("wide_steps", g(&self.wide_steps)),
            ("prefill_windows", g(&self.prefill_windows)),
            ("prefill_segment_windows", g(&self.prefill_segment_windows)),
            ("peel_steps", g(&self.peel_steps)),
            ("mixed_steps", g(&self.mixed_steps)),
            ("prefill_rows_narrowed", g(&self.prefill_rows_narrowed)),
            ("decode_attention_pieces", g(&self.decode_attention_pieces)),
            ("prompt_tokens_prefilled", g(&self.prompt_tokens_prefilled)),
            ("decode_rows", g(&self.decode_rows)),
            ("decode_steps", g(&self.decode_steps)),
            ("decode_argmax_steps", g(&self.decode_argmax_steps)),
            ("decode_top_steps", g(&self.decode_top_steps)),
            ("decode_logits_rows", g(&self.decode_logits_rows)),
            ("decode_home_microseconds", g(&self.decode_home_microseconds)),
            ("decode_host_microseconds", g(&self.decode_host_microseconds)),
            ("sessions_saved_to_host", g(&self.sessions_saved_to_host)),
            ("sessions_restored_from_host", g(&self.sessions_restored_from_host)),
        ]
    }
}
