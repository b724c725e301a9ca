//! A backend that records what the core asks of it, and can refuse to create streams.

use super::*;

/// Where the recorder's modules have their global `table`.
pub(super) const GLOBAL: u64 = 1 << 40;

/// A backend that records what it is asked to do.
#[derive(Debug)]
pub(super) struct Recorder {
    info: DeviceInfo,
    /// Streams it can still create (the simulator's thread limit).
    pub(super) streams_left: AtomicUsize,
    next_stream: AtomicU32,
    pub(super) live_streams: AtomicI64,
    next_ptr: AtomicU64,
    pub(super) freed: AtomicU64,
    pub(super) registered: AtomicI64,
    pub(super) submitted: Mutex<Vec<Submitted>>,
    /// Graphs and executable graphs not yet dropped.
    pub(super) live_graphs: Arc<AtomicI64>,
    /// Streams capturing.
    pub(super) capturing: AtomicI64,
    /// Captures begun, in all.
    pub(super) captures: AtomicUsize,
    /// Refuse every graph launch (as a driver might, out of resources).
    pub(super) refuse_graph_launch: AtomicBool,
    /// Refuse the submission of this command, outside a capture (0: none).
    pub(super) refuse_seq: AtomicU64,
    /// Refuse the submission of every command from this one on, outside a capture, as a dead
    /// context would (0: none).
    pub(super) refuse_from_seq: AtomicU64,
    /// Updates of executable graphs' nodes: the operation's index and its new work.
    pub(super) updates: Mutex<Vec<(usize, Updated)>>,
    /// Refuse every update of an executable graph.
    pub(super) refuse_updates: AtomicBool,
}

/// The work an executable graph's node was given.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Updated {
    Launch { grid: Dim3, params: Vec<u8> },
    Memset(Fill),
    Other,
}

/// A graph or executable graph of the recorder, counted while it lives.
#[derive(Debug)]
pub(super) struct LiveGraph(Arc<AtomicI64>);

impl LiveGraph {
    fn new(count: &Arc<AtomicI64>) -> LiveGraph {
        count.fetch_add(1, Ordering::Relaxed);
        LiveGraph(count.clone())
    }
}

impl Drop for LiveGraph {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, PartialEq)]
pub(super) struct Submitted {
    pub(super) stream: u32,
    pub(super) seq: u64,
    pub(super) op: Opcode,
    /// A launch's parameters, and whether they came borrowed.
    pub(super) params: Option<(Vec<u8>, bool)>,
    pub(super) publish: Option<(u32, u64)>,
}

impl Recorder {
    pub(super) fn new(streams: usize) -> Recorder {
        let sim = SimBackend::new(SimConfig {
            memory_bytes: 1 << 20,
            sm_count: 1,
            fault_scope: Default::default(),
            copy_latency: std::time::Duration::ZERO,
        })
        .unwrap();
        Recorder {
            info: sim.info().clone(),
            streams_left: AtomicUsize::new(streams),
            next_stream: AtomicU32::new(0),
            live_streams: AtomicI64::new(0),
            next_ptr: AtomicU64::new(1 << 20),
            freed: AtomicU64::new(0),
            registered: AtomicI64::new(0),
            submitted: Mutex::new(Vec::new()),
            live_graphs: Arc::default(),
            capturing: AtomicI64::new(0),
            captures: AtomicUsize::new(0),
            refuse_graph_launch: AtomicBool::new(false),
            refuse_seq: AtomicU64::new(0),
            refuse_from_seq: AtomicU64::new(0),
            updates: Mutex::new(Vec::new()),
            refuse_updates: AtomicBool::new(false),
        }
    }

    pub(super) fn take(&self) -> Vec<Submitted> {
        std::mem::take(&mut self.submitted.lock().unwrap())
    }
}

