//! Why the engine refuses a request.

/// Why `Engine::submit` refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; the context holds {n_ctx} (at least one more is needed to generate)")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("the request queue is full ({0} waiting); retry later")]
    QueueFull(usize),
    #[error("invalid sampling parameters: {0}")]
    BadParams(String),
    #[error("the engine has stopped")]
    Closed,
    /// The home's device failed mid-run; the home stays down until the process restarts.
    #[error("the device failed: {0}")]
    HomeDown(String),
}
