//! Questions a client asks once and keeps: the context's priority range and limits, a kernel's
//! attributes; and occupancy figures.

use mps_core::protocol::{
    CONTEXT_LIMITS, FUNC_ATTRIBUTES, OccupancyQuery, TENSOR_MAP_BYTES, TensorMapTiled, TensorShape,
};

use super::*;

/// The reply's values and data.
fn full<B: Backend>(c: &mut Client<B>, req: &Request<'_>) -> Result<([u64; 4], Vec<u8>)> {
    match c.send(req, 0, flags::REPLY) {
        Output::Post(done) => done.result().map(|v| (v, done.data().to_vec())),
        other => panic!("{req:?} was answered with {other:?}"),
    }
}

#[test]
fn context_limits_carry_the_priority_range_and_each_limit() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let ([least, greatest, mask, _], data) = full(&mut c, &Request::ContextLimits).unwrap();
    assert_eq!((least as u32 as i32, greatest as u32 as i32), (0, -5));
    assert_eq!(data.len(), CONTEXT_LIMITS * 8);
    let limit = |n: usize| u64::from_le_bytes(data[n * 8..n * 8 + 8].try_into().unwrap());
    // The simulator reports every limit but the L2 fetch granularity (5).
    assert_eq!(mask, 0b101_1111);
    assert_eq!(limit(0), 1024, "stack size");
    assert_eq!(limit(2), 8 << 20, "malloc heap");
    assert_eq!(limit(5), 0, "not reported: 0");
}

#[test]
fn a_kernel_attributes_come_from_the_backend_and_need_its_handle() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let f = c.function(m, "fill_u32");
    let req = Request::FuncAttributes { function: f };
    let ([count, mask, ..], data) = full(&mut c, &req).unwrap();
    assert_eq!(count, FUNC_ATTRIBUTES as u64);
    assert_eq!(mask, (1 << FUNC_ATTRIBUTES) - 1);
    let attr = |n: usize| i32::from_le_bytes(data[n * 4..n * 4 + 4].try_into().unwrap());
    assert_eq!(attr(0), 1024, "max threads per block");
    assert_eq!(attr(8), 48 << 10, "max dynamic shared memory");
    assert_eq!(attr(9), -1, "no preferred carveout");
    c.refused(
        &Request::FuncAttributes { function: m },
        0,
        Status::InvalidHandle,
        "",
    );
}

#[test]
fn occupancy_is_the_backend_figure_and_a_bad_block_is_refused() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let f = c.function(m, "fill_u32");
    let ask =
        |c: &mut Client<SimBackend>, query| c.call(&Request::Occupancy { function: f, query }, 0);
    let blocks = OccupancyQuery::ActiveBlocks {
        block_size: 256,
        dynamic_smem: 0,
        flags: 0,
    };
    assert_eq!(ask(&mut c, blocks).unwrap()[0], 8);
    let smem = OccupancyQuery::DynamicSmem {
        blocks: 2,
        block_size: 128,
    };
    assert_eq!(ask(&mut c, smem).unwrap()[0], (114 << 10) - 1024);
    let clusters = OccupancyQuery::ActiveClusters {
        block: Dim3 { x: 256, y: 1, z: 1 },
        cluster: Dim3 { x: 2, y: 1, z: 1 },
        dynamic_smem: 0,
        non_portable: false,
    };
    // Four SMs of eight such blocks, in pairs.
    assert_eq!(ask(&mut c, clusters).unwrap()[0], 16);
    let too_big = OccupancyQuery::ActiveBlocks {
        block_size: 2048,
        dynamic_smem: 0,
        flags: 0,
    };
    let e = ask(&mut c, too_big).unwrap_err();
    assert_eq!(e.status, Status::InvalidValue, "{e}");
    assert!(e.message.contains("2048 threads"), "{e}");
    // The client's session is fine after a refusal.
    assert_eq!(ask(&mut c, blocks).unwrap()[0], 8);
}

#[test]
fn a_module_global_is_the_backend_answer_and_needs_a_module_of_the_client() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let global = Request::ModuleGlobal {
        module: m,
        name: b"table",
    };
    c.refused(&global, 0, Status::NotFound, "no global named \"table\"");
    let f = c.function(m, "fill_u32");
    let wrong = Request::ModuleGlobal {
        module: f,
        name: b"table",
    };
    c.refused(&wrong, 0, Status::InvalidHandle, "");
}

#[test]
fn copies_and_memsets_may_name_a_module_global_until_its_module_is_unloaded() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let fill = |dst| Request::Memset {
        fill: Fill {
            dst,
            value: 7,
            elem_size: 4,
            count: 64,
        },
    };
    c.refused(
        &fill(recorder::GLOBAL),
        0,
        Status::InvalidHandle,
        "not inside",
    );
    let global = Request::ModuleGlobal {
        module: m,
        name: b"table",
    };
    // Asked twice, as programs do, it is one range.
    for _ in 0..2 {
        assert_eq!(c.ok(&global, 0)[..2], [recorder::GLOBAL, 256]);
    }
    c.ok(&fill(recorder::GLOBAL), 0);
    c.refused(
        &fill(recorder::GLOBAL + 4),
        0,
        Status::InvalidHandle,
        "past the end",
    );
    c.ok(&Request::ModuleUnload { module: m }, 0);
    c.refused(
        &fill(recorder::GLOBAL),
        0,
        Status::InvalidHandle,
        "not inside",
    );
}