impl Backend for Recorder {
    type Stream = u32;
    type Event = ();
    type Module = ();
    type Function = String;
    type Graph = LiveGraph;
    type GraphExec = LiveGraph;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_alloc(&self, size: u64) -> Result<u64> {
        Ok(self
            .next_ptr
            .fetch_add(size.next_multiple_of(256), Ordering::Relaxed))
    }

    fn mem_free(&self, _ptr: u64, size: u64) {
        self.freed.fetch_add(size, Ordering::Relaxed);
    }

    fn mem_get_info(&self) -> (u64, u64) {
        (1 << 30, 1 << 30)
    }

    fn vm_granularity(&self) -> u64 {
        2 << 20
    }

    fn vm_reserve(&self, size: u64, _align: u64) -> Result<u64> {
        self.mem_alloc(size)
    }

    fn vm_free(&self, _va: u64, _size: u64) {}

    fn vm_create(&self, size: u64) -> Result<u64> {
        self.mem_alloc(size)
    }

    fn vm_release(&self, _phys: u64, size: u64) {
        self.freed.fetch_add(size, Ordering::Relaxed);
    }

    fn vm_map(&self, _va: u64, _size: u64, _phys: u64, _offset: u64) -> Result<()> {
        Ok(())
    }

    fn vm_unmap(&self, _va: u64, _size: u64) {}

    fn vm_set_access(&self, _va: u64, _size: u64) -> Result<()> {
        Ok(())
    }

