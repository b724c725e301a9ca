//! Which SMs each client's kernels may run on: shares (a cap, as NVIDIA MPS's active thread
//! percentage) and reservations (SMs no other client of the server uses).
//!
//! The device is cut into *units*, its smallest SM partitions (on a GPU, the groups green
//! contexts are built from: 8 SMs on Hopper, plus a remainder). Each reservation takes whole
//! units, disjoint from everyone else's: a reservation made earlier keeps its units; a new one
//! takes the first free units, in client order. The remaining units are the pool, and every
//! other client gets the first units of the pool that cover its share. The whole device, with no reservation in force,
//! needs no partition at all.

use mps_core::{Error, Result, Status};

/// What one client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmRequest {
    /// The client.
    pub client: u32,
    /// Share of the device's SMs, 1..=100 percent (the lower of the client's and the server's).
    pub share: u32,
    /// SMs reserved for it alone, percent (0: none).
    pub reserve: u32,
    /// The units its reservation held in the last plan, if it had one then: a reservation keeps
    /// its units while they still cover it, so that other clients coming and going do not move
    /// it.
    pub current: Option<Placement>,
}

/// Where a client's kernels run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Anywhere on the device.
    Whole,
    /// On these units (indices into the device's unit list, ascending).
    Units(Vec<usize>),
}

/// A client's placement and the SMs it spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The client.
    pub client: u32,
    /// Where its kernels run.
    pub placement: Placement,
    /// SMs of that placement.
    pub sms: u32,
}

/// SMs that cover `percent` of `total` (at least one).
pub fn sms_for(total: u32, percent: u32) -> u32 {
    (total as u64 * percent as u64)
        .div_ceil(100)
        .clamp(1, total as u64) as u32
}

/// Takes units from the front of `free` until they cover `need` SMs.
fn take(units: &[u32], free: &mut Vec<usize>, need: u32) -> Vec<usize> {
    let mut got = 0;
    let n = free
        .iter()
        .take_while(|&&u| {
            let more = got < need;
            got += units[u];
            more
        })
        .count();
    free.drain(..n).collect()
}

fn span(units: &[u32], set: &[usize]) -> u32 {
    set.iter().map(|&u| units[u]).sum()
}

/// The units a reservation already holds, if they still cover it.
fn kept(units: &[u32], total: u32, r: &SmRequest) -> Option<Vec<usize>> {
    match &r.current {
        Some(Placement::Units(set)) if span(units, set) >= sms_for(total, r.reserve) => {
            Some(set.clone())
        }
        _ => None,
    }
}

/// The units of the part of the device from `from` to `to` percent of its SMs, for a group
/// confined to it (`mps-server --sm-range`): each unit belongs to the part its first SM is in,
/// so that parts that meet, such as 0-25 and 25-100, share no unit and leave none out. Fails
/// when the part holds no whole unit.
pub fn range(units: &[u32], from: u32, to: u32) -> Result<Vec<usize>> {
    let total: u64 = units.iter().map(|&u| u as u64).sum();
    let mut start = 0u64;
    let mut set = Vec::new();
    for (i, &u) in units.iter().enumerate() {
        if start * 100 >= from as u64 * total && start * 100 < to as u64 * total {
            set.push(i);
        }
        start += u as u64;
    }
    if set.is_empty() || from >= to {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "{from}-{to}% of this device's {total} SMs holds no whole SM partition (units of \
                 {:?} SMs); give the group a larger share or reservation",
                units.first().copied().unwrap_or(0)
            ),
        ));
    }
    Ok(set)
}

