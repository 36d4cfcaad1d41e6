//! The report's plots (plotters), each written as SVG and PNG: replicas
//! against load over time, the latency CDF, utilisation over time, SLO
//! misses over time, and GPU-hours against SLO attainment. Text is drawn with DejaVu Sans,
//! embedded (`assets/`, Bitstream Vera licence), so PNGs render the same
//! on any machine.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::Report;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register() {
    REGISTER.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

const SIZE: (u32, u32) = (960, 540);

fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

/// The plots.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Replicas,
    Cdf,
    Utilisation,
    Misses,
    Cost,
}

fn draw<DB: DrawingBackend>(
    kind: Kind,
    r: &Report,
    area: DrawingArea<DB, Shift>,
) -> Result<(), String> {
    match kind {
        Kind::Replicas => replicas(r, area),
        Kind::Cdf => cdf(r, area),
        Kind::Utilisation => over_time(
            r,
            area,
            "memory utilisation of GPUs in use",
            "% of usable memory allocated",
            Some(100.0),
            SeriesLabelPosition::LowerRight,
            |p| p.utilization_memory * 100.0,
        ),
        Kind::Misses => {
            let step = r
                .curves
                .iter()
                .find_map(|c| (c.series.len() > 1).then(|| c.series[1].t - c.series[0].t))
                .unwrap_or(1.0)
                .max(1e-9);
            over_time(
                r,
                area,
                "SLO misses over time (by arrival)",
                "requests/s missed or turned away",
                None,
                SeriesLabelPosition::UpperRight,
                move |p| p.missed as f64 / step,
            )
        }
        Kind::Cost => cost(r, area),
    }
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// The headline runs' curves, in policy order.
fn headline(report: &Report) -> Vec<(String, &crate::report::Curves)> {
    report
        .policies
        .values()
        .filter_map(|f| {
            let run = format!("{}/{}", f.policy, f.placement);
            report
                .curves
                .iter()
                .find(|c| c.run == run)
                .map(|c| (run, c))
        })
        .collect()
}

fn replicas<DB: DrawingBackend>(r: &Report, area: DrawingArea<DB, Shift>) -> Result<(), String> {
    area.fill(&WHITE).map_err(err)?;
    let runs = headline(r);
    let end = r.duration_s / 60.0;
    let top = runs
        .iter()
        .flat_map(|(_, c)| c.series.iter().map(|p| p.replicas))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let load_top = runs
        .iter()
        .flat_map(|(_, c)| c.series.iter().map(|p| p.load))
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(&area)
        .caption(
            format!("{}: replicas against load", r.scenario),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .right_y_label_area_size(56)
        .build_cartesian_2d(0.0..end, 0.0..top * 1.1)
        .map_err(err)?
        .set_secondary_coord(0.0..end, 0.0..load_top * 1.1);
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("replicas (all models)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("requests/s")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    if let Some((_, c)) = runs.first() {
        chart
            .draw_secondary_series(AreaSeries::new(
                c.series.iter().map(|p| (p.t / 60.0, p.load)),
                0.0,
                RGBColor(200, 200, 200).mix(0.5),
            ))
            .map_err(err)?
            .label("load (requests/s, right axis)")
            .legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 5), (x + 16, y + 5)],
                    RGBColor(200, 200, 200).filled(),
                )
            });
    }
    for (i, (name, c)) in runs.iter().enumerate() {
        let col = colour(i);
        chart
            .draw_series(LineSeries::new(
                c.series.iter().map(|p| (p.t / 60.0, f64::from(p.replicas))),
                col.stroke_width(2),
            ))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    area.present().map_err(err)
}

