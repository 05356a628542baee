//! The simulator's plots as SVG (plotters, no system library): efficiency against N, a
//! model's sweep over a parameter, and the planner's sweep of a system.
//!
//! Every axis is titled with its unit and carries at least three labelled ticks at any
//! scale: a log axis inside one decade gets 2-5 or 1-9 mantissas, or evenly spaced ticks
//! where even those are too sparse. Labels are written compactly (5000, 10k, 0.5: never
//! "5000.0"). Legends sit in a strip below the data, never over it.

use std::ops::Range;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::offered::Planned;
use crate::{hol_limit, Outcome, Policy};

/// Font sizes (px). The tests tell tick labels, axis titles and legends apart by them.
pub const TICK_FONT: f64 = 12.0;
pub const AXIS_FONT: f64 = 14.0;
pub const LEGEND_FONT: f64 = 13.0;
/// The plot area's background and the legend box's: the tests find them by colour.
pub const PLOT_BG: RGBColor = RGBColor(250, 250, 252);
pub const LEGEND_BG: RGBColor = RGBColor(246, 246, 240);

/// Curves' colours, distinct on white (Tableau's ten).
const PALETTE: [RGBColor; 10] = [
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

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An axis: its title (with the unit), its range and whether it is logarithmic.
#[derive(Debug, Clone)]
pub struct Axis {
    pub title: String,
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    /// Ticks to use instead of computed ones (e.g. N at powers of two); empty: computed.
    pub at: Vec<f64>,
}

impl Axis {
    fn new(title: impl Into<String>, (lo, hi): (f64, f64), log: bool) -> Axis {
        Axis {
            title: title.into(),
            lo,
            hi,
            log,
            at: Vec::new(),
        }
    }

    /// A value's position: its logarithm on a log axis.
    fn map(&self, v: f64) -> f64 {
        if self.log {
            v.max(1e-12).log10()
        } else {
            v
        }
    }

    fn range(&self) -> Range<f64> {
        self.map(self.lo)..self.map(self.hi)
    }

    /// The ticks and their labels.
    pub fn ticks(&self) -> Vec<(f64, String)> {
        let vals = if self.at.is_empty() {
            ticks(self.lo, self.hi, self.log)
        } else {
            self.at.clone()
        };
        labels(&vals, self.log)
    }
}

/// Tick values inside [lo, hi]: on a log axis the sparsest of 1, 1-2-5, 1-2-3-5 and 1-9
/// per decade that gives three, else (a narrow log range, or a linear axis) evenly spaced
/// ones at 1, 2 or 5 × a power of ten.
pub fn ticks(lo: f64, hi: f64, log: bool) -> Vec<f64> {
    if log && lo > 0.0 && hi > lo {
        let sets: [&[f64]; 4] = [
            &[1.0],
            &[1.0, 2.0, 5.0],
            &[1.0, 2.0, 3.0, 5.0],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        ];
        for mantissas in sets {
            let t = decades(lo, hi, mantissas);
            if t.len() >= 3 {
                // many decades: every k-th, at most 10 labels
                let k = t.len().div_ceil(10);
                return t.into_iter().step_by(k).collect();
            }
        }
    }
    linear_ticks(lo, hi)
}

/// `m` × 10^e for every mantissa and decade, inside [lo, hi].
fn decades(lo: f64, hi: f64, mantissas: &[f64]) -> Vec<f64> {
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let mut out = Vec::new();
    for e in e0..=e1 {
        for m in mantissas {
            let v = m * 10f64.powi(e);
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                out.push(v);
            }
        }
    }
    out
}

/// Multiples of a step of 1, 2 or 5 × 10^k inside [lo, hi]: between 3 and 9 of them (the
/// step is at least a tenth of the range and under 2.5 × an eighth of it).
fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 1.0, lo + 1.0)
    };
    let raw = (hi - lo) / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Labels for tick values: compact numbers, with k or M where that is shorter. A linear
