//! The device's attributes and UUID, paged to a client.

use mps_core::protocol::{ATTRIBUTES_PER_REPLY, DeviceAttribute, Request, flags};

use super::*;
use crate::session::core::Output;

/// One page from `first`: its attributes, the count of all, and the UUID if sent.
fn page<B: Backend>(
    c: &mut Client<B>,
    first: u32,
) -> (Vec<DeviceAttribute>, u64, Option<[u8; 16]>) {
    let done = match c.send(&Request::DeviceAttributes { first }, 0, flags::REPLY) {
        Output::Post(done) => done,
        other => panic!("answered with {other:?}"),
    };
    let [n, total, has_uuid, _] = done.result().unwrap();
    let data = done.data();
    let bytes = n as usize * size_of::<DeviceAttribute>();
    let attrs: Vec<DeviceAttribute> = data[..bytes]
        .chunks_exact(size_of::<DeviceAttribute>())
        .map(bytemuck::pod_read_unaligned)
        .collect();
    let uuid = (has_uuid == 1).then(|| data[bytes..bytes + 16].try_into().unwrap());
    assert_eq!(data.len(), bytes + if has_uuid == 1 { 16 } else { 0 });
    (attrs, total, uuid)
}

#[test]
fn every_attribute_arrives_in_pages_with_the_uuid() {
    let server = sim();
    let want = server.backend.info().clone();
    assert!(
        want.attributes.len() > ATTRIBUTES_PER_REPLY,
        "one page would test no paging"
    );
    let mut c = server.client(Limits::default());
    let mut got = Vec::new();
    loop {
        let (attrs, total, uuid) = page(&mut c, got.len() as u32);
        assert_eq!(total, want.attributes.len() as u64);
        assert_eq!(uuid, want.uuid);
        assert!(attrs.len() <= ATTRIBUTES_PER_REPLY);
        if attrs.is_empty() {
            break;
        }
        got.extend(attrs);
    }
    assert_eq!(got, want.attributes);
    // The simulator's own figures are among them.
    let sms = got
        .iter()
        .find(|a| a.attribute == 16) // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        .map(|a| a.value);
    assert_eq!(sms, Some(want.sm_count as i32));
}

#[test]
fn a_page_past_the_end_is_empty() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let (attrs, total, _) = page(&mut c, u32::MAX);
    assert!(attrs.is_empty());
    assert!(total > 0);
}