    fn host_register(&self, _segment: &Segment) -> Result<()> {
        self.registered.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn host_unregister(&self, _segment: &Segment) {
        self.registered.fetch_sub(1, Ordering::Relaxed);
    }

    fn host_map(&self, segment: &Segment) -> Result<u64> {
        Ok(segment.as_ptr() as u64)
    }

    fn host_unmap(&self, _addr: u64, _len: u64) {}

    fn module_load(&self, image: &[u8]) -> Result<()> {
        ImageFormat::detect(image).map(drop)
    }

    fn module_function(&self, _module: &(), name: &str) -> Result<(String, Vec<ParamInfo>)> {
        let layout = vec![
            ParamInfo { offset: 0, size: 8 },
            ParamInfo { offset: 8, size: 4 },
        ];
        Ok((name.to_string(), layout))
    }

    /// One global, `table`, of 256 bytes at [`GLOBAL`], far from the allocations it hands out.
    fn module_global(&self, _module: &(), name: &str) -> Result<(u64, u64)> {
        if name == "table" {
            return Ok((GLOBAL, 256));
        }
        Err(Error::new(
            Status::NotFound,
            format!("the recorder's modules have no global {name:?}"),
        ))
    }

    fn module_function_names(&self, _module: &()) -> Result<Vec<String>> {
        Ok(vec!["fill_u32".to_string()])
    }

    fn tensor_map_encode_tiled(
        &self,
        _map: &protocol::TensorMapTiled,
    ) -> Result<[u8; protocol::TENSOR_MAP_BYTES]> {
        Ok([0; protocol::TENSOR_MAP_BYTES])
    }

    fn tensor_map_replace_address(
        &self,
        map: &[u8; protocol::TENSOR_MAP_BYTES],
        _address: u64,
    ) -> Result<[u8; protocol::TENSOR_MAP_BYTES]> {
        Ok(*map)
    }

    /// Nothing to report: the session tests ask these of the simulator.
    fn context_limits(&self) -> ((i32, i32), [Option<u64>; protocol::CONTEXT_LIMITS]) {
        ((0, 0), [None; protocol::CONTEXT_LIMITS])
    }

    fn function_attributes(
        &self,
        _function: &String,
    ) -> Result<[Option<i32>; protocol::FUNC_ATTRIBUTES]> {
        Ok([None; protocol::FUNC_ATTRIBUTES])
    }

    fn occupancy(&self, function: &String, _query: protocol::OccupancyQuery) -> Result<u64> {
        Err(Error::new(
            Status::Unsupported,
            format!("the recorder has no occupancy figures for kernel {function:?}"),
        ))
    }

    fn place(&self, _assignments: &[crate::sm::Assignment]) -> Result<()> {
        Ok(())
    }

    fn stream_create(&self, _priority: i32, _client: &ClientContext) -> Result<u32> {
        self.streams_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .map_err(|_| Error::new(Status::OutOfMemory, "cannot start a stream thread"))?;
        self.live_streams.fetch_add(1, Ordering::Relaxed);
        Ok(self.next_stream.fetch_add(1, Ordering::Relaxed))
    }

    fn submit(
        &self,
        stream: &u32,
        seq: u64,
        op: Op<'_, Self>,
        publish: Option<Publish>,
    ) -> Result<()> {
        if self.capturing.load(Ordering::Relaxed) == 0 {
            if matches!(op, Op::GraphLaunch(_)) && self.refuse_graph_launch.load(Ordering::Relaxed)
            {
                return Err(Error::new(Status::OutOfMemory, "graph launch refused"));
            }
            let from = self.refuse_from_seq.load(Ordering::Relaxed);
            if seq == self.refuse_seq.load(Ordering::Relaxed) || (from != 0 && seq >= from) {
                return Err(Error::new(
                    Status::InvalidValue,
                    format!("command {seq} refused"),
                ));
            }
        }
        let (op, params) = match op {
            Op::Launch(l) => {
                let borrowed = matches!(l.params, Cow::Borrowed(_));
                (Opcode::Launch, Some((l.params.to_vec(), borrowed)))
            }
            Op::Nop => (Opcode::Mark, None),
            Op::CopyHtoD { .. } => (Opcode::CopyHtoD, None),
            Op::CopyDtoH { .. } => (Opcode::CopyDtoH, None),
            Op::CopyDtoD { .. } => (Opcode::CopyDtoD, None),
            Op::Memset { .. } => (Opcode::Memset, None),
            Op::Record(_) => (Opcode::EventRecord, None),
            Op::Wait(_) => (Opcode::StreamWaitEvent, None),
            Op::GraphLaunch(_) => (Opcode::GraphLaunch, None),
            Op::HostWait { .. } => (Opcode::HostWait, None),
        };
        self.submitted.lock().unwrap().push(Submitted {
            stream: *stream,
            seq,
            op,
            params,
            publish: publish.map(|p| (p.slot, p.seq)),
        });
        Ok(())
    }

    fn stream_synchronize(&self, _stream: &u32, _closing: &AtomicBool) -> Result<()> {
        Ok(())
    }

    fn stream_destroy(&self, _stream: u32) {
        self.live_streams.fetch_sub(1, Ordering::Relaxed);
    }

    fn event_create(&self) -> Result<()> {
        Ok(())
    }

    fn event_elapsed_ms(&self, _start: &(), _end: &()) -> Result<f32> {
        Ok(1.5)
    }

    fn capture_begin(&self, _stream: &u32) -> Result<()> {
        self.capturing.fetch_add(1, Ordering::Relaxed);
        self.captures.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn capture_end(&self, _stream: &u32) -> Result<LiveGraph> {
        self.capturing.fetch_sub(1, Ordering::Relaxed);
        Ok(LiveGraph::new(&self.live_graphs))
    }

    fn graph_instantiate(&self, _graph: &LiveGraph) -> Result<LiveGraph> {
        Ok(LiveGraph::new(&self.live_graphs))
    }

    fn graph_exec_update(&self, _exec: &LiveGraph, index: usize, op: &Op<'_, Self>) -> Result<()> {
        if self.refuse_updates.load(Ordering::Relaxed) {
            return Err(Error::invalid_value("the recorder refuses the update"));
        }
        let updated = match op {
            Op::Launch(l) => Updated::Launch {
                grid: l.grid,
                params: l.params.to_vec(),
            },
            Op::Memset(f) => Updated::Memset(*f),
            _ => Updated::Other,
        };
        self.updates.lock().unwrap().push((index, updated));
        Ok(())
    }
}