/// axis uses one suffix throughout (from its largest value), a log axis each its own.
fn labels(vals: &[f64], log: bool) -> Vec<(f64, String)> {
    let big = vals.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    vals.iter()
        .map(|&v| {
            let scale = if log { v.abs() } else { big };
            let text = match scale {
                _ if v == 0.0 => "0".to_string(),
                s if s >= 1e6 => format!("{}M", compact(v / 1e6)),
                s if s >= 1e4 => format!("{}k", compact(v / 1e3)),
                _ => compact(v),
            };
            (v, text)
        })
        .collect()
}

/// A number in as few characters as reads right: four significant digits at most, no
/// trailing zeros (5000, 412.5, 0.25, 0).
pub fn compact(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".into();
    }
    let decimals = ((-v.abs().log10()).ceil() as i32 + 3).clamp(0, 9) as usize;
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy)]
pub enum Mark {
    /// A curve: its line and a filled marker.
    Curve(RGBAColor),
    /// A line alone (a reference), dashed or not.
    Line(RGBAColor, bool),
    /// A marker alone, filled or hollow.
    Dot(RGBAColor, bool),
    /// An interval bar.
    Bar(RGBAColor),
}

/// One curve of a panel: its points, which are hollow (a point that does not keep up),
/// and each point's interval (empty: none).
#[derive(Debug, Clone)]
pub struct Curve {
    pub label: String,
    pub color: RGBAColor,
    pub pts: Vec<(f64, f64)>,
    pub hollow: Vec<bool>,
    pub bars: Vec<(f64, f64)>,
    /// A reference line: dashed, no markers.
    pub reference: bool,
}

impl Curve {
    fn new(label: impl Into<String>, k: usize, pts: Vec<(f64, f64)>) -> Curve {
        Curve {
            label: label.into(),
            color: PALETTE[k % PALETTE.len()].to_rgba(),
            pts,
            hollow: Vec::new(),
            bars: Vec::new(),
            reference: false,
        }
    }

    fn mark(&self) -> Mark {
        if self.reference {
            Mark::Line(self.color, true)
        } else {
            Mark::Curve(self.color)
        }
    }
}

/// Height of a legend strip of `rows` rows (px).
fn legend_height(rows: usize) -> u32 {
    rows as u32 * 20 + 14
}

/// The legend's entries laid out left to right, wrapped at `width`: each entry's
/// position, and the number of rows.
fn legend_layout(entries: &[(String, Mark)], width: u32) -> (Vec<(i32, i32)>, usize) {
    let (mut x, mut row) = (16i32, 0usize);
    let mut at = Vec::new();
    for (label, _) in entries {
        // the mark, then the text at about half an em a character
        let w = 34 + (label.chars().count() as f64 * LEGEND_FONT * 0.52) as i32 + 18;
        if x + w > width as i32 - 8 && x > 16 {
            (x, row) = (16, row + 1);
        }
        at.push((x, row as i32 * 20 + 17));
        x += w;
    }
    (at, row + 1)
}

/// Draws a legend into `area` (a strip of its own, outside every plot area), boxed.
fn legend(area: &Area, entries: &[(String, Mark)]) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("legend: {x}");
    if entries.is_empty() {
        return Ok(());
    }
    let (w, _) = area.dim_in_pixel();
    let (at, rows) = legend_layout(entries, w);
    let right = at
        .iter()
        .zip(entries)
        .map(|(&(x, _), (l, _))| x + 34 + (l.chars().count() as f64 * LEGEND_FONT * 0.52) as i32)
        .max()
        .unwrap_or(0)
        .min(w as i32 - 4);
    let bottom = rows as i32 * 20 + 8;
    area.draw(&Rectangle::new(
        [(6, 4), (right + 8, bottom)],
        LEGEND_BG.filled(),
    ))
    .map_err(|x| e(&x))?;
    area.draw(&Rectangle::new(
        [(6, 4), (right + 8, bottom)],
        BLACK.mix(0.5).stroke_width(1),
    ))
    .map_err(|x| e(&x))?;
    let font = TextStyle::from(("sans-serif", LEGEND_FONT).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (&(x, y), (label, mark)) in at.iter().zip(entries) {
        draw_mark(area, *mark, x, y).map_err(|x| e(&x))?;
        area.draw(&Text::new(label.clone(), (x + 30, y), font.clone()))
            .map_err(|x| e(&x))?;
    }
    Ok(())
}

