//! What launch geometry a device accepts, and the check of a launch against it.
//!
//! A CUDA server reads the limits from the device's attributes; the simulator presents
//! [`DeviceLimits::SM_90`], documented values of a real device.

use crate::protocol::{Cluster, Dim3, MAX_CLUSTER_BLOCKS, MAX_NON_PORTABLE_CLUSTER_BLOCKS};
use crate::status::{Error, Result, Status};

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

    /// What a client knows of its device's launch limits from the compute capability the
    /// server reported at connect, so that a launch past them fails in the launch call itself,
    /// as with CUDA: the thread, block and grid limits every device CUDA 13 supports shares
    /// (those of [`DeviceLimits::SM_90`]) and, for the capabilities the Programming Guide's
    /// table gives (7.0, 7.5, 8.0, 8.6, 8.9, 9.0), the shared memory an opted-in kernel may
    /// use. For another capability no shared-memory limit is known here, and the server's own
    /// check is the one that refuses.
    pub fn of_compute_capability(cc: (u32, u32)) -> DeviceLimits {
        let optin_kib = match cc {
            (7, 0) => 96,
            (7, 5) => 64,
            (8, 0) => 163,
            (8, 6) | (8, 9) => 99,
            (9, 0) => 227,
            _ => {
                return DeviceLimits {
                    max_shared_mem_per_block_optin: u32::MAX,
                    ..DeviceLimits::SM_90
                };
            }
        };
        DeviceLimits {
            max_shared_mem_per_block_optin: optin_kib << 10,
            ..DeviceLimits::SM_90
        }
    }
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

/// `CUDA_ERROR_INVALID_CLUSTER_SIZE`, which CUDA documents for a launch whose clusters are
/// misconfigured: the CUDA result of [`check_clusters`]'s refusals of a size.
const INVALID_CLUSTER_SIZE: u32 = 912;

/// Checks a launch's clusters: every extent at least 1 and dividing the grid's, and the
/// blocks of one cluster within 8, or 16 where the kernel allows non-portable sizes. Clusters
/// need compute capability 9.0 or later (`cc`, the device's).
pub fn check_clusters(grid: Dim3, cluster: &Cluster, cc: (u32, u32)) -> Result<()> {
    cluster_size(grid, cluster, cc).map_err(|e| match e.status {
        Status::InvalidValue => e.with_cuda_result(INVALID_CLUSTER_SIZE),
        _ => e,
    })
}

fn cluster_size(grid: Dim3, cluster: &Cluster, cc: (u32, u32)) -> Result<()> {
    let c = cluster.dims;
    if cc.0 < 9 {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "thread-block clusters need compute capability 9.0; the device is {}.{}",
                cc.0, cc.1
            ),
        ));
    }
    if c.x == 0
        || c.y == 0
        || c.z == 0
        || grid.x % c.x != 0
        || grid.y % c.y != 0
        || grid.z % c.z != 0
    {
        return Err(Error::invalid_value(format!(
            "clusters ({}, {}, {}) do not divide the grid ({}, {}, {})",
            c.x, c.y, c.z, grid.x, grid.y, grid.z
        )));
    }
    let most = if cluster.non_portable {
        MAX_NON_PORTABLE_CLUSTER_BLOCKS
    } else {
        MAX_CLUSTER_BLOCKS
    };
    if c.volume().is_none_or(|v| v > most as u64) {
        return Err(Error::invalid_value(format!(
            "a cluster of ({}, {}, {}) blocks is more than {most}{}",
            c.x,
            c.y,
            c.z,
            if cluster.non_portable {
                ""
            } else {
                " (the portable size; a kernel may allow up to 16 with \
                 CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)"
            }
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_clients_limits_follow_the_compute_capability_and_leave_unknown_shared_memory_to_the_server()
     {
        assert_eq!(
            DeviceLimits::of_compute_capability((9, 0)),
            DeviceLimits::SM_90
        );
        let ampere = DeviceLimits::of_compute_capability((8, 0));
        assert_eq!(ampere.max_shared_mem_per_block_optin, 163 << 10);
        assert_eq!(ampere.max_threads_per_block, 1024);
        let unknown = DeviceLimits::of_compute_capability((42, 0));
        assert_eq!(unknown.max_shared_mem_per_block_optin, u32::MAX);
        let one = Dim3 { x: 1, y: 1, z: 1 };
        assert!(check_geometry(one, one, 1 << 30, &unknown).is_ok());
        assert!(check_geometry(one, Dim3 { x: 2048, ..one }, 0, &unknown).is_err());
    }

    use super::*;
    use crate::status::Status;

    #[test]
    fn clusters_divide_the_grid_and_hold_eight_blocks_or_sixteen_where_allowed() {
        let grid = dim(64, 2, 1);
        let c = |x, y, z, non_portable| Cluster {
            dims: dim(x, y, z),
            non_portable,
        };
        assert!(check_clusters(grid, &c(2, 1, 1, false), (9, 0)).is_ok());
        assert!(check_clusters(grid, &c(4, 2, 1, false), (9, 0)).is_ok());
        assert!(check_clusters(grid, &c(16, 1, 1, true), (9, 0)).is_ok());
        assert!(check_clusters(grid, &c(8, 2, 1, true), (10, 0)).is_ok());
        let refused = |cl: Cluster, cc, status| {
            assert_eq!(
                check_clusters(grid, &cl, cc).unwrap_err().status,
                status,
                "{cl:?} on {cc:?}"
            )
        };
        // Past 8 blocks without the permission, past 16 with it.
        refused(c(16, 1, 1, false), (9, 0), Status::InvalidValue);
        refused(c(8, 4, 1, true), (9, 0), Status::InvalidValue);
        // Not dividing the grid, or empty.
        refused(c(3, 1, 1, false), (9, 0), Status::InvalidValue);
        refused(c(1, 1, 2, false), (9, 0), Status::InvalidValue);
        refused(c(0, 1, 1, false), (9, 0), Status::InvalidValue);
        // Before Hopper.
        refused(c(2, 1, 1, false), (8, 0), Status::Unsupported);
        let e = check_clusters(grid, &c(3, 1, 1, false), (9, 0)).unwrap_err();
        assert_eq!(e.cuda_result, Some(INVALID_CLUSTER_SIZE));
    }

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
