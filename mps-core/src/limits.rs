//! What launch geometry a device accepts, and the check of a launch against it.
//!
//! A CUDA server reads the limits from the device's attributes; the simulator presents
//! [`DeviceLimits::SM_90`], documented values of a real device.

use crate::protocol::Dim3;
use crate::status::{Error, Result};

/// The launch limits of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Threads in one block (x * y * z).
    pub max_threads_per_block: u32,
    /// The largest block extent in each dimension.
    pub max_block: Dim3,
    /// The largest grid extent in each dimension.
    pub max_grid: Dim3,
    /// Shared memory one block may use without opting in (static and dynamic together).
    pub max_shared_mem_per_block: u32,
    /// Shared memory one block may use once its kernel opted in (the CUDA server opts a kernel
    /// in at its first launch that needs it); dynamic shared memory of a launch is checked
    /// against this.
    pub max_shared_mem_per_block_optin: u32,
    /// Threads of a warp.
    pub warp_size: u32,
}

impl DeviceLimits {
    /// Compute capability 9.0 (Hopper: H100, H200), as the CUDA C Programming Guide's table of
    /// technical specifications gives it: 1024 threads per block, blocks up to (1024, 1024, 64),
    /// grids up to (2^31-1, 65535, 65535), 48 KiB of shared memory per block, 227 KiB after
    /// opting in, warps of 32. No CUDA device accepts more shared memory per block.
    pub const SM_90: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_block: Dim3 {
            x: 1024,
            y: 1024,
            z: 64,
        },
        max_grid: Dim3 {
            x: i32::MAX as u32,
            y: 65535,
            z: 65535,
        },
        max_shared_mem_per_block: 48 << 10,
        max_shared_mem_per_block_optin: 227 << 10,
        warp_size: 32,
    };
}

/// Checks a launch geometry against `limits`: no zero extent, the grid and the block within the
/// device's thread count per block, the block within its extents, and the dynamic shared memory
/// within what an opted-in kernel may use.
pub fn check_geometry(
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    limits: &DeviceLimits,
) -> Result<()> {
    if grid.volume() == Some(0) || block.volume() == Some(0) {
        return Err(Error::invalid_value(format!(
            "launch geometry grid ({}, {}, {}) block ({}, {}, {}) has a zero extent",
            grid.x, grid.y, grid.z, block.x, block.y, block.z
        )));
    }
    let g = limits.max_grid;
    if grid.x > g.x || grid.y > g.y || grid.z > g.z {
        return Err(Error::invalid_value(format!(
            "grid ({}, {}, {}) exceeds the device's limits ({}, {}, {})",
            grid.x, grid.y, grid.z, g.x, g.y, g.z
        )));
    }
    let max = limits.max_threads_per_block;
    if block.volume().is_none_or(|v| v > max as u64) {
        return Err(Error::invalid_value(format!(
            "block ({}, {}, {}) exceeds the device's {max} threads per block",
            block.x, block.y, block.z
        )));
    }
    let b = limits.max_block;
    if block.x > b.x || block.y > b.y || block.z > b.z {
        return Err(Error::invalid_value(format!(
            "block ({}, {}, {}) exceeds the device's limits ({}, {}, {})",
            block.x, block.y, block.z, b.x, b.y, b.z
        )));
    }
    let shared = limits.max_shared_mem_per_block_optin;
    if shared_mem > shared {
        return Err(Error::invalid_value(format!(
            "{shared_mem} bytes of dynamic shared memory exceed the device's {shared}-byte limit \
             per block"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;

    fn dim(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }

    /// A small device, so that each limit can be hit alone.
    const SMALL: DeviceLimits = DeviceLimits {
        max_threads_per_block: 256,
        max_block: Dim3 {
            x: 256,
            y: 128,
            z: 4,
        },
        max_grid: Dim3 {
            x: 100,
            y: 10,
            z: 2,
        },
        max_shared_mem_per_block: 16 << 10,
        max_shared_mem_per_block_optin: 32 << 10,
        warp_size: 32,
    };

    fn rejects(grid: Dim3, block: Dim3, shared: u32, limits: &DeviceLimits, says: &str) {
        let e = check_geometry(grid, block, shared, limits).unwrap_err();
        assert_eq!(e.status, Status::InvalidValue);
        assert!(e.message.contains(says), "{:?} lacks {says:?}", e.message);
    }

    #[test]
    fn each_limit_of_the_device_is_enforced_at_its_edge() {
        let one = dim(1, 1, 1);
        for l in [&SMALL, &DeviceLimits::SM_90] {
            let (g, b) = (l.max_grid, l.max_block);
            check_geometry(g, one, l.max_shared_mem_per_block_optin, l).unwrap();
            check_geometry(one, dim(b.x, 1, 1), 0, l).unwrap();
            check_geometry(one, dim(1, 1, b.z), 0, l).unwrap();
            rejects(dim(g.x + 1, 1, 1), one, 0, l, "grid");
            rejects(dim(1, g.y + 1, 1), one, 0, l, "grid");
            rejects(dim(1, 1, g.z + 1), one, 0, l, "grid");
            rejects(one, dim(b.x + 1, 1, 1), 0, l, "block");
            rejects(one, dim(1, b.y + 1, 1), 0, l, "block");
            rejects(one, dim(1, 1, b.z + 1), 0, l, "block");
            let too_many = format!("{} threads per block", l.max_threads_per_block);
            rejects(one, dim(b.x, 2, 1), 0, l, &too_many);
            let shared = l.max_shared_mem_per_block_optin;
            rejects(one, one, shared + 1, l, &format!("{shared}-byte limit"));
            rejects(dim(0, 1, 1), one, 0, l, "zero extent");
            rejects(one, dim(1, 0, 1), 0, l, "zero extent");
        }
        // Within each extent but over the thread count.
        rejects(
            dim(1, 1, 1),
            dim(64, 2, 4),
            0,
            &SMALL,
            "256 threads per block",
        );
        check_geometry(dim(1, 1, 1), dim(32, 2, 4), 0, &SMALL).unwrap();
    }

    #[test]
    fn a_block_whose_thread_count_overflows_is_refused_not_wrapped() {
        let huge = DeviceLimits {
            max_block: dim(u32::MAX, u32::MAX, u32::MAX),
            ..DeviceLimits::SM_90
        };
        rejects(
            dim(1, 1, 1),
            dim(u32::MAX, u32::MAX, u32::MAX),
            0,
            &huge,
            "threads per block",
        );
    }
}
