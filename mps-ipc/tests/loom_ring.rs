//! Exhaustive check of the ring protocol under loom's model of the C++ memory model.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p mps-ipc --test loom_ring --release`.
//! Loom explores every interleaving of the producer and consumer (and every value a relaxed or
//! acquire load may return), and its `UnsafeCell` reports any slot that is written while it may
//! be read: the proof that publication with Release/Acquire orders slot contents correctly.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use mps_ipc::ring::{Consumer, Producer, RingMemory};
use mps_ipc::sync::AtomicU32;

struct LoomRing {
    tail: AtomicU32,
    head: AtomicU32,
    slots: Vec<UnsafeCell<u64>>,
}

#[derive(Clone)]
struct Shared(Arc<LoomRing>);

// SAFETY: capacity is a power of two and every slot index passed in is below it.
unsafe impl RingMemory<u64> for Shared {
    fn capacity(&self) -> u32 {
        self.0.slots.len() as u32
    }
    fn tail(&self) -> &AtomicU32 {
        &self.0.tail
    }
    fn head(&self) -> &AtomicU32 {
        &self.0.head
    }
    unsafe fn write(&self, index: u32, value: &u64) {
        // SAFETY: loom checks that no read of this slot can be concurrent.
        self.0.slots[index as usize].with_mut(|p| unsafe { *p = *value });
    }
    unsafe fn read(&self, index: u32) -> u64 {
        // SAFETY: loom checks that no write of this slot can be concurrent.
        self.0.slots[index as usize].with(|p| unsafe { *p })
    }
}

fn ring(capacity: usize, start: u32) -> Shared {
    Shared(Arc::new(LoomRing {
        tail: AtomicU32::new(start),
        head: AtomicU32::new(start),
        slots: (0..capacity).map(|_| UnsafeCell::new(0)).collect(),
    }))
}

/// Sends `n` values through a ring of `capacity` slots, in batches of `batch`; the consumer must
/// see them all, in order, once each, with no data race on any slot.
fn transfer(capacity: usize, n: u64, batch: usize, start: u32) {
    loom::model(move || {
        let mem = ring(capacity, start);
        let mut producer = Producer::new(mem.clone());
        let mut consumer = Consumer::new(mem);
        let t = thread::spawn(move || {
            let mut next = 0u64;
            while next < n {
                let k = (batch as u64).min(n - next);
                let values: Vec<u64> = (next..next + k).collect();
                if producer.push(&values).unwrap() {
                    next += k;
                } else {
                    thread::yield_now();
                }
            }
        });
        let mut expect = 0u64;
        while expect < n {
            match consumer.pop().unwrap() {
                Some(v) => {
                    assert_eq!(v, expect);
                    expect += 1;
                }
                None => thread::yield_now(),
            }
        }
        t.join().unwrap();
        assert_eq!(consumer.available().unwrap(), 0);
    });
}

#[test]
fn single_slots_through_a_full_ring() {
    transfer(2, 3, 1, 0);
}

#[test]
fn batches_wrap_around() {
    transfer(2, 4, 2, 0);
}

#[test]
fn indices_wrap_at_u32_max() {
    transfer(2, 3, 1, u32::MAX - 1);
}
