//! The device's attributes and UUID as the server reports them (`cuDeviceGetAttribute`'s and
//! `cuDeviceGetUuid`'s answers): fetched in pages on the first question, then kept.

use std::collections::HashMap;

use mps_core::protocol::{DeviceAttribute, Request};
use mps_core::{Error, Result};

use crate::connection::Client;
use crate::report::Attributes;

impl Client {
    /// The value of device attribute `attribute` (a `CUdevice_attribute`), as the server's
    /// device reports it. An attribute the server does not report is refused
    /// (`InvalidValue`), as the driver refuses one it does not know.
    pub fn device_attribute(&self, attribute: i32) -> Result<i32> {
        self.attributes()?
            .values
            .get(&attribute)
            .copied()
            .ok_or_else(|| {
                Error::invalid_value(format!(
                    "device attribute {attribute} of {} is not reported by its mps server",
                    self.report.info.name
                ))
            })
    }

    /// The device's UUID, if the server reports one.
    pub fn device_uuid(&self) -> Result<Option<[u8; 16]>> {
        Ok(self.attributes()?.uuid)
    }

    fn attributes(&self) -> Result<&Attributes> {
        if let Some(r) = self.report.attributes.get() {
            return Ok(r);
        }
        // Two threads asking first both fetch; the first to finish is kept.
        let r = self.fetch_attributes()?;
        Ok(self.report.attributes.get_or_init(|| r))
    }

    fn fetch_attributes(&self) -> Result<Attributes> {
        let mut attributes = HashMap::new();
        let mut uuid = None;
        loop {
            let first = u32::try_from(attributes.len())
                .map_err(|_| Error::internal("too many device attributes"))?;
            let c = self.transport.call(&Request::DeviceAttributes { first })?;
            let [n, total, has_uuid, _] = c.values;
            let data = c.data();
            let bytes = (n as usize)
                .checked_mul(size_of::<DeviceAttribute>())
                .filter(|b| *b <= data.len())
                .ok_or_else(|| Error::internal("malformed device attribute reply"))?;
            if has_uuid == 1 {
                let u = data
                    .get(bytes..bytes + 16)
                    .ok_or_else(|| Error::internal("device attribute reply without its UUID"))?;
                uuid = Some(u.try_into().expect("16 bytes"));
            }
            for a in data[..bytes].chunks_exact(size_of::<DeviceAttribute>()) {
                let a: DeviceAttribute = bytemuck::pod_read_unaligned(a);
                attributes.insert(a.attribute, a.value);
            }
            if attributes.len() as u64 >= total {
                return Ok(Attributes {
                    values: attributes,
                    uuid,
                });
            }
            if n == 0 {
                return Err(Error::internal(format!(
                    "the server reported {} of its {total} device attributes, then none",
                    attributes.len()
                )));
            }
        }
    }
}
