//! End-to-end: virtual memory management (reservations, physical memory, mappings) from real
//! client processes against a simulator server (or a GPU where one is present).

mod common;

use common::*;
use mpsclient::{Client, DevicePtr, Dim3, Status, Stream};

fn grid(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

fn at(p: DevicePtr, offset: u64) -> DevicePtr {
    DevicePtr(p.0 + offset)
}

#[test]
fn mapped_memory_serves_copies_and_kernels_across_its_mappings() {
    let server = TestServer::start();
    let c = server.client();
    let g = c.vm_granularity().unwrap();
    assert!(g.is_power_of_two(), "{g}");
    let va = c.vm_reserve(4 * g, 0).unwrap();
    assert_eq!(va.0 % g, 0);
    let (p0, p1) = (c.vm_create(g).unwrap(), c.vm_create(g).unwrap());
    c.vm_map(va, g, p0, 0).unwrap();
    c.vm_map(at(va, g), g, p1, 0).unwrap();
    // Mapped but without access, the range is not the client's yet.
    let e = c
        .memcpy_htod(va, &[1, 2, 3, 4], Stream::DEFAULT)
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    c.vm_set_access(va, 2 * g).unwrap();
    // A copy across the two mappings, which the virtual range makes contiguous.
    let n = (g / 4) as usize;
    let a: Vec<f32> = (0..2 * n).map(|i| i as f32).collect();
    c.memcpy_htod(va, f32_bytes(&a), Stream::DEFAULT).unwrap();
    // A kernel reading and writing mapped memory: out (in the second mapping) = a + a.
    let m = c.module_load(&ptx()).unwrap();
    let add = c.module_get_function(m, "add_f32").unwrap();
    let nn = n as u64;
    c.launch(
        add,
        grid(64),
        grid(128),
        0,
        Stream::DEFAULT,
        &[
            &va.0.to_le_bytes(),
            &va.0.to_le_bytes(),
            &at(va, g).0.to_le_bytes(),
            &nn.to_le_bytes(),
        ],
    )
    .unwrap();
    let mut got = vec![0f32; n];
    c.memcpy_dtoh(
        bytemuck::cast_slice_mut(&mut got),
        at(va, g),
        Stream::DEFAULT,
    )
    .unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, 2.0 * i as f32, "element {i}");
    }
    // Past the mapped part of the reservation, nothing is the client's.
    let e = c
        .memcpy_htod(at(va, 2 * g - 4), &[0; 8], Stream::DEFAULT)
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    // A reservation with mappings cannot be freed; once unmapped it can.
    let e = c.vm_free(va).unwrap_err();
    assert!(e.message.contains("unmap"), "{e}");
    c.vm_unmap(va, 2 * g).unwrap();
    let e = c.memcpy_htod(va, &[0; 4], Stream::DEFAULT).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    for p in [p0, p1] {
        c.vm_release(p).unwrap();
    }
    c.vm_free(va).unwrap();
}

#[test]
fn two_mappings_of_one_allocation_alias_and_a_remap_keeps_its_data() {
    let server = TestServer::start();
    let c = server.client();
    let g = c.vm_granularity().unwrap();
    let va = c.vm_reserve(4 * g, 0).unwrap();
    let p = c.vm_create(g).unwrap();
    c.vm_map(va, g, p, 0).unwrap();
    c.vm_map(at(va, 2 * g), g, p, 0).unwrap();
    c.vm_set_access(va, g).unwrap();
    c.vm_set_access(at(va, 2 * g), g).unwrap();
    c.memcpy_htod(at(va, 100), b"aliased", Stream::DEFAULT)
        .unwrap();
    let mut got = [0u8; 7];
    c.memcpy_dtoh(&mut got, at(va, 2 * g + 100), Stream::DEFAULT)
        .unwrap();
    assert_eq!(&got, b"aliased");
    // Released while mapped, the memory lives on; unmapped and mapped elsewhere through the
    // retained handle, it still holds the bytes.
    let (retained, size) = c.vm_retain_handle(at(va, 5)).unwrap();
    assert_eq!((retained, size), (p, g));
    c.vm_release(p).unwrap();
    c.vm_unmap(va, g).unwrap();
    c.vm_unmap(at(va, 2 * g), g).unwrap();
    c.vm_map(at(va, 3 * g), g, p, 0).unwrap();
    c.vm_set_access(at(va, 3 * g), g).unwrap();
    let mut got = [0u8; 7];
    c.memcpy_dtoh(&mut got, at(va, 3 * g + 100), Stream::DEFAULT)
        .unwrap();
    assert_eq!(&got, b"aliased");
    c.vm_unmap(at(va, 3 * g), g).unwrap();
    c.vm_release(p).unwrap();
    // Released and unmapped: gone.
    let e = c.vm_map(va, g, p, 0).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    c.vm_free(va).unwrap();
}

#[test]
fn sizes_and_ranges_are_checked_against_the_granularity_and_the_reservations() {
    let server = TestServer::start();
    let c = server.client();
    let g = c.vm_granularity().unwrap();
    for e in [
        c.vm_reserve(g + 1, 0).unwrap_err(),
        c.vm_reserve(0, 0).unwrap_err(),
        c.vm_reserve(g, 3).unwrap_err(),
        c.vm_create(g / 2).unwrap_err(),
    ] {
        assert_eq!(e.status, Status::InvalidValue, "{e}");
    }
    let va = c.vm_reserve(2 * g, 0).unwrap();
    let p = c.vm_create(g).unwrap();
    let outside = c.vm_map(at(va, 2 * g), g, p, 0).unwrap_err();
    assert!(outside.message.contains("reservation"), "{outside}");
    let past_end = c.vm_map(va, g, p, g).unwrap_err();
    assert!(past_end.message.contains("runs past"), "{past_end}");
    c.vm_map(va, g, p, 0).unwrap();
    let overlap = c.vm_map(va, g, p, 0).unwrap_err();
    assert!(overlap.message.contains("overlaps"), "{overlap}");
    let unmapped = c.vm_set_access(va, 2 * g).unwrap_err();
    assert!(unmapped.message.contains("whole mappings"), "{unmapped}");
    // A mapping is not an allocation: cuMemFree of it is refused.
    c.vm_set_access(va, g).unwrap();
    let e = c.mem_free(va).unwrap_err();
    assert!(e.message.contains("cuMemUnmap"), "{e}");
}

