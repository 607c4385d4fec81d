//! Sorting rows of interned values, where evaluation spends much of its time.
//!
//! Start at `sort_rows`. Interned ids are small (dense from 0), so a least-significant-digit
//! radix sort over the columns in use beats comparison sorting on large inputs: a few passes
//! of 11-bit digits instead of `log2 n` comparisons per row. Small or already sorted inputs,
//! and inputs whose ids need too many passes, fall back to the standard library's sort.

/// Digit width of one radix pass.
const DIGIT: u32 = 11;
/// Below this many rows the comparison sort wins.
const SMALL: usize = 1024;

/// Sorts `v` by `row(t)` lexicographically (the order of `T`'s `Ord`, which must compare
/// `row` and nothing else).
pub fn sort_rows<T: Copy + Ord, const W: usize>(v: &mut Vec<T>, row: impl Fn(&T) -> &[u32; W]) {
    if v.len() < SMALL {
        v.sort_unstable();
        return;
    }
    if v.is_sorted() {
        return;
    }
    // An upper bound of each column's values (their bits OR-ed): columns always 0 need no pass.
    let mut bits = [0u32; W];
    for t in v.iter() {
        for (b, x) in bits.iter_mut().zip(row(t)) {
            *b |= x;
        }
    }
    let passes: u32 = bits.iter().map(|b| (32 - b.leading_zeros()).div_ceil(DIGIT)).sum();
    if passes > v.len().ilog2() / 2 {
        v.sort_unstable();
        return;
    }
    let mut from = std::mem::take(v);
    let mut to = from.clone();
    let mut counts = vec![0usize; 1 << DIGIT];
    let mask = (1u32 << DIGIT) - 1;
    for col in (0..W).rev() {
        let width = 32 - bits[col].leading_zeros();
        let mut shift = 0;
        while shift < width {
            counts.fill(0);
            for t in &from {
                counts[((row(t)[col] >> shift) & mask) as usize] += 1;
            }
            // One digit value for every row: this pass would not move anything.
            if !counts.contains(&from.len()) {
                let mut start = 0;
                for c in counts.iter_mut() {
                    let n = *c;
                    *c = start;
                    start += n;
                }
                for t in &from {
                    let d = ((row(t)[col] >> shift) & mask) as usize;
                    to[counts[d]] = *t;
                    counts[d] += 1;
                }
                std::mem::swap(&mut from, &mut to);
            }
            shift += DIGIT;
        }
    }
    *v = from;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn radix_and_comparison_sorts_agree() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (n, range) in [(5_000, 3u64), (20_000, 70_000), (3_000, 1 << 31), (2_000, 1)] {
            let mut v: Vec<[u32; 4]> =
                (0..n).map(|_| [0, 1, 2, 3].map(|c| if c == 3 { 0 } else { (next() % range) as u32 })).collect();
            let mut want = v.clone();
            want.sort();
            sort_rows(&mut v, |r| r);
            assert_eq!(v, want, "n={n} range={range}");
        }
    }
}
