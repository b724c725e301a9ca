//! The records of a run (bench.json), the markdown table of them and the series of the plot.
//!
//! Every record says how many clients were asked for and how many completed; a ratio between two
//! modes is given only where the same number completed in both, and otherwise says why not.

use std::collections::BTreeMap;

use crate::plot;

/// One measurement: `completed` of `asked` clients of one mode ran `workload` together.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Record {
    pub(crate) mode: String,
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

/// The ratio of `a`'s figure `key` to `b`'s, or why there is none.
fn ratio(a: Option<&Record>, b: Option<&Record>, key: &str) -> String {
    let (Some(a), Some(b)) = (a, b) else {
        return "—".into();
    };
    if a.completed != b.completed {
        return format!("not comparable ({} vs {})", a.counts(), b.counts());
    }
    match (a.values.get(key), b.values.get(key)) {
        (Some(x), Some(y)) if *y != 0.0 => format!("{:.2}x", x / y),
        _ => "—".into(),
    }
}

/// The table: per workload and client count, a row of completed/asked and one per figure, a
/// column per mode, mps against each other mode, mps-transparent against mps (the cost of
/// the transparent library), and mps-batched against mps and NVIDIA MPS (the gain of launch
/// batching).
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
    let find = |m: &str, w: &str, n: usize| {
        records
            .iter()
            .find(|r| r.mode == m && r.workload == w && r.asked == n)
    };
    let mut against: Vec<(&str, &str)> = Vec::new();
    if modes.contains(&"mps") {
        let others = modes
            .iter()
            .filter(|m| !["mps", "mps-transparent", "mps-batched"].contains(m));
        against.extend(others.map(|m| ("mps", *m)));
        if modes.contains(&"mps-transparent") {
            against.push(("mps-transparent", "mps"));
        }
        if modes.contains(&"mps-batched") {
            against.push(("mps-batched", "mps"));
        }
    }
    if modes.contains(&"mps-batched") && modes.contains(&"nvidia-mps") {
        against.push(("mps-batched", "nvidia-mps"));
    }
    let mut s = format!("| workload | N | figure | {} |", modes.join(" | "));
    for (a, b) in &against {
        s += &format!(" {a}/{b} |");
    }
    s += &format!("\n|{}\n", " --- |".repeat(3 + modes.len() + against.len()));
    for (w, n, k) in rows {
        let mut line = format!("| {w} | {n} | {k} |");
        for m in modes {
            let cell = match (find(m, &w, n), k.as_str()) {
                (Some(r), "completed") => r.counts(),
                (Some(r), k) => r.values.get(k).map_or("—".into(), |v| format!("{v:.4}")),
                (None, _) => "—".into(),
            };
            line += &format!(" {cell} |");
        }
        for (a, b) in &against {
            let cell = match k.as_str() {
                "completed" => String::new(),
                k => ratio(find(a, &w, n), find(b, &w, n), k),
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

/// Throughput against client count, per plotted workload and mode.
pub(crate) fn series(records: &[Record]) -> plot::Series {
    let mut s = plot::Series::new();
    for (workload, key, unit) in PLOTTED {
        for r in records.iter().filter(|r| r.workload == workload) {
            if let Some(v) = r.values.get(key) {
                s.entry(workload.to_string())
                    .or_insert_with(|| (unit.to_string(), BTreeMap::new()))
                    .1
                    .entry(r.mode.clone())
                    .or_default()
                    .push(plot::Point {
                        asked: r.asked,
                        completed: r.completed,
                        value: *v,
                    });
            }
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
}
