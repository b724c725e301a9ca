//! What the plugin advertises and hands out, free of I/O: each GPU the daemon serves is cut
//! into units of two resources (device memory in GiB, SM share in percent), each unit a
//! kubelet "device" of its own; an allocation of units becomes the container's mounts and
//! environment.
//!
//! The kubelet calls `Allocate` once per resource, so a container that asks for both gets two
//! responses, whose environments it merges (the first value of a key wins, and the kubelet logs
//! a conflict). Both responses therefore set the same values for what they share (pipe
//! directory, library path, `CUDA_VISIBLE_DEVICES`) whenever both units come from one GPU, and
//! each names the group after a unit only this container holds: whichever `MPS_GROUP` wins, no
//! other live container of the node has it, and every process of the container has the same.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::api::{ContainerAllocateResponse, Device, Mount};

/// Bytes of one unit of device memory.
pub const GIB: u64 = 1 << 30;
/// Units of SM share per GPU: one per percent.
pub const SM_UNITS: u32 = 100;
/// How the names of containers' own groups begin.
pub const GROUP_PREFIX: &str = "k8s-";
/// The kubelet's words for a device's health.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// The two resources, each registered with the kubelet on a socket of its own (the API names
/// one resource per endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// Device memory, in GiB.
    Memory,
    /// SM share, in percent of one GPU.
    Sm,
}

impl Resource {
    pub const ALL: [Resource; 2] = [Resource::Memory, Resource::Sm];

    /// The resource's name after the domain (`<domain>/gpu-memory`).
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "gpu-memory",
            Resource::Sm => "gpu-sm",
        }
    }

    /// The word for it in device IDs and group names.
    fn tag(self) -> &'static str {
        match self {
            Resource::Memory => "mem",
            Resource::Sm => "sm",
        }
    }

    /// The plugin's socket for this resource, in the kubelet's device plugin directory.
    pub fn socket(self) -> String {
        format!("mps-{}.sock", self.name())
    }
}

/// One GPU that the daemon serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Its ordinal as the daemon numbers devices (what `CUDA_VISIBLE_DEVICES` names).
    pub ordinal: u32,
    /// Units of device memory offered.
    pub memory_units: u32,
}

impl Gpu {
    /// Units of `resource` this GPU offers.
    pub fn units(&self, resource: Resource) -> u32 {
        match resource {
            Resource::Memory => self.memory_units,
            Resource::Sm => SM_UNITS,
        }
    }
}

/// The device ID of unit `unit` of `resource` on GPU `gpu`: `gpu0-mem-12`, `gpu3-sm-99`.
pub fn device_id(resource: Resource, gpu: u32, unit: u32) -> String {
    format!("gpu{gpu}-{}-{unit}", resource.tag())
}

/// The (resource, GPU, unit) of a device ID this plugin made, or `None`.
pub fn parse_id(id: &str) -> Option<(Resource, u32, u32)> {
    let rest = id.strip_prefix("gpu")?;
    let (gpu, rest) = rest.split_once('-')?;
    let (tag, unit) = rest.split_once('-')?;
    let resource = Resource::ALL.into_iter().find(|r| r.tag() == tag)?;
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    Some((resource, number(gpu)?, number(unit)?))
}

/// The devices of `resource` on `gpus`, with each GPU's health (`healthy[i]` for `gpus[i]`).
pub fn devices(resource: Resource, gpus: &[Gpu], healthy: &[bool]) -> Vec<Device> {
    gpus.iter()
        .enumerate()
        .flat_map(|(i, g)| {
            let health = if healthy.get(i).copied().unwrap_or(false) {
                HEALTHY
            } else {
                UNHEALTHY
            };
            (0..g.units(resource)).map(move |u| Device {
                id: device_id(resource, g.ordinal, u),
                health: health.into(),
                topology: None,
            })
        })
        .collect()
}

/// Which server group a container joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupMode {
    /// A group of its own, named after a unit it holds: its own server, context and faults.
    Own,
    /// One named group for every container: their kernels share one context (concurrent, as
    /// NVIDIA's MPS runs them), and so do their faults.
    Shared(String),
}

/// What a container is given besides its limits: the host paths the plugin mounts and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handout {
    /// The daemon's pipe directory on the host.
    pub pipe_dir: PathBuf,
    /// Where the container sees it (its `MPS_PIPE_DIRECTORY`).
    pub container_pipe_dir: PathBuf,
    /// The host directory that holds mps's `libcuda.so.1`, if containers get it.
    pub cuda_lib_dir: Option<PathBuf>,
    /// Where the container sees that directory (its `LD_LIBRARY_PATH`).
    pub container_cuda_lib_dir: PathBuf,
    /// Directories the container's `LD_LIBRARY_PATH` lists after the library's (it replaces
    /// the image's own), `:`-separated.
    pub library_path_after: Option<String>,
    pub group: GroupMode,
}

