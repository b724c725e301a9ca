//! Messages between the daemon and a server, on the socket the server inherits: a header, its
//! payload, and at most one file descriptor. Requests and answers are typed values, encoded
//! here and nowhere else (JSON, so that a mismatch between daemon and server reads as an error,
//! not as wrong numbers).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use bytemuck::{Pod, Zeroable};
use mps_core::protocol::MAGIC;
use mps_core::{Error, Result, Status};
use mps_ipc::socket;
use serde::{Deserialize, Serialize};

use crate::registry::{ClientStats, Registry};

/// A client's hello, with its connection attached (daemon to server).
pub(crate) const HANDOFF: u32 = 1;
/// A [`ServerRequest`] (daemon to server).
pub(crate) const REQUEST: u32 = 2;
/// The answer to a request (server to daemon).
pub(crate) const REPLY: u32 = 3;
/// The server's device context failed: its payload says why (server to daemon, unasked).
pub(crate) const FAILED: u32 = 4;
/// A client handed over after the context failed, given back with its hello to be routed to a
/// fresh server (server to daemon).
pub(crate) const RETURN: u32 = 5;
/// The server could not start: its payload says why (server to daemon, unasked, before it
/// exits).
pub(crate) const UNSTARTED: u32 = 6;
const MAX_PAYLOAD: usize = 1 << 20;

/// What the daemon asks of a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ServerRequest {
    /// Every live client's [`ClientStats`].
    Clients,
    /// Disconnect every connection of this client process.
    Terminate { client_pid: i32 },
    /// Priority of new clients.
    SetPriority(u32),
    /// SM share of every client, percent.
    SetShare(u32),
    /// The SM share in force, answered with [`ServerAnswer::Percent`].
    GetShare,
    /// Ceiling on the SMs clients may reserve in all, percent.
    SetMaxReserve(u32),
    /// The reservation ceiling, answered with [`ServerAnswer::Percent`].
    GetMaxReserve,
    /// Device memory per new client, bytes (0: no limit).
    SetMemLimit(u64),
    /// Device memory of all the clients together, bytes (0: no limit): the group's.
    SetMaxDeviceBytes(u64),
    /// What all the clients hold together, answered with [`ServerAnswer::Totals`].
    Totals,
}

/// A server's answer to a [`ServerRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ServerAnswer {
    /// One per live connection.
    Clients(Vec<ClientStats>),
    /// How many connections the client process had.
    Terminated { connections: u32 },
    /// A percentage asked for.
    Percent(u32),
    /// A setting was taken.
    Done,
    /// What all the server's clients hold together, against the server's limits.
    Totals {
        /// Device memory they hold.
        device_bytes: u64,
        /// The limit on it (0: none).
        max_device_bytes: u64,
        /// Connections served.
        connections: u32,
        /// SMs the server's clients run on, all of them together.
        sms: u32,
    },
}

/// An answer as it crosses: the error keeps its status.
type Reply = std::result::Result<ServerAnswer, (u32, String)>;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Header {
    magic: u32,
    kind: u32,
    len: u32,
    reserved: u32,
}

pub(crate) fn send(
    s: &UnixStream,
    kind: u32,
    payload: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let h = Header {
        magic: MAGIC,
        kind,
        len: payload.len() as u32,
        reserved: 0,
    };
    let mut msg = bytemuck::bytes_of(&h).to_vec();
    msg.extend_from_slice(payload);
    socket::send(s, &msg, fd.as_slice())
}

pub(crate) fn recv(s: &UnixStream) -> io::Result<(u32, Vec<u8>, Option<OwnedFd>)> {
    let mut h = Header::zeroed();
    let fd = socket::recv(s, bytemuck::bytes_of_mut(&mut h), 1)?
        .into_iter()
        .next();
    if h.magic != MAGIC || h.len as usize > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed control message",
        ));
    }
    let mut payload = vec![0u8; h.len as usize];
    socket::recv(s, &mut payload, 0)?;
    Ok((h.kind, payload, fd))
}

/// What a server sends its daemon goes through here: the answers of the thread serving the
/// daemon and the unasked news of a failed context must not interleave on the one socket (a
/// large answer may cross in several pieces).
pub(crate) fn send_to_daemon(
    s: &UnixStream,
    kind: u32,
    payload: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    send(s, kind, payload, fd)
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // These types hold only numbers, strings and lists: serializing them cannot fail.
    serde_json::to_vec(value).expect("a wire message serializes")
}

/// Sends `request` on `s`; its answer comes back as a [`REPLY`] to be read with
/// [`decode_reply`].
pub(crate) fn send_request(s: &UnixStream, request: &ServerRequest) -> Result<()> {
    send(s, REQUEST, &encode(request), None)
        .map_err(|e| Error::new(Status::Connection, format!("cannot send a request: {e}")))
}

/// The answer a [`REPLY`]'s payload carries.
pub(crate) fn decode_reply(payload: &[u8]) -> Result<ServerAnswer> {
    match serde_json::from_slice::<Reply>(payload) {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err((status, message))) => Err(Error::new(
            Status::from_u32(status).unwrap_or(Status::Internal),
            message,
        )),
        Err(e) => Err(Error::internal(format!(
            "an answer that does not decode ({e}); are the daemon and the server of one \
             version?"
        ))),
    }
}

