//! The handshake between a client and its server, over the Unix socket, before any ring is used.
//!
//! The client sends a [`Hello`] (magic, protocol version, the server group it asks for); the
//! server answers with a [`Welcome`]: on success the sizes of the rings and the device, with the
//! two segment descriptors attached; on refusal a status and a message. Later, a
//! [`HostBufferFd`] carries each host buffer's descriptor. Every message is `#[repr(C)]` and
//! [`bytemuck::Pod`]; this module encodes, decodes and checks them and does no I/O, so client,
//! server, daemon and tests share one definition of what a valid peer says.
//!
//! Past 600 lines because of its tests, at the end, which try every refusal of each message.

use bytemuck::{Pod, Zeroable};

use crate::protocol::PROTOCOL_VERSION;
use crate::status::{Error, Result, Status};

/// First word of every handshake message ("MPS!" little-endian).
pub const MAGIC: u32 = u32::from_le_bytes(*b"MPS!");
/// Bytes of a server group name, NUL padding included.
pub const GROUP_BYTES: usize = 32;
/// The group a client joins when it names none.
pub const DEFAULT_GROUP: &str = "default";
/// Bytes of a [`Hello`] that every protocol version shares: magic and version.
pub const HELLO_PREFIX: usize = 8;
/// Bytes of a [`Welcome`]'s message.
pub const WELCOME_MESSAGE_BYTES: usize = 192;

/// Which backend a server runs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU simulator.
    Sim = 0,
    /// A CUDA device.
    Cuda = 1,
}

impl BackendKind {
    /// The backend with this wire value.
    pub fn from_u32(v: u32) -> Option<BackendKind> {
        [BackendKind::Sim, BackendKind::Cuda]
            .into_iter()
            .find(|k| *k as u32 == v)
    }
}

/// Device description sent in the handshake.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct DeviceInfoWire {
    /// Device name, NUL-padded UTF-8.
    pub name: [u8; 64],
    /// Device memory in bytes.
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability, major.
    pub cc_major: u32,
    /// Compute capability, minor.
    pub cc_minor: u32,
    /// A [`BackendKind`] value.
    pub backend: u32,
}

impl DeviceInfoWire {
    /// The description of a device (the name is cut to fit, at a character boundary).
    pub fn new(
        name: &str,
        total_mem: u64,
        sm_count: u32,
        cc: (u32, u32),
        backend: BackendKind,
    ) -> DeviceInfoWire {
        DeviceInfoWire {
            name: put_str(name),
            total_mem,
            sm_count,
            cc_major: cc.0,
            cc_minor: cc.1,
            backend: backend as u32,
        }
    }

    /// The device name.
    pub fn name(&self) -> String {
        get_str(&self.name)
    }
}

/// First message of the handshake, client to server. Its first [`HELLO_PREFIX`] bytes (magic
/// and version) keep their place in every protocol version, so a peer can refuse another
/// version before reading the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Hello {
    /// [`MAGIC`].
    pub magic: u32,
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The device the client asks for: its ordinal on the host (what `mps-server --device`
    /// serves), not an index into the client's `CUDA_VISIBLE_DEVICES`.
    pub device: u32,
    /// [`HELLO_COUNT_DEVICES`], or zero.
    pub flags: u32,
    /// The server group the client asks for (`MPS_GROUP`), NUL-padded.
    pub group: [u8; GROUP_BYTES],
}

const _: () = assert!(std::mem::offset_of!(Hello, device) == HELLO_PREFIX);

/// [`Hello::flags`]: the client asks which devices are served and opens no session; the answer
/// is a [`DeviceList`].
pub const HELLO_COUNT_DEVICES: u32 = 1;

/// Every bit of [`Hello::flags`] this protocol version defines.
pub const HELLO_FLAGS: u32 = HELLO_COUNT_DEVICES;

impl Hello {
    /// The hello of a client of this protocol version asking for `group` on device 0.
    pub fn new(group: &str) -> Result<Hello> {
        Hello::for_device(group, 0)
    }

