//! `evb sim --system --report FILE`: the run as a report a planner can pass on. HTML is
//! self-contained (the plots inline); Markdown links the plots, which sit beside it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use evb_sim::offered::Planned;

/// Writes the report of `rows` (each point's label and figures) and `plots` (a group's
/// label and its SVG file) for the system in `source`, swept over `sweeps` (each key and
/// its values); the file's extension says the format.
pub fn write(
    path: &Path,
    source: &str,
    sweeps: &[(String, Vec<String>)],
    rows: &[(&str, &Planned)],
    plots: &[(String, PathBuf)],
) -> Result<(), String> {
    let html = match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => true,
        Some("md") => false,
        _ => return Err(format!("--report {}: FILE.html or FILE.md", path.display())),
    };
    let first = rows.first().ok_or("--report: no points")?.1;
    let name = if first.system.name.is_empty() {
        "system"
    } else {
        first.system.name.as_str()
    };
    let head = [
        "point",
        "load",
        "built Hz",
        "Gb/s",
        "BU link",
        "throttled",
        "keeps up",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "RU mem p99",
        "BU mem p99",
    ];
    let cells = |label: &str, p: &Planned| -> Vec<String> {
        let c = p.confidence.as_ref().filter(|c| c.replications > 1);
        vec![
            if label.is_empty() {
                "as given".into()
            } else {
                label.to_string()
            },
            format!("{:.1} %", p.offered_link_load * 100.0),
            format!("{:.0}", p.built_hz),
            format!("{:.1}", p.built_gbps),
            format!("{:.1} %", p.bu_link_busy * 100.0),
            format!("{:.3} %", p.throttled * 100.0),
            super::sim::keeps(p),
            with_range(p.latency_us.p50, c.map(|c| c.latency_p50_us), &|v| {
                format!("{v:.1}")
            }),
            with_range(p.latency_us.p99, c.map(|c| c.latency_p99_us), &|v| {
                format!("{v:.1}")
            }),
            with_range(p.latency_us.p999, c.map(|c| c.latency_p999_us), &|v| {
                format!("{v:.1}")
            }),
            with_range(
                p.ru_buffer_bytes.p99,
                c.map(|c| c.ru_mem_p99_bytes),
                &super::sim::bytes,
            ),
            with_range(
                p.bu_buffer_bytes.p99,
                c.map(|c| c.bu_mem_p99_bytes),
                &super::sim::bytes,
            ),
        ]
    };
    let s = &first.system;
    let keys: Vec<&str> = sweeps.iter().map(|(k, _)| k.as_str()).collect();
    // a sweep's first point is not the system: its swept keys are shown as ‹key›
    let shape = match sweeps {
        [] => s.shape(),
        _ => format!(
            "{}, {} points; the other keys: {}",
            capital(&super::sim::sweep_line(sweeps)),
            rows.len(),
            s.shape_with(&keys)
        ),
    };
    let runs = first.confidence.as_ref().map_or(1, |c| c.replications);
    let margin = first.confidence.as_ref().map_or(0.0, |c| c.margin);
    let mut note = "load: what the offered rate needs of the busiest link; memory: one RU's and \
                one BU's bytes held (fragments of events not yet released); latency: trigger \
                to the event built. Figures from `evb sim --system` (docs/planning.md). "
        .to_string();
    note.push_str(&super::sim::replication_note(runs, s.seed));
    note.push('.');
    if margin > 0.0 {
        let _ = write!(
            note,
            " Every point at (1 + {margin}) × trigger_hz: \"keeps up\" is with {:.0} % headroom.",
            margin * 100.0
        );
    }
    let mut out = String::new();
    if html {
        let _ = write!(
            out,
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n\
             <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
             td,th{{border:1px solid #bbb;padding:3px 8px;text-align:right}}\
             td:first-child{{text-align:left}}.no{{color:#b00;font-weight:bold}}</style>\n\
             </head><body>\n<h1>{t}</h1>\n<p>{src}: {shape}</p>\n<table>\n<tr>",
            t = esc(name),
            src = esc(source),
            shape = esc(&shape)
        );
        for h in head {
            let _ = write!(out, "<th>{}</th>", esc(h));
        }
        out.push_str("</tr>\n");
        for (label, p) in rows {
            out.push_str("<tr>");
            for (k, c) in cells(label, p).iter().enumerate() {
                let class = if k == 6 && !p.keeps_up {
                    " class=\"no\""
                } else {
                    ""
                };
                let _ = write!(out, "<td{class}>{}</td>", esc(c));
            }
            out.push_str("</tr>\n");
        }
        let _ = writeln!(out, "</table>\n<p>{}</p>", esc(&note));
        for (group, svg) in plots {
            let text =
                std::fs::read_to_string(svg).map_err(|e| format!("{}: {e}", svg.display()))?;
            let _ = writeln!(
                out,
                "<h2>{}</h2>\n{text}",
                esc(if group.is_empty() { "plot" } else { group })
            );
        }
        out.push_str("</body></html>\n");
    } else {
        let _ = writeln!(out, "# {name}\n\n{source}: {shape}\n");
        let _ = writeln!(out, "| {} |", head.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
        for (label, p) in rows {
            let row: Vec<String> = cells(label, p)
                .iter()
                .map(|c| c.replace('|', "\\|"))
                .collect();
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        let _ = writeln!(out, "\n{note}\n");
        let dir = path.parent().unwrap_or(Path::new(""));
        for (group, svg) in plots {
            // linked relative to the report where it can be
            let link = svg.strip_prefix(dir).unwrap_or(svg);
            let _ = writeln!(
                out,
                "![{}]({})\n",
                if group.is_empty() { "plot" } else { group },
                link.display()
            );
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, out).map_err(|e| format!("{}: {e}", path.display()))
}

/// A figure and its range over replications, each written by `f`: `412.0 [398.1–430.2]`.
fn with_range(
    v: f64,
    iv: Option<evb_sim::confidence::Interval>,
    f: &dyn Fn(f64) -> String,
) -> String {
    match iv {
        Some(i) if i.hi > i.lo => format!("{} [{}–{}]", f(v), f(i.lo), f(i.hi)),
        _ => f(v),
    }
}

/// `s` with its first letter a capital.
fn capital(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

/// Text made safe for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
