//! Helpers shared by the engine's test binaries (conformance.rs, scheduler.rs): greedy requests
//! of a fixed length and a stream read to its end.

use resin_engine::{Finish, GenEvent, GenHandle, GenRequest};

/// Greedy, exactly `n` tokens (no stop ids), so every run has the same length.
pub fn request(prompt: Vec<u32>, n: usize) -> GenRequest {
    let mut r = GenRequest::new(prompt, n);
    r.stop_ids = Some(Vec::new());
    r
}

/// A stream's tokens and how it finished.
pub fn collect(mut h: GenHandle) -> (Vec<u32>, Finish) {
    let mut ids = Vec::new();
    while let Some(ev) = h.blocking_next() {
        match ev {
            GenEvent::Delta { ids: new, .. } => ids.extend(new),
            GenEvent::Done(f) => return (ids, f),
            GenEvent::Error(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without Done");
}
