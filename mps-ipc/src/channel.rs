//! The shared memory of one client's connection, and where everything sits in it.
//!
//! Two segments, both created by the server:
//!
//! * the **client segment**, which the client maps read-write: the submission doorbell, the
//!   submission ring's tail and slots, the completion ring's head, the count of client threads
//!   asleep, and the staging area for pageable copies and module images;
//! * the **server segment**, which the client can only map read-only (it is sealed so): the
//!   progress doorbell, the submission ring's head, the completion ring's tail and slots, the
//!   first command the server needs a ring for, and the progress of every stream of the client.
//!
//! Each index and doorbell word sits on its own cache line, so the two sides never write the
//! same line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};

use mps_core::handshake::{RingSizes, Welcome};
use mps_core::protocol::{Command, Completion, MAX_STREAMS, SLOT_BYTES};
use mps_core::{Error, Result, Status};

use crate::doorbell::Doorbell;
use crate::ring::{Consumer, Producer, RingMemory};
use crate::segment::Segment;

const LINE: usize = 64;
const PAGE: usize = 4096;

// Client segment.
const SUBMIT_BELL: usize = 0;
const SERVER_SLEEPERS: usize = 4;
const SUBMIT_TAIL: usize = LINE;
const COMPLETE_HEAD: usize = 2 * LINE;
const CLIENT_SLEEPERS: usize = 3 * LINE;
const SUBMIT_SLOTS: usize = 4 * LINE;

// Server segment.
const PROGRESS_BELL: usize = 0;
const SUBMIT_HEAD: usize = LINE;
const COMPLETE_TAIL: usize = 2 * LINE;
const RING_FROM: usize = 3 * LINE;
const RING_STREAM: usize = 3 * LINE + 8;
const STREAM_DONE: usize = 4 * LINE;
const COMPLETE_SLOTS: usize = (STREAM_DONE + MAX_STREAMS * 8).next_multiple_of(PAGE);

/// Sizes of one connection's rings and staging area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Submission slots (a power of two).
    pub submit_slots: u32,
    /// Completion slots (a power of two).
    pub complete_slots: u32,
    /// Bytes of staging area (a multiple of the page size).
    pub staging_bytes: usize,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            submit_slots: 1024,
            complete_slots: 256,
            staging_bytes: 4 << 20,
        }
    }
}

impl Layout {
    /// The layout a server announced, if it is one this client can use.
    pub fn from_welcome(w: &Welcome) -> Result<Layout> {
        let rings = w.rings();
        let l = Layout {
            submit_slots: rings.submit_slots,
            complete_slots: rings.complete_slots,
            staging_bytes: usize::try_from(rings.staging_bytes).unwrap_or(usize::MAX),
        };
        l.validate()?;
        if l.rings() != rings {
            return Err(Error::new(
                Status::ProtocolMismatch,
                "the server's segment sizes do not match its ring sizes",
            ));
        }
        Ok(l)
    }

    /// The sizes as the welcome states them.
    pub fn rings(&self) -> RingSizes {
        RingSizes {
            submit_slots: self.submit_slots,
            complete_slots: self.complete_slots,
            staging_bytes: self.staging_bytes as u64,
            client_segment_bytes: self.client_bytes() as u64,
            server_segment_bytes: self.server_bytes() as u64,
        }
    }

    /// Checks the sizes are usable.
    pub fn validate(&self) -> Result<()> {
        let ok_ring = |n: u32| n.is_power_of_two() && (16..=1 << 16).contains(&n);
        if !ok_ring(self.submit_slots)
            || !ok_ring(self.complete_slots)
            || self.staging_bytes % PAGE != 0
            || self.staging_bytes == 0
            || self.staging_bytes > 1 << 30
        {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!("unusable ring layout {self:?}"),
            ));
        }
        Ok(())
    }

    fn staging_offset(&self) -> usize {
        (SUBMIT_SLOTS + self.submit_slots as usize * SLOT_BYTES).next_multiple_of(PAGE)
    }

    /// Bytes of the client segment.
    pub fn client_bytes(&self) -> usize {
        self.staging_offset() + self.staging_bytes
    }

    /// Bytes of the server segment.
    pub fn server_bytes(&self) -> usize {
        (COMPLETE_SLOTS + self.complete_slots as usize * size_of::<Completion>())
            .next_multiple_of(PAGE)
    }
}

