//! The plots read: each is rendered and its SVG parsed for the tick labels, the axis titles
//! and the legend's box.

use super::*;
use crate::confidence::{Confidence, Interval};
use crate::offered::{Spread, System};

/// An element's attribute.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    tag[at..].split('"').next()
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A text element: its tag's attributes and its content.
struct Label {
    x: f64,
    y: f64,
    anchor: String,
    size: String,
    text: String,
}

fn texts(svg: &str) -> Vec<Label> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let (tag, rest) = t.split_once('>')?;
            let text = rest.split("</text>").next()?.trim().to_string();
            Some(Label {
                x: num(tag, "x"),
                y: num(tag, "y"),
                anchor: attr(tag, "text-anchor")?.to_string(),
                size: attr(tag, "font-size")?.to_string(),
                text,
            })
        })
        .collect()
}

/// Rectangles filled with `fill`: x, y, width, height.
fn rects(svg: &str, fill: RGBColor) -> Vec<[f64; 4]> {
    let want = format!("#{:02X}{:02X}{:02X}", fill.0, fill.1, fill.2);
    svg.split("<rect")
        .skip(1)
        .filter_map(|t| {
            let tag = t.split('>').next()?;
            (attr(tag, "fill")? == want).then(|| {
                [
                    num(tag, "x"),
                    num(tag, "y"),
                    num(tag, "width"),
                    num(tag, "height"),
                ]
            })
        })
        .collect()
}

fn overlap(a: [f64; 4], b: [f64; 4]) -> bool {
    a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3]
}

/// A tick label as a number: digits with an optional k or M, never a trailing zero after
/// the point.
fn tick_value(s: &str) -> Result<f64, String> {
    let (digits, scale) = match s.strip_suffix('k') {
        Some(d) => (d, 1e3),
        None => match s.strip_suffix('M') {
            Some(d) => (d, 1e6),
            None => (s, 1.0),
        },
    };
    if digits.contains('.') && (digits.ends_with('0') || digits.ends_with('.')) {
        return Err(format!("{s:?}: more decimals than it needs"));
    }
    digits
        .parse::<f64>()
        .map(|v| v * scale)
        .map_err(|_| format!("{s:?} is not a number"))
}

/// Checks an SVG of `panels` panels: at least 3 numeric tick labels on each axis of each,
/// every axis titled with a unit in parentheses, and no legend box over a plot area.
/// Returns every text, for more checks.
fn check_svg(path: &std::path::Path, panels: usize) -> Vec<Label> {
    let svg = std::fs::read_to_string(path).unwrap();
    let areas = rects(&svg, PLOT_BG);
    assert_eq!(areas.len(), panels, "plot areas in {}", path.display());
    let legends = rects(&svg, LEGEND_BG);
    assert!(!legends.is_empty(), "no legend in {}", path.display());
    for l in &legends {
        for a in &areas {
            assert!(!overlap(*l, *a), "legend {l:?} over the plot area {a:?}");
        }
    }
    let all = texts(&svg);
    let size = |f: f64| format!("{}", f / 1.24);
    let ticks: Vec<&Label> = all.iter().filter(|t| t.size == size(TICK_FONT)).collect();
    for a in &areas {
        let (x0, y0, x1, y1) = (a[0], a[1], a[0] + a[2], a[1] + a[3]);
        let ys: Vec<&str> = ticks
            .iter()
            .filter(|t| t.anchor == "end" && t.x < x0 && t.x > x0 - 80.0)
            .filter(|t| t.y >= y0 - 2.0 && t.y <= y1 + 2.0)
            .map(|t| t.text.as_str())
            .collect();
        let xs: Vec<&str> = ticks
            .iter()
            .filter(|t| t.anchor == "middle" && t.y > y1 && t.y < y1 + 30.0)
            .filter(|t| t.x >= x0 - 2.0 && t.x <= x1 + 2.0)
            .map(|t| t.text.as_str())
            .collect();
        for (axis, labels) in [("x", &xs), ("y", &ys)] {
            assert!(labels.len() >= 3, "{axis} axis of {a:?}: {labels:?}");
            let vals: Vec<f64> = labels
                .iter()
                .map(|s| tick_value(s).unwrap_or_else(|e| panic!("{axis} axis: {e}")))
                .collect();
            let mut sorted = vals.clone();
            sorted.sort_by(f64::total_cmp);
            sorted.dedup();
            assert_eq!(sorted.len(), vals.len(), "{axis} labels repeat: {labels:?}");
        }
    }
    let titles: Vec<&Label> = all.iter().filter(|t| t.size == size(AXIS_FONT)).collect();
    assert_eq!(titles.len(), 2 * panels, "axis titles");
    for t in titles {
        let unit = t
            .text
            .rsplit_once('(')
            .and_then(|(_, u)| u.strip_suffix(')'))
            .unwrap_or("");
        assert!(
            !unit.trim().is_empty(),
            "axis title without a unit: {:?}",
            t.text
        );
    }
    all
}

/// A point of a sweep, made up: its latency (µs), memory (bytes) and verdict.
fn point(x_hz: f64, lat: [f64; 3], mem: f64, keeps_up: bool) -> Planned {
    let spread = |p50, p99, p999| Spread {
        mean: p50,
        p50,
        p99,
        p999,
        max: p999,
    };
    let system = System::from_toml(&format!(
        "name = \"test\"\nrus = 8\nbus = 8\nlink_gbps = 100\ntrigger_hz = {x_hz}\nfragment_bytes = 16000\n"
    ))
    .unwrap();
    Planned {
        offered_link_load: system.link_load(),
        built_hz: x_hz,
        built_gbps: x_hz * 8.0 * 16000.0 * 8.0 / 1e9,
        bu_link_busy: system.link_load().min(1.0),
        throttled: if keeps_up { 0.0 } else { 0.02 },
        keeps_up,
        latency_us: spread(lat[0], lat[1], lat[2]),
        ru_buffer_bytes: spread(mem, mem, mem),
        bu_buffer_bytes: spread(mem * 0.9, mem * 0.9, mem * 0.9),
        events_measured: 1000,
        confidence: None,
        system,
    }
}

