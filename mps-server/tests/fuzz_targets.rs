//! The cargo-fuzz targets of `fuzz/` (the PTX and fatbin readers, the hello and command
//! decoders), run on stable Rust: each over its checked-in corpus and then over mutations of
//! it (bits flipped, bytes changed, inserted and removed, inputs cut and spliced, lengths and
//! counts set to their edges), drawn from a fixed seed. None may panic. `MPS_FUZZ_MUTATIONS`
//! sets the mutations per corpus file (default 2000, a few seconds in all); `MPS_FUZZ_SEED`
//! replays another run (the seed is printed).
//!
//! The longer runs, with coverage guidance, are cargo-fuzz's: `cargo +nightly fuzz run ptx
//! fuzz/corpus/ptx` in `fuzz/`.

// The targets are `pub` for the cargo-fuzz binaries; here they are this test's own.
#[allow(unreachable_pub)]
#[path = "../../fuzz/src/lib.rs"]
mod targets;

use std::path::PathBuf;

/// A xorshift generator: the same mutations for the same seed, on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values a hostile peer writes into a length or count more often than chance would.
const EDGES: [u64; 8] = [0, 1, 0x7f, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, u64::MAX];

/// `input` changed by one to four mutations, some splicing in a part of `other`.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = rng.next() as u8;
            }
            2 => {
                let n = 1 + rng.below(16);
                let b = rng.next() as u8;
                v.splice(at..at, std::iter::repeat_n(b, n));
            }
            3 if !v.is_empty() => {
                let end = (at + 1 + rng.below(64)).min(v.len());
                v.drain(at.min(end)..end);
            }
            4 => v.truncate(at),
            5 if !other.is_empty() => {
                let from = rng.below(other.len());
                let to = (from + 1 + rng.below(256)).min(other.len());
                v.splice(at..at, other[from..to].iter().copied());
            }
            _ => {
                // A little-endian edge value of 2, 4 or 8 bytes over what is there.
                let width = [2, 4, 8][rng.below(3)];
                let bytes = EDGES[rng.below(EDGES.len())].to_le_bytes();
                for (k, b) in bytes[..width].iter().enumerate() {
                    if let Some(x) = v.get_mut(at + k) {
                        *x = *b;
                    }
                }
            }
        }
    }
    v
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!inputs.is_empty(), "no corpus in {}", dir.display());
    inputs
}

/// Runs `target` over its corpus and the corpus's mutations; a panic names the input (written
/// out in hex, to be added to the corpus once fixed).
fn run(name: &str, target: fn(&[u8])) {
    let mutations: usize = std::env::var("MPS_FUZZ_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let seed: u64 = std::env::var("MPS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_f00d_cafe_0001);
    eprintln!("{name}: seed {seed}, {mutations} mutations per corpus file");
    let inputs = corpus(name);
    let mut rng = Rng(seed.max(1));
    let attempt = |input: &[u8]| {
        let caught = std::panic::catch_unwind(|| target(input));
        if caught.is_err() {
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            panic!("{name} panicked on {} bytes: {hex}", input.len());
        }
    };
    for (i, input) in inputs.iter().enumerate() {
        attempt(input);
        for _ in 0..mutations {
            let other = &inputs[(i + 1 + rng.below(inputs.len())) % inputs.len()];
            attempt(&mutate(&mut rng, input, other));
        }
    }
}

#[test]
fn the_ptx_reader_survives_its_corpus_and_mutations() {
    run("ptx", targets::ptx);
}

#[test]
fn the_fatbin_reader_survives_its_corpus_and_mutations() {
    run("fatbin", targets::fatbin);
}

#[test]
fn the_hello_decoder_survives_its_corpus_and_mutations() {
    run("hello", targets::hello);
}

#[test]
fn the_command_decoder_survives_its_corpus_and_mutations() {
    run("command", targets::command);
}

/// The corpora are what they claim: each hello checks, each command decodes, each PTX and
/// fatbin loads, so that mutations start from inputs that reach deep into each reader.
#[test]
fn the_corpora_are_valid_inputs() {
    for h in corpus("hello") {
        mps_core::protocol::Hello::decode(&h)
            .unwrap()
            .check()
            .unwrap();
    }
    for c in corpus("command") {
        let cmd: mps_core::protocol::Command = bytemuck::pod_read_unaligned(&c[..64]);
        mps_core::protocol::Request::decode(&cmd, &c[64..]).unwrap();
    }
    for p in corpus("ptx") {
        assert!(!mps_core::ptx::parse_entries(&p).unwrap().is_empty());
    }
    for f in corpus("fatbin") {
        use mps_server::backend::Backend;
        let sim = mps_server::backend::sim::SimBackend::new(mps_server::backend::sim::SimConfig {
            memory_bytes: 1 << 20,
            sm_count: 4,
            fault_scope: Default::default(),
            copy_latency: std::time::Duration::ZERO,
        })
        .unwrap();
        sim.module_load(&f).unwrap();
    }
}
