//! A command as the ring slots it occupies: its header, then its payload cut into
//! [`SLOT_BYTES`] pieces, the last one zero-padded.
//!
//! [`Slots`] makes each slot on demand ([`Slots::slot`]), so a producer writes every slot once,
//! straight into the ring, and the payload never passes through a buffer of its own. A launch's
//! parameters may be scattered in the caller's memory (one pointer per parameter, as
//! `cuLaunchKernel` takes them): a [`Payload`] gathers them as each slot is made.

use crate::protocol::{Command, LaunchSpec, MAX_PARAM_BYTES, Request, SLOT_BYTES};
use crate::status::{Error, Result, Status};

/// The bytes that follow a command's header slot.
pub trait Payload {
    /// Bytes in all.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies bytes `start..start + out.len()` (within `len()`) into `out`.
    fn copy_to(&self, start: usize, out: &mut [u8]);
}

impl Payload for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn copy_to(&self, start: usize, out: &mut [u8]) {
        out.copy_from_slice(&self[start..start + out.len()]);
    }
}

/// A command's slots: the header and `ceil(payload.len() / SLOT_BYTES)` payload slots.
#[derive(Clone, Copy, Debug)]
pub struct Slots<P> {
    header: Command,
    payload: P,
}

impl<'a> Slots<&'a [u8]> {
    /// The slots of `req`, numbered `seq`, in `stream`, with `flags`.
    pub fn of(req: &'a Request<'_>, seq: u64, stream: u64, flags: u16) -> Slots<&'a [u8]> {
        let (header, payload) = req.encode(seq, stream, flags);
        Slots { header, payload }
    }
}

impl<P: Payload> Slots<P> {
    /// A header and a payload as they are (a test that sends what no client would uses this;
    /// the header's `extra_slots` is not made to agree).
    pub fn new(header: Command, payload: P) -> Slots<P> {
        Slots { header, payload }
    }

    /// The slots of `launch`, whose packed parameter bytes its `params` gathers. Fails when
    /// they are more than [`MAX_PARAM_BYTES`].
    pub fn launch(
        launch: LaunchSpec<u64, P>,
        seq: u64,
        stream: u64,
        flags: u16,
    ) -> Result<Slots<P>> {
        // The header depends on the parameters' length only; `Request::encode` stays the one
        // place that lays a launch header out.
        static LENGTH_ONLY: [u8; MAX_PARAM_BYTES] = [0; MAX_PARAM_BYTES];
        let len = launch.params.len();
        let sized = LENGTH_ONLY.get(..len).ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                format!(
                    "the kernel takes {len} bytes of parameters; mps passes at most {MAX_PARAM_BYTES}"
                ),
            )
        })?;
        let (spec, payload) = launch.with_params(sized);
        let req = Request::Launch { spec };
        let (header, _) = req.encode(seq, stream, flags);
        Ok(Slots { header, payload })
    }

    /// Slots in all, the header included.
    pub fn len(&self) -> usize {
        1 + self.payload.len().div_ceil(SLOT_BYTES)
    }

    /// Never: a command has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The header slot.
    pub fn header(&self) -> &Command {
        &self.header
    }

    /// Slot `i` (`i < len()`): the header, then payload pieces.
    pub fn slot(&self, i: usize) -> Command {
        if i == 0 {
            return self.header;
        }
        let start = (i - 1) * SLOT_BYTES;
        let n = SLOT_BYTES.min(self.payload.len() - start);
        let mut slot = [0u8; SLOT_BYTES];
        self.payload.copy_to(start, &mut slot[..n]);
        bytemuck::cast(slot)
    }

    /// Every slot, in order.
    pub fn iter(&self) -> impl Iterator<Item = Command> + '_ {
        (0..self.len()).map(|i| self.slot(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Dim3, flags};

    fn decode_back(slots: &[Command]) -> (Command, Vec<u8>) {
        let payload = slots[1..]
            .iter()
            .flat_map(|s| bytemuck::bytes_of(s).to_vec())
            .collect();
        (slots[0], payload)
    }

    #[test]
    fn a_request_becomes_slots_that_decode_back() {
        let name = b"a_kernel_name_longer_than_one_slot_of_sixty_four_bytes_so_it_spills";
        let req = Request::GetFunction {
            module: 3,
            name: name.as_slice(),
        };
        let slots: Vec<Command> = Slots::of(&req, 9, 0, flags::REPLY).iter().collect();
        assert_eq!(slots.len(), 3);
        assert_eq!(slots[0].extra_slots, 2);
        let (cmd, payload) = decode_back(&slots);
        assert_eq!(Request::decode(&cmd, &payload).unwrap(), req);
        assert_eq!(Slots::of(&Request::Mark, 1, 0, 0).len(), 1);
    }

    /// Parameters scattered in memory, gathered at their offsets (as a client does).
    struct Scattered<'a>(&'a [(usize, &'a [u8])], usize);

    impl Payload for Scattered<'_> {
        fn len(&self) -> usize {
            self.1
        }
        fn copy_to(&self, start: usize, out: &mut [u8]) {
            for (offset, bytes) in self.0 {
                for (k, b) in bytes.iter().enumerate() {
                    if let Some(o) = (offset + k).checked_sub(start).filter(|o| *o < out.len()) {
                        out[o] = *b;
                    }
                }
            }
        }
    }

    #[test]
    fn a_launch_gathers_its_parameters_into_the_slots() {
        let a = 0x1122_3344_5566_7788u64.to_le_bytes();
        let b = [0xabu8; 70];
        let c = 7u32.to_le_bytes();
        let parts: [(usize, &[u8]); 3] = [(0, &a), (8, &b), (80, &c)];
        let mut packed = vec![0u8; 84];
        for (o, bytes) in parts {
            packed[o..o + bytes.len()].copy_from_slice(bytes);
        }
        let grid = Dim3 { x: 4, y: 2, z: 1 };
        let block = Dim3 { x: 128, y: 1, z: 1 };
        let spec = LaunchSpec {
            function: 5,
            grid,
            block,
            shared_mem: 256,
            cluster: None,
            params: Scattered(&parts, 84),
        };
        let slots = Slots::launch(spec, 11, 3, 0).unwrap();
        let all: Vec<Command> = slots.iter().collect();
        let direct: Vec<Command> = Slots::of(
            &Request::Launch {
                spec: LaunchSpec {
                    function: 5,
                    grid,
                    block,
                    shared_mem: 256,
                    cluster: None,
                    params: &packed,
                },
            },
            11,
            3,
            0,
        )
        .iter()
        .collect();
        assert_eq!(all, direct);
        let (cmd, payload) = decode_back(&all);
        assert!(matches!(
            Request::decode(&cmd, &payload).unwrap(),
            Request::Launch { spec } if spec.params == packed.as_slice()
        ));
    }

    #[test]
    fn too_many_parameter_bytes_are_refused() {
        let big = [0u8; MAX_PARAM_BYTES + 1];
        let spec = LaunchSpec {
            function: 1,
            grid: Dim3::default(),
            block: Dim3::default(),
            shared_mem: 0,
            cluster: None,
            params: &big[..],
        };
        let e = Slots::launch(spec, 1, 0, 0).unwrap_err();
        assert_eq!(e.status, Status::Unsupported);
        assert!(e.message.contains("4097 bytes"), "{e}");
    }
}
