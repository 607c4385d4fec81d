//! The one seeded stream the property tests of every crate draw from (each includes this file
//! with `#[path]`): splitmix64, reproducible from its seed.
//!
//! Start at `Seeded::next`.

/// A reproducible stream of numbers (splitmix64) from a seed.
pub struct Seeded(pub u64);

#[allow(dead_code)] // each test file uses what it needs
impl Seeded {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