    /// The hello of a client asking for `group` on device ordinal `device`.
    pub fn for_device(group: &str, device: u32) -> Result<Hello> {
        check_group(group)?;
        Ok(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            device,
            flags: 0,
            group: put_str(group),
        })
    }

    /// The hello that asks which devices are served (answered by a [`DeviceList`]).
    pub fn count_devices(group: &str) -> Result<Hello> {
        Ok(Hello {
            flags: HELLO_COUNT_DEVICES,
            ..Hello::new(group)?
        })
    }

    /// Whether the hello asks which devices are served rather than for a session.
    pub fn asks_device_list(&self) -> bool {
        self.flags & HELLO_COUNT_DEVICES != 0
    }

    /// The hello in `bytes`, exactly one message long; its contents are not checked yet.
    pub fn decode(bytes: &[u8]) -> Result<Hello> {
        decode(bytes, "hello")
    }

    /// Checks magic and version, the part every protocol version shares (a hello of which only
    /// the first [`HELLO_PREFIX`] bytes have been read can be checked). The error is what the
    /// server tells the client.
    pub fn check_version(&self) -> Result<()> {
        if self.magic != MAGIC {
            return Err(Error::new(
                Status::ProtocolMismatch,
                "not an mps client (bad magic in hello)",
            ));
        }
        if self.version != PROTOCOL_VERSION {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!(
                    "client speaks protocol version {}, this server speaks {PROTOCOL_VERSION}; \
                     use a libmpsclient of the server's release",
                    self.version
                ),
            ));
        }
        Ok(())
    }

    /// The group the hello asks for, checked (see [`check_group`]).
    pub fn group(&self) -> Result<String> {
        let group = get_str(&self.group);
        check_group(&group)?;
        Ok(group)
    }

    /// Refuses flag bits this protocol version does not define (a later client's, or junk),
    /// rather than ignore what the client meant by them.
    pub fn check_flags(&self) -> Result<()> {
        let unknown = self.flags & !HELLO_FLAGS;
        if unknown != 0 {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!(
                    "the hello sets flag bits {unknown:#x}, which protocol version \
                     {PROTOCOL_VERSION} does not define; use a libmpsclient of the server's \
                     release"
                ),
            ));
        }
        Ok(())
    }

    /// Checks the whole hello: version, flags, then group; returns the group.
    pub fn check(&self) -> Result<String> {
        self.check_version()?;
        self.check_flags()?;
        self.group()
    }
}

/// Checks a group name: 1 to 31 bytes of letters, digits, `_`, `-` and `.`, not starting with a
/// dot (it names a directory and a log file).
pub fn check_group(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() < GROUP_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_value(format!(
            "group name {name:?} must be 1 to {} letters, digits, '_', '-' or '.', not starting with '.'",
            GROUP_BYTES - 1
        )))
    }
}

/// The sizes a server announces in its [`Welcome`]: the two rings, the staging area and the two
/// segments that hold them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RingSizes {
    /// Slots of the submission ring.
    pub submit_slots: u32,
    /// Slots of the completion ring.
    pub complete_slots: u32,
    /// Bytes of the staging area.
    pub staging_bytes: u64,
    /// Bytes of the client-writable segment.
    pub client_segment_bytes: u64,
    /// Bytes of the server-written segment.
    pub server_segment_bytes: u64,
}

/// The server's answer to [`Hello`]; on success the two segment file descriptors travel with it
/// (client-writable first, then the server's read-only one).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Welcome {
    /// [`MAGIC`].
    pub magic: u32,
    /// The server's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// A [`Status`] value: anything but success means no session, and `message` says why.
    pub status: u32,
    /// The server-assigned client id.
    pub client_id: u32,
    /// Slots of the submission ring.
    pub submit_slots: u32,
    /// Slots of the completion ring.
    pub complete_slots: u32,
    /// Bytes of the staging area.
    pub staging_bytes: u64,
    /// Bytes of the client-writable segment.
    pub client_segment_bytes: u64,
    /// Bytes of the server-written segment.
    pub server_segment_bytes: u64,
    /// The device.
    pub device: DeviceInfoWire,
    /// NUL-padded UTF-8 message (why the handshake failed).
    pub message: [u8; WELCOME_MESSAGE_BYTES],
}

