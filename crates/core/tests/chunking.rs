//! `chunk_rows`: how the engine cuts a prompt into prefill chunks under a budget so that every
//! row takes the arithmetic of the prompt's own window chain on a home whose short windows
//! take other kernels (the Vulkan home: under 16 rows).

use resin_core::{chunk_rows, PF_WINDOW};

/// The chunks a prompt of `len` rows (prefill starting at `start`) is cut into with `room` rows
/// a quantum, as the engine's loop takes them (the first chunk of a quantum gets at least
/// `2 * min_rows` of room).
fn chunks(len: usize, start: usize, room: usize, min_rows: usize, cut: impl Fn(usize, usize, usize, usize, usize) -> usize) -> Vec<usize> {
    let (mut fed, mut out) = (start, Vec::new());
    while fed < len {
        let least = if min_rows > 1 { 2 * min_rows } else { 1 };
        let take = cut(len, start, fed, room.max(least), min_rows);
        assert!(take > 0, "len {len} room {room}: no progress at {fed}");
        out.push(take);
        fed += take;
    }
    out
}

/// Whether every row of `cut` lands in a chunk of the kernel class it has in the chain of its
/// own: the chain's last window when under `min_rows` rows is a chunk by itself, every other
/// chunk has at least `min_rows` rows.
fn exact(len: usize, start: usize, cut: &[usize], min_rows: usize) -> bool {
    let last = (len - start - 1) % PF_WINDOW + 1;
    let n = cut.len();
    cut.iter().enumerate().all(|(k, &c)| if last < min_rows && k == n - 1 { c == last } else { c >= min_rows })
}

#[test]
fn chunks_keep_each_row_in_its_own_chains_kernels() {
    for min_rows in [16usize, 9] {
        for len in (1..1400).step_by(7).chain([130, 520, 527, 528, 1024, 1031, 1040]) {
            for start in [0usize, 3, 200] {
                if start >= len {
                    continue;
                }
                for room in [1usize, 10, 16, 20, 32, 100, 128, 512] {
                    let cut = chunks(len, start, room, min_rows, chunk_rows);
                    assert_eq!(cut.iter().sum::<usize>(), len - start);
                    assert!(exact(len, start, &cut, min_rows), "len {len} start {start} room {room}: {cut:?}");
                    // Within the room (the first chunk of a quantum may take twice the least).
                    assert!(cut.iter().all(|&c| c <= room.max(2 * min_rows)), "len {len} room {room}: {cut:?}");
                }
            }
        }
    }
    // The worked cases: 130 rows at 128 a quantum are 114 + 16 (not 128 + 2: the 2 would take
    // the GEMV); 520 are four 128s and the chain's own 8-row last window.
    assert_eq!(chunks(130, 0, 128, 16, chunk_rows), vec![114, 16]);
    assert_eq!(chunks(520, 0, 128, 16, chunk_rows), vec![128, 128, 128, 128, 8]);
    // Control: cutting at the room alone breaks the rule.
    let naive = |len: usize, _: usize, fed: usize, room: usize, _: usize| (len - fed).min(room);
    assert!(!exact(130, 0, &chunks(130, 0, 128, 16, naive), 16));
    assert!(!exact(520, 0, &chunks(520, 0, 100, 16, naive), 16));
}

#[test]
fn a_home_whose_rows_never_depend_on_their_window_cuts_at_the_room() {
    for (len, fed, room) in [(130usize, 0usize, 128usize), (520, 384, 128), (5, 0, 1), (700, 10, 512)] {
        assert_eq!(chunk_rows(len, 0, fed, room, 1), (len - fed).min(room));
    }
    assert_eq!(chunk_rows(10, 0, 10, 5, 16), 0, "nothing left");
}
