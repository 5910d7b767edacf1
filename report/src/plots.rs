//! One chart per op, variant, dtype, cols and mode: GB/s against tokens for ferrofuse and every
//! peer, with the copy ceiling, drawn by plotters into an RGB buffer and written as PNG.
//!
//! The font is DejaVu Sans from the `dejavu` crate, compiled in: the charts come out the same
//! on every machine, whether it has fonts installed or not (CI's and the GPU hosts' often have
//! none).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Once;

use ferrofuse_bench_schema::schema::{IMPL_FERROFUSE, PEER_IMPLS, Record, Report};
use ferrofuse_bench_schema::shapes::{Op, TOKENS};
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::tables::{models_label, op_names};
use crate::write;

/// Chart size in pixels; the legend takes the right-hand `LEGEND_W`.
const W: u32 = 960;
const H: u32 = 560;
const LEGEND_W: u32 = 190;
const FONT: &str = "sans-serif";
const TEXT: RGBColor = RGBColor(20, 20, 20);
const SUBTLE: RGBColor = RGBColor(90, 90, 90);
const GRID: RGBColor = RGBColor(225, 225, 225);
const AXIS: RGBColor = RGBColor(60, 60, 60);

/// One line of points, drawn with markers.
pub struct Series {
    pub name: String,
    pub color: RGBColor,
    /// `(tokens, GB/s)`, tokens > 0, in token order.
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub subtitle: String,
    /// Where the x axis has labels: the token counts measured.
    pub x_ticks: Vec<f64>,
    pub series: Vec<Series>,
    /// The copy ceiling, GB/s: a dashed line.
    pub ceiling: f64,
}

fn impl_color(imp: &str) -> RGBColor {
    match imp {
        IMPL_FERROFUSE => RGBColor(214, 39, 40),
        "torch_eager" => RGBColor(127, 127, 127),
        "torch_compile" => RGBColor(31, 119, 180),
        "triton" => RGBColor(44, 160, 44),
        "candle" => RGBColor(255, 127, 14),
        _ => RGBColor(148, 103, 189),
    }
}

/// Writes one PNG per chart and an `index.md` showing them all into `dir`; returns how many.
pub fn write_plots(report: &Report, dir: &Path) -> Result<usize, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let charts = charts(report);
    let mut index = String::from("# ferrofuse benchmark plots\n\n");
    let _ = writeln!(
        index,
        "{} ({}), commit {}, {}. GB/s = minimal bytes / median time; dashed: the copy ceiling.\n",
        report.gpu, report.driver, report.commit, report.date
    );
    for (name, chart) in &charts {
        let png = png(chart).map_err(|e| format!("drawing {name}: {e}"))?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).map_err(|e| format!("writing {}: {e}", path.display()))?;
        let _ = writeln!(index, "![{name}]({name}.png)\n");
    }
    write(&dir.join("index.md"), &index)?;
    Ok(charts.len())
}

