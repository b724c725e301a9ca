//! The session core driven in memory: commands built with `Request::encode` as a client writes
//! them, answered by the core on the simulator or on a backend that records what it is given.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use mps_core::alloc::AllocTable;
use mps_core::protocol::{
    self, Command, DeviceCopy, Dim3, Fill, HostRef, LaunchSpec, MAX_STREAMS, Opcode, ParamInfo,
    Request, SLOT_BYTES, flags,
};
use mps_core::ptx::ImageFormat;
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, Layout};
use mps_ipc::segment::Segment;

use super::core::{Output, Released, SessionCore, Shared};
use super::limits::{BatchPacing, Limits};
use super::tables::HandleIssuer;
use crate::backend::sim::{SimBackend, SimConfig};
use crate::backend::{Backend, ClientContext, DeviceInfo, FaultSink, Op, Publish};
use crate::registry::{Defaults, Registry};
use recorder::{Recorder, Submitted, Updated};

mod against_client;
mod batch;
mod device;
mod graphs;
mod hostfn;
mod isolation;
mod launch;
mod limits;
mod queries;
mod recorder;
mod validation;
mod workers;

const PTX: &[u8] = include_bytes!("../../../../kernels/test_kernels.ptx");

/// Failures of accepted work, as the backend reports them.
#[derive(Debug, Default)]
struct Faults(Mutex<Vec<(u64, Error)>>);

impl FaultSink for Faults {
    fn fault(&self, seq: u64, err: Error) {
        self.0.lock().unwrap().push((seq, err));
    }

    fn has_faulted(&self) -> bool {
        !self.0.lock().unwrap().is_empty()
    }
}

/// What every client of one server shares.
struct Server<B: Backend> {
    backend: Arc<B>,
    handles: Arc<HandleIssuer>,
    registry: Arc<Registry>,
}

impl<B: Backend> Server<B> {
    fn new(backend: B) -> Self {
        let defaults = Defaults {
            mem_limit: 0,
            priority: protocol::PRIORITY_NORMAL,
            sm_share: 100,
            max_sm_reserve: 100,
        };
        let units = backend.info().sm_units.clone();
        Server {
            backend: Arc::new(backend),
            handles: Arc::default(),
            registry: Arc::new(Registry::new(defaults, units, Box::new(|_| Ok(())))),
        }
    }

    fn client(&self, limits: Limits) -> Client<B> {
        self.try_client(limits).expect("a new session")
    }

    fn try_client(&self, limits: Limits) -> Result<Client<B>> {
        let channel = Channel::create(Layout::default())?;
        let faults = Arc::new(Faults::default());
        let ctx = ClientContext {
            id: 1,
            allocations: Arc::new(RwLock::new(AllocTable::default())),
            closing: Arc::new(AtomicBool::new(false)),
            faults: faults.clone(),
            sm: Arc::default(),
            busy_ns: Arc::default(),
            gates: Arc::default(),
            priority: Arc::new(AtomicU32::new(self.registry.default_priority())),
        };
        let shared = Shared {
            backend: self.backend.clone(),
            handles: self.handles.clone(),
            registry: self.registry.clone(),
            limits,
            // Each test client a process of its own, as separate clients usually are.
            charges: self.registry.ledger().open(1000, {
                static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);
                PID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            }),
        };
        Ok(Client {
            core: SessionCore::new(shared, channel.clone(), ctx)?,
            channel,
            faults,
            seq: 0,
        })
    }
}

fn sim() -> Server<SimBackend> {
    Server::new(
        SimBackend::new(SimConfig {
            memory_bytes: 64 << 20,
            sm_count: 4,
            fault_scope: Default::default(),
            copy_latency: std::time::Duration::ZERO,
        })
        .unwrap(),
    )
}

/// A client's end, writing commands as the client library does.
struct Client<B: Backend> {
    core: SessionCore<B>,
    channel: Channel,
    faults: Arc<Faults>,
    seq: u64,
}

impl<B: Backend> Client<B> {
    fn send(&mut self, req: &Request<'_>, stream: u64, flags: u16) -> Output {
        self.seq += 1;
        let (cmd, payload) = req.encode(self.seq, stream, flags);
        self.send_raw(&cmd, payload)
    }

    /// Hands the core a command and its payload padded to whole slots, as the ring holds them.
    fn send_raw(&mut self, cmd: &Command, payload: &[u8]) -> Output {
        let mut slots = payload.to_vec();
        slots.resize(cmd.extra_slots as usize * SLOT_BYTES, 0);
        self.core.handle(cmd, &slots)
    }

