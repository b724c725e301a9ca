//! Single-producer single-consumer rings of fixed-size slots.
//!
//! Each side keeps its own index in private memory (the authoritative copy) and publishes it in
//! shared memory for the peer; indices run freely and wrap at 2^32, capacities are powers of two.
//! A side never trusts the peer's published index: a distance of more than the capacity between
//! the two means the peer corrupted the ring, and is reported as [`RingError::Corrupt`].
//!
//! The consumer copies each slot out before looking at it, so a producer that rewrites a slot
//! after publishing it can only change what the consumer sees into other well-formed bytes.

use crate::sync::{AtomicU32, Ordering};

/// The peer broke the ring protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The peer's index is more than a capacity away from ours.
    Corrupt {
        /// Our index.
        ours: u32,
        /// The peer's published index.
        theirs: u32,
    },
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Corrupt { ours, theirs } => write!(
                f,
                "ring indices are inconsistent (ours {ours}, peer's {theirs}): the peer corrupted the ring"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// The memory a ring lives in: two published indices and `capacity` slots.
///
/// # Safety
/// Implementations must return the same index words and slot storage for the life of the value,
/// `capacity` must be a power of two, and slot `i` for `i < capacity` must be valid to read and
/// write as a `T` (with any bit pattern being a valid `T`).
pub unsafe trait RingMemory<T> {
    /// Slots in the ring.
    fn capacity(&self) -> u32;
    /// The producer's published index (the tail).
    fn tail(&self) -> &AtomicU32;
    /// The consumer's published index (the head).
    fn head(&self) -> &AtomicU32;
    /// Writes slot `index` (already reduced modulo the capacity).
    ///
    /// # Safety
    /// Only the producer calls this, for a slot the consumer has released.
    unsafe fn write(&self, index: u32, value: &T);
    /// Reads slot `index` (already reduced modulo the capacity).
    ///
    /// # Safety
    /// Only the consumer calls this, for a slot the producer has published.
    unsafe fn read(&self, index: u32) -> T;
}

/// The writing end of a ring.
#[derive(Debug)]
pub struct Producer<T, M: RingMemory<T>> {
    mem: M,
    tail: u32,
    _slot: std::marker::PhantomData<fn(T)>,
}

impl<T, M: RingMemory<T>> Producer<T, M> {
    /// The producer over `mem`, continuing from the tail published there.
    pub fn new(mem: M) -> Self {
        let tail = mem.tail().load(Ordering::Relaxed);
        Producer {
            mem,
            tail,
            _slot: std::marker::PhantomData,
        }
    }

    /// Free slots now.
    pub fn free(&self) -> Result<u32, RingError> {
        let head = self.mem.head().load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.mem.capacity() {
            return Err(RingError::Corrupt {
                ours: self.tail,
                theirs: head,
            });
        }
        Ok(self.mem.capacity() - used)
    }

    /// Writes `values` into consecutive slots and publishes them, if they all fit now; returns
    /// `Ok(false)` (and writes nothing) when the ring lacks room.
    pub fn push(&mut self, values: &[T]) -> Result<bool, RingError>
    where
        T: Copy,
    {
        self.push_with(values.len(), |i| values[i])
    }

    /// Writes `n` values, made by `value(i)` as slot `i` is written, into consecutive slots and
    /// publishes them, if they all fit now; returns `Ok(false)` (and calls `value` not at all)
    /// when the ring lacks room. A command thus goes into the ring without being gathered
    /// anywhere first.
    pub fn push_with(
        &mut self,
        n: usize,
        mut value: impl FnMut(usize) -> T,
    ) -> Result<bool, RingError> {
        if (self.free()? as usize) < n {
            return Ok(false);
        }
        let mask = self.mem.capacity() - 1;
        for i in 0..n {
            // SAFETY: `free()` showed the consumer has released these slots (its head, read with
            // Acquire, is at most capacity - n behind our tail), and we are the only producer.
            unsafe {
                self.mem
                    .write(self.tail.wrapping_add(i as u32) & mask, &value(i))
            };
        }
        self.tail = self.tail.wrapping_add(n as u32);
        self.mem.tail().store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// The ring's memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }
}

/// The reading end of a ring.
#[derive(Debug)]
pub struct Consumer<T, M: RingMemory<T>> {
    mem: M,
    head: u32,
    _slot: std::marker::PhantomData<fn() -> T>,
}

impl<T, M: RingMemory<T>> Consumer<T, M> {
    /// The consumer over `mem`, continuing from the head published there.
    pub fn new(mem: M) -> Self {
        let head = mem.head().load(Ordering::Relaxed);
        Consumer {
            mem,
            head,
            _slot: std::marker::PhantomData,
        }
    }

    /// Published slots not yet consumed.
    pub fn available(&self) -> Result<u32, RingError> {
        let tail = self.mem.tail().load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.head);
        if avail > self.mem.capacity() {
            return Err(RingError::Corrupt {
                ours: self.head,
                theirs: tail,
            });
        }
        Ok(avail)
    }

    /// Copies out the slot `offset` places past the head. The caller must have seen
    /// `available() > offset`.
    pub fn peek(&self, offset: u32) -> T {
        let mask = self.mem.capacity() - 1;
        // SAFETY: the index is reduced modulo the capacity; the caller saw (through `available`,
        // which loads the tail with Acquire) that the producer published this slot, and we do not
        // release it before `advance`.
        unsafe { self.mem.read(self.head.wrapping_add(offset) & mask) }
    }

    /// Releases `n` slots (at most what `available` reported) back to the producer.
    pub fn advance(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
        self.mem.head().store(self.head, Ordering::Release);
    }

    /// Copies out and releases one slot, if any is available.
    pub fn pop(&mut self) -> Result<Option<T>, RingError> {
        if self.available()? == 0 {
            return Ok(None);
        }
        let v = self.peek(0);
        self.advance(1);
        Ok(Some(v))
    }

    /// The ring's memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }
}