impl Welcome {
    /// A welcome into a session: client `client_id`, with these rings, on this device.
    pub fn accept(client_id: u32, rings: RingSizes, device: DeviceInfoWire) -> Welcome {
        Welcome {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            status: Status::Success as u32,
            client_id,
            submit_slots: rings.submit_slots,
            complete_slots: rings.complete_slots,
            staging_bytes: rings.staging_bytes,
            client_segment_bytes: rings.client_segment_bytes,
            server_segment_bytes: rings.server_segment_bytes,
            device,
            message: [0; WELCOME_MESSAGE_BYTES],
        }
    }

    /// A refusal carrying `err` (its message cut to fit).
    pub fn refuse(err: &Error) -> Welcome {
        Welcome {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            status: err.status as u32,
            message: put_str(&err.message),
            ..Zeroable::zeroed()
        }
    }

    /// The welcome in `bytes`, exactly one message long; its contents are not checked yet.
    pub fn decode(bytes: &[u8]) -> Result<Welcome> {
        decode(bytes, "welcome")
    }

    /// What the client makes of the welcome: `Ok` to a session this library can use, else the
    /// refusal the server sent, or why the answer is not one. `peer` names the socket in
    /// messages.
    pub fn check(&self, peer: &dyn std::fmt::Display) -> Result<()> {
        if self.magic != MAGIC {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!("{peer} is not an mps server socket"),
            ));
        }
        match Status::from_u32(self.status) {
            Some(Status::Success) => {}
            Some(status) => return Err(Error::new(status, get_str(&self.message))),
            None => {
                return Err(Error::new(
                    Status::ProtocolMismatch,
                    format!(
                        "the server at {peer} refused with unknown status {}",
                        self.status
                    ),
                ));
            }
        }
        if self.version != PROTOCOL_VERSION {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!(
                    "the server at {peer} speaks protocol version {}, this library {PROTOCOL_VERSION}",
                    self.version
                ),
            ));
        }
        if BackendKind::from_u32(self.device.backend).is_none() {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!(
                    "the server at {peer} runs backend {}, which this library does not know",
                    self.device.backend
                ),
            ));
        }
        Ok(())
    }

    /// The ring sizes announced.
    pub fn rings(&self) -> RingSizes {
        RingSizes {
            submit_slots: self.submit_slots,
            complete_slots: self.complete_slots,
            staging_bytes: self.staging_bytes,
            client_segment_bytes: self.client_segment_bytes,
            server_segment_bytes: self.server_segment_bytes,
        }
    }

    /// The backend announced ([`BackendKind::Sim`] for an unknown value, which
    /// [`Welcome::check`] refuses).
    pub fn backend(&self) -> BackendKind {
        BackendKind::from_u32(self.device.backend).unwrap_or(BackendKind::Sim)
    }
}

/// Devices a daemon can reach with ordinals at most this.
pub const MAX_DEVICES: u32 = 64;

/// The answer to a hello that asks which devices are served ([`HELLO_COUNT_DEVICES`]): the
/// daemon's devices, or a standalone server's one, as a set of device ordinals. Its magic,
/// version and status are where a [`Welcome`] has them: a refusal (another protocol version, a
/// bad group) comes as a whole welcome, which the status tells apart.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct DeviceList {
    /// [`MAGIC`].
    pub magic: u32,
    /// The server's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// [`Status::Success`]; anything else means a [`Welcome`] that refuses.
    pub status: u32,
    /// Zero.
    pub reserved: u32,
    /// Bit `d` set: device ordinal `d` is served.
    pub served: u64,
}

// A device list and a welcome share their first three words: magic, version and status.
const _: () = assert!(std::mem::offset_of!(DeviceList, status) == 8);
const _: () = assert!(std::mem::offset_of!(Welcome, status) == 8);

impl DeviceList {
    /// The list of these device ordinals (each below [`MAX_DEVICES`]).
    pub fn new(devices: &[u32]) -> Result<DeviceList> {
        let mut served = 0u64;
        for &d in devices {
            if d >= MAX_DEVICES {
                return Err(Error::invalid_value(format!(
                    "device {d}: mps serves device ordinals 0 to {}",
                    MAX_DEVICES - 1
                )));
            }
            served |= 1 << d;
        }
        Ok(DeviceList {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            status: Status::Success as u32,
            reserved: 0,
            served,
        })
    }

