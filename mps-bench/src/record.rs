//! The records of a run (bench.json), the markdown table of them and the series of the plot.
//!
//! Every record says how many clients were asked for and how many completed; a ratio between two
//! modes is given only where the same number completed in both, and otherwise says why not. A
//! run of several rounds has a record per round: the table shows each figure's median over the
//! rounds and each ratio as the median of the rounds' own ratios, with their range, since two
//! modes of one round ran closest together in time.

use std::collections::BTreeMap;

use crate::plot;

/// One measurement: `completed` of `asked` clients of one mode ran `workload` together.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Record {
    pub(crate) mode: String,
    /// Which round of the run, from 0 (absent in records of runs before rounds: 0).
    #[serde(default)]
    pub(crate) round: usize,
    pub(crate) workload: String,
    pub(crate) asked: usize,
    /// Clients that completed correctly: the figures are of these alone.
    pub(crate) completed: usize,
    pub(crate) values: BTreeMap<String, f64>,
    pub(crate) note: String,
}

impl Record {
    fn counts(&self) -> String {
        format!("{}/{}", self.completed, self.asked)
    }
}

/// The middle value of `v` (the mean of the two middle ones for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// One mode's records of a workload and client count, a record per round.
struct Rounds<'a>(Vec<&'a Record>);

impl<'a> Rounds<'a> {
    /// The records of `mode` running `workload` with `asked` clients.
    fn of(records: &'a [Record], mode: &str, workload: &str, asked: usize) -> Rounds<'a> {
        let of = |r: &&Record| r.mode == mode && r.workload == workload && r.asked == asked;
        Rounds(records.iter().filter(of).collect())
    }

    /// The round in which the fewest clients completed.
    fn fewest(&self) -> Option<&'a Record> {
        self.0.iter().copied().min_by_key(|r| r.completed)
    }

    /// The fewest clients that completed in any round, of those asked.
    fn counts(&self) -> String {
        self.fewest().map_or("—".into(), Record::counts)
    }

    fn median(&self, key: &str) -> Option<f64> {
        median(
            self.0
                .iter()
                .filter_map(|r| r.values.get(key).copied())
                .collect(),
        )
    }

    fn round(&self, round: usize) -> Option<&'a Record> {
        self.0.iter().copied().find(|r| r.round == round)
    }
}

/// The ratio of `a`'s figure `key` to `b`'s: per round in which both ran, their median, and
/// with more than one round their range; or why there is none.
fn ratio(a: &Rounds, b: &Rounds, key: &str) -> String {
    let mut ratios = Vec::new();
    for x in &a.0 {
        let Some(y) = b.round(x.round) else { continue };
        if x.completed != y.completed {
            return format!("not comparable ({} vs {})", x.counts(), y.counts());
        }
        if let (Some(p), Some(q)) = (x.values.get(key), y.values.get(key))
            && *q != 0.0
        {
            ratios.push(p / q);
        }
    }
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    match (ratios.len(), median(ratios)) {
        (_, None) => "—".into(),
        (1, Some(m)) => format!("{m:.2}x"),
        (_, Some(m)) => format!("{m:.2}x ({lo:.2}–{hi:.2})"),
    }
}