/// A legend entry's mark, 24 px wide from (x, y).
fn draw_mark(
    area: &Area,
    mark: Mark,
    x: i32,
    y: i32,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    match mark {
        Mark::Curve(c) => {
            area.draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                c.stroke_width(2),
            ))?;
            area.draw(&Circle::new((x + 12, y), 4, c.filled()))
        }
        Mark::Line(c, dashed) if dashed => {
            for k in 0..3 {
                area.draw(&PathElement::new(
                    vec![(x + 9 * k, y), (x + 9 * k + 6, y)],
                    c.stroke_width(2),
                ))?;
            }
            Ok(())
        }
        Mark::Line(c, _) => area.draw(&PathElement::new(
            vec![(x, y), (x + 24, y)],
            c.stroke_width(2),
        )),
        Mark::Dot(c, true) => area.draw(&Circle::new((x + 12, y), 4, c.filled())),
        Mark::Dot(c, false) => area.draw(&Circle::new((x + 12, y), 4, c.stroke_width(2))),
        Mark::Bar(c) => {
            area.draw(&PathElement::new(
                vec![(x + 12, y - 7), (x + 12, y + 7)],
                c.stroke_width(1),
            ))?;
            for yy in [y - 7, y + 7] {
                area.draw(&PathElement::new(
                    vec![(x + 8, yy), (x + 16, yy)],
                    c.stroke_width(1),
                ))?;
            }
            Ok(())
        }
    }
}

/// One panel: a chart of `curves` over axes `x` and `y` in the top of `area`, its legend
/// in a strip below it.
fn panel(area: &Area, caption: &str, x: &Axis, y: &Axis, curves: &[Curve]) -> Result<(), String> {
    let e = |m: &dyn std::fmt::Display| format!("{caption}: {m}");
    let entries: Vec<(String, Mark)> = curves.iter().map(|c| (c.label.clone(), c.mark())).collect();
    let (w, h) = area.dim_in_pixel();
    let (_, rows) = legend_layout(&entries, w);
    let (top, bottom) = area.split_vertically(h.saturating_sub(legend_height(rows)));
    let (xt, yt) = (x.ticks(), y.ticks());
    let key =
        |a: &Axis, t: &[(f64, String)]| -> Vec<f64> { t.iter().map(|(v, _)| a.map(*v)).collect() };
    let mut chart = ChartBuilder::on(&top)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(68)
        .build_cartesian_2d(
            Ticked(x.range(), key(x, &xt)),
            Ticked(y.range(), key(y, &yt)),
        )
        .map_err(|m| e(&m))?;
    chart.plotting_area().fill(&PLOT_BG).map_err(|m| e(&m))?;
    let label = |a: &Axis, t: &[(f64, String)], v: f64| -> String {
        t.iter()
            .min_by(|p, q| (a.map(p.0) - v).abs().total_cmp(&(a.map(q.0) - v).abs()))
            .map_or_else(String::new, |(_, s)| s.clone())
    };
    let xf = |v: &f64| label(x, &xt, *v);
    let yf = |v: &f64| label(y, &yt, *v);
    chart
        .configure_mesh()
        .x_desc(x.title.as_str())
        .y_desc(y.title.as_str())
        .label_style(("sans-serif", TICK_FONT))
        .axis_desc_style(("sans-serif", AXIS_FONT))
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(|m| e(&m))?;
    for c in curves {
        let pts: Vec<(f64, f64)> = c.pts.iter().map(|&(a, b)| (x.map(a), y.map(b))).collect();
        draw_curve(&mut chart, c, &pts, |v| y.map(v)).map_err(|m| e(&m))?;
    }
    legend(&bottom, &entries)
}

/// A linear coordinate (in an axis's mapped values) whose ticks are given: plotters' own
/// pick none inside a decade of a log axis.
struct Ticked(Range<f64>, Vec<f64>);

impl Ranged for Ticked {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.0.end - self.0.start;
        let r = if span > 0.0 {
            (v - self.0.start) / span
        } else {
            0.5
        };
        limit.0 + (r * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.1.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.0.clone()
    }
}

type Chart<'a> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<Ticked, Ticked>>;