/// One connection's two segments.
#[derive(Debug, Clone)]
pub struct Channel {
    client: Arc<Segment>,
    server: Arc<Segment>,
    layout: Layout,
}

impl Channel {
    /// Creates both segments (server side).
    pub fn create(layout: Layout) -> Result<Channel> {
        layout.validate()?;
        let client = Segment::create("mps-client", layout.client_bytes())?;
        let server = Segment::create("mps-server", layout.server_bytes())?;
        server.seal(true)?;
        Ok(Channel {
            client: Arc::new(client),
            server: Arc::new(server),
            layout,
        })
    }

    /// Wraps segments received in the handshake (client side).
    pub fn open(client: Segment, server: Segment, layout: Layout) -> Result<Channel> {
        if client.len() < layout.client_bytes() || server.len() < layout.server_bytes() {
            return Err(Error::new(
                Status::ProtocolMismatch,
                "received segments are smaller than the layout",
            ));
        }
        Ok(Channel {
            client: Arc::new(client),
            server: Arc::new(server),
            layout,
        })
    }

    /// The sizes.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The client segment (to send its fd).
    pub fn client_segment(&self) -> &Arc<Segment> {
        &self.client
    }

    /// The server segment (to send its fd).
    pub fn server_segment(&self) -> &Arc<Segment> {
        &self.server
    }

    fn word<T>(seg: &Segment, offset: usize) -> &T {
        debug_assert!(offset + size_of::<T>() <= seg.len() && offset % align_of::<T>() == 0);
        // SAFETY: every offset used here is a constant or computed from the validated layout,
        // lies inside the mapping (whose length was checked against the layout) and is aligned
        // for T (an atomic integer, valid for any bit pattern). The mapping lives as long as the
        // segment, which outlives the returned reference.
        unsafe { &*(seg.as_ptr().add(offset) as *const T) }
    }

    /// The doorbell the client rings after submitting and the server sleeps on.
    pub fn submit_bell(&self) -> Doorbell<'_> {
        Doorbell::new(
            Self::word(&self.client, SUBMIT_BELL),
            Self::word(&self.client, SERVER_SLEEPERS),
        )
    }

    /// The doorbell the server rings after publishing progress or completions and client
    /// threads sleep on.
    pub fn progress_bell(&self) -> Doorbell<'_> {
        Doorbell::new(
            Self::word(&self.server, PROGRESS_BELL),
            Self::word(&self.client, CLIENT_SLEEPERS),
        )
    }

    /// The sequence number from which the server needs the client to ring for commands that
    /// may join a batched run ([`Opcode::may_join_run`], with neither `MARK` nor `REPLY`) in
    /// stream [`Channel::ring_stream`]; 0: ring for every command. The server sets it while it
    /// holds a run that such commands may continue, to the command that would complete the
    /// run, and clears it before it next looks at the ring: the commands before it are held
    /// anyway, and need not each wake a sleeping server thread. Only a hint: a client that rings regardless costs wake-ups, one
    /// that never rings waits for the hold to run out. Each side orders its store before its
    /// load of the other's word with a `SeqCst` fence (the client: its ring's tail, then this;
    /// the server: this, then the tail), so that a command left unrung is seen by the server
    /// unless the word still asked for no ring.
    ///
    /// [`Opcode::may_join_run`]: mps_core::protocol::Opcode::may_join_run
    pub fn ring_from(&self) -> &AtomicU64 {
        Self::word(&self.server, RING_FROM)
    }

    /// The stream of the run that [`Channel::ring_from`] is about (written before it).
    pub fn ring_stream(&self) -> &AtomicU64 {
        Self::word(&self.server, RING_STREAM)
    }

    /// The published progress of stream slot `slot` (sequence number of its latest completed
    /// marked command). Panics on a slot past [`MAX_STREAMS`].
    pub fn stream_done(&self, slot: u32) -> &AtomicU64 {
        assert!(
            (slot as usize) < MAX_STREAMS,
            "stream slot {slot} out of range"
        );
        Self::word(&self.server, STREAM_DONE + slot as usize * 8)
    }

    /// The staging area: base address and length. Both sides may write it; each side copies
    /// out what it reads.
    pub fn staging(&self) -> (*mut u8, usize) {
        // SAFETY: the staging area lies inside the client segment by construction of the layout.
        let base = unsafe { self.client.as_ptr().add(self.layout.staging_offset()) };
        (base, self.layout.staging_bytes)
    }

    fn submit_memory(&self) -> ShmRing<Command> {
        ShmRing::new(
            self,
            &self.client,
            SUBMIT_SLOTS,
            self.layout.submit_slots,
            (&self.client, SUBMIT_TAIL),
            (&self.server, SUBMIT_HEAD),
        )
    }

    fn complete_memory(&self) -> ShmRing<Completion> {
        ShmRing::new(
            self,
            &self.server,
            COMPLETE_SLOTS,
            self.layout.complete_slots,
            (&self.server, COMPLETE_TAIL),
            (&self.client, COMPLETE_HEAD),
        )
    }

    /// The submission ring's published indices, tail then head: how far the client has posted
    /// and the server has taken (a look, for statistics; neither end is disturbed).
    pub fn submit_indices(&self) -> (u32, u32) {
        let m = self.submit_memory();
        (
            m.tail().load(std::sync::atomic::Ordering::Acquire),
            m.head().load(std::sync::atomic::Ordering::Acquire),
        )
    }

    /// The client's end of the submission ring.
    pub fn submit_producer(&self) -> Producer<Command, ShmRing<Command>> {
        Producer::new(self.submit_memory())
    }

    /// The server's end of the submission ring.
    pub fn submit_consumer(&self) -> Consumer<Command, ShmRing<Command>> {
        Consumer::new(self.submit_memory())
    }

    /// The server's end of the completion ring.
    pub fn complete_producer(&self) -> Producer<Completion, ShmRing<Completion>> {
        Producer::new(self.complete_memory())
    }

    /// The client's end of the completion ring.
    pub fn complete_consumer(&self) -> Consumer<Completion, ShmRing<Completion>> {
        Consumer::new(self.complete_memory())
    }
}

