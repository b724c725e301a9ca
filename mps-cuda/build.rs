//! Gives the library the soname of NVIDIA's driver library, so that a program linked with
//! `-lcuda` (which records `libcuda.so.1`) loads it when its directory comes first.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
