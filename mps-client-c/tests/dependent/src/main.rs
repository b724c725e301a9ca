//! Calls C that uses mps.h, linked with the mps client library's Rust crate.

use std::ffi::{CStr, c_char};

// The C ABI's symbols come from the crate itself.
use mpsclient as _;

unsafe extern "C" {
    fn not_ready_text() -> *const c_char;
}

fn main() {
    // SAFETY: the C function returns a static NUL-terminated string from mps_status_string.
    let text = unsafe { CStr::from_ptr(not_ready_text()) };
    println!("{}", text.to_string_lossy());
}
