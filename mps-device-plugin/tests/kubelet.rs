//! The plugin against a fake kubelet that speaks the real protocol over Unix sockets:
//! registration of both resources, a kubelet restart, `ListAndWatch` following the GPUs'
//! health, and `GetPreferredAllocation` and `Allocate` for several containers.

mod common;

use std::collections::HashSet;

use common::*;
use mps_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreStartContainerRequest, PreferredAllocationRequest,
};
use mps_device_plugin::shares::{Gpu, HEALTHY, Resource, UNHEALTHY, device_id};

fn two_gpus() -> Vec<Gpu> {
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

fn ids(resource: Resource, gpu: u32, units: std::ops::Range<u32>) -> Vec<String> {
    units.map(|u| device_id(resource, gpu, u)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_resources_register_and_list_their_units() {
    let dir = temp_dir("register");
    let mut kubelet = FakeKubelet::start(&dir);
    let plugin = TestPlugin::start(&dir, two_gpus(), handout(&dir, None));
    let regs = kubelet.both_registrations().await;
    assert_eq!(regs[0].resource_name, "mps-rs.github.io/gpu-memory");
    assert_eq!(regs[1].resource_name, "mps-rs.github.io/gpu-sm");
    for (r, resource) in regs.iter().zip([Resource::Memory, Resource::Sm]) {
        assert_eq!(r.version, "v1beta1");
        assert_eq!(r.endpoint, resource.socket());
        let options = r.options.as_ref().unwrap();
        assert!(options.get_preferred_allocation_available);
        assert!(!options.pre_start_required);

        let mut client = kubelet.connect(&r.endpoint).await;
        let got = client
            .get_device_plugin_options(Empty {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(&got, options);
        let list = next_list(&mut list_and_watch(&mut client).await).await;
        let expected = match resource {
            Resource::Memory => 8 + 4,
            Resource::Sm => 100 + 100,
        };
        assert_eq!(list.devices.len(), expected);
        assert!(list.devices.iter().all(|d| d.health == HEALTHY));
        let unique: HashSet<_> = list.devices.iter().map(|d| &d.id).collect();
        assert_eq!(unique.len(), expected, "device IDs are unique");
    }
    plugin.stop().await;
    // A stopped plugin takes its sockets away.
    assert!(!dir.join(Resource::Memory.socket()).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_kubelet_gets_both_resources_registered_again() {
    let dir = temp_dir("restart");
    let mut kubelet = FakeKubelet::start(&dir);
    let plugin = TestPlugin::start(&dir, two_gpus(), handout(&dir, None));
    kubelet.both_registrations().await;
    for round in 0..3 {
        // The last restart leaves the plugin's sockets: the new kubelet.sock alone tells.
        if round < 2 {
            kubelet.restart().await;
        } else {
            kubelet.restart_keeping_plugin_sockets().await;
        }
        let regs = kubelet.both_registrations().await;
        assert_eq!(
            regs[0].resource_name, "mps-rs.github.io/gpu-memory",
            "round {round}"
        );
        assert_eq!(
            regs[1].resource_name, "mps-rs.github.io/gpu-sm",
            "round {round}"
        );
        // The new kubelet reaches the plugin on the re-created sockets.
        for r in &regs {
            let mut client = kubelet.connect(&r.endpoint).await;
            let list = next_list(&mut list_and_watch(&mut client).await).await;
            assert!(!list.devices.is_empty());
        }
    }
    plugin.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_marks_a_gpus_units_unhealthy_while_its_servers_are_down() {
    let dir = temp_dir("health");
    let mut kubelet = FakeKubelet::start(&dir);
    let plugin = TestPlugin::start(&dir, two_gpus(), handout(&dir, None));
    let regs = kubelet.both_registrations().await;
    let mut mem = kubelet.connect(&regs[0].endpoint).await;
    let mut sm = kubelet.connect(&regs[1].endpoint).await;
    let mut mem_stream = list_and_watch(&mut mem).await;
    let mut sm_stream = list_and_watch(&mut sm).await;
    next_list(&mut mem_stream).await;
    next_list(&mut sm_stream).await;

    plugin.health.send(vec![true, false]).unwrap();
    let health = |l: &mps_device_plugin::api::ListAndWatchResponse, prefix: &str| {
        l.devices
            .iter()
            .filter(|d| d.id.starts_with(prefix))
            .map(|d| d.health.clone())
            .collect::<HashSet<_>>()
    };
    let l = next_list(&mut mem_stream).await;
    assert_eq!(health(&l, "gpu0-"), HashSet::from([HEALTHY.to_string()]));
    assert_eq!(health(&l, "gpu1-"), HashSet::from([UNHEALTHY.to_string()]));
    let l = next_list(&mut sm_stream).await;
    assert_eq!(health(&l, "gpu1-"), HashSet::from([UNHEALTHY.to_string()]));

    // The daemon gone: every unit; back: every unit healthy again.
    plugin.health.send(vec![false, false]).unwrap();
    let l = next_list(&mut mem_stream).await;
    assert!(l.devices.iter().all(|d| d.health == UNHEALTHY));
    plugin.health.send(vec![true, true]).unwrap();
    let l = next_list(&mut mem_stream).await;
    assert!(l.devices.iter().all(|d| d.health == HEALTHY));
    plugin.stop().await;
    // The streams end with the plugin.
    assert!(
        within("the stream's end", mem_stream.message())
            .await
            .unwrap()
            .is_none()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_containers_get_their_units_limits_and_groups_of_their_own() {
    let dir = temp_dir("allocate");
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let mut kubelet = FakeKubelet::start(&dir);
    let plugin = TestPlugin::start(&dir, two_gpus(), handout(&dir, Some(&lib)));
    let regs = kubelet.both_registrations().await;
    let mut mem = kubelet.connect(&regs[0].endpoint).await;
    let mut sm = kubelet.connect(&regs[1].endpoint).await;

    // The kubelet asks where 3 GiB should come from, GPU 0 and 1 both free: from one GPU, the
    // one that fits most tightly.
    let mut available = ids(Resource::Memory, 0, 0..8);
    available.extend(ids(Resource::Memory, 1, 0..4));
    let preferred = mem
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 3,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        preferred.container_responses[0].device_i_ds,
        ids(Resource::Memory, 1, 0..3)
    );

    // One pod of two containers: 3 GiB of GPU 1, and 2 GiB of GPU 0.
    let answer = mem
        .allocate(AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest {
                    devices_ids: ids(Resource::Memory, 1, 0..3),
                },
                ContainerAllocateRequest {
                    devices_ids: ids(Resource::Memory, 0, 4..6),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let [a, b] = &answer.container_responses[..] else {
        panic!("{answer:?}");
    };
    assert_eq!(a.envs["MPS_PINNED_DEVICE_MEM_LIMIT"], "3G");
    assert_eq!(a.envs["CUDA_VISIBLE_DEVICES"], "1");
    assert_eq!(b.envs["MPS_PINNED_DEVICE_MEM_LIMIT"], "2G");
    assert_eq!(b.envs["CUDA_VISIBLE_DEVICES"], "0");
    assert_ne!(a.envs["MPS_GROUP"], b.envs["MPS_GROUP"]);
    for r in [a, b] {
        assert_eq!(r.envs["MPS_PIPE_DIRECTORY"], "/run/mps");
        assert_eq!(r.envs["LD_LIBRARY_PATH"], "/opt/mps/lib");
        let hosts: Vec<_> = r.mounts.iter().map(|m| m.host_path.as_str()).collect();
        assert_eq!(hosts, [dir.to_str().unwrap(), lib.to_str().unwrap()]);
        assert!(r.mounts.iter().all(|m| m.read_only));
    }

    // The SM share of the first container: the preference follows its memory to GPU 1.
    let mut sm_available = ids(Resource::Sm, 0, 0..100);
    sm_available.extend(ids(Resource::Sm, 1, 0..100));
    mem.allocate(AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids(Resource::Memory, 1, 0..3),
        }],
    })
    .await
    .unwrap();
    let preferred = sm
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: sm_available,
                must_include_device_i_ds: vec![],
                allocation_size: 30,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let sm_ids = preferred.container_responses[0].device_i_ds.clone();
    assert_eq!(sm_ids, ids(Resource::Sm, 1, 0..30));
    let answer = sm
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: sm_ids,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let s = &answer.container_responses[0];
    assert_eq!(s.envs["MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    // What the two responses of one container both set, they set alike.
    for key in [
        "CUDA_VISIBLE_DEVICES",
        "MPS_PIPE_DIRECTORY",
        "LD_LIBRARY_PATH",
    ] {
        assert_eq!(s.envs[key], a.envs[key], "{key}");
    }

    // Units of two GPUs for one container are refused, saying why.
    let mut spanning = ids(Resource::Memory, 0, 0..1);
    spanning.extend(ids(Resource::Memory, 1, 0..1));
    let e = mem
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: spanning,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("from one GPU"), "{e}");

    // PreStartContainer is not asked for, and answers all the same.
    sm.pre_start_container(PreStartContainerRequest {
        devices_ids: ids(Resource::Sm, 0, 0..1),
    })
    .await
    .unwrap();
    plugin.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
