//! Line charts as SVG and PNG, written by hand to keep xtask light: one chart model, two
//! renderers. The SVG is text; the PNG is drawn on an RGB canvas with a bitmap font
//! ([`font`]) and encoded with zlib from `miniz_oxide` (pure Rust) and a CRC-32 here.
//!
//! The x axis is logarithmic (base 2: token counts), the y axis linear from 0.

mod font;

use std::fmt::Write as _;

pub type Rgb = [u8; 3];

/// One line of points, drawn with markers.
pub struct Series {
    pub name: String,
    pub color: Rgb,
    /// `(x, y)` with `x > 0`; drawn in x order.
    pub points: Vec<(f64, f64)>,
}

/// A horizontal reference line (the copy ceiling).
pub struct HLine {
    pub y: f64,
    pub label: String,
    pub color: Rgb,
}

pub struct Chart {
    pub title: String,
    pub subtitle: String,
    pub x_label: String,
    pub y_label: String,
    /// Where x ticks go (the token counts).
    pub x_ticks: Vec<f64>,
    pub series: Vec<Series>,
    pub hline: Option<HLine>,
}

const W: u32 = 960;
const H: u32 = 560;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 86.0;
const BOTTOM: f64 = 60.0;
const GRID: Rgb = [225, 225, 225];
const AXIS: Rgb = [60, 60, 60];
const TEXT: Rgb = [20, 20, 20];

