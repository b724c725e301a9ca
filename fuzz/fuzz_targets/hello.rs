#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mps_fuzz::hello(data));
