//! Which session holds which region of the mirror (engine-side bookkeeping; homes never see it).

use crate::RegionId;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Free,
    /// In use by a live session.
    Pinned,
    /// Rows kept for a conversation's next turn; reclaimable, least recently used first.
    Parked,
}

#[derive(Debug, Clone)]
struct Slot {
    state: State,
    /// Tokens whose K/V rows the region holds, positions 0..tokens.len().
    tokens: Vec<u32>,
    last_used: u64,
}

/// Region allocation with pin / park / adopt and LRU reuse of parked regions.
#[derive(Debug, Clone)]
pub struct RegionTable {
    slots: Vec<Slot>,
    clock: u64,
}

/// A region handed to a session, how many of its rows already match the prompt, and the
/// tokens of the parked history it displaced (empty unless a parked region was reused: the
/// caller may save those rows to host memory before anything overwrites them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub region: RegionId,
    pub reused: usize,
    pub evicted: Vec<u32>,
}

impl RegionTable {
    pub fn new(regions: usize) -> Self {
        RegionTable { slots: vec![Slot { state: State::Free, tokens: Vec::new(), last_used: 0 }; regions], clock: 0 }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn pinned(&self) -> usize {
        self.slots.iter().filter(|s| s.state == State::Pinned).count()
    }

    /// Claim a region for `prompt`: the parked region sharing the longest prefix with it
    /// (adopt), else a free one, else the least recently used parked one. None when all are
    /// pinned (the caller waits; that is not an error).
    ///
    /// At least one prompt token is always left to prefill (its logits are needed), so `reused`
    /// is at most `prompt.len() - 1`.
    pub fn claim(&mut self, prompt: &[u32]) -> Option<Claim> {
        self.claim_with(prompt, true)
    }

    /// The longest prefix of `prompt` a parked region holds (what `claim` would adopt).
    pub fn best_parked(&self, prompt: &[u32]) -> usize {
        let cap = prompt.len().saturating_sub(1);
        self.slots.iter().filter(|s| s.state == State::Parked).map(|s| common_prefix(&s.tokens, prompt).min(cap)).max().unwrap_or(0)
    }

    /// A region without adopting any parked history: a free one, else the least recently used
    /// parked one (reported in `evicted`). For a session restored from host memory.
    pub fn claim_empty(&mut self) -> Option<Claim> {
        self.claim_with(&[], false)
    }

    fn claim_with(&mut self, prompt: &[u32], adopt: bool) -> Option<Claim> {
        self.clock += 1;
        let cap = prompt.len().saturating_sub(1);
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| adopt && s.state == State::Parked)
            .map(|(i, s)| (i, common_prefix(&s.tokens, prompt).min(cap)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.slots[i].last_used));
        let (idx, reused) = match best {
            Some(b) => b,
            None => {
                let free = self.slots.iter().position(|s| s.state == State::Free);
                let idx = free.or_else(|| self.slots.iter().enumerate().filter(|(_, s)| s.state == State::Parked).min_by_key(|(_, s)| s.last_used).map(|(i, _)| i))?;
                (idx, 0)
            }
        };
        let s = &mut self.slots[idx];
        let evicted = if reused == 0 && s.state == State::Parked { std::mem::take(&mut s.tokens) } else { Vec::new() };
        s.state = State::Pinned;
        s.tokens.truncate(reused);
        s.last_used = self.clock;
        Some(Claim { region: RegionId(idx as u32), reused, evicted })
    }

    /// Record that the region now holds K/V rows for `tokens` (positions 0..len).
    pub fn set_tokens(&mut self, r: RegionId, tokens: &[u32]) {
        if let Some(s) = self.slots.get_mut(r.0 as usize) {
            s.tokens.clear();
            s.tokens.extend_from_slice(tokens);
        }
    }

    pub fn push_token(&mut self, r: RegionId, token: u32) {
        if let Some(s) = self.slots.get_mut(r.0 as usize) {
            s.tokens.push(token);
        }
    }

    pub fn tokens(&self, r: RegionId) -> &[u32] {
        self.slots.get(r.0 as usize).map(|s| s.tokens.as_slice()).unwrap_or(&[])
    }

    /// Unpin but keep the rows for a later turn to adopt.
    pub fn park(&mut self, r: RegionId) {
        self.clock += 1;
        if let Some(s) = self.slots.get_mut(r.0 as usize) {
            s.state = State::Parked;
            s.last_used = self.clock;
        }
    }

    /// Unpin and forget the rows.
    pub fn free(&mut self, r: RegionId) {
        if let Some(s) = self.slots.get_mut(r.0 as usize) {
            s.state = State::Free;
            s.tokens.clear();
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adopt_takes_longest_prefix_and_keeps_one_token_to_prefill() {
        let mut t = RegionTable::new(2);
        let a = t.claim(&[1, 2, 3]).unwrap();
        t.set_tokens(a.region, &[1, 2, 3, 4]);
        t.park(a.region);
        let b = t.claim(&[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(b, Claim { region: a.region, reused: 4, evicted: vec![] });
        t.set_tokens(b.region, &[1, 2, 3, 4, 5, 6]);
        t.park(b.region);
        // The same prompt again: every row matches, but the last token must still run.
        let c = t.claim(&[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(c.reused, 5);
        assert_eq!(t.tokens(c.region), &[1, 2, 3, 4, 5]);
    }

    #[test]
    fn all_pinned_means_wait_and_lru_parked_is_evicted() {
        let mut t = RegionTable::new(2);
        let a = t.claim(&[1]).unwrap();
        let b = t.claim(&[2]).unwrap();
        assert_eq!(t.claim(&[3]), None);
        t.set_tokens(a.region, &[1]);
        t.set_tokens(b.region, &[2]);
        t.park(a.region);
        t.park(b.region);
        let c = t.claim(&[9]).unwrap();
        assert_eq!(c, Claim { region: a.region, reused: 0, evicted: vec![1] }, "the LRU parked history is reported");
        assert!(t.tokens(c.region).is_empty());
        t.free(c.region);
        assert_eq!(t.claim(&[8]).unwrap().region, a.region, "free regions go before parked ones");
    }

    #[test]
    fn claim_empty_never_adopts_and_reports_what_it_displaces() {
        let mut t = RegionTable::new(1);
        let a = t.claim(&[1, 2, 3]).unwrap();
        t.set_tokens(a.region, &[1, 2, 3]);
        t.park(a.region);
        assert_eq!(t.best_parked(&[1, 2, 3, 4]), 3);
        let b = t.claim_empty().unwrap();
        assert_eq!(b, Claim { region: a.region, reused: 0, evicted: vec![1, 2, 3] });
        assert_eq!(t.best_parked(&[1, 2, 3, 4]), 0);
        assert_eq!(t.claim_empty(), None, "the only region is pinned");
    }
}
