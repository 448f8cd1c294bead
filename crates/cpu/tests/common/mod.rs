//! Helpers shared by the CPU home's model tests.
#![allow(dead_code)]

pub mod f64_pass;

/// Index of the largest logit (the first on ties), as greedy sampling picks it.
pub fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}
