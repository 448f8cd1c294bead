//! Host-cached sessions: when a parked session's region is reused for another, its K/V rows
//! are copied to host memory (bounded, least recently used out first); a later turn whose
//! prompt extends such a history takes a region, gets the rows back and prefills only the
//! new suffix, as if its region had never been taken.

/// One saved history: its tokens (positions 0..len) and the home's snapshot of their rows.
struct Entry {
    tokens: Vec<u32>,
    snapshot: Vec<u8>,
    last_used: u64,
}

pub struct HostCache {
    entries: Vec<Entry>,
    bytes: usize,
    cap: usize,
    clock: u64,
}

impl HostCache {
    /// A cache of at most `cap` bytes of snapshots (0: nothing is kept).
    pub fn new(cap: usize) -> Self {
        HostCache { entries: Vec::new(), bytes: 0, cap, clock: 0 }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    /// Keep a history, dropping the least recently used ones past the cap. A snapshot larger
    /// than the whole cap is not kept. Returns whether it was kept.
    pub fn insert(&mut self, tokens: Vec<u32>, snapshot: Vec<u8>) -> bool {
        if snapshot.len() > self.cap || tokens.is_empty() {
            return false;
        }
        // A history another entry already extends (or equals) adds nothing.
        if self.entries.iter().any(|e| e.tokens.len() >= tokens.len() && e.tokens[..tokens.len()] == tokens[..]) {
            return false;
        }
        // Entries this one extends are superseded.
        self.entries.retain(|e| !(e.tokens.len() <= tokens.len() && tokens[..e.tokens.len()] == e.tokens[..]));
        self.bytes = self.entries.iter().map(|e| e.snapshot.len()).sum();
        while self.bytes + snapshot.len() > self.cap {
            let Some(lru) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) else { break };
            self.bytes -= self.entries.swap_remove(lru).snapshot.len();
        }
        self.clock += 1;
        self.bytes += snapshot.len();
        self.entries.push(Entry { tokens, snapshot, last_used: self.clock });
        true
    }

    /// The entry sharing the longest prefix with `prompt` (at most `prompt.len() - 1` tokens, so
    /// one token is left to prefill): (index, rows to restore).
    pub fn best(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let cap = prompt.len().saturating_sub(1);
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(cap)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].last_used))
    }

    /// Take entry `i` out (its rows go back into a region).
    pub fn take(&mut self, i: usize) -> (Vec<u32>, Vec<u8>) {
        let e = self.entries.swap_remove(i);
        self.bytes -= e.snapshot.len();
        (e.tokens, e.snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins_and_one_token_is_left() {
        let mut c = HostCache::new(1000);
        assert!(c.insert(vec![1, 2, 3], vec![0; 30]));
        assert!(c.insert(vec![7, 8], vec![0; 20]));
        assert_eq!(c.best(&[1, 2, 3, 4]), Some((0, 3)));
        assert_eq!(c.best(&[1, 2, 3]), Some((0, 2)), "the last prompt token is prefilled");
        assert_eq!(c.best(&[9]), None);
        let (t, s) = c.take(0);
        assert_eq!((t, s.len(), c.bytes(), c.len()), (vec![1, 2, 3], 30, 20, 1));
    }

    #[test]
    fn the_cap_drops_least_recently_used_and_extensions_supersede() {
        let mut c = HostCache::new(100);
        assert!(c.insert(vec![1], vec![0; 40]));
        assert!(c.insert(vec![2], vec![0; 40]));
        assert!(c.insert(vec![3], vec![0; 40]), "evicts [1]");
        assert_eq!(c.best(&[1, 5]), None);
        assert_eq!(c.bytes(), 80);
        assert!(!c.insert(vec![4], vec![0; 101]), "larger than the cap");
        assert!(c.insert(vec![2, 9], vec![0; 50]), "supersedes [2]");
        assert_eq!(c.len(), 2);
        assert!(!c.insert(vec![2], vec![0; 10]), "a prefix of a kept history adds nothing");
        assert!(!HostCache::new(0).enabled());
    }
}
