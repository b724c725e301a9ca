//! How the legacy default stream and a context's blocking streams are ordered with each other
//! (see `stream`'s documentation): the waits, through events, that mps inserts only where work
//! of both kinds meets.

use std::collections::HashMap;

use crate::connection::{Connection, Event, Res, Stream};

/// Where the legacy default stream and a context's blocking streams stand with each other.
#[derive(Debug, Default)]
pub(crate) struct LegacyOrder {
    /// How many times work has been put in the legacy stream.
    epoch: u64,
    /// An event recorded in the legacy stream, at legacy work number `event_epoch`.
    event: Option<Event>,
    event_epoch: u64,
    /// The context's blocking streams, by handle.
    blocking: HashMap<usize, Blocking>,
}

#[derive(Debug)]
struct Blocking {
    stream: Stream,
    /// It has work the legacy stream has not waited for.
    dirty: bool,
    /// The legacy work number it has waited for.
    seen: u64,
    /// An event for the legacy stream to wait on.
    event: Option<Event>,
}

fn ensure_event(conn: &Connection, slot: &mut Option<Event>) -> Res<Event> {
    match *slot {
        Some(e) => Ok(e),
        None => {
            let e = conn.event_create()?;
            *slot = Some(e);
            Ok(e)
        }
    }
}

impl LegacyOrder {
    /// Blocking stream `handle` (mps stream `stream`) was made in the context.
    pub(crate) fn add_blocking(&mut self, handle: usize, stream: Stream) {
        let b = Blocking {
            stream,
            dirty: false,
            seen: 0,
            event: None,
        };
        self.blocking.insert(handle, b);
    }

    /// Blocking stream `handle` is destroyed: the event made for it, if any, to destroy.
    pub(crate) fn remove_blocking(&mut self, handle: usize) -> Option<Event> {
        self.blocking.remove(&handle).and_then(|b| b.event)
    }

    /// The events it made, for the context's teardown.
    pub(crate) fn events(self) -> Vec<Event> {
        let own = self.blocking.into_values().filter_map(|b| b.event);
        self.event.into_iter().chain(own).collect()
    }

    /// Inserts the waits that work about to go into `stream` needs: the legacy stream
    /// `legacy` (`blocking` `None`) or blocking stream `blocking`. For a synchronisation (`work`
    /// false) the legacy stream takes in the blocking streams' work as work would, but nothing
    /// new is counted as submitted.
    pub(crate) fn order(
        &mut self,
        conn: &Connection,
        legacy: Stream,
        stream: Stream,
        blocking: Option<usize>,
        work: bool,
    ) -> Res<()> {
        match blocking {
            None => {
                for b in self.blocking.values_mut().filter(|b| b.dirty) {
                    let e = ensure_event(conn, &mut b.event)?;
                    conn.event_record(e, b.stream)?;
                    conn.stream_wait_event(legacy, e)?;
                    b.dirty = false;
                }
                if work {
                    self.epoch += 1;
                }
            }
            Some(h) => {
                let epoch = self.epoch;
                let seen = self.blocking.get(&h).map_or(epoch, |b| b.seen);
                if seen < epoch {
                    let e = ensure_event(conn, &mut self.event)?;
                    if self.event_epoch < epoch {
                        conn.event_record(e, legacy)?;
                        self.event_epoch = epoch;
                    }
                    conn.stream_wait_event(stream, e)?;
                }
                if let Some(b) = self.blocking.get_mut(&h) {
                    b.seen = epoch;
                    b.dirty = true;
                }
            }
        }
        Ok(())
    }
}