/// Ring memory inside a channel's segments.
#[derive(Debug)]
pub struct ShmRing<T> {
    _segments: Channel,
    slots: *mut T,
    tail: *const AtomicU32,
    head: *const AtomicU32,
    capacity: u32,
}

impl<T> ShmRing<T> {
    fn new(
        ch: &Channel,
        slot_seg: &Segment,
        slot_offset: usize,
        capacity: u32,
        tail: (&Segment, usize),
        head: (&Segment, usize),
    ) -> Self {
        debug_assert!(slot_offset + capacity as usize * size_of::<T>() <= slot_seg.len());
        ShmRing {
            _segments: ch.clone(),
            // SAFETY: the slot array lies inside the segment (layout arithmetic, checked above).
            slots: unsafe { slot_seg.as_ptr().add(slot_offset) } as *mut T,
            tail: Channel::word::<AtomicU32>(tail.0, tail.1),
            head: Channel::word::<AtomicU32>(head.0, head.1),
            capacity,
        }
    }
}

// SAFETY: the pointers stay valid while `_segments` holds the mappings; capacity is a validated
// power of two; slots are `Command`/`Completion`, Pod types valid for any bit pattern.
unsafe impl<T: bytemuck::Pod> RingMemory<T> for ShmRing<T> {
    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn tail(&self) -> &AtomicU32 {
        // SAFETY: points into a live mapping, aligned (see `Channel::word`).
        unsafe { &*self.tail }
    }

    fn head(&self) -> &AtomicU32 {
        // SAFETY: as for `tail`.
        unsafe { &*self.head }
    }

    unsafe fn write(&self, index: u32, value: &T) {
        debug_assert!(index < self.capacity);
        // SAFETY: index < capacity, so the slot lies inside the mapping; volatile because the
        // peer process reads it.
        unsafe { self.slots.add(index as usize).write_volatile(*value) }
    }

    unsafe fn read(&self, index: u32) -> T {
        debug_assert!(index < self.capacity);
        // SAFETY: index < capacity, so the slot lies inside the mapping. A volatile read copies
        // the slot exactly once, so a peer rewriting it cannot make us see two different values.
        unsafe { self.slots.add(index as usize).read_volatile() }
    }
}

// SAFETY: the raw pointers point into shared mappings kept alive by `_segments`; ring accesses
// are atomic or volatile copies, valid from any thread.
unsafe impl<T> Send for ShmRing<T> {}