fn cdf<DB: DrawingBackend>(r: &Report, area: DrawingArea<DB, Shift>) -> Result<(), String> {
    area.fill(&WHITE).map_err(err)?;
    let runs = headline(r);
    let lo = runs
        .iter()
        .flat_map(|(_, c)| c.latency_cdf.iter().map(|p| p.0))
        .fold(f64::INFINITY, f64::min)
        .max(1e-3);
    // No request served (a scenario whose rates are all 0): an empty
    // chart over a decade, not a log axis over an infinite range.
    let lo = if lo.is_finite() { lo } else { 1e-3 };
    let hi = runs
        .iter()
        .flat_map(|(_, c)| c.latency_cdf.iter().map(|p| p.0))
        .filter(|x| x.is_finite())
        .fold(lo * 10.0, f64::max);
    let mut chart = ChartBuilder::on(&area)
        .caption(
            format!("{}: end-to-end latency CDF", r.scenario),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds (log)")
        .y_desc("fraction of served requests")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, (name, c)) in runs.iter().enumerate() {
        let col = colour(i);
        chart
            .draw_series(LineSeries::new(
                c.latency_cdf.iter().copied(),
                col.stroke_width(2),
            ))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    area.present().map_err(err)
}

/// Each headline run's `value` of its series over time; the y axis up to
/// `top`, or to the highest value when `None`.
fn over_time<DB: DrawingBackend>(
    r: &Report,
    area: DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    top: Option<f64>,
    legend: SeriesLabelPosition,
    value: impl Fn(&crate::engine::Point) -> f64,
) -> Result<(), String> {
    area.fill(&WHITE).map_err(err)?;
    let runs = headline(r);
    let end = r.duration_s / 60.0;
    let top = top.unwrap_or_else(|| {
        runs.iter()
            .flat_map(|(_, c)| c.series.iter().map(&value))
            .fold(0.0_f64, f64::max)
            .max(1.0)
            * 1.1
    });
    let mut chart = ChartBuilder::on(&area)
        .caption(format!("{}: {title}", r.scenario), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, (name, c)) in runs.iter().enumerate() {
        let col = colour(i);
        chart
            .draw_series(LineSeries::new(
                c.series.iter().map(|p| (p.t / 60.0, value(p))),
                col.stroke_width(2),
            ))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    area.present().map_err(err)
}

fn cost<DB: DrawingBackend>(r: &Report, area: DrawingArea<DB, Shift>) -> Result<(), String> {
    area.fill(&WHITE).map_err(err)?;
    let hi = r.runs.iter().map(|f| f.gpu_hours).fold(0.1_f64, f64::max) * 1.15;
    let lo_att = r
        .runs
        .iter()
        .filter_map(|f| f.slo_attainment.map(|a| a * 100.0))
        .fold(100.0_f64, f64::min)
        .min(95.0)
        .floor();
    let mut chart = ChartBuilder::on(&area)
        .caption(
            format!("{}: GPU-hours against SLO attainment", r.scenario),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..hi, lo_att..100.5)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("GPU-hours")
        .y_desc("% of requests within SLO")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, f) in r.runs.iter().enumerate() {
        let col = colour(i / 2);
        let Some(attainment) = f.slo_attainment else {
            continue;
        };
        let point = (f.gpu_hours, attainment * 100.0);
        let label = format!("{}/{}", f.policy, f.placement);
        let shape = f.placement == "packer";
        chart
            .draw_series(std::iter::once(
                EmptyElement::at(point)
                    + Circle::new(
                        (0, 0),
                        6,
                        if shape {
                            col.filled()
                        } else {
                            col.stroke_width(2)
                        },
                    )
                    + Text::new(label, (8, -6), ("sans-serif", 12)),
            ))
            .map_err(err)?;
    }
    area.present().map_err(err)
}

/// Writes every plot as `<name>.svg` and `<name>.png` in `dir`; returns
/// (title, file) for the report, SVG first.
pub fn write(report: &Report, dir: &Path) -> Result<Vec<(String, String)>, String> {
    register();
    let plots = [
        ("Replicas against load", "replicas", Kind::Replicas),
        ("Latency CDF", "latency-cdf", Kind::Cdf),
        ("Utilisation over time", "utilization", Kind::Utilisation),
        ("SLO misses over time", "misses", Kind::Misses),
        (
            "GPU-hours against SLO attainment",
            "cost-attainment",
            Kind::Cost,
        ),
    ];
    let mut out = Vec::new();
    for (title, name, kind) in plots {
        let svg_path = dir.join(format!("{name}.svg"));
        draw(
            kind,
            report,
            SVGBackend::new(&svg_path, SIZE).into_drawing_area(),
        )?;
        let png_path = dir.join(format!("{name}.png"));
        draw(
            kind,
            report,
            BitMapBackend::new(&png_path, SIZE).into_drawing_area(),
        )?;
        out.push((title.to_string(), format!("{name}.svg")));
    }
    Ok(out)
}