/// What a container's units of one resource are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub resource: Resource,
    /// The GPU's ordinal.
    pub gpu: u32,
    /// The units, ascending.
    pub units: Vec<u32>,
}

/// Checks that `ids` are distinct units of `resource` that `gpus` offer, all on one GPU.
pub fn check(resource: Resource, ids: &[String], gpus: &[Gpu]) -> Result<Allocation, String> {
    let mut by_gpu: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for id in ids {
        let Some((r, gpu, unit)) = parse_id(id) else {
            return Err(format!(
                "device {id:?} is not a device of this plugin (IDs read gpu<N>-mem-<unit> or \
                 gpu<N>-sm-<unit>)"
            ));
        };
        if r != resource {
            return Err(format!(
                "device {id} is a unit of {}, asked for as {}",
                r.name(),
                resource.name()
            ));
        }
        let Some(g) = gpus.iter().find(|g| g.ordinal == gpu) else {
            return Err(format!(
                "device {id}: GPU {gpu} is not served by the mps daemon"
            ));
        };
        if unit >= g.units(resource) {
            return Err(format!(
                "device {id}: GPU {gpu} offers {} units of {}",
                g.units(resource),
                resource.name()
            ));
        }
        by_gpu.entry(gpu).or_default().push(unit);
    }
    if by_gpu.len() > 1 {
        let list: Vec<String> = by_gpu.keys().map(u32::to_string).collect();
        return Err(format!(
            "the {} units come from GPUs {}: a container's share must come from one GPU; ask \
             for no more than one GPU of the node has free",
            resource.name(),
            list.join(" and ")
        ));
    }
    let Some((gpu, mut units)) = by_gpu.pop_first() else {
        return Err(format!("no unit of {} asked for", resource.name()));
    };
    units.sort_unstable();
    if units.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("a unit of {} is asked for twice", resource.name()));
    }
    Ok(Allocation {
        resource,
        gpu,
        units,
    })
}

impl Handout {
    /// The server group of a container holding `a`.
    pub fn group(&self, a: &Allocation) -> String {
        match &self.group {
            GroupMode::Own => format!("{GROUP_PREFIX}{}-{}{}", a.gpu, a.resource.tag(), a.units[0]),
            GroupMode::Shared(name) => name.clone(),
        }
    }

    /// What the kubelet gives the container that holds `a`: the mounts, and the environment
    /// that puts its processes in its group, on its GPU, with its limit of `a.resource`.
    pub fn respond(&self, a: &Allocation) -> ContainerAllocateResponse {
        let n = a.units.len();
        let mut envs = std::collections::HashMap::new();
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        envs.insert("MPS_PIPE_DIRECTORY".into(), path(&self.container_pipe_dir));
        envs.insert("CUDA_VISIBLE_DEVICES".into(), a.gpu.to_string());
        envs.insert("MPS_GROUP".into(), self.group(a));
        match a.resource {
            Resource::Memory => envs.insert("MPS_PINNED_DEVICE_MEM_LIMIT".into(), format!("{n}G")),
            Resource::Sm => envs.insert("MPS_ACTIVE_THREAD_PERCENTAGE".into(), n.to_string()),
        };
        let mut mounts = vec![Mount {
            container_path: path(&self.container_pipe_dir),
            host_path: path(&self.pipe_dir),
            // Connecting to a socket needs no write access to the file system it is on.
            read_only: true,
        }];
        if let Some(lib) = &self.cuda_lib_dir {
            let mut search = path(&self.container_cuda_lib_dir);
            if let Some(after) = self.library_path_after.as_deref().filter(|a| !a.is_empty()) {
                search = format!("{search}:{after}");
            }
            envs.insert("LD_LIBRARY_PATH".into(), search);
            mounts.push(Mount {
                container_path: path(&self.container_cuda_lib_dir),
                host_path: path(lib),
                read_only: true,
            });
        }
        ContainerAllocateResponse {
            envs,
            mounts,
            ..Default::default()
        }
    }
}

