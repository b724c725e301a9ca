//! Host functions in stream order (`cuLaunchHostFunc`).
//!
//! A host function travels as a [`Request::HostWait`]: the server publishes the command's
//! progress once the work before it in the stream is done, then holds the stream until this
//! client raises the stream's gate word. One thread of the client (started with the first
//! function) watches the progress of each stream's oldest pending function, runs it, and then
//! raises the gate: the launching thread never blocks, later work in the stream waits for the
//! function, and the functions of one stream run in order. The gate words, one per stream
//! slot, lie in a host buffer of the client's, which the server's streams (or the device)
//! read.
//!
//! After a fault or a lost connection no later progress is published, and pending functions
//! are not called (as CUDA does not call a host function after an error in its context).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use mps_core::protocol::{HostRef, MAX_STREAMS, Request, flags};
use mps_core::slots::Slots;
use mps_core::{Error, Result};
use mps_ipc::channel::Channel;

use crate::connection::Client;
use crate::handles::Stream;
use crate::transport::{lock, spin};

/// The first nap of the thread between looks at the progress of pending functions.
const FIRST_NAP: Duration = Duration::from_micros(20);
/// The longest: a function's start may lag the end of the work before it by this much on a
/// GPU, whose progress writes ring no doorbell.
const MAX_NAP: Duration = Duration::from_micros(250);

/// A host function, called once.
pub type HostFn = Box<dyn FnOnce() + Send>;

/// The client's host functions and the thread that runs them.
#[derive(Default)]
pub(crate) struct HostFuncs {
    shared: Arc<Shared>,
    /// The gate buffer's handle and the thread, made with the first function.
    started: Mutex<Option<Started>>,
}

struct Started {
    handle: u64,
    thread: std::thread::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when a function is queued or the client goes away.
    queued: Condvar,
}

#[derive(Default)]
struct State {
    /// In submission order.
    pending: VecDeque<Pending>,
    /// The last gate value given out, per stream slot.
    issued: Vec<u64>,
    stop: bool,
}

struct Pending {
    slot: u32,
    seq: u64,
    value: u64,
    f: HostFn,
}

impl Client {
    /// Queues `f` in `stream`: it runs, on a thread of this client, once the work queued
    /// before it is done, and work queued after it waits until it returns. `f` must not call
    /// into this client (CUDA forbids CUDA calls in a host function alike).
    pub fn launch_host_func(&self, stream: Stream, f: HostFn) -> Result<()> {
        self.transport.check()?;
        self.refuse_capturing(stream, "launch a host function in")?;
        let slot = self.stream_slot(stream)?;
        let handle = self.host_funcs_started()?;
        let shared = &self.host_funcs.shared;
        let gate = HostRef::Buffer {
            handle,
            offset: u64::from(slot) * 8,
        };
        let mut f = Some(f);
        let req = Request::HostWait { gate, value: 0 };
        self.transport.submit(
            stream,
            flags::MARK,
            req.opcode(),
            |seq| {
                // Under the submission lock: values follow the order of the commands.
                let mut st = lock(&shared.state);
                let value = st.issued[slot as usize] + 1;
                st.issued[slot as usize] = value;
                let f = f.take().expect("a submission makes its slots once");
                st.pending.push_back(Pending {
                    slot,
                    seq,
                    value,
                    f,
                });
                let (header, _) =
                    Request::HostWait { gate, value }.encode(seq, stream.0, flags::MARK);
                Ok(Slots::new(header, &[][..]))
            },
            |_, _, _| {},
        )?;
        shared.queued.notify_one();
        Ok(())
    }

    /// The gate buffer's handle, allocating it and starting the thread on first use.
    fn host_funcs_started(&self) -> Result<u64> {
        let mut started = lock(&self.host_funcs.started);
        if let Some(s) = &*started {
            return Ok(s.handle);
        }
        let gates = self.host_alloc(MAX_STREAMS * 8)?;
        let handle = self
            .host
            .buffers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(gates as usize))
            .map(|m| m.handle)
            .ok_or_else(|| Error::internal("the host functions' gate buffer is not listed"))?;
        lock(&self.host_funcs.shared.state).issued = vec![0; MAX_STREAMS];
        let shared = self.host_funcs.shared.clone();
        let channel = self.transport.channel.clone();
        let at = gates as usize;
        let thread = std::thread::Builder::new()
            .name("mps-host-funcs".into())
            .spawn(move || run(&shared, &channel, at))
            .map_err(|e| Error::internal(format!("cannot start the host-function thread: {e}")))?;
        *started = Some(Started { handle, thread });
        Ok(handle)
    }

    /// Stops the host-function thread (pending functions are not called); the gate buffer goes
    /// with the client's other host buffers, after it.
    pub(crate) fn stop_host_funcs(&self) {
        let Some(s) = lock(&self.host_funcs.started).take() else {
            return;
        };
        lock(&self.host_funcs.shared.state).stop = true;
        self.host_funcs.shared.queued.notify_all();
        let _ = s.thread.join();
    }
}

/// The thread's loop: runs every pending function whose stream reached it, oldest first per
/// stream, and raises the stream's gate after each.
fn run(shared: &Shared, channel: &Channel, gates: usize) {
    let bell = channel.progress_bell();
    let mut nap = FIRST_NAP;
    loop {
        let ready = {
            let mut st = lock(&shared.state);
            while st.pending.is_empty() && !st.stop {
                st = shared.queued.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.stop {
                return;
            }
            take_ready(&mut st, channel)
        };
        if ready.is_empty() {
            // The server rings the bell when it publishes from the host; a device writes the
            // progress word silently, so look again after a nap that grows while nothing comes.
            // It spins only on its first look, so that a function behind long work costs a
            // wake-up per nap, not a spin.
            let seen = bell.value();
            let spin = if nap == FIRST_NAP {
                spin()
            } else {
                Duration::ZERO
            };
            bell.wait(spin, nap, || bell.value() != seen);
            nap = (nap * 2).min(MAX_NAP);
            continue;
        }
        nap = FIRST_NAP;
        for p in ready {
            // A function that panics still lets its stream go on (and the thread live).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(p.f));
            // SAFETY: slot < MAX_STREAMS words of the gate buffer, which lives until this
            // thread is joined; the server reads the word only atomically.
            let word = unsafe { &*(gates as *const AtomicU64).add(p.slot as usize) };
            word.store(p.value, Ordering::Release);
        }
    }
}

/// Takes out, in order, the oldest pending function of each stream slot whose progress has
/// reached it.
fn take_ready(st: &mut State, channel: &Channel) -> Vec<Pending> {
    let mut seen = Vec::new();
    let mut ready = Vec::new();
    let mut i = 0;
    while i < st.pending.len() {
        let p = &st.pending[i];
        if seen.contains(&p.slot) {
            i += 1;
            continue;
        }
        seen.push(p.slot);
        if channel.stream_done(p.slot).load(Ordering::Acquire) >= p.seq {
            ready.extend(st.pending.remove(i));
        } else {
            i += 1;
        }
    }
    ready
}