#[test]
fn a_log_axis_inside_one_decade_has_labels_and_the_markers_are_explained() {
    // latency from 322 to 345 µs: the padded axis spans less than a decade
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("narrow.svg");
    let xs = [100.0, 200.0, 400.0];
    let pts: Vec<Planned> = [
        ([340.0, 344.0, 345.0], false),
        ([330.0, 338.0, 340.0], true),
        ([322.0, 330.0, 333.0], true),
    ]
    .into_iter()
    .zip(xs)
    .map(|((lat, ok), x)| point(x * 1e3, lat, 2e6, ok))
    .collect();
    sweep_svg("link_gbps", "", &xs, &pts, &path).unwrap();
    let texts = check_svg(&path, 4);
    let legend = |s: &str| texts.iter().any(|t| t.text.contains(s));
    assert!(legend("does not keep up"), "the hollow marker explained");
    assert!(legend("keeps up"));
    assert!(legend("throttled"), "a throttle panel");
    assert!(legend("offered"));
    assert!(
        legend("a sweep over link_gbps"),
        "the title says it is a sweep"
    );
}

#[test]
fn a_large_range_axis_is_logarithmic_and_labelled_compactly() {
    // trigger rate over three decades, latency over four: 1, 10, 100, 1000, 10k
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.svg");
    let xs = [1e3, 1e4, 1e5, 1e6];
    let pts: Vec<Planned> = xs
        .iter()
        .zip([
            [2.0, 3.0, 4.0],
            [5.0, 9.0, 20.0],
            [50.0, 300.0, 900.0],
            [5e3, 2e4, 5e4],
        ])
        .map(|(&x, lat)| {
            let mut p = point(x, lat, x * 3.0, x < 1e6);
            // replications: bars on the curves
            p.confidence = Some(Confidence {
                replications: 3,
                kept_up: 3,
                latency_p99_us: Interval {
                    lo: lat[1] * 0.9,
                    hi: lat[1] * 1.1,
                },
                ..Confidence::default()
            });
            p
        })
        .collect();
    sweep_svg("trigger_hz", "credits=4", &xs, &pts, &path).unwrap();
    let texts = check_svg(&path, 4);
    let all: Vec<&str> = texts.iter().map(|t| t.text.as_str()).collect();
    assert!(all.contains(&"10k"), "{all:?}");
    assert!(
        all.iter().any(|t| t.contains("over 3 replications")),
        "{all:?}"
    );
    assert!(!all.iter().any(|t| t.ends_with(".0")), "{all:?}");
}

#[test]
fn a_simulated_sweep_and_the_other_plots_read() {
    // a sweep of the model itself (the report's plot), over a linear axis
    let dir = tempfile::tempdir().unwrap();
    let base = System::from_toml(
        "rus = 4\nbus = 4\nlink_gbps = 10\ntrigger_hz = 20000\nfragment_bytes = 10000\nfragment_sd_bytes = 2000\nevents = 2000\n",
    )
    .unwrap();
    let xs = [10.0, 20.0, 40.0];
    let pts: Vec<Planned> = xs
        .iter()
        .map(|&g| {
            crate::confidence::plan_replicated(
                &System {
                    link_gbps: g,
                    ..base.clone()
                },
                2,
                0.0,
            )
        })
        .collect();
    let path = dir.path().join("sweep.svg");
    sweep_svg("link_gbps", "", &xs, &pts, &path).unwrap();
    check_svg(&path, 4);
    // efficiency against N and a model's curves
    let outcomes: Vec<Outcome> = [1, 2, 4, 8]
        .into_iter()
        .flat_map(|n| Policy::ALL.map(|p| crate::simulate(p, n, n, 500, 1)))
        .collect();
    let path = dir.path().join("eff.svg");
    efficiency_svg(&outcomes, &path).unwrap();
    check_svg(&path, 1);
    let curves = vec![("a".to_string(), vec![(8.0, 0.5), (64.0, 0.6), (512.0, 0.7)])];
    let path = dir.path().join("curves.svg");
    curves_svg("N", "N (hosts; log scale)", &curves, true, &path).unwrap();
    check_svg(&path, 1);
}

#[test]
fn ticks_and_labels_are_compact() {
    assert_eq!(compact(5000.0), "5000");
    assert_eq!(compact(0.5), "0.5");
    assert_eq!(compact(0.30000000000000004), "0.3");
    assert_eq!(compact(412.5), "412.5");
    assert_eq!(compact(-0.0), "0");
    // inside one decade: 300, 400, 500 or finer
    let t = ticks(260.0, 540.0, true);
    assert!(t.len() >= 3, "{t:?}");
    // narrower than the 1-9 mantissas: even steps
    let t = ticks(101.0, 127.0, true);
    assert!(t.len() >= 3 && t.len() <= 9, "{t:?}");
    for (lo, hi) in [(0.0, 1.0), (0.0, 47686.0), (95.0, 105.0), (1e-3, 2e-3)] {
        let t = ticks(lo, hi, false);
        assert!(t.len() >= 3 && t.len() <= 9, "{lo}..{hi}: {t:?}");
    }
    let l: Vec<String> = labels(&[0.0, 20e3, 40e3], false)
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    assert_eq!(l, ["0", "20k", "40k"]);
}
