//! Which devices a client sees: the devices its daemon (or standalone server) serves, filtered
//! and ordered by `CUDA_VISIBLE_DEVICES` as CUDA does, so that a client's device `i` is the
//! `i`-th visible one and the hello names the device's ordinal on the host.

use std::os::unix::net::UnixStream;
use std::path::Path;

use mps_core::handshake::{DeviceList, Hello, Welcome};
use mps_core::{Error, Result, Status};
use mps_ipc::socket;

/// The devices this process sees, as host ordinals in the order it numbers them: `served` (in
/// increasing order), or, when `visible` (`CUDA_VISIBLE_DEVICES`) is set, the ordinals it lists,
/// as CUDA reads it: the list ends at the first entry that is not a served device (or repeats
/// one), so "1,7,0" with devices 0 and 1 served is device 1 alone. An empty list hides every
/// device. Device UUIDs are refused: mps knows devices by ordinal only.
pub(crate) fn visible(visible: Option<&str>, served: &[u32]) -> Result<Vec<u32>> {
    let Some(list) = visible else {
        return Ok(served.to_vec());
    };
    let mut seen = Vec::new();
    for entry in list.split(',').map(str::trim) {
        if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
            return Err(Error::invalid_value(format!(
                "CUDA_VISIBLE_DEVICES names device {entry:?} by UUID; mps knows devices by \
                 ordinal only: use their indices (nvidia-smi -L lists both)"
            )));
        }
        match entry.parse::<u32>() {
            Ok(d) if served.contains(&d) && !seen.contains(&d) => seen.push(d),
            _ => break,
        }
    }
    Ok(seen)
}

/// The devices this process sees through the server socket in `dir` (see [`visible`]).
pub(crate) fn visible_devices(dir: &Path, group: &str) -> Result<Vec<u32>> {
    let served = served(dir, group)?;
    let env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    visible(env.as_deref(), &served)
}

/// Asks the daemon or server at `dir` which device ordinals it serves.
fn served(dir: &Path, group: &str) -> Result<Vec<u32>> {
    let path = dir.join(socket::SOCKET_NAME);
    let sock = UnixStream::connect(&path).map_err(|e| {
        Error::new(
            Status::Connection,
            format!(
                "cannot reach an mps server at {}: {e}; is mps-control or mps-server running \
                 with this pipe directory?",
                path.display()
            ),
        )
    })?;
    let io = |e: std::io::Error| {
        Error::new(
            Status::Connection,
            format!("asking {} for its devices: {e}", path.display()),
        )
    };
    let hello = Hello::count_devices(group)
        .map_err(|e| Error::invalid_value(format!("MPS_GROUP: {}", e.message)))?;
    // Nothing goes to a socket that neither this user nor root serves.
    socket::check_server(&sock, &path)?;
    // A server that refuses this connection at once (a limit on connections) may close it
    // before the hello is sent: its refusal is still there to read, and says more than the
    // broken pipe.
    let sent = socket::send(&sock, bytemuck::bytes_of(&hello), &[]);
    let mut list: DeviceList = bytemuck::Zeroable::zeroed();
    socket::recv(&sock, bytemuck::bytes_of_mut(&mut list), 0)
        .map_err(|e| io(sent.err().unwrap_or(e)))?;
    if list.status != Status::Success as u32 {
        // A refusal: the rest of a welcome follows.
        let mut welcome: Welcome = bytemuck::Zeroable::zeroed();
        let bytes = bytemuck::bytes_of_mut(&mut welcome);
        bytes[..size_of::<DeviceList>()].copy_from_slice(bytemuck::bytes_of(&list));
        socket::recv(&sock, &mut bytes[size_of::<DeviceList>()..], 0).map_err(io)?;
        welcome.check(&path.display())?;
    }
    Ok(DeviceList::decode(bytemuck::bytes_of(&list), &path.display())?.devices())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_variable_every_served_device_is_visible() {
        assert_eq!(visible(None, &[0, 1]).unwrap(), vec![0, 1]);
        assert_eq!(visible(None, &[2]).unwrap(), vec![2]);
    }

    #[test]
    fn the_variable_orders_and_remaps_as_cuda_does() {
        // Visible device 0 is host device 1.
        assert_eq!(visible(Some("1"), &[0, 1]).unwrap(), vec![1]);
        assert_eq!(visible(Some("1,0"), &[0, 1]).unwrap(), vec![1, 0]);
        assert_eq!(visible(Some(" 0 , 1 "), &[0, 1]).unwrap(), vec![0, 1]);
        // An invalid entry ends the list; what follows it is not seen.
        assert_eq!(visible(Some("1,7,0"), &[0, 1]).unwrap(), vec![1]);
        assert_eq!(visible(Some("0,x,1"), &[0, 1]).unwrap(), vec![0]);
        assert_eq!(visible(Some("0,0,1"), &[0, 1]).unwrap(), vec![0]);
        assert_eq!(visible(Some("-1"), &[0, 1]).unwrap(), Vec::<u32>::new());
        assert_eq!(visible(Some(""), &[0, 1]).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn device_uuids_are_refused_with_a_reason() {
        let e = visible(Some("GPU-8e6e1a1c-0000-0000-0000-000000000000"), &[0]).unwrap_err();
        assert_eq!(e.status, Status::InvalidValue);
        assert!(e.message.contains("by UUID"), "{e}");
    }
}
