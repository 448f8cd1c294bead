pub mod synth;
pub mod inspect;