/// The charts of a report, named `{op}_{variant}_{dtype}_{cols}_{mode}`, in the tables' order.
pub fn charts(report: &Report) -> Vec<(String, Chart)> {
    let mut groups: BTreeMap<(usize, String, String, usize, String), Vec<&Record>> =
        BTreeMap::new();
    for r in &report.results {
        let Some(op_pos) = op_names().position(|o| o == r.op) else {
            continue;
        };
        groups
            .entry((
                op_pos,
                r.variant.clone(),
                r.dtype.clone(),
                r.cols,
                r.mode.clone(),
            ))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((op_pos, variant, dtype, cols, mode), recs) in groups {
        let op = Op::ALL[op_pos].name();
        // ferrofuse first, then the peers in the tables' order.
        let mut by_impl: BTreeMap<usize, Series> = BTreeMap::new();
        for r in recs.iter().filter(|r| r.rows > 0) {
            let order = std::iter::once(IMPL_FERROFUSE)
                .chain(PEER_IMPLS)
                .position(|i| i == r.imp)
                .unwrap_or(99);
            by_impl
                .entry(order)
                .or_insert_with(|| Series {
                    name: r.imp.clone(),
                    color: impl_color(&r.imp),
                    points: Vec::new(),
                })
                .points
                .push((r.rows as f64, r.gbs));
        }
        let mut series: Vec<Series> = by_impl.into_values().collect();
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        // The default token counts, and any other count measured, within the data's range.
        let xs: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        let (lo, hi) = xs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
        let mut ticks: Vec<f64> = TOKENS.iter().map(|&t| t as f64).chain(xs).collect();
        ticks.sort_by(|a, b| a.total_cmp(b));
        ticks.dedup();
        ticks.retain(|t| *t >= lo && *t <= hi);

        let dim = if op.starts_with("gated") { "I" } else { "H" };
        let models = models_label(op, &variant, cols);
        let mode_text = if mode == "graph" {
            "CUDA-graph replay (no L2 flush)"
        } else {
            "per call, L2 flushed before each run"
        };
        let chart = Chart {
            title: format!("{op} {variant} {dtype}, {dim} = {cols}"),
            subtitle: if models.is_empty() {
                mode_text.to_string()
            } else {
                format!("{models}; {mode_text}")
            },
            x_ticks: ticks,
            series,
            ceiling: report.copy_ceiling_gbs,
        };
        out.push((format!("{op}_{variant}_{dtype}_{cols}_{mode}"), chart));
    }
    out
}

/// Registers the compiled-in font under the family name the charts ask for (once per process:
/// plotters keeps a global table).
fn register_font() -> Result<(), String> {
    static REGISTER: Once = Once::new();
    let mut result = Ok(());
    REGISTER.call_once(|| {
        result = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "DejaVu Sans from the dejavu crate is not a usable font".to_string());
    });
    result
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `n` ticks up to `max`.
fn nice_step(max: f64, n: usize) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * mag)
}

/// The chart as PNG bytes.
pub fn png(chart: &Chart) -> Result<Vec<u8>, Box<dyn Error>> {
    register_font()?;
    let mut rgb = vec![0u8; (W * H * 3) as usize];
    draw(chart, &mut rgb)?;
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, W, H);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(&rgb)?;
    Ok(out)
}

