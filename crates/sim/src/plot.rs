//! Efficiency against N, one line per policy, as an SVG (plotters, no system library).

use plotters::prelude::*;

use crate::{hol_limit, Outcome, Policy};

/// Draws every outcome of an N × N sweep to `path`.
pub fn efficiency_svg(points: &[Outcome], path: &std::path::Path) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("plot {}: {x}", path.display());
    let nmax = points.iter().map(|p| p.sources).max().unwrap_or(2).max(2) as f64;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "N x N switch, saturated inputs: output-link efficiency",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((1f64..nmax).log_scale(), 0.5f64..1.02)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("N (RUs = BUs)")
        .y_desc("efficiency")
        .draw()
        .map_err(|x| e(&x))?;
    for (k, policy) in Policy::ALL.into_iter().enumerate() {
        let pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.policy == policy && p.sources == p.destinations)
            .map(|p| (p.sources as f64, p.efficiency))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(policy.name())
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
    let limit = hol_limit();
    chart
        .draw_series(LineSeries::new(
            vec![(1.0, limit), (nmax, limit)],
            BLACK.stroke_width(1),
        ))
        .map_err(|x| e(&x))?
        .label(format!("2 - sqrt 2 = {limit:.4}"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::MiddleRight)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// The unit of a system file's key, for an axis (docs/scaling.md, "Planning a system").
pub fn unit_of(key: &str) -> &'static str {
    match key {
        "link_gbps" => "Gb/s",
        "trigger_hz" => "Hz",
        "fragment_bytes" | "fragment_sd_bytes" => "bytes",
        "credits" => "events per BU",
        "build_us" | "hop_us" => "µs",
        "rus" | "bus" => "nodes",
        _ => "",
    }
}

/// A sweep of `evb sim --system` over `key` (`xs`, one per point), as an SVG: the build
/// latency's p50, p99 and p99.9 (µs, log scale) on the left, one RU's and one BU's memory
/// (p99, MB) on the right; points that do not keep up are drawn hollow. `group` names the
/// other keys' values of a sweep over several (empty: none).
pub fn sweep_svg(
    key: &str,
    group: &str,
    xs: &[f64],
    points: &[crate::offered::Planned],
    path: &std::path::Path,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("plot {}: {x}", path.display());
    if xs.len() != points.len() || xs.is_empty() {
        return Err(e(&"no points"));
    }
    let (x0, x1) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let pad = ((x1 - x0) * 0.05).max(x0.abs() * 0.05).max(1e-9);
    let (x0, x1) = (x0 - pad, x1 + pad);
    let name = points[0].system.name.clone();
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let title = if name.is_empty() {
        "system".to_string()
    } else {
        name
    };
    let root = root
        .titled(
            &if group.is_empty() {
                format!("{title}, over {key}")
            } else {
                format!("{title}, over {key} ({group})")
            },
            ("sans-serif", 20),
        )
        .map_err(|x| e(&x))?;
    let (left, right) = root.split_horizontally(550);
    let xlabel = match unit_of(key) {
        "" => key.to_string(),
        u => format!("{key} ({u})"),
    };
    // latency
    let lat: Vec<[f64; 3]> = points
        .iter()
        .map(|p| [p.latency_us.p50, p.latency_us.p99, p.latency_us.p999].map(|v| v.max(1e-3)))
        .collect();
    let (lo, hi) = lat
        .iter()
        .flatten()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let mut chart = ChartBuilder::on(&left)
        .caption("build latency, trigger to built", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, ((lo / 1.5)..(hi * 1.5)).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc(xlabel.as_str())
        .y_desc("latency (µs)")
        .draw()
        .map_err(|x| e(&x))?;
    for (k, label) in ["p50", "p99", "p99.9"].into_iter().enumerate() {
        let pts: Vec<(f64, f64)> = xs.iter().zip(&lat).map(|(&x, l)| (x, l[k])).collect();
        draw_curve(&mut chart, &pts, |i| points[i].keeps_up, k, label).map_err(|x| e(&x))?;
    }
    legend(&mut chart).map_err(|x| e(&x))?;
    // memory
    let mem: Vec<[f64; 2]> = points
        .iter()
        .map(|p| [p.ru_buffer_bytes.p99 / 1e6, p.bu_buffer_bytes.p99 / 1e6])
        .collect();
    let top = mem.iter().flatten().fold(0.0f64, |a, &v| a.max(v)) * 1.15 + 1e-6;
    let mut chart = ChartBuilder::on(&right)
        .caption("memory held, p99", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, 0.0..top)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc(xlabel.as_str())
        .y_desc("MB (10⁶ bytes)")
        .draw()
        .map_err(|x| e(&x))?;
    for (k, label) in ["one RU", "one BU"].into_iter().enumerate() {
        let pts: Vec<(f64, f64)> = xs.iter().zip(&mem).map(|(&x, m)| (x, m[k])).collect();
        draw_curve(&mut chart, &pts, |i| points[i].keeps_up, k + 3, label).map_err(|x| e(&x))?;
    }
    legend(&mut chart).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

type Chart<'a, Y> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

/// The chart's legend, in its upper right corner.
fn legend<Y>(chart: &mut Chart<'_, Y>) -> Result<(), String>
where
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|x| x.to_string())
}

/// One labelled curve, its points filled where the system keeps up and hollow where not.
fn draw_curve<Y>(
    chart: &mut Chart<'_, Y>,
    pts: &[(f64, f64)],
    filled: impl Fn(usize) -> bool,
    k: usize,
    label: &str,
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64>,
{
    let color = Palette99::pick(k).to_rgba();
    chart
        .draw_series(LineSeries::new(pts.to_vec(), color.stroke_width(2)))
        .map_err(|x| x.to_string())?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(pts.iter().enumerate().map(|(i, &(x, y))| {
            let style = if filled(i) {
                color.filled()
            } else {
                color.stroke_width(2)
            };
            Circle::new((x, y), 4, style)
        }))
        .map_err(|x| x.to_string())?;
    Ok(())
}

/// Curves of y against x (`curves`: a label and its points each) as an SVG: a model's
/// sweep over one of its parameters, one curve per shaping (and size) or routing. `y` is a
/// fraction, drawn as a percentage from 0 to 100; `log2_x` spaces x by its logarithm (N
/// from 8 to 512), its labels still in x.
pub fn curves_svg(
    title: &str,
    xlabel: &str,
    curves: &[(String, Vec<(f64, f64)>)],
    log2_x: bool,
    path: &std::path::Path,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("plot {}: {x}", path.display());
    let fx = |x: f64| if log2_x { x.max(1e-9).log2() } else { x };
    let xs = curves
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(x, _)| fx(x)));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if x0 > x1 {
        return Err(e(&"no points"));
    }
    let pad = ((x1 - x0) * 0.05).max(x0.abs() * 0.05).max(1e-9);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0f64..102.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .x_label_formatter(&|x| {
            if log2_x {
                format!("{:.0}", 2f64.powf(*x))
            } else {
                format!("{x}")
            }
        })
        .y_desc("links busy (%)")
        .draw()
        .map_err(|x| e(&x))?;
    for (k, (label, pts)) in curves.iter().enumerate() {
        let pts: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (fx(x), y * 100.0)).collect();
        draw_curve(&mut chart, &pts, |_| true, k, label).map_err(|x| e(&x))?;
    }
    legend(&mut chart).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
