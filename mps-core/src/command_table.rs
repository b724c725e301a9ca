//! One declaration per command.
//!
//! [`commands!`](crate::command_table::commands) takes the protocol's one table of commands
//! (in [`crate::protocol`]) and derives from it everything that used to be written out beside
//! it: the [`Opcode`] wire enum, what each opcode may carry (stream order, a payload) and whether
//! it may wait for the device, the typed request enum, and its encoder and decoder. Each field
//! names the first argument word it occupies; its type's [`Arg`] implementation lays it out
//! there, so the layout of a field kind (a host reference, a launch) is written once whatever
//! command carries it.
//!
//! A command's entry reads
//!
//! ```text
//! /// What it does and what it replies.
//! Name = opcode => "name" [ordered payload waits runs] { field: Type = word if check, .. },
//! ```
//!
//! where the flags, the fields and the per-field `if` checks are each optional (a check that
//! needs several words belongs to a type of them: a fill's value must fit its element). `ordered`: the command runs in stream order (and may carry `MARK`);
//! `payload`: it may carry continuation slots; `waits`: handling it may wait for the device (see
//! the server's session workers); `runs`: it may join a batched run (the server's launch
//! batching), so that a client may leave it unrung while the server holds a run. An entry may
//! end with `| Other = opcode => "other" by f`: a second opcode for the same request, which
//! `f(&request)` chooses when encoding (a launch in clusters is a launch laid out otherwise).

use crate::protocol::{Opcode, SLOT_BYTES};
use crate::status::{Error, Result};

/// What a field's decoder knows of the command it comes from, for its checks and messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Source<'p> {
    /// The command's sequence number.
    pub(crate) seq: u64,
    /// Its opcode.
    pub(crate) opcode: Opcode,
    /// The bytes of its continuation slots.
    pub(crate) payload: &'p [u8],
}

impl<'p> Source<'p> {
    /// An invalid-value error that names the command and `field`.
    #[cold]
    pub(crate) fn error(&self, field: &str, what: impl std::fmt::Display) -> Error {
        Error::invalid_value(format!(
            "command {} ({}): {field} {what}",
            self.seq,
            self.opcode.name(),
        ))
    }

    /// The error of a word that does not fit its field.
    #[cold]
    pub(crate) fn out_of_range(&self, field: &str, value: u64, bits: u32) -> Error {
        self.error(
            field,
            format_args!("out of range ({value} does not fit in {bits} bits)"),
        )
    }

    /// The first `len` payload bytes, which must be at most `max` and fill exactly the slots
    /// the command claims; `what` names them in an error.
    #[inline]
    pub(crate) fn payload(&self, what: &str, len: u64, max: usize) -> Result<&'p [u8]> {
        if len > max as u64 || len as usize > self.payload.len() {
            return Err(self.error(
                what,
                format_args!("of {len} bytes is longer than {max} bytes or than its payload"),
            ));
        }
        let len = len as usize;
        if self.payload.len() != len.div_ceil(SLOT_BYTES) * SLOT_BYTES {
            return Err(self.error(
                what,
                format_args!(
                    "of {len} bytes comes with {} payload slots",
                    self.payload.len() / SLOT_BYTES
                ),
            ));
        }
        Ok(&self.payload[..len])
    }
}

/// How a field travels in a command's argument words (and payload).
pub(crate) trait Arg<'p>: Sized {
    /// Writes the field into `args`, which start at its first word; a field with payload bytes
    /// points `payload` at them.
    fn put<'s>(&'s self, args: &mut [u64], payload: &mut &'s [u8]);
    /// Reads the field `field` from `args`, which start at its first word; anything a
    /// well-behaved client never writes is an error.
    fn take(args: &[u64], from: &Source<'p>, field: &'static str) -> Result<Self>;
    /// The opcode a request with this field travels under, of `declared` and the entry's
    /// second opcode (a launch in clusters has its own).
    #[inline]
    fn opcode(&self, declared: Opcode) -> Opcode {
        declared
    }
}

impl Arg<'_> for u64 {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[0] = *self;
    }
    #[inline]
    fn take(args: &[u64], _: &Source<'_>, _: &'static str) -> Result<u64> {
        Ok(args[0])
    }
}