/// Axis geometry shared by both renderers.
struct Frame {
    x_min: f64,
    x_max: f64,
    y_max: f64,
    y_ticks: Vec<f64>,
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `n` ticks up to `max`.
pub fn nice_step(max: f64, n: usize) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * mag >= raw {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Compact tick label: 16384 -> "16384", 4500 -> "4500", 0.5 -> "0.5".
fn tick_label(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Chart {
    fn frame(&self) -> Frame {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(self.x_ticks.iter().copied())
            .filter(|x| *x > 0.0);
        let (mut x_min, mut x_max) = (f64::INFINITY, 0.0f64);
        for x in xs {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
        }
        if !x_min.is_finite() {
            (x_min, x_max) = (1.0, 2.0);
        }
        if x_max <= x_min {
            x_max = x_min * 2.0;
        }
        let y_data = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(self.hline.as_ref().map(|h| h.y))
            .filter(|y| y.is_finite())
            .fold(0.0f64, f64::max);
        let step = nice_step(y_data * 1.05, 6);
        let y_max = ((y_data * 1.05) / step).ceil().max(1.0) * step;
        let y_ticks = (0..)
            .map(|i| i as f64 * step)
            .take_while(|v| *v <= y_max + step * 1e-9)
            .collect();
        Frame {
            x_min,
            x_max,
            y_max,
            y_ticks,
        }
    }
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        let t = (x.log2() - self.x_min.log2()) / (self.x_max.log2() - self.x_min.log2());
        LEFT + t * (W as f64 - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        let t = y / self.y_max;
        H as f64 - BOTTOM - t * (H as f64 - TOP - BOTTOM)
    }
}

fn hex(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Chart {
    pub fn svg(&self) -> String {
        let f = self.frame();
        let (x0, x1) = (LEFT, W as f64 - RIGHT);
        let (y0, y1) = (H as f64 - BOTTOM, TOP);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Arial, Helvetica, sans-serif">"#
        );
        let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="26" font-size="17" fill="{}">{}</text>"#,
            hex(TEXT),
            esc(&self.title)
        );
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="48" font-size="13" fill="{}">{}</text>"#,
            hex(AXIS),
            esc(&self.subtitle)
        );
        for &v in &f.y_ticks {
            let y = f.py(v);
            let _ = writeln!(
                s,
                r#"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="{}"/>"#,
                hex(GRID)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="end" fill="{}">{}</text>"#,
                x0 - 6.0,
                y + 4.5,
                hex(TEXT),
                tick_label(v)
            );
        }
        for &v in &self.x_ticks {
            let x = f.px(v);
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="{}"/>"#,
                hex(GRID)
            );
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" font-size="13" text-anchor="middle" fill="{}">{}</text>"#,
                y0 + 18.0,
                hex(TEXT),
                tick_label(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<polyline points="{x0},{y1} {x0},{y0} {x1},{y0}" fill="none" stroke="{}"/>"#,
            hex(AXIS)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle" fill="{}">{}</text>"#,
            (x0 + x1) / 2.0,
            H as f64 - 16.0,
            hex(TEXT),
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="13" fill="{}">{}</text>"#,
            8.0,
            y1 - 10.0,
            hex(TEXT),
            esc(&self.y_label)
        );
        if let Some(h) = &self.hline {
            let y = f.py(h.y);
            let _ = writeln!(
                s,
                r#"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="{}" stroke-width="1.5" stroke-dasharray="6,4"/>"#,
                hex(h.color)
            );
        }
        for series in &self.series {
            let mut pts: Vec<(f64, f64)> = series.points.clone();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let coords: Vec<String> = pts
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", f.px(x), f.py(y)))
                .collect();
            let c = hex(series.color);
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
                coords.join(" ")
            );
            for &(x, y) in &pts {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"/>"#,
                    f.px(x),
                    f.py(y)
                );
            }
        }
        for (i, (label, color, dashed)) in self.legend().into_iter().enumerate() {
            let ly = TOP + 10.0 + i as f64 * 22.0;
            let lx = W as f64 - RIGHT + 16.0;
            let dash = if dashed {
                r#" stroke-dasharray="6,4""#
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/>"#,
                lx + 26.0,
                hex(color)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="13" fill="{}">{}</text>"#,
                lx + 32.0,
                ly + 4.5,
                hex(TEXT),
                esc(&label)
            );
        }
        s.push_str("</svg>\n");
        s
    }

    fn legend(&self) -> Vec<(String, Rgb, bool)> {
        let mut l: Vec<(String, Rgb, bool)> = self
            .series
            .iter()
            .map(|s| (s.name.clone(), s.color, false))
            .collect();
        if let Some(h) = &self.hline {
            l.push((h.label.clone(), h.color, true));
        }
        l
    }

    pub fn png(&self) -> Vec<u8> {
        let f = self.frame();
        let mut c = Canvas::new(W, H);
        let (x0, x1) = (LEFT, W as f64 - RIGHT);
        let (y0, y1) = (H as f64 - BOTTOM, TOP);
        c.text(LEFT, 10.0, &self.title, &font::LARGE, TEXT, Align::Left);
        c.text(LEFT, 36.0, &self.subtitle, &font::SMALL, AXIS, Align::Left);
        for &v in &f.y_ticks {
            let y = f.py(v).round();
            c.line(x0, y, x1, y, GRID, 1.0, None);
            c.text(
                x0 - 6.0,
                y - 8.0,
                &tick_label(v),
                &font::SMALL,
                TEXT,
                Align::Right,
            );
        }
        for &v in &self.x_ticks {
            let x = f.px(v).round();
            c.line(x, y0, x, y1, GRID, 1.0, None);
            c.text(
                x,
                y0 + 6.0,
                &tick_label(v),
                &font::SMALL,
                TEXT,
                Align::Center,
            );
        }
        c.line(x0, y1, x0, y0, AXIS, 1.0, None);
        c.line(x0, y0, x1, y0, AXIS, 1.0, None);
        c.text(
            (x0 + x1) / 2.0,
            H as f64 - 28.0,
            &self.x_label,
            &font::SMALL,
            TEXT,
            Align::Center,
        );
        c.text(
            8.0,
            y1 - 24.0,
            &self.y_label,
            &font::SMALL,
            TEXT,
            Align::Left,
        );
        if let Some(h) = &self.hline {
            let y = f.py(h.y).round();
            c.line(x0, y, x1, y, h.color, 1.5, Some((6.0, 4.0)));
        }
        for series in &self.series {
            let mut pts: Vec<(f64, f64)> = series.points.clone();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            for w in pts.windows(2) {
                let (a, b) = (w[0], w[1]);
                c.line(
                    f.px(a.0),
                    f.py(a.1),
                    f.px(b.0),
                    f.py(b.1),
                    series.color,
                    2.0,
                    None,
                );
            }
            for &(x, y) in &pts {
                c.disk(f.px(x), f.py(y), 3.5, series.color);
            }
        }
        for (i, (label, color, dashed)) in self.legend().into_iter().enumerate() {
            let ly = TOP + 10.0 + i as f64 * 22.0;
            let lx = W as f64 - RIGHT + 16.0;
            let dash = if dashed { Some((6.0, 4.0)) } else { None };
            c.line(lx, ly, lx + 26.0, ly, color, 2.0, dash);
            c.text(lx + 32.0, ly - 9.0, &label, &font::SMALL, TEXT, Align::Left);
        }
        c.encode_png()
    }
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Center,
    Right,
}

