//! SVG line charts for the report, from a small JSON spec the harness writes:
//!
//! ```json
//! {"plots": [{"file": "x.svg", "title": "...", "x_label": "...", "y_label": "...",
//!             "kind": "percentile" | "line", "y_log": true,
//!             "series": [{"name": "ferrolog", "points": [[x, y], ...]}]}]}
//! ```
//!
//! `percentile` charts take x as a percentile (0-100) and spread the tail out, as
//! HdrHistogram's plots do: x is drawn at -log10(1 - p/100), so 90, 99, 99.9 ... are
//! evenly spaced.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Spec {
    pub plots: Vec<PlotSpec>,
}

#[derive(Deserialize)]
pub struct PlotSpec {
    pub file: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub kind: String,
    #[serde(default)]
    pub y_log: bool,
    pub series: Vec<Series>,
}

#[derive(Deserialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Series colours in order: ferrolog, Kafka, Kafka with flush, then more.
const COLOURS: &[RGBColor] = &[
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBAColor {
    COLOURS[i % COLOURS.len()].to_rgba()
}

/// The highest percentile drawn: 99.999 (x = 5); 100 is drawn there too.
const PERCENTILE_X_MAX: f64 = 5.0;

fn percentile_x(p: f64) -> f64 {
    if p >= 100.0 {
        PERCENTILE_X_MAX
    } else {
        (-(1.0 - p / 100.0).log10()).min(PERCENTILE_X_MAX)
    }
}

fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    match x.round() as i64 {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        3 => "99.9%".into(),
        4 => "99.99%".into(),
        5 => "99.999%".into(),
        _ => format!("{p:.3}%"),
    }
}

pub fn render(spec_path: &Path, out_dir: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let spec: Spec = serde_json::from_str(&text).context("parsing the plot spec")?;
    std::fs::create_dir_all(out_dir)?;
    let mut written = Vec::new();
    for p in &spec.plots {
        let path = out_dir.join(&p.file);
        draw(p, &path).with_context(|| format!("drawing {}", path.display()))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}

fn draw(p: &PlotSpec, path: &Path) -> Result<()> {
    let percentile = p.kind == "percentile";
    let series: Vec<(String, Vec<(f64, f64)>)> = p
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .map(|(x, y)| (if percentile { percentile_x(*x) } else { *x }, *y))
                .filter(|(x, y)| x.is_finite() && y.is_finite() && (!p.y_log || *y > 0.0))
                .collect();
            (s.name.clone(), pts)
        })
        .collect();
    let all = series.iter().flat_map(|(_, pts)| pts.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 1.0, 10.0);
    }
    if percentile {
        x0 = 0.0;
        x1 = PERCENTILE_X_MAX;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    if p.y_log {
        let (lo, hi) = (y0.max(1e-3) / 1.5, (y1 * 1.5).max(y0 * 2.0));
        let mut chart = ChartBuilder::on(&root)
            .caption(&p.title, ("sans-serif", 20))
            .margin(15)
            .margin_right(40)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d(x0..x1, (lo..hi).log_scale())?;
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(p.x_label.as_str()).y_desc(p.y_label.as_str());
        let fmt = |x: &f64| percentile_label(*x);
        if percentile {
            mesh.x_labels(6).x_label_formatter(&fmt);
        }
        mesh.draw()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = colour(i);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        legend(&mut chart)?;
    } else {
        let hi = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(&p.title, ("sans-serif", 20))
            .margin(15)
            .margin_right(40)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d(x0..x1, 0f64..hi)?;
        chart
            .configure_mesh()
            .x_desc(p.x_label.as_str())
            .y_desc(p.y_label.as_str())
            .draw()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = colour(i);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("legend: {e}"))?;
    Ok(())
}
