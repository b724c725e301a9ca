//! A hasher for maps keyed by handles.
//!
//! std's SipHash guards against keys chosen to collide, which handles, numbers handed out from a
//! counter, are not, and on a launch's path it costs more than the rest of a lookup. A
//! multiply-rotate mix (rustc's FxHash) spreads a counter's steps (1 for the server's handles,
//! whose kind sits in the top byte; 16 for the driver library's) over the low bits that pick a
//! bucket and the high bits that tag it. Only for keys the map's owner hands out: a map keyed by
//! values a peer chooses keeps SipHash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher; see the module's documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct HandleHasher(u64);

impl HandleHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0xf135_7aea_2e62_a9c5);
    }
}

impl Hasher for HandleHasher {
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|b| self.add(u64::from(*b)));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// What makes [`HandleHasher`]s for a map.
pub type HandleHashing = BuildHasherDefault<HandleHasher>;

/// A map keyed by handles.
pub type HandleMap<K, V> = HashMap<K, V, HandleHashing>;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// How many of 256 buckets 256 handles `step` apart from `first` fall in.
    fn buckets(first: u64, step: u64) -> usize {
        (0..256)
            .map(|i| {
                let mut h = HandleHasher::default();
                h.write_u64(first + step * i);
                h.finish() % 256
            })
            .collect::<HashSet<u64>>()
            .len()
    }

    #[test]
    fn handles_16_apart_pick_different_buckets() {
        // A map picks a bucket by the hash's low bits; such handles' own low 4 bits are all 0.
        let n = buckets(0x1000, 16);
        assert!(n > 128, "256 handles in {n} buckets");
    }

    #[test]
    fn consecutive_handles_of_one_kind_pick_different_buckets() {
        // The server's handles: the kind in the top byte, a counter below.
        let n = buckets(1 << 56, 1);
        assert!(n > 128, "256 handles in {n} buckets");
    }
}
