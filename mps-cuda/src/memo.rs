//! Each thread's memos of the handles it resolved. A program names the same function and stream
//! launch after launch (the same executable graph and event request after request), and resolving them through the registries takes a read lock, a hash and
//! a reference count for each object, and a context's lock to see that it is active: more than
//! the client takes to put the launch in its ring.
//!
//! A memo keeps only answers that were not refusals, and it is emptied whenever a context,
//! stream, event, function or executable graph is removed, or a context deactivated, anywhere in
//! the process
//! ([`handles_changed`], called by the registries made with `Registry::memoised`): a handle is
//! never reused, so nothing else turns such an answer into a refusal. A memo is then one atomic
//! load and one lookup of a small map of the thread's own.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;

use mps_core::handle_hash::HandleHashing;

use crate::connection::Res;

/// Advanced once each removal of a memoised handle or deactivation of a context is done.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Says that a memoised handle was removed, or a context deactivated: every memo's answers
/// lapse. Called after the change, so that an answer taken from a registry before it carries the
/// epoch before it too (see [`Memo::with`]).
pub(crate) fn handles_changed() {
    EPOCH.fetch_add(1, Ordering::Release);
}

/// The process's epoch now.
#[cfg(test)]
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// What a thread resolved, `K` to `V`, at epoch `epoch`.
#[derive(Debug)]
struct Entries<K, V> {
    epoch: u64,
    map: HashMap<K, V, HandleHashing>,
}

/// One thread's memo (in a `thread_local!`).
#[derive(Debug)]
pub(crate) struct Memo<K, V>(RefCell<Entries<K, V>>);

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Memo(RefCell::new(Entries {
            epoch: 0,
            map: HashMap::default(),
        }))
    }
}

impl<K: Hash + Eq, V> Memo<K, V> {
    /// Runs `body` on the value for `key`: the memo's, else the one `make` resolves, which is kept
    /// if no handle changed while it was resolved. `make` and `body` must not use this memo (a
    /// use from within would find it busy and resolve without it).
    fn with<R>(
        &self,
        epoch: &AtomicU64,
        key: K,
        make: impl FnOnce() -> Res<V>,
        body: impl FnOnce(&V) -> Res<R>,
    ) -> Res<R> {
        let Ok(mut e) = self.0.try_borrow_mut() else {
            return body(&make()?);
        };
        // Read before `make` looks in the registries: a removal that `make` misses advances the
        // epoch after it, and so past this value.
        let now = epoch.load(Ordering::Acquire);
        if e.epoch != now {
            e.map.clear();
            e.epoch = now;
        }
        if let Some(v) = e.map.get(&key) {
            return body(v);
        }
        let v = make()?;
        if epoch.load(Ordering::Acquire) != now {
            return body(&v);
        }
        body(e.map.entry(key).or_insert(v))
    }
}

/// Runs `body` on the value for `key` in the calling thread's memo `memo` (see [`Memo::with`]);
/// without the memo where the thread is exiting and its memos are gone.
pub(crate) fn through<K: Hash + Eq, V, R>(
    memo: &'static LocalKey<Memo<K, V>>,
    key: K,
    make: impl FnOnce() -> Res<V>,
    body: impl FnOnce(&V) -> Res<R>,
) -> Res<R> {
    through_at(&EPOCH, memo, key, make, body)
}

/// As [`through`], with the epoch `epoch` in place of the process's (for tests that run at
/// once).
fn through_at<K: Hash + Eq, V, R>(
    epoch: &AtomicU64,
    memo: &'static LocalKey<Memo<K, V>>,
    key: K,
    make: impl FnOnce() -> Res<V>,
    body: impl FnOnce(&V) -> Res<R>,
) -> Res<R> {
    let mut calls = Some((make, body));
    let memoised = memo.try_with(|m| {
        let (make, body) = calls
            .take()
            .expect("try_with runs its closure at most once");
        m.with(epoch, key, make, body)
    });
    match (memoised, calls) {
        (Ok(r), _) => r,
        (Err(_), Some((make, body))) => body(&make()?),
        (Err(_), None) => unreachable!("try_with failed without running its closure"),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::abi::CUresult;

    thread_local! {
        static SQUARES: Memo<usize, usize> = Memo::default();
    }

    /// The square of `n` through the memo at `epoch`, counting in `made` how often it was worked
    /// out.
    fn square(epoch: &AtomicU64, n: usize, made: &Cell<u32>) -> Res<usize> {
        through_at(
            epoch,
            &SQUARES,
            n,
            || {
                made.set(made.get() + 1);
                Ok(n * n)
            },
            |v| Ok(*v),
        )
    }

    #[test]
    fn an_answer_is_kept_until_handles_change() {
        static EPOCH: AtomicU64 = AtomicU64::new(0);
        let made = Cell::new(0);
        assert_eq!(square(&EPOCH, 3, &made), Ok(9));
        assert_eq!(square(&EPOCH, 3, &made), Ok(9));
        assert_eq!(made.get(), 1, "the second answer came from the memo");
        EPOCH.fetch_add(1, Ordering::Release);
        assert_eq!(square(&EPOCH, 3, &made), Ok(9));
        assert_eq!(made.get(), 2, "a change of handles empties the memo");
    }

    #[test]
    fn a_refusal_is_not_kept() {
        static EPOCH: AtomicU64 = AtomicU64::new(0);
        thread_local! {
            static CHECKED: Memo<usize, ()> = Memo::default();
        }
        let tries = Cell::new(0);
        let check = |ok: bool| {
            through_at(
                &EPOCH,
                &CHECKED,
                7,
                || {
                    tries.set(tries.get() + 1);
                    match ok {
                        true => Ok(()),
                        false => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
                    }
                },
                |_| Ok(()),
            )
        };
        assert_eq!(check(false), Err(CUresult::CUDA_ERROR_INVALID_HANDLE));
        assert_eq!(check(true), Ok(()));
        assert_eq!(
            check(false),
            Ok(()),
            "the answer that was no refusal is kept"
        );
        assert_eq!(tries.get(), 2);
    }

    #[test]
    fn an_answer_resolved_while_handles_changed_is_not_kept() {
        static EPOCH: AtomicU64 = AtomicU64::new(0);
        thread_local! {
            static RACED: Memo<usize, u32> = Memo::default();
        }
        let made = Cell::new(0);
        let get = |change: bool| {
            through_at(
                &EPOCH,
                &RACED,
                1,
                || {
                    made.set(made.get() + 1);
                    if change {
                        // As if another thread removed a handle while this one resolved.
                        EPOCH.fetch_add(1, Ordering::Release);
                    }
                    Ok(made.get())
                },
                |v| Ok(*v),
            )
        };
        assert_eq!(get(true), Ok(1));
        assert_eq!(
            get(false),
            Ok(2),
            "the raced answer was used once, not kept"
        );
        assert_eq!(get(false), Ok(2));
    }

    #[test]
    fn a_use_from_within_resolves_without_the_memo() {
        static EPOCH: AtomicU64 = AtomicU64::new(0);
        let made = Cell::new(0);
        let nested = through_at(
            &EPOCH,
            &SQUARES,
            4,
            || square(&EPOCH, 4, &made),
            |v| Ok(*v + square(&EPOCH, 5, &made)?),
        );
        assert_eq!(nested, Ok(16 + 25));
        assert_eq!(made.get(), 2, "both inner uses worked their answer out");
    }
}