impl Arg<'_> for u32 {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[0] = u64::from(*self);
    }
    #[inline]
    fn take(args: &[u64], from: &Source<'_>, field: &'static str) -> Result<u32> {
        u32::try_from(args[0]).map_err(|_| from.out_of_range(field, args[0], 32))
    }
}

/// Travels as its 32 bits.
impl Arg<'_> for i32 {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[0] = u64::from(*self as u32);
    }
    #[inline]
    fn take(args: &[u64], from: &Source<'_>, field: &'static str) -> Result<i32> {
        u32::take(args, from, field).map(|v| v as i32)
    }
}

impl Arg<'_> for u8 {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[0] = u64::from(*self);
    }
    #[inline]
    fn take(args: &[u64], from: &Source<'_>, field: &'static str) -> Result<u8> {
        u8::try_from(args[0]).map_err(|_| from.out_of_range(field, args[0], 8))
    }
}

impl Arg<'_> for bool {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[0] = u64::from(*self);
    }
    #[inline]
    fn take(args: &[u64], from: &Source<'_>, field: &'static str) -> Result<bool> {
        match args[0] {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(from.error(field, format_args!("is {n}, not 0 or 1"))),
        }
    }
}

/// A name (of a kernel, of a global): its length in the word, its bytes in the payload.
impl<'p> Arg<'p> for &'p [u8] {
    #[inline]
    fn put<'s>(&'s self, args: &mut [u64], payload: &mut &'s [u8]) {
        args[0] = self.len() as u64;
        *payload = self;
    }
    #[inline]
    fn take(args: &[u64], from: &Source<'p>, field: &'static str) -> Result<&'p [u8]> {
        from.payload(field, args[0], crate::protocol::MAX_NAME_BYTES)
    }
}

