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