/// The table: per workload and client count, a row of completed/asked and one per figure, a
/// column per mode, mps against each other mode, mps-transparent against mps (the cost of
/// the transparent library), mps against mps-unbatched (the gain of launch batching) and
/// mps-unbatched against NVIDIA MPS, and mps-batched against mps and NVIDIA MPS (records of
/// runs from when batching was off by default).
pub(crate) fn table(records: &[Record], modes: &[&str]) -> String {
    let mut rows: Vec<(String, usize, String)> = Vec::new();
    for r in records {
        for k in std::iter::once("completed").chain(r.values.keys().map(String::as_str)) {
            let key = (r.workload.clone(), r.asked, k.to_string());
            if !rows.contains(&key) {
                rows.push(key);
            }
        }
    }
    let find = |m: &str, w: &str, n: usize| Rounds::of(records, m, w, n);
    let variants = ["mps", "mps-transparent", "mps-batched"];
    let mut against: Vec<(&str, &str)> = Vec::new();
    if modes.contains(&"mps") {
        let others = modes.iter().filter(|m| !variants.contains(m));
        against.extend(others.map(|m| ("mps", *m)));
        for v in ["mps-transparent", "mps-batched"] {
            if modes.contains(&v) {
                against.push((v, "mps"));
            }
        }
    }
    for v in ["mps-unbatched", "mps-batched"] {
        if modes.contains(&v) && modes.contains(&"nvidia-mps") {
            against.push((v, "nvidia-mps"));
        }
    }
    let mut s = format!("| workload | N | figure | {} |", modes.join(" | "));
    for (a, b) in &against {
        s += &format!(" {a}/{b} |");
    }
    s += &format!("\n|{}\n", " --- |".repeat(3 + modes.len() + against.len()));
    for (w, n, k) in rows {
        let mut line = format!("| {w} | {n} | {k} |");
        for m in modes {
            let rounds = find(m, &w, n);
            let cell = match k.as_str() {
                "completed" => rounds.counts(),
                k => rounds.median(k).map_or("—".into(), |v| format!("{v:.4}")),
            };
            line += &format!(" {cell} |");
        }
        for (a, b) in &against {
            let cell = match k.as_str() {
                "completed" => String::new(),
                k => ratio(&find(a, &w, n), &find(b, &w, n), k),
            };
            line += &format!(" {cell} |");
        }
        s += &line;
        s.push('\n');
    }
    s
}

/// The workloads the plot draws, each with its figure and unit.
const PLOTTED: [(&str, &str, &str); 3] = [
    ("spin", "kernels_per_s", "kernels/s"),
    ("tiny", "kernels_per_s", "kernels/s"),
    ("infer", "requests_per_s", "requests/s"),
];