/// Places every client. Fails, placing no one, when the reservations would leave no unit for
/// the clients that share.
pub fn plan(units: &[u32], requests: &[SmRequest]) -> Result<Vec<Assignment>> {
    let total: u32 = units.iter().sum();
    let reserving: Vec<&SmRequest> = requests.iter().filter(|r| r.reserve > 0).collect();
    if !reserving.is_empty() && units.len() == 1 {
        return Err(Error::new(
            Status::Unsupported,
            "this device's SMs cannot be partitioned, so none can be reserved (the server's log \
             says why)",
        ));
    }
    // Reservations that keep their units go first, so that new ones cannot take them.
    let mut free: Vec<usize> = (0..units.len()).collect();
    let mut held: Vec<Option<Vec<usize>>> = Vec::with_capacity(reserving.len());
    for r in &reserving {
        let keep = kept(units, total, r).filter(|set| set.iter().all(|u| free.contains(u)));
        if let Some(set) = &keep {
            free.retain(|u| !set.contains(u));
        }
        held.push(keep);
    }
    let mut out = Vec::with_capacity(requests.len());
    for (r, keep) in reserving.iter().zip(held) {
        let set = match keep {
            Some(set) => set,
            None => take(units, &mut free, sms_for(total, r.reserve)),
        };
        if free.is_empty() {
            return Err(Error::new(
                Status::QuotaExceeded,
                format!(
                    "reserving {}% of the SMs would leave none for the other clients of the \
                     server; ask for less",
                    r.reserve
                ),
            ));
        }
        out.push(Assignment {
            client: r.client,
            sms: span(units, &set),
            placement: Placement::Units(set),
        });
    }
    let pool = free;
    for r in requests.iter().filter(|r| r.reserve == 0) {
        let set = take(units, &mut pool.clone(), sms_for(total, r.share));
        out.push(if set.len() == units.len() {
            Assignment {
                client: r.client,
                placement: Placement::Whole,
                sms: total,
            }
        } else {
            Assignment {
                client: r.client,
                sms: span(units, &set),
                placement: Placement::Units(set),
            }
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200 as green contexts cut it: 15 groups of 8 SMs and a remainder of 12.
    fn h200() -> Vec<u32> {
        let mut u = vec![8; 15];
        u.push(12);
        u
    }

    fn req(client: u32, share: u32, reserve: u32) -> SmRequest {
        SmRequest {
            client,
            share,
            reserve,
            current: None,
        }
    }

    #[test]
    fn full_shares_without_reservations_need_no_partition() {
        let a = plan(&h200(), &[req(1, 100, 0), req(2, 100, 0)]).unwrap();
        assert!(
            a.iter()
                .all(|a| a.placement == Placement::Whole && a.sms == 132)
        );
    }

    #[test]
    fn a_share_rounds_up_to_whole_units() {
        let a = plan(&h200(), &[req(1, 50, 0), req(2, 25, 0)]).unwrap();
        // 50% of 132 is 66 SMs: nine units of 8 (72); 25% is 33: five units (40).
        assert_eq!(a[0].sms, 72);
        assert_eq!(a[1].sms, 40);
        assert_eq!(a[0].placement, Placement::Units((0..9).collect()));
    }

    #[test]
    fn reservations_are_disjoint_from_everyone_else() {
        let a = plan(&h200(), &[req(1, 100, 25), req(2, 100, 0), req(3, 100, 10)]).unwrap();
        let units = |c: u32| match &a.iter().find(|x| x.client == c).unwrap().placement {
            Placement::Units(u) => u.clone(),
            Placement::Whole => panic!("client {c} was not partitioned"),
        };
        let (r1, shared, r3) = (units(1), units(2), units(3));
        assert_eq!(a[0].sms, 40, "25% of 132 SMs rounds up to five units");
        for u in &shared {
            assert!(!r1.contains(u) && !r3.contains(u));
        }
        assert!(r1.iter().all(|u| !r3.contains(u)));
        assert_eq!(
            r1.len() + r3.len() + shared.len(),
            16,
            "the shared client gets the whole pool"
        );
    }

    #[test]
    fn ranges_that_meet_share_no_unit_and_leave_none_out() {
        let a = range(&h200(), 0, 25).unwrap();
        let b = range(&h200(), 25, 60).unwrap();
        let c = range(&h200(), 60, 100).unwrap();
        assert_eq!(
            a,
            (0..5).collect::<Vec<_>>(),
            "units starting before 33 SMs"
        );
        let mut all: Vec<usize> = a.iter().chain(&b).chain(&c).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
        assert_eq!(
            range(&[1; 16], 50, 100).unwrap(),
            (8..16).collect::<Vec<_>>()
        );
        let e = range(&h200(), 99, 100).unwrap_err();
        assert!(e.message.contains("99-100%"), "{}", e.message);
        assert!(range(&[132], 0, 50).is_ok() && range(&[132], 50, 100).is_err());
    }

    #[test]
    fn a_reservation_must_leave_a_pool() {
        let e = plan(&h200(), &[req(1, 100, 100)]).unwrap_err();
        assert_eq!(e.status, Status::QuotaExceeded);
        assert!(plan(&h200(), &[req(1, 100, 90)]).is_ok());
        let e = plan(&[132], &[req(1, 100, 10)]).unwrap_err();
        assert_eq!(e.status, Status::Unsupported);
    }

    #[test]
    fn an_unpartitionable_device_runs_every_share_on_the_whole_device() {
        let a = plan(&[132], &[req(1, 25, 0)]).unwrap();
        assert_eq!(a[0].placement, Placement::Whole);
    }

    #[test]
    fn single_sm_units_give_exact_counts() {
        let units = vec![1; 8];
        let a = plan(&units, &[req(1, 100, 50), req(2, 25, 0), req(3, 100, 0)]).unwrap();
        assert_eq!(
            a.iter().map(|a| a.sms).collect::<Vec<_>>(),
            vec![4, 2, 4],
            "reserved half, a quarter of the device, and the rest of the pool"
        );
        assert_eq!(sms_for(8, 1), 1);
    }

    #[test]
    fn a_reservation_keeps_its_units_when_an_earlier_one_goes() {
        let first = plan(&h200(), &[req(1, 100, 25), req(2, 100, 25), req(3, 100, 0)]).unwrap();
        let of = |a: &[Assignment], c: u32| a.iter().find(|x| x.client == c).unwrap().clone();
        let second = of(&first, 2).placement;
        // Client 1 leaves; client 2 stays where it was, and a newcomer gets the freed units.
        let again = plan(
            &h200(),
            &[
                SmRequest {
                    current: Some(second.clone()),
                    ..req(2, 100, 25)
                },
                req(3, 100, 0),
                req(4, 100, 10),
            ],
        )
        .unwrap();
        assert_eq!(of(&again, 2).placement, second);
        assert_eq!(of(&again, 4).placement, Placement::Units(vec![0, 1]));
        // A placement that no longer covers the reservation is not kept.
        let grown = plan(
            &h200(),
            &[SmRequest {
                current: Some(Placement::Units(vec![14])),
                ..req(5, 100, 25)
            }],
        )
        .unwrap();
        assert_eq!(grown[0].sms, 40);
    }
}