#[test]
fn physical_memory_counts_against_the_clients_limit() {
    let server = TestServer::start_with(&["--mem-limit", "8MiB"]);
    let c = server.client();
    let g = c.vm_granularity().unwrap();
    let held: Vec<_> = (0..(8 << 20) / g)
        .map(|_| c.vm_create(g).unwrap())
        .collect();
    let e = c.vm_create(g).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{e}");
    let e = c.mem_alloc(256).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{e}");
    assert_eq!(
        c.mem_get_info().unwrap().0,
        0,
        "nothing free under the limit"
    );
    c.vm_release(held[0]).unwrap();
    c.vm_create(g).unwrap();
}

#[test]
fn physical_memory_past_the_device_is_out_of_memory() {
    if on_gpu() {
        eprintln!("skipped on a GPU: needs the simulator's small device (--sim-memory)");
        return;
    }
    let server = TestServer::start_with(&["--sim-memory", "8MiB"]);
    let c = server.client();
    let g = c.vm_granularity().unwrap();
    let _held: Vec<_> = (0..(8 << 20) / g)
        .map(|_| c.vm_create(g).unwrap())
        .collect();
    let e = c.vm_create(g).unwrap_err();
    assert_eq!(e.status, Status::OutOfMemory, "{e}");
}

#[test]
fn another_clients_handles_reservations_and_mappings_are_refused() {
    let server = TestServer::start();
    let (owner, other) = (server.client(), server.client());
    let g = owner.vm_granularity().unwrap();
    let va = owner.vm_reserve(2 * g, 0).unwrap();
    let p = owner.vm_create(g).unwrap();
    owner.vm_map(va, g, p, 0).unwrap();
    owner.vm_set_access(va, g).unwrap();
    let theirs = other.vm_reserve(2 * g, 0).unwrap();
    assert!(
        theirs.0 >= va.0 + 2 * g || theirs.0 + 2 * g <= va.0,
        "reservations overlap"
    );
    let e = other.vm_map(theirs, g, p, 0).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    let mine = other.vm_create(g).unwrap();
    let e = other.vm_map(at(va, g), g, mine, 0).unwrap_err();
    assert!(e.message.contains("reservation"), "{e}");
    for e in [
        other.vm_release(p).unwrap_err(),
        other.memcpy_htod(va, &[1; 4], Stream::DEFAULT).unwrap_err(),
    ] {
        assert_eq!(e.status, Status::InvalidHandle, "{e}");
    }
    for e in [
        other.vm_unmap(va, g).unwrap_err(),
        other.vm_free(va).unwrap_err(),
        other.vm_retain_handle(va).unwrap_err(),
    ] {
        assert_eq!(e.status, Status::InvalidValue, "{e}");
    }
}

#[test]
fn a_dead_clients_physical_memory_and_reservations_go_back() {
    if let Some(_role) = role() {
        let c = Client::connect(None).unwrap();
        let g = c.vm_granularity().unwrap();
        let va = c.vm_reserve(8 * g, 0).unwrap();
        for i in 0..3 {
            let p = c.vm_create(g).unwrap();
            c.vm_map(at(va, i * g), g, p, 0).unwrap();
        }
        c.vm_set_access(va, 3 * g).unwrap();
        c.memset_d8(va, 7, 3 * g, Stream::DEFAULT).unwrap();
        // A host buffer, whose device address is a range of the reservation space too.
        c.host_alloc(4096).unwrap();
        c.stream_synchronize(Stream::DEFAULT).unwrap();
        println!("ready");
        loop {
            std::thread::park();
        }
    }
    if on_gpu() {
        eprintln!("skipped on a GPU: needs the simulator's small device (--sim-memory)");
        return;
    }
    let server = TestServer::start_with(&["--sim-memory", "8MiB"]);
    let test = "a_dead_clients_physical_memory_and_reservations_go_back";
    let mut holder = spawn_role(test, "holder", &server);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(holder.stdout.take().unwrap()));
    assert!(
        lines.any(|l| l.unwrap().ends_with("ready")),
        "the holder never got ready"
    );
    let probe = server.client();
    let g = probe.vm_granularity().unwrap();
    let e = probe.vm_create(2 * g).unwrap_err();
    assert_eq!(e.status, Status::OutOfMemory, "{e}");
    // The simulator's whole reservation space (1 GiB beside 8 MiB of memory) is free only once
    // the holder's reservation and its host buffer's device range have gone back.
    let everything = 1 << 30;
    let e = probe.vm_reserve(everything, 0).unwrap_err();
    assert_eq!(e.status, Status::OutOfMemory, "{e}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_until(
        "free device memory after the holder's death",
        || probe.mem_get_info().unwrap().0,
        |free| *free == 8 << 20,
    );
    let p = probe.vm_create(4 * g).unwrap();
    probe.vm_release(p).unwrap();
    // The host buffer goes back after the memory: wait for the address space as well.
    wait_until(
        "the whole reservation space after the holder's death",
        || {
            let va = probe.vm_reserve(everything, 0).ok();
            va.map(|va| probe.vm_free(va).unwrap()).is_some()
        },
        |reserved| *reserved,
    );
}