#[test]
fn a_modules_kernel_names_come_in_pages_and_go_with_the_module() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let page =
        |c: &mut Client<_>, offset| full(c, &Request::ModuleFunctionNames { module: m, offset });
    let ([total, count, ..], first) = page(&mut c, 0).unwrap();
    let mut names = first;
    while (names.len() as u64) < total {
        let (_, more) = page(&mut c, names.len() as u64).unwrap();
        assert!(
            !more.is_empty(),
            "a page past {} of {total} bytes",
            names.len()
        );
        names.extend(more);
    }
    let listed: Vec<&[u8]> = names.split(|b| *b == 0).filter(|n| !n.is_empty()).collect();
    assert_eq!(listed.len() as u64, count);
    assert!(listed.contains(&&b"fill_u32"[..]), "{listed:?}");
    assert_eq!(names.len() as u64, total);
    let past = Request::ModuleFunctionNames {
        module: m,
        offset: total + 1,
    };
    c.refused(&past, 0, Status::InvalidValue, "lies past the");
    c.call(&Request::ModuleUnload { module: m }, 0).unwrap();
    let gone = Request::ModuleFunctionNames {
        module: m,
        offset: 0,
    };
    c.refused(&gone, 0, Status::InvalidHandle, "");
}

/// A float tensor of `rows` rows of 16 elements, each row 128 bytes apart, at `address`.
fn tensor_map(address: u64, rows: u64) -> Request<'static> {
    Request::TensorMapEncodeTiled {
        map: TensorMapTiled {
            data_type: 7,
            rank: 2,
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
            address,
            shape: TensorShape {
                dims: [16, rows, 0, 0, 0],
                strides: [128, 0, 0, 0],
                box_dims: [16, 4, 0, 0, 0],
                element_strides: [1, 1, 0, 0, 0],
            },
        },
    }
}

#[test]
fn a_tensor_map_of_the_clients_memory_is_the_backends_descriptor() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let ptr = c.alloc(4096);
    let req = tensor_map(ptr, 32);
    let ([len, ..], data) = full(&mut c, &req).unwrap();
    assert_eq!(len, TENSOR_MAP_BYTES as u64);
    assert_eq!(data.len(), TENSOR_MAP_BYTES);
    // The simulator's descriptor holds the parameters, the address first.
    assert_eq!(data[..8], ptr.to_le_bytes());
    assert_eq!(data[8..10], [7, 2]);
    assert_eq!(
        full(&mut c, &req).unwrap().1,
        data,
        "the same request, the same descriptor"
    );
    // The last row of 32 ends at 31 * 128 + 64 bytes, inside the 4096.
    let (_, inside) = full(&mut c, &tensor_map(ptr + 4096 - (31 * 128 + 64), 32)).unwrap();
    assert_eq!(inside.len(), TENSOR_MAP_BYTES);
}

#[test]
fn a_tensor_map_is_refused_outside_the_clients_memory_or_its_ranks() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let ptr = c.alloc(4096);
    // 33 rows reach past the allocation; an address of no allocation; another client's.
    c.refused(
        &tensor_map(ptr, 33),
        0,
        Status::InvalidValue,
        "runs past the end",
    );
    c.refused(
        &tensor_map(0x10, 1),
        0,
        Status::InvalidValue,
        "not inside any allocation",
    );
    let mut other = server.client(Limits::default());
    let theirs = other.alloc(4096);
    c.refused(
        &tensor_map(theirs, 1),
        0,
        Status::InvalidValue,
        "not inside any allocation",
    );
    for rank in [0, 6] {
        let Request::TensorMapEncodeTiled { mut map } = tensor_map(ptr, 1) else {
            unreachable!()
        };
        map.rank = rank;
        let req = Request::TensorMapEncodeTiled { map };
        c.refused(
            &req,
            0,
            Status::InvalidValue,
            &format!("rank {rank} is not 1 to 5"),
        );
    }
    let Request::TensorMapEncodeTiled { mut map } = tensor_map(ptr, 1) else {
        unreachable!()
    };
    map.data_type = 16;
    let req = Request::TensorMapEncodeTiled { map };
    c.refused(&req, 0, Status::InvalidValue, "data type 16");
    // CUDA's documented alignments: a global address of 16 bytes, strides multiple of 16.
    map.data_type = 7;
    map.address += 8;
    let req = Request::TensorMapEncodeTiled { map };
    c.refused(&req, 0, Status::InvalidValue, "not aligned to 16 bytes");
    map.address -= 8;
    map.shape.strides[0] = 120;
    let req = Request::TensorMapEncodeTiled { map };
    c.refused(&req, 0, Status::InvalidValue, "stride 0 of 120 bytes");
}

#[test]
fn a_tensor_maps_address_is_replaced_only_within_the_clients_memory() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let (a, b) = (c.alloc(4096), c.alloc(4096));
    let (_, map) = full(&mut c, &tensor_map(a, 1)).unwrap();
    fn replace(address: u64, map: &[u8]) -> Request<'_> {
        Request::TensorMapReplaceAddress { address, map }
    }
    let ([len, ..], moved) = full(&mut c, &replace(b, &map)).unwrap();
    assert_eq!(len, TENSOR_MAP_BYTES as u64);
    // The simulator's descriptor starts with its address; the rest stays.
    assert_eq!(moved[..8], b.to_le_bytes());
    assert_eq!(moved[8..], map[8..]);
    let req = replace(b + 8, &map);
    c.refused(&req, 0, Status::InvalidValue, "not aligned to 16 bytes");
    let req = replace(b + (1 << 40), &map);
    c.refused(&req, 0, Status::InvalidValue, "not inside any allocation");
    let req = replace(b, &map[..64]);
    c.refused(&req, 0, Status::InvalidValue, "of 64 bytes");
}