/// The server's side: decodes a request's payload, has `registry` answer it, and encodes
/// the reply.
pub(crate) fn answer(registry: &Registry, payload: &[u8]) -> Vec<u8> {
    let reply: Reply = serde_json::from_slice::<ServerRequest>(payload)
        .map_err(|e| {
            Error::invalid_value(format!(
                "a request that does not decode ({e}); are the daemon and the server of one \
                 version?"
            ))
        })
        .and_then(|request| registry.answer(request))
        .map_err(|e| (e.status as u32, e.message));
    encode(&reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Defaults;

    fn registry() -> Registry {
        let defaults = Defaults {
            mem_limit: 0,
            priority: 0,
            sm_share: 40,
            max_sm_reserve: 50,
        };
        Registry::new(defaults, vec![16], Box::new(|_| Ok(())))
    }

    fn round_trip(registry: &Registry, request: &ServerRequest) -> Reply {
        serde_json::from_slice(&answer(registry, &encode(request))).unwrap()
    }

    #[test]
    fn answers_and_errors_cross_as_the_values_they_were() {
        let r = registry();
        assert_eq!(
            round_trip(&r, &ServerRequest::GetShare),
            Ok(ServerAnswer::Percent(40))
        );
        assert_eq!(
            round_trip(&r, &ServerRequest::SetMaxReserve(60)),
            Ok(ServerAnswer::Done)
        );
        assert_eq!(
            round_trip(&r, &ServerRequest::GetMaxReserve),
            Ok(ServerAnswer::Percent(60))
        );
        assert_eq!(
            round_trip(&r, &ServerRequest::Clients),
            Ok(ServerAnswer::Clients(vec![]))
        );
        // An error keeps its status and its message.
        let Err((status, message)) = round_trip(&r, &ServerRequest::Terminate { client_pid: 77 })
        else {
            panic!("terminating a client that is not there succeeded");
        };
        assert_eq!(Status::from_u32(status), Some(Status::NotFound));
        assert!(message.contains("no client with pid 77"), "{message}");
        // The server checks ranges itself.
        let Err((status, _)) = round_trip(&r, &ServerRequest::SetShare(0)) else {
            panic!("a share of 0% was taken");
        };
        assert_eq!(Status::from_u32(status), Some(Status::InvalidValue));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Whatever bytes arrive, the server answers with a reply that decodes, never a panic.
        #[test]
        fn any_payload_gets_a_reply(payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let reply = answer(&registry(), &payload);
            proptest::prop_assert!(serde_json::from_slice::<Reply>(&reply).is_ok());
        }

        /// Every request, whatever its numbers, is answered or refused with a status, and a
        /// share or ceiling that was taken reads back as set.
        #[test]
        fn any_request_is_answered_or_refused(kind in 0u8..10, n in proptest::prelude::any::<u64>()) {
            let r = registry();
            let p = n as u32;
            let request = match kind {
                0 => ServerRequest::Clients,
                1 => ServerRequest::Terminate { client_pid: n as i32 },
                2 => ServerRequest::SetPriority(p),
                3 => ServerRequest::SetShare(p),
                4 => ServerRequest::GetShare,
                5 => ServerRequest::SetMaxReserve(p),
                6 => ServerRequest::GetMaxReserve,
                7 => ServerRequest::SetMaxDeviceBytes(n),
                8 => ServerRequest::Totals,
                _ => ServerRequest::SetMemLimit(n),
            };
            let taken = round_trip(&r, &request).is_ok();
            if taken && let ServerRequest::SetShare(p) = request {
                proptest::prop_assert_eq!(round_trip(&r, &ServerRequest::GetShare), Ok(ServerAnswer::Percent(p)));
            }
            if taken && let ServerRequest::SetMaxDeviceBytes(n) = request {
                let totals = round_trip(&r, &ServerRequest::Totals);
                let set = matches!(totals, Ok(ServerAnswer::Totals { max_device_bytes, .. }) if max_device_bytes == n);
                proptest::prop_assert!(set, "the limit set reads back");
            }
            if taken && let ServerRequest::SetMaxReserve(p) = request {
                proptest::prop_assert_eq!(round_trip(&r, &ServerRequest::GetMaxReserve), Ok(ServerAnswer::Percent(p)));
            }
        }
    }

    #[test]
    fn a_request_that_does_not_decode_is_refused() {
        let reply: Reply = serde_json::from_slice(&answer(&registry(), b"clients")).unwrap();
        let (status, message) = reply.unwrap_err();
        assert_eq!(Status::from_u32(status), Some(Status::InvalidValue));
        assert!(message.contains("does not decode"), "{message}");
    }

    #[test]
    fn stats_survive_the_trip() {
        let stats = ClientStats {
            id: 3,
            pid: -1,
            uid: u32::MAX,
            mem: u64::MAX,
            mem_limit: 1 << 40,
            priority: 1,
            sms: 132,
            sm_share: 25,
            sm_reserve: 10,
            launches: 1,
            copies: 2,
            bytes_copied: 3,
            gpu_ms: 4,
            batch_hits: 5,
            batch_misses: 6,
            batch_graphs: 7,
            batch_cache_entries: 8,
            batch_cache_bytes: 9,
        };
        let answer = ServerAnswer::Clients(vec![stats]);
        let back: ServerAnswer = serde_json::from_slice(&encode(&answer)).unwrap();
        assert_eq!(back, answer);
    }
}
