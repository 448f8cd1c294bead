//! The engine: sessions over regions of a home's K/V mirror, the scheduler tick, sampling,
//! stop conditions, prefix reuse and streaming. It drives any [`resin_core::Home`].

mod engine;
mod error;
mod host_cache;
mod sampling;
mod stop;

pub use engine::{
    auto_quantum, Engine, EngineConfig, EngineStats, Finish, FinishReason, GenEvent, GenHandle, GenRequest, LogitsConstraint, PrefillQuantum, ShutdownOnDrop, SubmitError,
    TokenLogprob, PREFILL_QUANTUM_MIN, PREFILL_TICK_TARGET,
};
pub use host_cache::HostCache;
pub use resin_core::balanced_groups;
pub use sampling::{argmax, Rng, Sampler, SamplingParams};
pub use stop::{partial_tail, StopMatcher, StopOutcome};