/// Declares the protocol's commands from one table; see the [module](self) for the syntax.
macro_rules! commands {
    (
        $(#[$ometa:meta])*
        $ovis:vis enum $opcode:ident;
        $(#[$rmeta:meta])*
        $rvis:vis enum $request:ident<$lt:lifetime> {
            $(
                $(#[doc = $doc:literal])*
                $variant:ident = $value:literal => $label:literal [$($flag:ident)*]
                $({ $($field:ident : $fty:ty = $word:literal $(if $check:path)?),+ $(,)? })?
                $(| $(#[doc = $adoc:literal])* $alias:ident = $avalue:literal => $alabel:literal)?
                ,
            )+
        }
    ) => {
        $crate::wire_enum! {
            $(#[$ometa])*
            $ovis enum $opcode: u16, from_u16 {
                $(
                    $(#[doc = $doc])*
                    $variant = $value => $label,
                    $(
                        $(#[doc = $adoc])*
                        $alias = $avalue => $alabel,
                    )?
                )+
            }
        }

        impl $opcode {
            /// Whether commands of this kind run in stream order (and so may carry
            /// [`flags::MARK`]).
            $ovis const fn is_stream_ordered(self) -> bool {
                match self {
                    $(
                        $opcode::$variant $(| $opcode::$alias)? =>
                            $crate::command_table::commands!(@has ordered $($flag)*),
                    )+
                }
            }

            /// Whether commands of this kind may carry continuation slots.
            $ovis const fn takes_payload(self) -> bool {
                match self {
                    $(
                        $opcode::$variant $(| $opcode::$alias)? =>
                            $crate::command_table::commands!(@has payload $($flag)*),
                    )+
                }
            }

            /// Whether handling a command of this kind may wait for the device (or for the
            /// client), rather than only queue work.
            $ovis const fn may_wait(self) -> bool {
                match self {
                    $(
                        $opcode::$variant $(| $opcode::$alias)? =>
                            $crate::command_table::commands!(@has waits $($flag)*),
                    )+
                }
            }

            /// Whether commands of this kind may join a batched run on the server (with
            /// neither `MARK` nor `REPLY`): what a client need not ring for while the server
            /// holds a run that it may continue (see `Channel::ring_from` in mps-ipc).
            $ovis const fn may_join_run(self) -> bool {
                match self {
                    $(
                        $opcode::$variant $(| $opcode::$alias)? =>
                            $crate::command_table::commands!(@has runs $($flag)*),
                    )+
                }
            }
        }

        $(#[$rmeta])*
        $rvis enum $request<$lt> {
            $(
                $(#[doc = $doc])*
                $variant $({ $($field: $fty),+ })?,
            )+
        }

        impl $request<'_> {
            /// The opcode of this request.
            $rvis fn opcode(&self) -> $opcode {
                match self {
                    $(
                        $request::$variant $({ $($field),+ })? => {
                            #[allow(unused_mut)]
                            let mut op = $opcode::$variant;
                            $($( op = $crate::command_table::Arg::opcode($field, op); )+)?
                            op
                        }
                    )+
                }
            }

            /// The header slot and the payload bytes (to be written into the following slots)
            /// of this request.
            $rvis fn encode(&self, seq: u64, stream: u64, flags: u16) -> (Command, &[u8]) {
                use $crate::command_table::Arg as _;
                let mut args = [0u64; 5];
                let mut payload: &[u8] = &[];
                let opcode = match self {
                    $(
                        $request::$variant $({ $($field),+ })? => {
                            #[allow(unused_mut)]
                            let mut op = $opcode::$variant;
                            $($(
                                $field.put(&mut args[$word..], &mut payload);
                                op = $crate::command_table::Arg::opcode($field, op);
                            )+)?
                            op
                        }
                    )+
                };
                let cmd = Command {
                    opcode: opcode as u16,
                    flags,
                    extra_slots: payload.len().div_ceil(SLOT_BYTES) as u16,
                    reserved: 0,
                    seq,
                    stream,
                    args,
                };
                (cmd, payload)
            }

            /// Decodes a command copied out of shared memory. `payload` holds the bytes of its
            /// `extra_slots` continuation slots. Anything a well-behaved client never sends is
            /// an error.
            $rvis fn decode<$lt>(cmd: &Command, payload: &$lt [u8]) -> Result<$request<$lt>> {
                let op = $crate::command_table::check_header(cmd, payload.len())?;
                #[allow(unused_variables)]
                let a = &cmd.args;
                #[allow(unused_variables)]
                let from = $crate::command_table::Source {
                    seq: cmd.seq,
                    opcode: op,
                    payload,
                };
                let req = match op {
                    $(
                        $opcode::$variant $(| $opcode::$alias)? => {
                            $($(
                                let $field = <$fty as $crate::command_table::Arg>::take(
                                    &a[$word..],
                                    &from,
                                    stringify!($field),
                                )?;
                                $( $check(&from, stringify!($field), &$field)?; )?
                            )+)?
                            $request::$variant $({ $($field),+ })?
                        }
                    )+
                };
                Ok(req)
            }
        }
    };
    (@has ordered ordered $($rest:ident)*) => { true };
    (@has payload payload $($rest:ident)*) => { true };
    (@has waits waits $($rest:ident)*) => { true };
    (@has runs runs $($rest:ident)*) => { true };
    (@has $want:ident $other:ident $($rest:ident)*) => {
        $crate::command_table::commands!(@has $want $($rest)*)
    };
    (@has $want:ident) => { false };
}

pub(crate) use commands;

/// The checks every command's header passes before its fields are read: a known opcode, no
/// undefined flag or reserved bits, `MARK` only on stream-ordered work, a payload only where
/// the opcode takes one, and `payload_len` bytes for the slots the command claims.
#[inline]
pub(crate) fn check_header(cmd: &crate::protocol::Command, payload_len: usize) -> Result<Opcode> {
    use crate::protocol::flags;
    let op = Opcode::from_u16(cmd.opcode).ok_or_else(|| {
        Error::invalid_value(format!(
            "command {} has unknown opcode {}",
            cmd.seq, cmd.opcode
        ))
    })?;
    if cmd.flags & !flags::ALL != 0 || cmd.reserved != 0 {
        return Err(Error::invalid_value(format!(
            "command {} ({op:?}) has undefined flag or reserved bits set",
            cmd.seq
        )));
    }
    if cmd.flags & flags::MARK != 0 && !op.is_stream_ordered() {
        return Err(Error::invalid_value(format!(
            "command {} ({op:?}) is not stream-ordered and cannot carry MARK",
            cmd.seq
        )));
    }
    if payload_len != cmd.extra_slots as usize * SLOT_BYTES {
        return Err(Error::internal("payload length does not match extra_slots"));
    }
    if !op.takes_payload() && cmd.extra_slots != 0 {
        return Err(Error::invalid_value(format!(
            "command {} ({op:?}) takes no payload but has {} extra slots",
            cmd.seq, cmd.extra_slots
        )));
    }
    Ok(op)
}
