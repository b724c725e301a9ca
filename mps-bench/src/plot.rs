//! The throughput plot: work per second against client count for each mode, one panel per
//! workload, drawn as SVG by plotters (text stays text, so the GPU machine needs no fonts and the
//! docs embed the file as it is). A point where fewer clients completed than were asked is
//! labelled with both counts.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

/// One measured point: clients asked, clients that completed, and the figure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Point {
    pub(crate) asked: usize,
    pub(crate) completed: usize,
    pub(crate) value: f64,
}

/// Per panel (workload) its unit and, per mode, its points.
pub(crate) type Series = BTreeMap<String, (String, BTreeMap<String, Vec<Point>>)>;

const PANEL_W: u32 = 420;
const H: u32 = 400;

/// Colour of each mode's line.
fn colour(mode: &str) -> RGBColor {
    match mode {
        "native" => RGBColor(140, 140, 140),
        "nvidia-mps" => RGBColor(40, 150, 60),
        "one-context" => RGBColor(220, 130, 30),
        "mps-transparent" => RGBColor(150, 60, 180),
        "mps-batched" => RGBColor(0, 170, 200),
        _ => RGBColor(30, 90, 200),
    }
}

/// Draws `series` into an SVG document, the modes in the order given.
pub(crate) fn svg(series: &Series, modes: &[&str]) -> Result<String, String> {
    let mut text = String::new();
    let panels = series.len().max(1) as u32;
    {
        let root = SVGBackend::with_string(&mut text, (PANEL_W * panels, H)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let areas = root.split_evenly((1, panels as usize));
        for (area, (workload, (unit, by_mode))) in areas.iter().zip(series) {
            panel(area, workload, unit, by_mode, modes).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(text)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn panel(
    area: &Area<'_>,
    workload: &str,
    unit: &str,
    by_mode: &BTreeMap<String, Vec<Point>>,
    modes: &[&str],
) -> Result<(), Box<dyn std::error::Error>> {
    let points = by_mode.values().flatten();
    let x_max = points.clone().map(|p| p.asked).max().unwrap_or(1).max(2) as f64;
    let y_max = points.map(|p| p.value).fold(0.0, f64::max).max(1.0) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(workload, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d((1.0..x_max).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("clients")
        .y_desc(unit)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| match y.abs() {
            v if v >= 1e6 => format!("{:.1}M", y / 1e6),
            v if v >= 1e4 => format!("{:.0}k", y / 1e3),
            _ => format!("{y:.0}"),
        })
        .draw()?;
    for mode in modes {
        let Some(points) = by_mode.get(*mode) else {
            continue;
        };
        let c = colour(mode);
        let xy: Vec<(f64, f64)> = points.iter().map(|p| (p.asked as f64, p.value)).collect();
        chart
            .draw_series(LineSeries::new(xy.clone(), c.stroke_width(2)))?
            .label(*mode)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(xy.iter().map(|p| Circle::new(*p, 3, c.filled())))?;
        chart.draw_series(points.iter().filter(|p| p.completed < p.asked).map(|p| {
            Text::new(
                format!("{}/{}", p.completed, p.asked),
                (p.asked as f64, p.value),
                ("sans-serif", 12).into_font().color(&c),
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Writes the plot of `series` to `out`.
pub(crate) fn write(series: &Series, modes: &[&str], out: &Path) -> Result<(), String> {
    let text = svg(series, modes)?;
    std::fs::write(out, text).map_err(|e| format!("cannot write the plot {}: {e}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_of_fewer_completed_clients_than_asked_is_labelled() {
        let point = |asked, completed, value| Point {
            asked,
            completed,
            value,
        };
        let by_mode = [
            (
                "nvidia-mps".to_string(),
                vec![point(8, 8, 3e5), point(64, 48, 5e5)],
            ),
            (
                "mps".to_string(),
                vec![point(8, 8, 3e5), point(64, 64, 5.5e5)],
            ),
        ];
        let series: Series = [(
            "spin".to_string(),
            ("kernels/s".to_string(), by_mode.into()),
        )]
        .into();
        let svg = svg(&series, &["nvidia-mps", "mps"]).unwrap();
        assert!(svg.contains("48/64"), "{svg}");
        assert!(!svg.contains("64/64"), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 4, "{svg}");
    }
}