/// A curve's line, its markers (hollow where asked) and its interval bars; `pts` are in
/// the chart's coordinates, `fy` maps a bar's ends there.
fn draw_curve(
    chart: &mut Chart<'_>,
    c: &Curve,
    pts: &[(f64, f64)],
    fy: impl Fn(f64) -> f64,
) -> Result<(), String> {
    let err = |x: &dyn std::fmt::Display| x.to_string();
    if c.reference {
        chart
            .draw_series(DashedLineSeries::new(
                pts.to_vec(),
                6,
                4,
                c.color.stroke_width(2),
            ))
            .map_err(|x| err(&x))?;
        return Ok(());
    }
    chart
        .draw_series(LineSeries::new(pts.to_vec(), c.color.stroke_width(2)))
        .map_err(|x| err(&x))?;
    for (&(x, _), &(lo, hi)) in pts.iter().zip(&c.bars) {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, fy(lo)), (x, fy(hi))],
                c.color.stroke_width(1),
            )))
            .map_err(|x| err(&x))?;
    }
    let color = c.color;
    chart
        .draw_series(pts.iter().enumerate().map(|(i, &p)| {
            let style = if c.hollow.get(i).copied().unwrap_or(false) {
                color.stroke_width(2)
            } else {
                color.filled()
            };
            Circle::new(p, 4, style)
        }))
        .map_err(|x| err(&x))?;
    Ok(())
}

/// The smallest and largest of `vals`, padded for a plot: by a factor on a log axis, by a
/// twentieth of the span on a linear one (a single value: ± 5 % of it, or ± 1).
fn padded(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (lo, hi) = vals
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if lo > hi {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        return (lo / 1.25, hi * 1.25);
    }
    let pad = ((hi - lo) * 0.05).max(lo.abs() * 0.05).max(1e-9);
    (lo - pad, hi + pad)
}

/// From 0 to a little above the largest of `vals` (at least `floor`).
fn from_zero(vals: impl Iterator<Item = f64>, floor: f64) -> (f64, f64) {
    let top = vals.filter(|v| v.is_finite()).fold(floor, f64::max);
    (0.0, top * 1.12)
}

/// Draws every outcome of an N × N sweep to `path`.
pub fn efficiency_svg(points: &[Outcome], path: &std::path::Path) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("plot {}: {x}", path.display());
    let nmax = points.iter().map(|p| p.sources).max().unwrap_or(2).max(2) as f64;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut curves: Vec<Curve> = Policy::ALL
        .into_iter()
        .enumerate()
        .map(|(k, policy)| {
            let pts = points
                .iter()
                .filter(|p| p.policy == policy && p.sources == p.destinations)
                .map(|p| (p.sources as f64, p.efficiency * 100.0))
                .collect();
            Curve::new(policy.name(), k, pts)
        })
        .filter(|c| !c.pts.is_empty())
        .collect();
    let limit = hol_limit();
    curves.push(Curve {
        reference: true,
        ..Curve::new(
            format!("2 - sqrt 2 = {:.2} %", limit * 100.0),
            0,
            vec![(1.0, limit * 100.0), (nmax, limit * 100.0)],
        )
    });
    curves.last_mut().expect("pushed").color = BLACK.to_rgba();
    let x = Axis::new("N, RUs = BUs (nodes)", (1.0, nmax), true);
    let y = Axis::new("output links busy (%)", (50.0, 102.0), false);
    panel(
        &root,
        "N x N switch, saturated inputs: output-link efficiency",
        &x,
        &y,
        &curves,
    )?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// The unit of a system file's key, for an axis (docs/planning.md).
pub fn unit_of(key: &str) -> &'static str {
    match key {
        "link_gbps" => "Gb/s",
        "trigger_hz" => "Hz",
        "fragment_bytes" | "fragment_sd_bytes" => "bytes",
        "credits" => "events per BU",
        "build_us" | "hop_us" => "µs",
        "rus" | "bus" => "nodes",
        "link_efficiency" => "fraction of the link",
        "events" => "events",
        "seed" => "seed",
        "leaf_radix" => "ports per leaf",
        "oversubscription" => "host ports per uplink",
        "spines" => "spines",
        "host_gbps" => "Gb/s",
        "size_correlation" => "share of the variance",
        _ => "",
    }
}