    /// The list in `bytes`, checked: one message long, of this protocol version.
    pub fn decode(bytes: &[u8], peer: &dyn std::fmt::Display) -> Result<DeviceList> {
        let list: DeviceList = decode(bytes, "device list")?;
        if list.magic != MAGIC
            || list.version != PROTOCOL_VERSION
            || list.status != Status::Success as u32
        {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!("{peer} answered the device query with something else than a device list"),
            ));
        }
        Ok(list)
    }

    /// The device ordinals served, in increasing order.
    pub fn devices(&self) -> Vec<u32> {
        (0..MAX_DEVICES)
            .filter(|d| self.served & (1 << d) != 0)
            .collect()
    }
}

/// Message on the socket that carries a host buffer's file descriptor, sent right before the
/// reply to [`Opcode::HostAlloc`](crate::protocol::Opcode::HostAlloc).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct HostBufferFd {
    /// [`MAGIC`].
    pub magic: u32,
    /// Zero.
    pub reserved: u32,
    /// The buffer's handle.
    pub handle: u64,
    /// Its size in bytes.
    pub size: u64,
}

impl HostBufferFd {
    /// The message for host buffer `handle` of `size` bytes.
    pub fn new(handle: u64, size: u64) -> HostBufferFd {
        HostBufferFd {
            magic: MAGIC,
            reserved: 0,
            handle,
            size,
        }
    }

    /// Checks that the message announces the buffer the reply named.
    pub fn check(&self, handle: u64, size: u64) -> Result<()> {
        if self.magic != MAGIC || self.handle != handle || self.size != size {
            return Err(Error::new(
                Status::Connection,
                format!(
                    "the server's host buffer message ({:#x}, {} bytes) does not match its reply \
                     ({handle:#x}, {size} bytes)",
                    self.handle, self.size
                ),
            ));
        }
        Ok(())
    }
}

fn decode<T: Pod>(bytes: &[u8], what: &str) -> Result<T> {
    if bytes.len() != size_of::<T>() {
        return Err(Error::new(
            Status::ProtocolMismatch,
            format!(
                "a {what} is {} bytes, not {}: the peer is not mps of this release",
                size_of::<T>(),
                bytes.len()
            ),
        ));
    }
    Ok(bytemuck::pod_read_unaligned(bytes))
}

/// Copies `s` into a NUL-padded fixed-size field, cut at a character boundary.
pub fn put_str<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut len = s.len().min(N - 1);
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    out[..len].copy_from_slice(&s.as_bytes()[..len]);
    out
}

