//! CPU implementations of the test kernels in `kernels/test_kernels.cu`, bound by entry name.
//!
//! Each kernel is a grid-stride loop on the GPU, so its result does not depend on the launch
//! geometry; here it is one loop. Every range a kernel touches is checked against the launching
//! client's allocations first: a stray access is `MPS_ERROR_ILLEGAL_ADDRESS` for that client and
//! touches nothing.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mps_core::alloc::AllocTable;
use mps_core::protocol::{Dim3, ParamInfo};
use mps_core::{Error, Result, Status};

use super::memory::DeviceMemory;

/// What a running kernel may use.
pub(super) struct KernelEnv<'a> {
    pub(super) name: &'static str,
    pub(super) memory: &'a DeviceMemory,
    pub(super) allocations: &'a AllocTable,
    pub(super) closing: &'a AtomicBool,
    pub(super) sm_count: u32,
    pub(super) grid: Dim3,
    pub(super) params: &'a [u8],
    pub(super) layout: &'a [ParamInfo],
}

impl KernelEnv<'_> {
    /// The host address of `len` bytes at `addr`, if the client owns them all.
    fn range(&self, addr: u64, len: u64, what: &str) -> Result<*mut u8> {
        self.allocations
            .check_range(
                addr,
                len,
                &format!("kernel {} {what}", self.name),
                Status::IllegalAddress,
            )
            .map_err(|mut e| {
                e.message.push_str(" (kernel fault)");
                e
            })?;
        self.memory.host_ptr(addr, len)
    }

    fn elems(&self, addr: u64, n: u64, size: u64, what: &str) -> Result<*mut u8> {
        let len = n.checked_mul(size).ok_or_else(|| {
            Error::new(
                Status::IllegalAddress,
                format!("kernel {}: {what} of {n} elements overflows", self.name),
            )
        })?;
        self.range(addr, len, what)
    }

    fn arg<const N: usize>(&self, i: usize) -> [u8; N] {
        let p = self.layout[i];
        debug_assert_eq!(p.size as usize, N);
        self.params[p.offset as usize..p.offset as usize + N]
            .try_into()
            .expect("layout checked at bind time")
    }

    fn u64(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.arg(i))
    }

    fn u32(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.arg(i))
    }

    fn f32(&self, i: usize) -> f32 {
        f32::from_le_bytes(self.arg(i))
    }

    fn f64(&self, i: usize) -> f64 {
        f64::from_le_bytes(self.arg(i))
    }
}

/// A built-in kernel: its name, the sizes of its parameters, and its body.
pub(super) struct Builtin {
    pub(super) name: &'static str,
    sizes: &'static [u32],
    pub(super) run: fn(&KernelEnv<'_>) -> Result<()>,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "fill_u32",
        sizes: &[8, 4, 8],
        run: fill_u32,
    },
    Builtin {
        name: "add_f32",
        sizes: &[8, 8, 8, 8],
        run: add_f32,
    },
    Builtin {
        name: "saxpy_f32",
        sizes: &[4, 8, 8, 8],
        run: saxpy_f32,
    },
    Builtin {
        name: "spin_ns",
        sizes: &[8, 8],
        run: spin_ns,
    },
    Builtin {
        name: "fault_write",
        sizes: &[8],
        run: fault_write,
    },
    Builtin {
        name: "affine_f32",
        sizes: &[16, 8, 8],
        run: affine_f32,
    },
    Builtin {
        name: "sum_params",
        sizes: &[8, 1, 2, 4, 8, 4, 8, 1, 2, 4, 8, 1, 4],
        run: sum_params,
    },
];

/// The built-in implementation of the PTX entry `name` with parameter layout `layout`.
pub(super) fn bind(name: &str, layout: &[ParamInfo]) -> Result<&'static Builtin> {
    let b = BUILTINS.iter().find(|b| b.name == name).ok_or_else(|| {
        let known: Vec<_> = BUILTINS.iter().map(|b| b.name).collect();
        Error::new(
            Status::Unsupported,
            format!(
                "the simulator has no implementation of kernel {name:?} (it runs only {})",
                known.join(", ")
            ),
        )
    })?;
    let sizes: Vec<u32> = layout.iter().map(|p| p.size).collect();
    if sizes != b.sizes {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "kernel {name} in this module has parameter sizes {sizes:?}; the simulator's {name} takes {:?}",
                b.sizes
            ),
        ));
    }
    Ok(b)
}

fn fill_u32(k: &KernelEnv<'_>) -> Result<()> {
    let (p, value, n) = (k.u64(0), k.u32(1), k.u64(2));
    if n == 0 {
        return Ok(());
    }
    let dst = k.elems(p, n, 4, "argument p")?;
    for i in 0..n as usize {
        // SAFETY: `elems` checked that n * 4 bytes at dst lie in device memory.
        unsafe { (dst as *mut u32).add(i).write_unaligned(value) };
    }
    Ok(())
}

