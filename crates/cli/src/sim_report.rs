//! `evb sim --system --report FILE`: the run as a report a planner can pass on. HTML is
//! self-contained (the plots inline); Markdown links the plots, which sit beside it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use evb_sim::offered::Planned;

/// Writes the report of `rows` (each point's label and figures) and `plots` (a group's
/// label and its SVG file) for the system in `source`; the file's extension says the
/// format.
pub fn write(
    path: &Path,
    source: &str,
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
            if p.keeps_up { "yes" } else { "NO" }.into(),
            format!("{:.1}", p.latency_us.p50),
            format!("{:.1}", p.latency_us.p99),
            format!("{:.1}", p.latency_us.p999),
            super::sim::bytes(p.ru_buffer_bytes.p99),
            super::sim::bytes(p.bu_buffer_bytes.p99),
        ]
    };
    let s = &first.system;
    let shape = s.shape();
    let note = "load: what the offered rate needs of the busiest link; memory: one RU's and \
                one BU's bytes held (fragments of events not yet released); latency: trigger \
                to the event built. Figures from `evb sim --system` (docs/scaling.md).";
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
        let _ = writeln!(out, "</table>\n<p>{}</p>", esc(note));
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

/// Text made safe for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
