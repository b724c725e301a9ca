//! The driver layer on a real device: it describes device 0 and loads, creates and releases
//! objects in its primary context. Skipped, saying so, where no GPU is present.

use cudarc::driver::result;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use mps_driver::{Call, Event, Module};

/// Says the test was skipped, on stderr and in `$MPS_TEST_SKIP_LOG` (as the server's tests do).
fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    if let Some(path) = std::env::var_os("MPS_TEST_SKIP_LOG") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("the skip log opens");
        f.write_all(line.as_bytes())
            .expect("the skip log is written");
    }
}

#[test]
fn device_zero_is_described_and_its_objects_are_released() {
    const TEST: &str = "device_zero_is_described_and_its_objects_are_released";
    let n = match mps_driver::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => return skip(TEST, "needs a GPU (the driver sees none)"),
        Err(e) => return skip(TEST, &format!("needs a GPU ({e})")),
    };
    println!("{n} devices");
    let dev = result::device::get(0).call("cuDeviceGet").unwrap();
    assert!(!mps_driver::name(dev).unwrap().is_empty());
    assert!(mps_driver::total_mem(dev).unwrap() > 0);
    let sms = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    let count = mps_driver::attribute(dev, sms).unwrap();
    assert!(count > 0);
    let all = mps_driver::all_attributes(dev).unwrap();
    assert!(all.contains(&(sms as i32, count)), "{all:?}");
    mps_driver::uuid(dev).unwrap();
    // SAFETY: a device of the driver's; the primary context is released below.
    let ctx = unsafe { result::primary_ctx::retain(dev) }
        .call("cuDevicePrimaryCtxRetain")
        .unwrap();
    // SAFETY: the context was just retained.
    unsafe { result::ctx::set_current(ctx) }
        .call("cuCtxSetCurrent")
        .unwrap();
    let mut ptx = include_bytes!("../../kernels/test_kernels.ptx").to_vec();
    ptx.push(0);
    // SAFETY: NUL-terminated PTX text.
    let module = unsafe { Module::load_data(&ptx) }.unwrap();
    let event = Event::create(CUevent_flags::CU_EVENT_DEFAULT).unwrap();
    assert!(!module.raw().is_null() && !event.raw().is_null());
    drop((module, event));
    // SAFETY: retained above; nothing of it is left.
    unsafe { result::primary_ctx::release(dev) }
        .call("cuDevicePrimaryCtxRelease")
        .unwrap();
}