/// The string in a NUL-padded fixed-size field.
pub fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DeviceInfoWire {
        DeviceInfoWire::new("sim", 1 << 30, 4, (9, 0), BackendKind::Sim)
    }

    #[test]
    fn a_hello_round_trips_and_passes_the_servers_checks() {
        let hello = Hello::new("team-a").unwrap();
        let back = Hello::decode(bytemuck::bytes_of(&hello)).unwrap();
        assert_eq!(back, hello);
        assert_eq!(back.check().unwrap(), "team-a");
        assert_eq!(
            Hello::new(DEFAULT_GROUP).unwrap().group().unwrap(),
            "default"
        );
    }

    #[test]
    fn the_server_refuses_another_magic_version_or_group() {
        let good = Hello::new("default").unwrap();
        let e = Hello { magic: 1, ..good }.check().unwrap_err();
        assert_eq!(e.status, Status::ProtocolMismatch);
        assert!(e.message.contains("magic"), "{e}");
        let e = Hello {
            version: PROTOCOL_VERSION + 1,
            ..good
        }
        .check()
        .unwrap_err();
        assert_eq!(e.status, Status::ProtocolMismatch);
        assert!(
            e.message
                .contains(&format!("version {}", PROTOCOL_VERSION + 1)),
            "{e}"
        );
        let e = Hello {
            group: put_str("../etc"),
            ..good
        }
        .check()
        .unwrap_err();
        assert_eq!(e.status, Status::InvalidValue);
        assert!(Hello::new(".hidden").is_err());
        let e = Hello::decode(&[0; 10]).unwrap_err();
        assert_eq!(e.status, Status::ProtocolMismatch);
    }

    #[test]
    fn the_version_check_needs_only_the_shared_prefix() {
        let good = Hello::new("default").unwrap();
        let mut prefix_only: Hello = Zeroable::zeroed();
        bytemuck::bytes_of_mut(&mut prefix_only)[..HELLO_PREFIX]
            .copy_from_slice(&bytemuck::bytes_of(&good)[..HELLO_PREFIX]);
        prefix_only.check_version().unwrap();
    }

    #[test]
    fn the_client_accepts_a_welcome_and_reports_a_refusal() {
        let rings = RingSizes {
            submit_slots: 1024,
            complete_slots: 256,
            staging_bytes: 4 << 20,
            client_segment_bytes: 5 << 20,
            server_segment_bytes: 1 << 20,
        };
        let w = Welcome::accept(7, rings, device());
        let back = Welcome::decode(bytemuck::bytes_of(&w)).unwrap();
        back.check(&"/tmp/mps/mps.sock").unwrap();
        assert_eq!(back.client_id, 7);
        assert_eq!(back.rings(), rings);
        assert_eq!(back.device.name(), "sim");
        assert_eq!(back.backend(), BackendKind::Sim);

        let refused = Welcome::refuse(&Error::new(Status::PermissionDenied, "uid 5 elsewhere"));
        let e = refused.check(&"sock").unwrap_err();
        assert_eq!(e.status, Status::PermissionDenied);
        assert_eq!(e.message, "uid 5 elsewhere");
    }

    #[test]
    fn the_client_refuses_a_welcome_it_cannot_use() {
        let w = Welcome::accept(1, RingSizes::default(), device());
        let e = Welcome { magic: 0, ..w }.check(&"x.sock").unwrap_err();
        assert!(e.message.contains("x.sock is not an mps server"), "{e}");
        let e = Welcome { version: 1, ..w }.check(&"x.sock").unwrap_err();
        assert_eq!(e.status, Status::ProtocolMismatch);
        assert!(e.message.contains("protocol version 1"), "{e}");
        let e = Welcome { status: 9999, ..w }.check(&"x.sock").unwrap_err();
        assert!(e.message.contains("unknown status 9999"), "{e}");
        let mut d = device();
        d.backend = 7;
        let e = Welcome { device: d, ..w }.check(&"x.sock").unwrap_err();
        assert!(e.message.contains("backend 7"), "{e}");
    }

    #[test]
    fn a_device_query_and_its_answer_round_trip() {
        let q = Hello::count_devices("default").unwrap();
        assert!(q.asks_device_list());
        assert!(!Hello::for_device("default", 1).unwrap().asks_device_list());
        assert_eq!(Hello::for_device("default", 3).unwrap().device, 3);
        let list = DeviceList::new(&[3, 0, 63]).unwrap();
        let back = DeviceList::decode(bytemuck::bytes_of(&list), &"sock").unwrap();
        assert_eq!(back.devices(), vec![0, 3, 63]);
        assert!(DeviceList::new(&[64]).is_err());
        let e = DeviceList::decode(&[0; 24], &"sock").unwrap_err();
        assert!(e.message.contains("sock answered"), "{e}");
    }

    #[test]
    fn a_host_buffer_message_must_match_its_reply() {
        let m = HostBufferFd::new(0x11, 8192);
        m.check(0x11, 8192).unwrap();
        assert_eq!(m.check(0x12, 8192).unwrap_err().status, Status::Connection);
        assert!(m.check(0x11, 4096).is_err());
        assert!(HostBufferFd { magic: 0, ..m }.check(0x11, 8192).is_err());
    }

    #[test]
    fn group_names_are_checked() {
        for good in ["default", "critical", "team-a_1.x"] {
            check_group(good).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "x".repeat(32).as_str(), "sp ace", "ü"] {
            assert!(check_group(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fixed_strings_round_trip_and_cut() {
        let f: [u8; 8] = put_str("hello world");
        assert_eq!(get_str(&f), "hello w");
        let f: [u8; 8] = put_str("ab");
        assert_eq!(get_str(&f), "ab");
        let f: [u8; 4] = put_str("aé€");
        assert_eq!(get_str(&f), "aé");
    }
}