fn add_f32(k: &KernelEnv<'_>) -> Result<()> {
    let n = k.u64(3);
    if n == 0 {
        return Ok(());
    }
    let a = k.elems(k.u64(0), n, 4, "argument a")? as *const f32;
    let b = k.elems(k.u64(1), n, 4, "argument b")? as *const f32;
    let c = k.elems(k.u64(2), n, 4, "argument c")? as *mut f32;
    for i in 0..n as usize {
        // SAFETY: all three ranges of n floats were checked to lie in device memory.
        unsafe {
            c.add(i)
                .write_unaligned(a.add(i).read_unaligned() + b.add(i).read_unaligned())
        };
    }
    Ok(())
}

fn saxpy_f32(k: &KernelEnv<'_>) -> Result<()> {
    let (alpha, n) = (k.f32(0), k.u64(3));
    if n == 0 {
        return Ok(());
    }
    let x = k.elems(k.u64(1), n, 4, "argument x")? as *const f32;
    let y = k.elems(k.u64(2), n, 4, "argument y")? as *mut f32;
    for i in 0..n as usize {
        // SAFETY: both ranges of n floats were checked to lie in device memory.
        unsafe {
            let v = alpha * x.add(i).read_unaligned() + y.add(i).read_unaligned();
            y.add(i).write_unaligned(v);
        }
    }
    Ok(())
}

/// Each block waits `ns`; blocks run in waves of one block per SM, so the kernel takes
/// `ceil(blocks / sm_count) * ns`. The wait sleeps rather than burns a core (the simulator may
/// run many streams on few cores) and gives up early when the client goes away.
fn spin_ns(k: &KernelEnv<'_>) -> Result<()> {
    let (ns, counter) = (k.u64(0), k.u64(1));
    if counter % 4 != 0 {
        return Err(Error::new(
            Status::IllegalAddress,
            format!("kernel spin_ns: counter {counter:#x} is not 4-byte aligned (kernel fault)"),
        ));
    }
    let ctr = k.range(counter, 4, "argument counter")?;
    let blocks = k.grid.volume().unwrap_or(u64::MAX);
    let waves = blocks.div_ceil(k.sm_count.max(1) as u64);
    let total = Duration::from_nanos(ns.saturating_mul(waves));
    let start = Instant::now();
    while start.elapsed() < total && !k.closing.load(Ordering::Relaxed) {
        let left = total.saturating_sub(start.elapsed());
        if left > Duration::from_micros(100) {
            std::thread::sleep(left.min(Duration::from_millis(10)));
        } else {
            std::hint::spin_loop();
        }
    }
    // SAFETY: ctr points at 4 bytes of device memory, 4-byte aligned (checked above, and the
    // mapping is page-aligned); all accesses to counters are atomic.
    let ctr = unsafe { AtomicU32::from_ptr(ctr as *mut u32) };
    ctr.fetch_add(blocks.min(u32::MAX as u64) as u32, Ordering::Relaxed);
    Ok(())
}

fn fault_write(k: &KernelEnv<'_>) -> Result<()> {
    let dst = k.range(k.u64(0), 4, "argument addr")?;
    // SAFETY: 4 bytes at dst lie in device memory.
    unsafe { (dst as *mut u32).write_unaligned(0xdead_beef) };
    Ok(())
}

/// `struct Affine { float scale; float shift; uint64_t n; }` by value, then x and y.
fn affine_f32(k: &KernelEnv<'_>) -> Result<()> {
    let a: [u8; 16] = k.arg(0);
    let word = |at: usize| a[at..at + 4].try_into().expect("4 bytes");
    let scale = f32::from_le_bytes(word(0));
    let shift = f32::from_le_bytes(word(4));
    let n = u64::from_le_bytes(a[8..16].try_into().expect("8 bytes"));
    if n == 0 {
        return Ok(());
    }
    let x = k.elems(k.u64(1), n, 4, "argument x")? as *const f32;
    let y = k.elems(k.u64(2), n, 4, "argument y")? as *mut f32;
    for i in 0..n as usize {
        // SAFETY: both ranges of n floats were checked to lie in device memory.
        unsafe {
            y.add(i)
                .write_unaligned(scale * x.add(i).read_unaligned() + shift)
        };
    }
    Ok(())
}

/// `*out` = the sum of the twelve parameters after it (floats truncated, as the CUDA kernel's
/// casts do).
fn sum_params(k: &KernelEnv<'_>) -> Result<()> {
    let u8_at = |i| u8::from_le_bytes(k.arg(i)) as u64;
    let u16_at = |i| u16::from_le_bytes(k.arg(i)) as u64;
    let terms = [
        u8_at(1),
        u16_at(2),
        k.u32(3) as u64,
        k.u64(4),
        k.f32(5) as u64,
        k.f64(6) as u64,
        u8_at(7),
        u16_at(8),
        k.u32(9) as u64,
        k.u64(10),
        u8_at(11),
        k.f32(12) as u64,
    ];
    let sum = terms.iter().fold(0u64, |s, t| s.wrapping_add(*t));
    let out = k.range(k.u64(0), 8, "argument out")?;
    // SAFETY: 8 bytes at out lie in device memory.
    unsafe { (out as *mut u64).write_unaligned(sum) };
    Ok(())
}
