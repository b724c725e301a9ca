//! Client priorities on the device: a normal client's kernel starts before the queued work of a
//! below-normal client, whose streams run at a less urgent device priority than any normal
//! client's (even one left at CUDA's default priority, itself the least urgent). GPU only: the
//! simulator runs every stream's work as it comes.

mod common;

use std::io::BufRead;
use std::time::{Duration, Instant};

use common::*;
use mpsclient::{Dim3, Stream};

const TEST: &str = "a_normal_clients_kernel_starts_before_a_below_normal_clients_queued_work";

/// The below-normal client's kernels: enough blocks of [`BLOCK_NS`] for this many waves of the
/// whole device, so that each kernel keeps every SM busy for about `WAVES * BLOCK_NS`.
const WAVES: u32 = 40;
/// How long each of its blocks stays resident.
const BLOCK_NS: u64 = 100_000;
/// Its kernels, queued at once on its default stream: about 2 s of work.
const KERNELS: u32 = 500;
/// Resident blocks of 256 threads per SM that `spin_ns` can have (2048 threads per SM on
/// every GPU mps serves; fewer only makes the waves longer).
const BLOCKS_PER_SM: u32 = 8;

fn dim(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// The below-normal client: queues [`KERNELS`] kernels that fill the device, says so, then
/// waits for them and reports how many blocks ran.
fn background() {
    let c = mpsclient::Client::connect(None).expect("connect");
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let counter = c.mem_alloc(4).unwrap();
    c.memset_d32(counter, 0, 1, Stream::DEFAULT).unwrap();
    let blocks = c.device_info().sm_count * BLOCKS_PER_SM * WAVES;
    for _ in 0..KERNELS {
        c.launch(
            spin,
            dim(blocks),
            dim(256),
            0,
            Stream::DEFAULT,
            &[&BLOCK_NS.to_le_bytes(), &counter.0.to_le_bytes()],
        )
        .unwrap();
    }
    println!("queued");
    let mut ran = [0u8; 4];
    c.memcpy_dtoh(&mut ran, counter, Stream::DEFAULT).unwrap();
    println!(
        "background: {} of {} blocks ran",
        u32::from_le_bytes(ran),
        blocks * KERNELS
    );
}

/// The median time a one-block kernel of the normal client `c` takes (launch to synchronised)
/// while a client at priority `level` has its work queued (every time is printed).
fn beside_queued_work(server: &TestServer, c: &mpsclient::Client, level: &str) -> Duration {
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let counter = c.mem_alloc(4).unwrap();
    let one_block = || {
        let t = Instant::now();
        c.launch(
            spin,
            dim(1),
            dim(32),
            0,
            Stream::DEFAULT,
            &[&10_000u64.to_le_bytes(), &counter.0.to_le_bytes()],
        )
        .unwrap();
        c.stream_synchronize(Stream::DEFAULT).unwrap();
        t.elapsed()
    };
    let alone = one_block();
    let mut bg = spawn_role_with(
        TEST,
        "background",
        server,
        &[("MPS_CLIENT_PRIORITY", level)],
    );
    let mut lines = std::io::BufReader::new(bg.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.unwrap().ends_with("queued")),
        "the client at priority {level} never queued its work"
    );
    // Let its first kernels reach the device.
    std::thread::sleep(Duration::from_millis(100));
    let mut beside: Vec<Duration> = (0..9).map(|_| one_block()).collect();
    beside.sort();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = bg.wait().unwrap();
    assert!(
        status.success(),
        "the client at priority {level} failed: {rest:?}"
    );
    let ran = rest
        .iter()
        .find(|l| l.starts_with("background:"))
        .unwrap_or_else(|| panic!("no report from the client at priority {level}: {rest:?}"));
    // Its kernels ran whole.
    let words: Vec<&str> = ran.split_whitespace().collect();
    assert_eq!(words[1], words[3], "{ran}");
    println!(
        "beside a client at priority {level}: one block alone {alone:?}, beside its queued \
         work {beside:?}; {ran}"
    );
    c.mem_free(counter).unwrap();
    c.module_unload(m).unwrap();
    beside[beside.len() / 2]
}

#[test]
fn a_normal_clients_kernel_starts_before_a_below_normal_clients_queued_work() {
    if role().as_deref() == Some("background") {
        background();
        return;
    }
    if let Err(why) = mps_server::backend::cuda::probe() {
        skip(TEST, &format!("needs a GPU ({why})"));
        return;
    }
    let server = TestServer::start_with(&["--backend", "cuda"]);
    let c = server.client();
    // For the record: beside a normal client's work the device takes the kernels in turn.
    let same = beside_queued_work(&server, &c, "0");
    let below = beside_queued_work(&server, &c, "1");
    println!("median beside a normal client {same:?}, beside a below-normal client {below:?}");
    // Each background kernel holds the device for about WAVES * BLOCK_NS (4 ms): behind it, a
    // kernel of the normal client waits for a kernel boundary, about 2 ms on average; ahead
    // of it, for a block of the running kernel to end (0.1 ms).
    let bound = Duration::from_nanos(u64::from(WAVES) * BLOCK_NS / 4);
    assert!(
        below < bound,
        "a normal client's kernel took {below:?} (median) beside a below-normal client's \
         queued work, over {bound:?}"
    );
}