    fn call(&mut self, req: &Request<'_>, stream: u64) -> Result<[u64; 4]> {
        match self.send(req, stream, flags::REPLY) {
            Output::Post(c) | Output::HostBuffer { reply: Some(c), .. } => {
                assert_eq!(c.seq, self.seq, "{req:?}");
                c.result()
            }
            other => panic!("{req:?} was answered with {other:?}"),
        }
    }

    fn ok(&mut self, req: &Request<'_>, stream: u64) -> [u64; 4] {
        self.call(req, stream)
            .unwrap_or_else(|e| panic!("{req:?} on stream {stream:#x}: {e}"))
    }

    fn refused(&mut self, req: &Request<'_>, stream: u64, status: Status, says: &str) -> Error {
        let e = match self.call(req, stream) {
            Ok(v) => panic!("{req:?} on stream {stream:#x} was accepted: {v:?}"),
            Err(e) => e,
        };
        assert_eq!(e.status, status, "{req:?}: {e}");
        assert!(e.message.contains(says), "{req:?}: {e:?} lacks {says:?}");
        e
    }

    fn staging_write(&self, offset: usize, bytes: &[u8]) {
        let (base, len) = self.channel.staging();
        assert!(offset + bytes.len() <= len);
        // SAFETY: the range lies inside the staging area (asserted above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset), bytes.len()) };
    }

    fn load_module(&mut self, image: &[u8]) -> Result<u64> {
        self.staging_write(0, image);
        let req = Request::ModuleData {
            staging_offset: 0,
            len: image.len() as u64,
            last: true,
        };
        self.call(&req, 0).map(|v| v[0])
    }

    fn function(&mut self, module: u64, name: &str) -> u64 {
        let req = Request::GetFunction {
            module,
            name: name.as_bytes(),
        };
        self.ok(&req, 0)[0]
    }

    fn stream(&mut self) -> u64 {
        self.ok(&Request::StreamCreate { priority: 0 }, 0)[0]
    }

    fn event(&mut self) -> u64 {
        self.ok(&Request::EventCreate, 0)[0]
    }

    fn alloc(&mut self, size: u64) -> u64 {
        self.ok(&Request::MemAlloc { size }, 0)[0]
    }

    fn host_alloc(&mut self, size: u64) -> u64 {
        self.ok(&Request::HostAlloc { size }, 0)[0]
    }
}

/// `fill_u32(p, value, n)` packed as its parameter layout says.
fn fill_params(p: u64, value: u32, n: u64) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(&p.to_le_bytes());
    b[8..12].copy_from_slice(&value.to_le_bytes());
    b[16..].copy_from_slice(&n.to_le_bytes());
    b
}

fn one() -> Dim3 {
    Dim3 { x: 1, y: 1, z: 1 }
}

fn launch(function: u64, params: &[u8]) -> Request<'_> {
    Request::Launch {
        spec: LaunchSpec {
            function,
            grid: one(),
            block: one(),
            shared_mem: 0,
            cluster: None,
            params,
        },
    }
}

/// Waits (with a deadline) until `slot`'s published progress reaches `seq`.
fn wait_progress(channel: &Channel, slot: u32, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while channel.stream_done(slot).load(Ordering::Acquire) < seq {
        assert!(Instant::now() < deadline, "slot {slot} never reached {seq}");
        std::thread::yield_now();
    }
}

/// Waits for all work in `stream` so far, as the client library does (a marked no-op).
fn sync<B: Backend>(c: &mut Client<B>, stream: u64, slot: u32) {
    let out = c.send(&Request::Mark, stream, flags::MARK);
    assert!(matches!(out, Output::Silent), "{out:?}");
    wait_progress(&c.channel, slot, c.seq);
}

/// A host buffer and its pages (as the client maps them).
fn host_buffer<B: Backend>(c: &mut Client<B>, size: u64) -> (u64, Arc<Segment>) {
    match c.send(&Request::HostAlloc { size }, 0, flags::REPLY) {
        Output::HostBuffer {
            segment, message, ..
        } => (message.handle, segment),
        other => panic!("{other:?}"),
    }
}

/// The first `n` words of a host buffer, once the stream that wrote them was synchronised.
fn u32s(seg: &Segment, n: usize) -> Vec<u32> {
    // SAFETY: the callers' buffers hold at least n words; the stream that wrote them was
    // synchronised.
    let bytes = unsafe { std::slice::from_raw_parts(seg.as_ptr(), n * 4) };
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// `add_f32(a, b, out, n)` packed as its parameter layout says.
fn add_params(a: u64, b: u64, out: u64, n: u64) -> [u8; 32] {
    let mut p = [0u8; 32];
    for (i, v) in [a, b, out, n].into_iter().enumerate() {
        p[i * 8..][..8].copy_from_slice(&v.to_le_bytes());
    }
    p
}
