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
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in points
        .iter()
        .filter(|p| p.bench == "p2p" && !p.gb_per_s.is_nan())
    {
        let name = p.series();
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push((p.size as f64, p.gb_per_s)),
            None => series.push((name, vec![(p.size as f64, p.gb_per_s)])),
        }
    }
    for (_, v) in &mut series {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let iperf = points
        .iter()
        .find(|p| p.system == "iperf3" && !p.gb_per_s.is_nan())
        .map(|p| p.gb_per_s);
    let xmin = 32.0f64;
    let xmax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.0))
        .fold(2.0 * 1024.0 * 1024.0, f64::max)
        * 2.0;
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .chain(iperf)
        .fold(0.1, f64::max)
        * 1.15;
    let e = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("GB/s (receiver)")
        .x_label_formatter(&|x| human_size(*x))
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
    if let Some(g) = iperf {
        chart
            .draw_series(LineSeries::new(
                vec![(xmin, g), (xmax, g)],
                BLACK.stroke_width(1),
            ))
            .map_err(|x| e(&x))?
            .label(format!("iperf3 -l 1M ({g:.2} GB/s)"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