/// An RGB image on a white background.
struct Canvas {
    w: u32,
    h: u32,
    px: Vec<Rgb>,
}

impl Canvas {
    fn new(w: u32, h: u32) -> Self {
        Self {
            w,
            h,
            px: vec![[255, 255, 255]; (w * h) as usize],
        }
    }

    /// Blends `color` into pixel (x, y) with coverage `a` in [0, 1].
    fn blend(&mut self, x: i64, y: i64, color: Rgb, a: f64) {
        if x < 0 || y < 0 || x >= self.w as i64 || y >= self.h as i64 || a <= 0.0 {
            return;
        }
        let a = a.min(1.0);
        let p = &mut self.px[(y as u32 * self.w + x as u32) as usize];
        for k in 0..3 {
            p[k] = (p[k] as f64 * (1.0 - a) + color[k] as f64 * a).round() as u8;
        }
    }

    /// A line `width` pixels wide, antialiased by distance to the segment; `dash` is
    /// (on, off) lengths in pixels.
    #[allow(clippy::too_many_arguments)]
    fn line(
        &mut self,
        xa: f64,
        ya: f64,
        xb: f64,
        yb: f64,
        color: Rgb,
        width: f64,
        dash: Option<(f64, f64)>,
    ) {
        let (dx, dy) = (xb - xa, yb - ya);
        let len2 = dx * dx + dy * dy;
        let len = len2.sqrt();
        let r = width / 2.0;
        let (lo_x, hi_x) = (xa.min(xb) - r - 1.0, xa.max(xb) + r + 1.0);
        let (lo_y, hi_y) = (ya.min(yb) - r - 1.0, ya.max(yb) + r + 1.0);
        for y in lo_y.floor() as i64..=hi_y.ceil() as i64 {
            for x in lo_x.floor() as i64..=hi_x.ceil() as i64 {
                let (cx, cy) = (x as f64 + 0.5, y as f64 + 0.5);
                let t = if len2 > 0.0 {
                    (((cx - xa) * dx + (cy - ya) * dy) / len2).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                if let Some((on, off)) = dash
                    && (t * len) % (on + off) > on
                {
                    continue;
                }
                let (px, py) = (xa + t * dx, ya + t * dy);
                let d = ((cx - px).powi(2) + (cy - py).powi(2)).sqrt();
                self.blend(x, y, color, r + 0.5 - d);
            }
        }
    }

    fn disk(&mut self, cx: f64, cy: f64, r: f64, color: Rgb) {
        for y in (cy - r - 1.0).floor() as i64..=(cy + r + 1.0).ceil() as i64 {
            for x in (cx - r - 1.0).floor() as i64..=(cx + r + 1.0).ceil() as i64 {
                let d = ((x as f64 + 0.5 - cx).powi(2) + (y as f64 + 0.5 - cy).powi(2)).sqrt();
                self.blend(x, y, color, r + 0.5 - d);
            }
        }
    }

    /// Draws `s` with its top-left corner (for `Left`) at (x, top).
    fn text(&mut self, x: f64, top: f64, s: &str, f: &font::BitmapFont, color: Rgb, align: Align) {
        let width: u32 = s.chars().map(|ch| advance(f, ch)).sum();
        let mut pen = match align {
            Align::Left => x,
            Align::Center => x - width as f64 / 2.0,
            Align::Right => x - width as f64,
        }
        .round() as i64;
        let top = top.round() as i64;
        for ch in s.chars() {
            let g = glyph_index(ch);
            let rows = &f.rows[g * f.height as usize..(g + 1) * f.height as usize];
            for (dy, bits) in rows.iter().enumerate() {
                for dx in 0..32 {
                    if bits >> dx & 1 == 1 {
                        self.blend(pen + dx as i64, top + dy as i64, color, 1.0);
                    }
                }
            }
            pen += advance(f, ch) as i64;
        }
    }

    fn encode_png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(((self.w * 3 + 1) * self.h) as usize);
        for row in self.px.chunks(self.w as usize) {
            raw.push(0); // filter: none
            for p in row {
                raw.extend_from_slice(p);
            }
        }
        encode_png_rgb(self.w, self.h, &raw)
    }
}