/// The units of `resource` to prefer for a container that needs `size` of them, out of
/// `available`, keeping `must_include`: all from one GPU, the one given by `hint` if it has
/// room (where the container's units of the other resource went), else the GPU with the fewest
/// free units that fits (packing GPUs leaves whole ones for large asks); lowest units first.
/// When no GPU has room, the kubelet's own choice stands (an empty answer) and `Allocate`
/// refuses it, saying why.
pub fn preferred(
    resource: Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
    hint: Option<u32>,
) -> Vec<String> {
    let mut free: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (r, gpu, unit) in available.iter().filter_map(|id| parse_id(id)) {
        if r == resource {
            free.entry(gpu).or_default().push(unit);
        }
    }
    let required: Vec<(u32, u32)> = must_include
        .iter()
        .filter_map(|id| parse_id(id))
        .filter(|(r, ..)| *r == resource)
        .map(|(_, g, u)| (g, u))
        .collect();
    let fits = |gpu: u32| {
        let units = free.get(&gpu).map_or(0, Vec::len);
        required.iter().all(|(g, _)| *g == gpu) && units >= size
    };
    let gpu = if let Some(&(g, _)) = required.first() {
        Some(g).filter(|&g| fits(g))
    } else if let Some(h) = hint.filter(|&h| fits(h)) {
        Some(h)
    } else {
        free.iter()
            .filter(|(g, _)| fits(**g))
            .min_by_key(|(g, units)| (units.len(), **g))
            .map(|(g, _)| *g)
    };
    let Some(gpu) = gpu else {
        return Vec::new();
    };
    let mut units: Vec<u32> = required.iter().map(|(_, u)| *u).collect();
    let mut rest = free.get(&gpu).cloned().unwrap_or_default();
    rest.sort_unstable();
    for u in rest {
        if units.len() >= size {
            break;
        }
        if !units.contains(&u) {
            units.push(u);
        }
    }
    units.sort_unstable();
    units
        .into_iter()
        .map(|u| device_id(resource, gpu, u))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<Gpu> {
        vec![
            Gpu {
                ordinal: 0,
                memory_units: 8,
            },
            Gpu {
                ordinal: 1,
                memory_units: 4,
            },
        ]
    }

    fn handout() -> Handout {
        Handout {
            pipe_dir: "/run/mps".into(),
            container_pipe_dir: "/run/mps".into(),
            cuda_lib_dir: Some("/usr/lib/mps".into()),
            container_cuda_lib_dir: "/opt/mps/lib".into(),
            library_path_after: None,
            group: GroupMode::Own,
        }
    }

    fn ids(resource: Resource, gpu: u32, units: &[u32]) -> Vec<String> {
        units.iter().map(|&u| device_id(resource, gpu, u)).collect()
    }

    #[test]
    fn device_ids_read_back() {
        for r in Resource::ALL {
            for (g, u) in [(0, 0), (7, 99), (12, 140)] {
                assert_eq!(parse_id(&device_id(r, g, u)), Some((r, g, u)));
            }
        }
        for bad in [
            "",
            "gpu",
            "gpu0",
            "gpu0-mem",
            "gpu0-mem-",
            "gpux-mem-1",
            "gpu0-cpu-1",
        ] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
        assert_eq!(parse_id("gpu0-mem-+1"), None);
        // The kubelet allows IDs of 63 characters.
        assert!(device_id(Resource::Memory, 63, u32::MAX).len() <= 63);
    }

    #[test]
    fn every_unit_is_a_device_with_its_gpus_health() {
        let mem = devices(Resource::Memory, &gpus(), &[true, false]);
        assert_eq!(mem.len(), 12);
        assert!(mem[..8].iter().all(|d| d.health == HEALTHY));
        assert!(mem[8..].iter().all(|d| d.health == UNHEALTHY));
        assert_eq!(mem[8].id, "gpu1-mem-0");
        let sm = devices(Resource::Sm, &gpus(), &[true, true]);
        assert_eq!(sm.len(), 200);
        // A GPU whose health is not known yet is not offered.
        let unknown = devices(Resource::Sm, &gpus(), &[]);
        assert!(unknown.iter().all(|d| d.health == UNHEALTHY));
    }

    #[test]
    fn an_allocation_sets_the_limit_of_its_resource_and_a_group_of_its_own() {
        let h = handout();
        let a = check(
            Resource::Memory,
            &ids(Resource::Memory, 1, &[3, 1]),
            &gpus(),
        )
        .unwrap();
        assert_eq!(a.units, vec![1, 3]);
        let r = h.respond(&a);
        assert_eq!(r.envs["MPS_PINNED_DEVICE_MEM_LIMIT"], "2G");
        assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], "1");
        assert_eq!(r.envs["MPS_GROUP"], "k8s-1-mem1");
        assert_eq!(r.envs["MPS_PIPE_DIRECTORY"], "/run/mps");
        assert_eq!(r.envs["LD_LIBRARY_PATH"], "/opt/mps/lib");
        assert!(!r.envs.contains_key("MPS_ACTIVE_THREAD_PERCENTAGE"));
        assert_eq!(r.mounts.len(), 2);
        assert_eq!(r.mounts[1].host_path, "/usr/lib/mps");
        assert_eq!(r.mounts[1].container_path, "/opt/mps/lib");

        let s = check(Resource::Sm, &ids(Resource::Sm, 1, &[40, 41, 42]), &gpus()).unwrap();
        let r2 = h.respond(&s);
        assert_eq!(r2.envs["MPS_ACTIVE_THREAD_PERCENTAGE"], "3");
        assert_eq!(r2.envs["MPS_GROUP"], "k8s-1-sm40");
        // What both responses set, they set alike: the container's merged environment has no
        // conflict but the group's name, and either name is this container's alone.
        for key in [
            "MPS_PIPE_DIRECTORY",
            "CUDA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH",
        ] {
            assert_eq!(r.envs[key], r2.envs[key], "{key}");
        }
        assert_eq!(r.mounts, r2.mounts);
        // The group name is a valid mps group (1 to 31 of letters, digits, _ - .).
        let longest = h.group(&Allocation {
            resource: Resource::Memory,
            gpu: 63,
            units: vec![u32::MAX],
        });
        assert!(
            mps_core::handshake::Hello::new(&longest).is_ok(),
            "{longest}"
        );
    }

    #[test]
    fn a_shared_group_and_no_library_are_honoured() {
        let h = Handout {
            cuda_lib_dir: None,
            group: GroupMode::Shared("pods".into()),
            ..handout()
        };
        let a = check(Resource::Sm, &ids(Resource::Sm, 0, &[0]), &gpus()).unwrap();
        let r = h.respond(&a);
        assert_eq!(r.envs["MPS_GROUP"], "pods");
        assert!(!r.envs.contains_key("LD_LIBRARY_PATH"));
        assert_eq!(r.mounts.len(), 1);
        // The image's own directories after the library's.
        let h = Handout {
            library_path_after: Some("/usr/local/cuda/lib64".into()),
            ..handout()
        };
        assert_eq!(
            h.respond(&a).envs["LD_LIBRARY_PATH"],
            "/opt/mps/lib:/usr/local/cuda/lib64"
        );
    }

    #[test]
    fn bad_allocations_are_refused_with_the_reason() {
        let g = gpus();
        let refuse = |r: Resource, ids: &[String]| check(r, ids, &g).unwrap_err();
        let mut two = ids(Resource::Memory, 0, &[0]);
        two.extend(ids(Resource::Memory, 1, &[0]));
        assert!(refuse(Resource::Memory, &two).contains("GPUs 0 and 1"));
        assert!(refuse(Resource::Sm, &ids(Resource::Memory, 0, &[0])).contains("asked for as"));
        assert!(refuse(Resource::Memory, &ids(Resource::Memory, 1, &[4])).contains("offers 4"));
        assert!(refuse(Resource::Memory, &ids(Resource::Memory, 2, &[0])).contains("GPU 2"));
        assert!(refuse(Resource::Memory, &["nvidia0".into()]).contains("not a device"));
        assert!(refuse(Resource::Memory, &ids(Resource::Memory, 0, &[1, 1])).contains("twice"));
        assert!(refuse(Resource::Memory, &[]).contains("no unit"));
    }

    #[test]
    fn preferred_units_come_from_one_gpu() {
        let mut avail = ids(Resource::Memory, 0, &[0, 1, 2, 5, 6, 7]);
        avail.extend(ids(Resource::Memory, 1, &[2, 3]));
        // Best fit: GPU 1 has the fewest free units that still fit 2.
        assert_eq!(
            preferred(Resource::Memory, &avail, &[], 2, None),
            ids(Resource::Memory, 1, &[2, 3])
        );
        // Three fit only GPU 0; lowest units first.
        assert_eq!(
            preferred(Resource::Memory, &avail, &[], 3, None),
            ids(Resource::Memory, 0, &[0, 1, 2])
        );
        // The hint wins where it fits, and not where it does not.
        assert_eq!(
            preferred(Resource::Memory, &avail, &[], 2, Some(0)),
            ids(Resource::Memory, 0, &[0, 1])
        );
        assert_eq!(
            preferred(Resource::Memory, &avail, &[], 3, Some(1)),
            ids(Resource::Memory, 0, &[0, 1, 2])
        );
        // Units that must be included are, on their GPU.
        assert_eq!(
            preferred(
                Resource::Memory,
                &avail,
                &ids(Resource::Memory, 0, &[6]),
                2,
                Some(1)
            ),
            ids(Resource::Memory, 0, &[0, 6])
        );
        // No GPU has room: the kubelet's choice stands.
        assert!(preferred(Resource::Memory, &avail, &[], 7, None).is_empty());
    }
}
