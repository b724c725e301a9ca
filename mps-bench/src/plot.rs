//! The throughput plot: kernels/s against client count for each mode, one panel per workload,
//! drawn into a PNG (a small raster with a built-in 5x7 font, so the benchmark needs no fonts or
//! plotting libraries on the GPU machine).

use std::collections::BTreeMap;
use std::path::Path;

const W: usize = 1000;
const H: usize = 460;
const WHITE: [u8; 3] = [255, 255, 255];
const BLACK: [u8; 3] = [30, 30, 30];
const GRID: [u8; 3] = [225, 225, 225];

/// Colour of each mode's line.
fn colour(mode: &str) -> [u8; 3] {
    match mode {
        "native" => [140, 140, 140],
        "nvidia-mps" => [40, 150, 60],
        "one-context" => [220, 130, 30],
        _ => [30, 90, 200],
    }
}

struct Canvas {
    px: Vec<[u8; 3]>,
}

impl Canvas {
    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            self.px[y as usize * W + x as usize] = c;
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: i64) {
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).max(1);
        for i in 0..=steps {
            let x = x0 + (x1 - x0) * i / steps;
            let y = y0 + (y1 - y0) * i / steps;
            for dx in 0..thick {
                for dy in 0..thick {
                    self.set(x + dx - thick / 2, y + dy - thick / 2, c);
                }
            }
        }
    }

    fn text(&mut self, x: i64, y: i64, s: &str, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let rows = glyph(ch);
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        let (px, py) = (x + i as i64 * 7 + col as i64, y + r as i64);
                        self.set(px, py, c);
                    }
                }
            }
        }
    }
}

/// 5x7 glyphs for the characters the plot uses (others draw as a box).
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_lowercase() {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        'a' => [0x00, 0x00, 0x0e, 0x01, 0x0f, 0x11, 0x0f],
        'c' => [0x00, 0x00, 0x0e, 0x10, 0x10, 0x11, 0x0e],
        'd' => [0x01, 0x01, 0x0d, 0x13, 0x11, 0x11, 0x0f],
        'e' => [0x00, 0x00, 0x0e, 0x11, 0x1f, 0x10, 0x0e],
        'h' => [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11],
        'i' => [0x04, 0x00, 0x0c, 0x04, 0x04, 0x04, 0x0e],
        'k' => [0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12],
        'l' => [0x0c, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'm' => [0x00, 0x00, 0x1a, 0x15, 0x15, 0x11, 0x11],
        'n' => [0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11],
        'o' => [0x00, 0x00, 0x0e, 0x11, 0x11, 0x11, 0x0e],
        'p' => [0x00, 0x00, 0x1e, 0x11, 0x1e, 0x10, 0x10],
        'r' => [0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10],
        's' => [0x00, 0x00, 0x0e, 0x10, 0x0e, 0x01, 0x1e],
        't' => [0x08, 0x08, 0x1c, 0x08, 0x08, 0x09, 0x06],
        'u' => [0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0d],
        'v' => [0x00, 0x00, 0x11, 0x11, 0x11, 0x0a, 0x04],
        'x' => [0x00, 0x00, 0x11, 0x0a, 0x04, 0x0a, 0x11],
        'y' => [0x00, 0x00, 0x11, 0x11, 0x0f, 0x01, 0x0e],
        '/' => [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00],
        '-' => [0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00],
        '=' => [0x00, 0x00, 0x1f, 0x00, 0x1f, 0x00, 0x00],
        ':' => [0x00, 0x0c, 0x0c, 0x00, 0x0c, 0x0c, 0x00],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c],
        ',' => [0x00, 0x00, 0x00, 0x00, 0x0c, 0x04, 0x08],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        ' ' => [0; 7],
        _ => [0x1f, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1f],
    }
}

/// `series[workload][mode]` = (clients, kernels/s) points.
pub(crate) type Series = BTreeMap<String, BTreeMap<String, Vec<(usize, f64)>>>;

/// Draws one panel per workload and writes the PNG.
pub(crate) fn write(series: &Series, modes: &[&str], out: &Path) -> std::io::Result<()> {
    let mut c = Canvas {
        px: vec![WHITE; W * H],
    };
    let panels = series.len().max(1);
    let pw = W / panels;
    for (p, (workload, by_mode)) in series.iter().enumerate() {
        let (left, top) = ((p * pw + 70) as i64, 40i64);
        let (right, bottom) = (((p + 1) * pw - 20) as i64, (H - 60) as i64);
        let max_y = by_mode
            .values()
            .flatten()
            .map(|(_, v)| *v)
            .fold(1.0, f64::max)
            * 1.1;
        let max_n = by_mode
            .values()
            .flatten()
            .map(|(n, _)| *n)
            .max()
            .unwrap_or(1)
            .max(2);
        let xs = |n: usize| {
            left + ((n as f64).log2() / (max_n as f64).log2() * (right - left) as f64) as i64
        };
        let ys = |v: f64| bottom - (v / max_y * (bottom - top) as f64) as i64;
        // Grid, ticks and labels.
        for i in 0..=5 {
            let v = max_y * i as f64 / 5.0;
            let y = ys(v);
            c.line((left, y), (right, y), GRID, 1);
            c.text(
                left - 62,
                y - 3,
                &format!("{:>6}k", (v / 1000.0).round()),
                BLACK,
            );
        }
        let mut n = 1;
        while n <= max_n {
            let x = xs(n);
            c.line((x, top), (x, bottom), GRID, 1);
            c.text(x - 6, bottom + 8, &n.to_string(), BLACK);
            n *= 2;
        }
        c.line((left, bottom), (right, bottom), BLACK, 1);
        c.line((left, top), (left, bottom), BLACK, 1);
        c.text(left, 15, &format!("{workload}: kernels/s"), BLACK);
        c.text((left + right) / 2 - 40, bottom + 25, "clients (N)", BLACK);
        for (m, mode) in modes.iter().enumerate() {
            let Some(points) = by_mode.get(*mode) else {
                continue;
            };
            let col = colour(mode);
            for w in points.windows(2) {
                c.line((xs(w[0].0), ys(w[0].1)), (xs(w[1].0), ys(w[1].1)), col, 3);
            }
            for (n, v) in points {
                c.line((xs(*n) - 3, ys(*v)), (xs(*n) + 3, ys(*v)), col, 4);
            }
            let ly = top + 10 + m as i64 * 14;
            c.line((right - 120, ly + 3), (right - 100, ly + 3), col, 3);
            c.text(right - 94, ly, mode, BLACK);
        }
    }
    let file = std::fs::File::create(out)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), W as u32, H as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(std::io::Error::other)?;
    let bytes: Vec<u8> = c.px.iter().flatten().copied().collect();
    writer
        .write_image_data(&bytes)
        .map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)
}
