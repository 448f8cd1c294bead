//! How a prefill call becomes a window chain; shared by every home so they cut the same
//! windows, land the same logits rows and count the same way.

use crate::{Counters, Segment};

/// One row of the chain: a token of a segment at its absolute position in its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainRow {
    pub region: u32,
    pub pos: u32,
    pub token: u32,
}

/// One window: rows `start..end` of the chain; `logit_rows` (relative to `start`, ascending)
/// are the segments' last rows that land in it; `segments` how many segments have rows in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub end: usize,
    pub logit_rows: Vec<usize>,
    pub segments: usize,
}

/// The segments flattened into rows, cut into windows of at most `window` rows, each landing
/// at most `max_logit_rows` logits rows (a window is cut early when it would land more).
pub fn plan_chain(segments: &[Segment<'_>], window: usize, max_logit_rows: usize) -> (Vec<ChainRow>, Vec<Window>) {
    let window = window.max(1);
    let max_logit_rows = max_logit_rows.max(1);
    let mut rows = Vec::with_capacity(segments.iter().map(|s| s.tokens.len()).sum());
    let mut ends = Vec::with_capacity(segments.len());
    for s in segments {
        for (i, &t) in s.tokens.iter().enumerate() {
            rows.push(ChainRow { region: s.region.0, pos: s.start + i as u32, token: t });
        }
        if !s.tokens.is_empty() {
            ends.push(rows.len() - 1);
        }
    }
    let mut windows = Vec::new();
    let (mut lo, mut next_end) = (0usize, 0usize);
    while lo < rows.len() {
        let mut hi = (lo + window).min(rows.len());
        // Segment ends inside lo..hi, at most max_logit_rows of them.
        let mut logit_rows = Vec::new();
        let mut e = next_end;
        while e < ends.len() && ends[e] < hi {
            if logit_rows.len() == max_logit_rows {
                hi = ends[e - 1] + 1;
                break;
            }
            logit_rows.push(ends[e] - lo);
            e += 1;
        }
        // Segments with rows here: those ending in the window, plus one running past it.
        let segments_here = (e - next_end) + usize::from(e < ends.len() && hi > lo && (e == 0 || ends[e - 1] + 1 < hi));
        windows.push(Window { start: lo, end: hi, logit_rows, segments: segments_here });
        next_end = e;
        lo = hi;
    }
    (rows, windows)
}

/// Count a window on the shared counters.
pub fn count_window(counters: &Counters, w: &Window) {
    Counters::add(&counters.prefill_windows, 1);
    if w.segments > 1 {
        Counters::add(&counters.prefill_segment_windows, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RegionId;

    fn seg(region: u32, start: u32, tokens: &[u32]) -> Segment<'_> {
        Segment { region: RegionId(region), start, tokens }
    }

    #[test]
    fn one_segment_over_two_windows() {
        let t: Vec<u32> = (0..600).collect();
        let (rows, w) = plan_chain(&[seg(1, 10, &t)], 512, 8);
        assert_eq!(rows.len(), 600);
        assert_eq!(rows[599], ChainRow { region: 1, pos: 609, token: 599 });
        assert_eq!(w, vec![Window { start: 0, end: 512, logit_rows: vec![], segments: 1 }, Window { start: 512, end: 600, logit_rows: vec![87], segments: 1 }]);
    }

    #[test]
    fn segments_share_a_window_and_count_once_each() {
        let (a, b, c) = (vec![1u32; 300], vec![2u32; 300], vec![3u32; 5]);
        let (_, w) = plan_chain(&[seg(0, 0, &a), seg(1, 0, &b), seg(2, 7, &c)], 512, 8);
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].start, w[0].end, w[0].logit_rows.clone(), w[0].segments), (0, 512, vec![299], 2));
        assert_eq!((w[1].start, w[1].end, w[1].logit_rows.clone(), w[1].segments), (512, 605, vec![87, 92], 2));
    }

    #[test]
    fn a_window_is_cut_when_it_would_land_too_many_logits_rows() {
        let t = [5u32; 3];
        let segs: Vec<Segment<'_>> = (0..5).map(|r| seg(r, 0, &t)).collect();
        let (_, w) = plan_chain(&segs, 512, 2);
        let cuts: Vec<(usize, usize, Vec<usize>)> = w.iter().map(|w| (w.start, w.end, w.logit_rows.clone())).collect();
        assert_eq!(cuts, vec![(0, 6, vec![2, 5]), (6, 12, vec![2, 5]), (12, 15, vec![2])]);
        assert!(w.iter().all(|w| w.segments == w.logit_rows.len()));
    }
}