fn draw(chart: &Chart, rgb: &mut [u8]) -> Result<(), Box<dyn Error>> {
    let root = BitMapBackend::with_buffer(rgb, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw_text(&chart.title, &(FONT, 20).into_font().color(&TEXT), (80, 12))?;
    root.draw_text(
        &chart.subtitle,
        &(FONT, 14).into_font().color(&SUBTLE),
        (80, 40),
    )?;
    let (plot, legend) = root.split_horizontally(W - LEGEND_W);

    // x: log scale over the measured token counts (padded when there is only one).
    let points = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x_lo, mut x_hi) = points.clone().fold((f64::INFINITY, 0.0f64), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    if !x_lo.is_finite() {
        (x_lo, x_hi) = (1.0, 2.0);
    }
    if x_hi <= x_lo {
        (x_lo, x_hi) = (x_lo / 2.0, x_hi * 2.0);
    }
    // y: from 0 to a round number above the data and the ceiling.
    let y_data = points
        .map(|p| p.1)
        .chain([chart.ceiling])
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max);
    let step = nice_step(y_data * 1.05, 6);
    let y_steps = ((y_data * 1.05) / step).ceil().max(1.0);
    let y_max = y_steps * step;

    let mut plane = ChartBuilder::on(&plot)
        .margin_top(76)
        .margin_left(12)
        .margin_right(20)
        .margin_bottom(8)
        .x_label_area_size(46)
        .y_label_area_size(66)
        .build_cartesian_2d(
            (x_lo..x_hi)
                .log_scale()
                .with_key_points(chart.x_ticks.clone()),
            0.0..y_max,
        )?;
    plane
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .label_style((FONT, 13).into_font().color(&TEXT))
        .axis_desc_style((FONT, 14).into_font().color(&TEXT))
        .x_desc("tokens (rows)")
        .y_desc("GB/s (minimal traffic)")
        // As many labels as steps of `step` from 0: plotters then picks that step.
        .y_labels(y_steps as usize + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    if chart.ceiling > 0.0 {
        plane.draw_series(DashedLineSeries::new(
            [(x_lo, chart.ceiling), (x_hi, chart.ceiling)],
            7,
            4,
            BLACK.stroke_width(1),
        ))?;
    }
    for s in &chart.series {
        plane.draw_series(LineSeries::new(
            s.points.iter().copied(),
            s.color.stroke_width(2),
        ))?;
        plane.draw_series(
            s.points
                .iter()
                .map(|&p| Circle::new(p, 3, s.color.filled())),
        )?;
    }

    // The legend, beside the plot: a line sample and the name per series, then the ceiling.
    let label = (FONT, 14)
        .into_font()
        .color(&TEXT)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let row_y = |i: usize| 96 + 24 * i as i32;
    for (i, s) in chart.series.iter().enumerate() {
        let y = row_y(i);
        legend.draw(&PathElement::new(
            [(4, y), (30, y)],
            s.color.stroke_width(2),
        ))?;
        legend.draw_text(&s.name, &label, (38, y))?;
    }
    if chart.ceiling > 0.0 {
        let y = row_y(chart.series.len());
        for x in [4, 14, 24] {
            legend.draw(&PathElement::new(
                [(x, y), (x + 6, y)],
                BLACK.stroke_width(1),
            ))?;
        }
        let text = format!("copy {:.0} GB/s", chart.ceiling);
        legend.draw_text(&text, &label, (38, y))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::merged;

    #[test]
    fn charts_of_a_sample() {
        let m = merged();
        let charts = charts(&m);
        let names: Vec<&str> = charts.iter().map(|(n, _)| n.as_str()).collect();
        // per_call and graph charts of one shape; the launch floor and the copy are no charts.
        assert_eq!(
            names,
            [
                "gated_fwd_silu_split_bf16_14336_graph",
                "gated_fwd_silu_split_bf16_14336_per_call"
            ]
        );
        let per_call = &charts[1].1;
        assert_eq!(per_call.title, "gated_fwd silu_split bf16, I = 14336");
        assert!(
            per_call
                .subtitle
                .starts_with("LLaMA-3-8B, Mistral-7B; per call")
        );
        let series: Vec<&str> = per_call.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            series,
            [
                "ferrofuse",
                "torch_eager",
                "torch_compile",
                "triton",
                "candle"
            ]
        );
        // The default token counts within the data's range (1 to 16384 rows).
        assert_eq!(
            per_call.x_ticks,
            [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0]
        );
        assert_eq!(per_call.ceiling, 4240.0);
    }

    #[test]
    fn writes_pngs_that_show_the_series() {
        let m = merged();
        let dir = std::env::temp_dir().join(format!("ferrofuse-plots-{}", std::process::id()));
        assert_eq!(write_plots(&m, &dir).unwrap(), 2);
        let file =
            std::fs::File::open(dir.join("gated_fwd_silu_split_bf16_14336_per_call.png")).unwrap();
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .unwrap();
        let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut rgb).unwrap();
        assert_eq!((info.width, info.height), (W, H));
        // Pixels of ferrofuse's colour (its line and legend sample) and of text.
        let pixels: Vec<&[u8]> = rgb.chunks(3).collect();
        let count = |c: RGBColor| pixels.iter().filter(|p| **p == [c.0, c.1, c.2]).count();
        assert!(count(impl_color(IMPL_FERROFUSE)) > 100);
        assert!(count(impl_color("triton")) > 100);
        assert!(count(TEXT) > 100, "no text drawn: is the font registered?");
        let index = std::fs::read_to_string(dir.join("index.md")).unwrap();
        assert!(index.contains("(gated_fwd_silu_split_bf16_14336_graph.png)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(4500.0, 6), 1000.0);
        assert_eq!(nice_step(100.0, 5), 20.0);
        assert_eq!(nice_step(0.0, 5), 1.0);
    }
}