/// A sweep of `evb sim --system` over `key` (`xs`, one per point), as an SVG of four
/// panels against the key: the build latency's p50, p99 and p99.9 (µs, log scale); one
/// RU's and one BU's memory (p99, MB); the data built and offered (Gb/s); and the links'
/// load and the triggers throttled (%). Points that do not keep up are hollow; with
/// replications, bars span the figure's range over them. A strip at the bottom explains
/// the markers. `group` names the other keys' values of a sweep over several (empty:
/// none).
pub fn sweep_svg(
    key: &str,
    group: &str,
    xs: &[f64],
    points: &[Planned],
    path: &std::path::Path,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("plot {}: {x}", path.display());
    if xs.len() != points.len() || xs.is_empty() {
        return Err(e(&"no points"));
    }
    let name = match points[0].system.name.as_str() {
        "" => "system",
        n => n,
    };
    let root = SVGBackend::new(path, (1100, 940)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let title = match group {
        "" => format!("{name}: a sweep over {key}"),
        g => format!("{name}: a sweep over {key} ({g})"),
    };
    let root = root.titled(&title, ("sans-serif", 20)).map_err(|x| e(&x))?;
    let replications = points[0].confidence.as_ref().map_or(1, |c| c.replications);
    let notes = marker_notes(replications);
    let (_, h) = root.dim_in_pixel();
    let (w, _) = root.dim_in_pixel();
    let (_, rows) = legend_layout(&notes, w);
    let (grid, foot) = root.split_vertically(h - legend_height(rows));
    let panels = grid.split_evenly((2, 2));
    // a range of more than a factor 20 reads better on a log axis
    let (lo, hi) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let log_x = lo > 0.0 && hi / lo >= 20.0;
    let x = Axis::new(
        match unit_of(key) {
            "" => key.to_string(),
            u => format!("{key} ({u})"),
        },
        padded(xs.iter().copied(), log_x),
        log_x,
    );
    let hollow: Vec<bool> = points.iter().map(|p| !p.keeps_up).collect();
    let series = |k: usize, label: &str, f: &Figure<'_>| {
        let vals: Vec<_> = points.iter().map(f).collect();
        Curve {
            hollow: hollow.clone(),
            bars: vals.iter().filter_map(|(_, b)| *b).collect(),
            ..Curve::new(
                label,
                k,
                xs.iter().zip(&vals).map(|(&x, (v, _))| (x, *v)).collect(),
            )
        }
    };
    let iv = |p: &Planned,
              f: fn(&crate::confidence::Confidence) -> crate::confidence::Interval,
              scale: f64| {
        p.confidence
            .as_ref()
            .filter(|c| c.replications > 1)
            .map(|c| (f(c).lo * scale, f(c).hi * scale))
    };
    // latency
    let lat = [
        series(0, "p50", &|p| {
            (p.latency_us.p50, iv(p, |c| c.latency_p50_us, 1.0))
        }),
        series(1, "p99", &|p| {
            (p.latency_us.p99, iv(p, |c| c.latency_p99_us, 1.0))
        }),
        series(2, "p99.9", &|p| {
            (p.latency_us.p999, iv(p, |c| c.latency_p999_us, 1.0))
        }),
    ];
    let y = Axis::new("latency (µs)", padded(all_values(&lat), true), true);
    panel(&panels[0], "build latency, trigger to built", &x, &y, &lat)?;
    // memory
    let mem = [
        series(3, "one RU, p99", &|p| {
            (
                p.ru_buffer_bytes.p99 / 1e6,
                iv(p, |c| c.ru_mem_p99_bytes, 1e-6),
            )
        }),
        series(4, "one BU, p99", &|p| {
            (
                p.bu_buffer_bytes.p99 / 1e6,
                iv(p, |c| c.bu_mem_p99_bytes, 1e-6),
            )
        }),
    ];
    let y = Axis::new(
        "memory held (MB, 10⁶ bytes)",
        from_zero(all_values(&mem), 1e-3),
        false,
    );
    panel(&panels[1], "memory held, p99", &x, &y, &mem)?;
    // throughput: what is built against what the trigger offers
    let gbps = series(5, "built", &|p| {
        (p.built_gbps, iv(p, |c| c.built_gbps, 1.0))
    });
    let offered = Curve {
        reference: true,
        color: BLACK.mix(0.6).to_rgba(),
        ..series(0, "offered (trigger rate × event size)", &|p| {
            (offered_gbps(p), None)
        })
    };
    let thr = [gbps, offered];
    let y = Axis::new(
        "event data (Gb/s)",
        from_zero(all_values(&thr), 1e-3),
        false,
    );
    panel(&panels[2], "throughput", &x, &y, &thr)?;
    // load and throttling
    let load = [
        series(6, "offered load", &|p| (p.offered_link_load * 100.0, None)),
        series(7, "BU links busy", &|p| {
            (p.bu_link_busy * 100.0, iv(p, |c| c.bu_link_busy, 100.0))
        }),
        series(8, "triggers throttled", &|p| {
            (p.throttled * 100.0, iv(p, |c| c.throttled, 100.0))
        }),
    ];
    let y = Axis::new(
        "load, busy or throttled (%)",
        from_zero(all_values(&load), 100.0),
        false,
    );
    panel(&panels[3], "links' load and throttling", &x, &y, &load)?;
    legend(&foot, &notes)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// A point's figure for a curve, and its range over replications if any.
type Figure<'a> = dyn Fn(&Planned) -> (f64, Option<(f64, f64)>) + 'a;

/// The data a point's trigger offers (Gb/s): rate × RUs × the mean fragment.
fn offered_gbps(p: &Planned) -> f64 {
    let s = &p.system;
    s.trigger_hz * s.rus as f64 * s.fragment_bytes * 8.0 / 1e9
}

/// Every value a panel shows, bars included (for its range).
fn all_values(curves: &[Curve]) -> impl Iterator<Item = f64> + '_ {
    curves.iter().flat_map(|c| {
        c.pts
            .iter()
            .map(|p| p.1)
            .chain(c.bars.iter().flat_map(|b| [b.0, b.1]))
    })
}