/// Index of `ch` in the font tables (`?` for anything outside ASCII 32..=126).
fn glyph_index(ch: char) -> usize {
    let c = ch as u32;
    if (32..=126).contains(&c) {
        (c - 32) as usize
    } else {
        ('?' as u32 - 32) as usize
    }
}

fn advance(f: &font::BitmapFont, ch: char) -> u32 {
    f.advance[glyph_index(ch)] as u32
}

/// CRC-32 (ISO-HDLC, as PNG uses) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG file from filtered scanlines (`raw`: one filter byte then `3 * w` bytes, per row).
pub fn encode_png_rgb(w: u32, h: u32, raw: &[u8]) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let chunk = |out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    };
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no filter set, no interlace
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(
        &mut out,
        b"IDAT",
        &miniz_oxide::deflate::compress_to_vec_zlib(raw, 8),
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Chart {
        Chart {
            title: "gated_fwd silu_split bf16 <I=14336>".into(),
            subtitle: "LLaMA-3-8B, Mistral-7B & co".into(),
            x_label: "tokens".into(),
            y_label: "GB/s".into(),
            x_ticks: vec![1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0],
            series: vec![
                Series {
                    name: "ferrofuse".into(),
                    color: [214, 39, 40],
                    points: vec![(16384.0, 4100.0), (1.0, 20.0), (1024.0, 3000.0)],
                },
                Series {
                    name: "triton".into(),
                    color: [44, 160, 44],
                    points: vec![(1.0, 15.0), (16384.0, 4000.0)],
                },
            ],
            hline: Some(HLine {
                y: 4240.0,
                label: "copy ceiling".into(),
                color: [0, 0, 0],
            }),
        }
    }

    #[test]
    fn crc_matches_png_reference_values() {
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn png_is_well_formed_and_decodes() {
        let png = sample().png();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // Walk the chunks, checking each CRC, and inflate IDAT back to the scanlines.
        let mut at = 8;
        let mut kinds = Vec::new();
        let mut idat = Vec::new();
        while at < png.len() {
            let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let kind = &png[at + 4..at + 8];
            let data = &png[at + 8..at + 8 + len];
            let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
            assert_eq!(crc, crc32(&png[at + 4..at + 8 + len]));
            if kind == b"IDAT" {
                idat.extend_from_slice(data);
            }
            kinds.push(String::from_utf8_lossy(kind).to_string());
            at += 12 + len;
        }
        assert_eq!(kinds, ["IHDR", "IDAT", "IEND"]);
        let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&idat).unwrap();
        assert_eq!(raw.len(), ((W * 3 + 1) * H) as usize);
        // Something other than white was drawn, and the series color appears.
        assert!(raw.chunks(3).any(|p| p == [214, 39, 40]));
    }

    #[test]
    fn svg_has_every_series_and_escapes_text() {
        let svg = sample().svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("&lt;I=14336&gt;"));
        assert!(svg.contains("&amp; co"));
        assert_eq!(svg.matches("<polyline").count(), 3, "axes + two series");
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.contains(">copy ceiling<"));
    }

    #[test]
    fn axes() {
        assert_eq!(nice_step(4452.0, 6), 1000.0);
        assert_eq!(nice_step(10.0, 5), 2.0);
        assert_eq!(nice_step(0.0, 5), 1.0);
        let f = sample().frame();
        assert_eq!(f.y_max, 5000.0);
        assert_eq!(f.y_ticks.len(), 6);
        assert!((f.px(1.0) - LEFT).abs() < 1e-9);
        assert!((f.px(16384.0) - (W as f64 - RIGHT)).abs() < 1e-9);
        assert!((f.py(0.0) - (H as f64 - BOTTOM)).abs() < 1e-9);
        assert_eq!(tick_label(16384.0), "16384");
        assert_eq!(tick_label(0.5), "0.5");
    }
}
