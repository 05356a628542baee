//! What a run leaves behind: a table on the terminal, every point as CSV and JSON, and a
//! plot of throughput against message size (SVG).

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::measure::Point;

/// A figure of evb divided by a reference measured in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub name: String,
    /// evb's figure / the reference's, oriented so that bigger is better
    pub value: f64,
    pub target: f64,
    pub met: bool,
    pub evb: f64,
    pub reference: f64,
    pub unit: String,
}

pub fn human_size(b: f64) -> String {
    let b = b.round() as u64;
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

fn num(x: f64, prec: usize) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.prec$}")
    }
}

fn rate(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The terminal table: one line per point, then the ratios.
pub fn table(points: &[Point], ratios: &[Ratio]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<6} {:<36} {:>6} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "bench",
        "series",
        "size",
        "msgs/s",
        "GB/s",
        "txCPU/GB",
        "rxCPU/GB",
        "p50 us",
        "p99 us",
        "p99.9us"
    );
    for p in points {
        let _ = writeln!(
            s,
            "{:<6} {:<36} {:>6} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
            p.bench,
            p.series(),
            human_size(p.size as f64),
            rate(p.msgs_per_s),
            num(p.gb_per_s, 3),
            num(p.send_cpu_s_per_gb, 3),
            num(p.recv_cpu_s_per_gb, 3),
            num(p.p50_us, 1),
            num(p.p99_us, 1),
            num(p.p999_us, 1),
        );
    }
    if !ratios.is_empty() {
        let _ = writeln!(s, "\nratios (same run, medians):");
        for r in ratios {
            if r.target == 0.0 {
                // a comparison the issues ask to see, with no figure to reach
                let _ = writeln!(
                    s,
                    "  {:<58} {:>7.3}  (no target)     ({} vs {} {})",
                    r.name,
                    r.value,
                    num(r.evb, 3),
                    num(r.reference, 3),
                    r.unit
                );
                continue;
            }
            let _ = writeln!(
                s,
                "  {:<58} {:>7.3}  target >= {:<5} {}  ({} vs {} {})",
                r.name,
                r.value,
                r.target,
                if r.met { "MET" } else { "not met" },
                num(r.evb, 3),
                num(r.reference, 3),
                r.unit
            );
        }
    }
    s
}

pub fn csv(points: &[Point]) -> String {
    let mut s = String::from(
        "bench,system,transport,variant,size,senders,receivers,in_flight,reps,msgs_per_s,gb_per_s,send_cpu_s_per_gb,recv_cpu_s_per_gb,p50_us,p99_us,p999_us,note\n",
    );
    let f = |x: f64| {
        if x.is_nan() {
            String::new()
        } else {
            format!("{x}")
        }
    };
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"",
            p.bench,
            p.system,
            p.transport,
            p.variant,
            p.size,
            p.senders,
            p.receivers,
            p.in_flight,
            p.reps,
            f(p.msgs_per_s),
            f(p.gb_per_s),
            f(p.send_cpu_s_per_gb),
            f(p.recv_cpu_s_per_gb),
            f(p.p50_us),
            f(p.p99_us),
            f(p.p999_us),
            p.note.replace('"', "'"),
        );
    }
    s
}

/// Throughput against message size for every p2p series, with iperf3 as a line.
pub fn plot(points: &[Point], path: &Path, title: &str) -> Result<(), String> {
    let series = series_of(points, |p| {
        (p.bench == "p2p" && !p.gb_per_s.is_nan()).then(|| (p.series(), p.size as f64, p.gb_per_s))
    });
    let iperf = points
        .iter()
        .find(|p| p.system == "iperf3" && !p.gb_per_s.is_nan())
        .map(|p| (format!("iperf3 -l 1M ({:.2} GB/s)", p.gb_per_s), p.gb_per_s));
    let xmax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.0))
        .fold(2.0 * 1024.0 * 1024.0, f64::max)
        * 2.0;
    chart(
        path,
        title,
        ("message size (bytes)", 32.0, xmax, true),
        "GB/s (receiver)",
        &series,
        iperf,
    )
}

/// `evb bench build`'s scaling series: GB/s built and the RUs' and BUs' CPU seconds per GB
/// against N, for the N x N runs.
pub fn plot_scaling(points: &[Point], path: &Path, title: &str) -> Result<(), String> {
    let scaled = |p: &Point| {
        p.bench == "build" && p.variant.ends_with(" scaling") && p.senders == p.receivers
    };
    let mut series = series_of(points, |p| {
        scaled(p).then(|| ("GB/s built".into(), p.senders as f64, p.gb_per_s))
    });
    series.extend(series_of(points, |p| {
        scaled(p).then(|| {
            (
                "RUs: CPU s per GB".into(),
                p.senders as f64,
                p.send_cpu_s_per_gb,
            )
        })
    }));
    series.extend(series_of(points, |p| {
        scaled(p).then(|| {
            (
                "BUs: CPU s per GB".into(),
                p.senders as f64,
                p.recv_cpu_s_per_gb,
            )
        })
    }));
    if series.is_empty() {
        return Ok(());
    }
    chart(
        path,
        title,
        ("N (N RUs x N BUs)", 0.5, 4.5, false),
        "GB/s, or CPU s per GB",
        &series,
        None,
    )
}

type Series = Vec<(String, Vec<(f64, f64)>)>;

/// Points grouped into named series of (x, y), sorted by x.
fn series_of(points: &[Point], pick: impl Fn(&Point) -> Option<(String, f64, f64)>) -> Series {
    let mut series: Series = Vec::new();
    for (name, x, y) in points.iter().filter_map(pick) {
        if y.is_nan() {
            continue;
        }
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push((x, y)),
            None => series.push((name, vec![(x, y)])),
        }
    }
    for (_, v) in &mut series {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// A line chart of `series` (x axis: description, range, logarithmic), with an optional
/// labelled horizontal reference line.
fn chart(
    path: &Path,
    title: &str,
    (x_desc, xmin, xmax, log_x): (&str, f64, f64, bool),
    y_desc: &str,
    series: &Series,
    hline: Option<(String, f64)>,
) -> Result<(), String> {
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .chain(hline.as_ref().map(|h| h.1))
        .fold(0.1, f64::max)
        * 1.15;
    let e = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64);
    macro_rules! draw {
        ($chart:expr, $fmt:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_label_formatter($fmt)
                .draw()
                .map_err(|x| e(&x))?;
            for (i, (name, pts)) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|x| e(&x))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        pts.iter()
                            .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                    )
                    .map_err(|x| e(&x))?;
            }
            if let Some((label, g)) = &hline {
                chart
                    .draw_series(LineSeries::new(
                        vec![(xmin, *g), (xmax, *g)],
                        BLACK.stroke_width(1),
                    ))
                    .map_err(|x| e(&x))?
                    .label(label.as_str())
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|x| e(&x))?;
        }};
    }
    if log_x {
        let c = builder
            .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax)
            .map_err(|x| e(&x))?;
        draw!(c, &|x: &f64| human_size(*x));
    } else {
        let c = builder
            .build_cartesian_2d(xmin..xmax, 0f64..ymax)
            .map_err(|x| e(&x))?;
        draw!(c, &|x: &f64| format!("{x:.0}"));
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