/// What the markers mean: filled keeps up, hollow does not; with replications, the bars.
fn marker_notes(replications: u32) -> Vec<(String, Mark)> {
    let grey = BLACK.mix(0.6).to_rgba();
    let mut notes = vec![
        ("keeps up (filled)".to_string(), Mark::Dot(grey, true)),
        (
            "does not keep up (hollow)".to_string(),
            Mark::Dot(grey, false),
        ),
    ];
    if replications > 1 {
        notes.push((
            format!("min-max over {replications} replications"),
            Mark::Bar(grey),
        ));
    }
    notes
}

/// Curves of y against x (`curves`: a label and its points each) as an SVG: a model's
/// sweep over one of its parameters, one curve per shaping (and size) or routing. `y` is a
/// fraction, drawn as a percentage from 0 to 100; `log2_x` spaces x by its logarithm (N
/// from 8 to 512), its ticks at the points' x.
pub fn curves_svg(
    title: &str,
    xlabel: &str,
    curves: &[(String, Vec<(f64, f64)>)],
    log2_x: bool,
    path: &std::path::Path,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| format!("plot {}: {x}", path.display());
    let xs = curves.iter().flat_map(|(_, p)| p.iter().map(|&(x, _)| x));
    if xs.clone().next().is_none() {
        return Err(e(&"no points"));
    }
    let log = log2_x && xs.clone().all(|x| x > 0.0);
    let mut x = Axis::new(xlabel, padded(xs.clone(), log), log);
    if log {
        let mut at: Vec<f64> = xs.collect();
        at.sort_by(f64::total_cmp);
        at.dedup();
        // at most 10 labels: every k-th point
        let k = at.len().div_ceil(10);
        x.at = at.into_iter().step_by(k).collect();
        if x.at.len() < 3 {
            x.at.clear();
        }
    }
    let y = Axis::new("links busy (%)", (0.0, 102.0), false);
    let cs: Vec<Curve> = curves
        .iter()
        .enumerate()
        .map(|(k, (label, pts))| {
            Curve::new(
                label.clone(),
                k,
                pts.iter().map(|&(x, y)| (x, y * 100.0)).collect(),
            )
        })
        .collect();
    let root = SVGBackend::new(path, (900, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    panel(&root, title, &x, &y, &cs)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests;