/// Throughput against client count, per plotted workload and mode (medians over the rounds).
pub(crate) fn series(records: &[Record]) -> plot::Series {
    let mut s = plot::Series::new();
    for (workload, key, unit) in PLOTTED {
        let mut seen: Vec<(&str, usize)> = Vec::new();
        for r in records.iter().filter(|r| r.workload == workload) {
            if seen.contains(&(r.mode.as_str(), r.asked)) {
                continue;
            }
            seen.push((r.mode.as_str(), r.asked));
            let rounds = Rounds::of(records, &r.mode, workload, r.asked);
            let (Some(value), Some(fewest)) = (rounds.median(key), rounds.fewest()) else {
                continue;
            };
            s.entry(workload.to_string())
                .or_insert_with(|| (unit.to_string(), BTreeMap::new()))
                .1
                .entry(r.mode.clone())
                .or_default()
                .push(plot::Point {
                    asked: r.asked,
                    completed: fewest.completed,
                    value,
                });
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(mode: &str, asked: usize, completed: usize, kps: f64) -> Record {
        Record {
            mode: mode.into(),
            round: 0,
            workload: "spin".into(),
            asked,
            completed,
            values: [("kernels_per_s".to_string(), kps)].into(),
            note: String::new(),
        }
    }

    #[test]
    fn a_ratio_of_unequal_client_counts_says_it_is_not_comparable() {
        let records = [
            record("nvidia-mps", 64, 48, 500.0),
            record("mps", 64, 64, 550.0),
            record("nvidia-mps", 8, 8, 300.0),
            record("mps", 8, 8, 330.0),
        ];
        let t = table(&records, &["nvidia-mps", "mps"]);
        assert!(
            t.contains("| spin | 64 | completed | 48/64 | 64/64 |"),
            "{t}"
        );
        assert!(
            t.contains("| spin | 64 | kernels_per_s | 500.0000 | 550.0000 | not comparable (64/64 vs 48/64) |"),
            "{t}"
        );
        assert!(
            t.contains("| spin | 8 | kernels_per_s | 300.0000 | 330.0000 | 1.10x |"),
            "{t}"
        );
    }

    #[test]
    fn mps_transparent_is_set_against_mps() {
        let records = [
            record("nvidia-mps", 8, 8, 300.0),
            record("mps", 8, 8, 400.0),
            record("mps-transparent", 8, 8, 380.0),
        ];
        let t = table(&records, &["nvidia-mps", "mps", "mps-transparent"]);
        assert!(
            t.starts_with(
                "| workload | N | figure | nvidia-mps | mps | mps-transparent | \
                 mps/nvidia-mps | mps-transparent/mps |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| spin | 8 | kernels_per_s | 300.0000 | 400.0000 | 380.0000 | 1.33x | 0.95x |"
            ),
            "{t}"
        );
    }

    #[test]
    fn mps_batched_is_set_against_mps_and_nvidia_mps() {
        let records = [
            record("nvidia-mps", 8, 8, 300.0),
            record("mps", 8, 8, 240.0),
            record("mps-batched", 8, 8, 360.0),
        ];
        let t = table(&records, &["nvidia-mps", "mps", "mps-batched"]);
        assert!(
            t.starts_with(
                "| workload | N | figure | nvidia-mps | mps | mps-batched | \
                 mps/nvidia-mps | mps-batched/mps | mps-batched/nvidia-mps |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| spin | 8 | kernels_per_s | 300.0000 | 240.0000 | 360.0000 | 0.80x | 1.50x | \
                 1.20x |"
            ),
            "{t}"
        );
    }

    #[test]
    fn rounds_give_medians_and_the_median_of_each_rounds_ratio() {
        let round = |round, mode, kps| Record {
            round,
            ..record(mode, 1, 1, kps)
        };
        // The machine drifts: round 1 is slow for both modes, which the ratios of each
        // round see through and a ratio of the medians (440 / 400 = 1.10x) would not.
        let records = [
            round(0, "mps", 400.0),
            round(0, "mps-transparent", 392.0),
            round(1, "mps", 300.0),
            round(1, "mps-transparent", 297.0),
            round(2, "mps", 500.0),
            round(2, "mps-transparent", 440.0),
        ];
        let t = table(&records, &["mps", "mps-transparent"]);
        assert!(
            t.contains("| spin | 1 | kernels_per_s | 400.0000 | 392.0000 | 0.98x (0.88–0.99) |"),
            "{t}"
        );
        let points = &series(&records)["spin"].1["mps"];
        assert_eq!(points.len(), 1, "one point per client count: {points:?}");
        assert_eq!(points[0].value, 400.0);
    }

    #[test]
    fn a_round_with_fewer_clients_completed_makes_the_ratio_not_comparable() {
        let records = [
            record("mps", 8, 8, 400.0),
            record("nvidia-mps", 8, 8, 380.0),
            Record {
                round: 1,
                ..record("mps", 8, 7, 350.0)
            },
            Record {
                round: 1,
                ..record("nvidia-mps", 8, 8, 360.0)
            },
        ];
        let t = table(&records, &["nvidia-mps", "mps"]);
        assert!(t.contains("| spin | 8 | completed | 8/8 | 7/8 |"), "{t}");
        assert!(t.contains("not comparable (7/8 vs 8/8)"), "{t}");
    }

    #[test]
    fn mps_is_set_against_mps_unbatched_and_that_against_nvidia_mps() {
        let records = [
            record("nvidia-mps", 8, 8, 300.0),
            record("mps", 8, 8, 600.0),
            record("mps-unbatched", 8, 8, 240.0),
        ];
        let t = table(&records, &["nvidia-mps", "mps", "mps-unbatched"]);
        assert!(
            t.starts_with(
                "| workload | N | figure | nvidia-mps | mps | mps-unbatched | \
                 mps/nvidia-mps | mps/mps-unbatched | mps-unbatched/nvidia-mps |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| spin | 8 | kernels_per_s | 300.0000 | 600.0000 | 240.0000 | 2.00x | 2.50x | \
                 0.80x |"
            ),
            "{t}"
        );
    }
}
