//! Questions about the server's context and a kernel: the stream priority range, the
//! context's limits (`cuCtxGetLimit`'s), a kernel's attributes (`cuFuncGetAttribute`'s) and
//! occupancy figures (`cuOccupancy*`'s).

use mps_core::protocol::{
    CONTEXT_LIMITS, FUNC_ATTRIBUTES, OccupancyQuery, Request, TENSOR_MAP_BYTES, TensorMapTiled,
};
use mps_core::{Error, Result};

use crate::connection::Client;
use crate::handles::{DevicePtr, Function, Module};
pub use crate::report::ContextLimits;

/// A kernel's attributes: each `CUfunction_attribute` from 0, `None` where the device
/// reports none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionAttributes(pub [Option<i32>; FUNC_ATTRIBUTES]);

/// The values that a reply's `mask` marks as reported, from its data of `width`-byte
/// little-endian values.
fn masked<const N: usize>(mask: u64, data: &[u8], width: usize) -> Result<[Option<u64>; N]> {
    if data.len() < N * width {
        return Err(Error::internal(format!(
            "a reply of {} bytes for {N} values of {width} bytes",
            data.len()
        )));
    }
    Ok(std::array::from_fn(|i| {
        let mut b = [0u8; 8];
        b[..width].copy_from_slice(&data[i * width..(i + 1) * width]);
        (mask >> i & 1 == 1).then_some(u64::from_le_bytes(b))
    }))
}

impl Client {
    /// The context's stream priority range and limits: asked once, then kept (the server's
    /// context does not change them; clients cannot).
    pub fn context_limits(&self) -> Result<ContextLimits> {
        if let Some(l) = self.report.context.get() {
            return Ok(*l);
        }
        let c = self.transport.call(&Request::ContextLimits)?;
        let [least, greatest, mask, _] = c.values;
        let limits = masked::<CONTEXT_LIMITS>(mask, c.data(), 8)?;
        let l = ContextLimits {
            least_priority: least as u32 as i32,
            greatest_priority: greatest as u32 as i32,
            limits,
        };
        Ok(*self.report.context.get_or_init(|| l))
    }

    /// The attributes of kernel `f`, as the server's driver reports them now (callers that
    /// keep them must follow the changes they make).
    pub fn function_attributes(&self, f: Function) -> Result<FunctionAttributes> {
        let c = self
            .transport
            .call(&Request::FuncAttributes { function: f.0 })?;
        let [count, mask, ..] = c.values;
        if count != FUNC_ATTRIBUTES as u64 {
            return Err(Error::internal(format!(
                "the server reported {count} kernel attributes, not {FUNC_ATTRIBUTES}"
            )));
        }
        let values = masked::<FUNC_ATTRIBUTES>(mask, c.data(), 4)?;
        Ok(FunctionAttributes(
            values.map(|v| v.map(|v| v as u32 as i32)),
        ))
    }

    /// The device address and size of the global variable `name` of `module`. Kernels may be
    /// given the address, and copies and memsets reach it until the module is unloaded.
    pub fn module_get_global(&self, module: Module, name: &str) -> Result<(DevicePtr, u64)> {
        if name.is_empty() || name.len() > mps_core::protocol::MAX_NAME_BYTES {
            return Err(Error::invalid_value(format!(
                "global name must be 1 to {} bytes",
                mps_core::protocol::MAX_NAME_BYTES
            )));
        }
        let [ptr, size, ..] = self
            .transport
            .call(&Request::ModuleGlobal {
                module: module.0,
                name: name.as_bytes(),
            })?
            .values;
        Ok((DevicePtr(ptr), size))
    }

    /// The names of `module`'s kernels, in the order the server's driver lists them.
    pub fn module_function_names(&self, module: Module) -> Result<Vec<String>> {
        let mut bytes = Vec::new();
        let count = loop {
            let c = self.transport.call(&Request::ModuleFunctionNames {
                module: module.0,
                offset: bytes.len() as u64,
            })?;
            let [total, count, ..] = c.values;
            bytes.extend_from_slice(c.data());
            if bytes.len() as u64 >= total {
                break count;
            }
            if c.data().is_empty() {
                return Err(Error::internal("the server's kernel names ended early"));
            }
        };
        let names: Vec<String> = bytes
            .split(|b| *b == 0)
            .take(count as usize)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        if names.len() as u64 != count {
            return Err(Error::internal(format!(
                "the server named {} kernels of the {count} it counted",
                names.len()
            )));
        }
        Ok(names)
    }

    /// The tiled TMA descriptor (`CUtensorMap`'s 128 bytes) of `map`, encoded in the server's
    /// context, where the address is the device's.
    pub fn tensor_map_encode_tiled(&self, map: &TensorMapTiled) -> Result<[u8; TENSOR_MAP_BYTES]> {
        let c = self
            .transport
            .call(&Request::TensorMapEncodeTiled { map: *map })?;
        c.data().try_into().map_err(|_| {
            Error::internal(format!(
                "the server's tensor map is {} bytes, not {TENSOR_MAP_BYTES}",
                c.data().len()
            ))
        })
    }

    /// The TMA descriptor `map` made to name `address` instead, by the server's driver.
    pub fn tensor_map_replace_address(
        &self,
        map: &[u8; TENSOR_MAP_BYTES],
        address: DevicePtr,
    ) -> Result<[u8; TENSOR_MAP_BYTES]> {
        let c = self.transport.call(&Request::TensorMapReplaceAddress {
            address: address.0,
            map,
        })?;
        c.data().try_into().map_err(|_| {
            Error::internal(format!(
                "the server's tensor map is {} bytes, not {TENSOR_MAP_BYTES}",
                c.data().len()
            ))
        })
    }

    /// The occupancy figure `query` of kernel `f`, per SM of the whole device.
    pub fn occupancy(&self, f: Function, query: OccupancyQuery) -> Result<u64> {
        Ok(self
            .transport
            .call(&Request::Occupancy {
                function: f.0,
                query,
            })?
            .values[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_values_keep_only_those_reported() {
        let data: Vec<u8> = [7i32, -1, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        let v = masked::<3>(0b101, &data, 4).unwrap();
        assert_eq!(v, [Some(7), None, Some(3)]);
        assert!(masked::<4>(0b1, &data, 4).is_err(), "too short");
    }
}
