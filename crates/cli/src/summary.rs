//! The end-of-run table and verdict.

use std::collections::BTreeMap;

use evb_builder::NodeEvent;
use evb_config::Config;
use serde_json::Value;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

pub fn print(
    cfg: &Config,
    ids: &[String],
    reports: &BTreeMap<String, Value>,
    run: &Value,
    problems: &[String],
) {
    let secs = run["seconds"].as_f64().unwrap_or(0.0);
    println!();
    println!(
        "{:<10} {:<4} {:<9} {:>12} {:>12} {:>10} {:>9}  notes",
        "node", "role", "state", "events", "payload MB", "MB/s", "CPU us/ev"
    );
    for id in ids {
        let Some(r) = reports.get(id) else {
            println!(
                "{id:<10} {:<4} {:<9} {:>12} {:>12} {:>10} {:>9}  no report",
                "?", "?", "-", "-", "-", "-"
            );
            continue;
        };
        let s = &r["stats"];
        let role = r["role"].as_str().unwrap_or("?");
        let state = r["state"].as_str().unwrap_or("?");
        let (events, bytes, notes) = match role {
            "evm" => (
                u(&s["triggered"]),
                0,
                format!(
                    "released {}, most in flight {}, duplicate releases {}",
                    u(&s["released"]),
                    u(&s["in_flight_high_water"]),
                    u(&s["duplicate_releases"])
                ),
            ),
            "ru" => {
                let mut notes = format!(
                    "still held {}, waits for memory {}",
                    u(&s["retained"]),
                    u(&s["pool_waits"])
                );
                if u(&s["stream_fragments_received"]) > 0 {
                    notes += &format!(
                        ", from streams {} (unbuilt {}, dropped {}, sync losses {})",
                        u(&s["stream_fragments_received"]),
                        u(&s["stream_fragments_unbuilt"]),
                        u(&s["dropped_at_source"]),
                        u(&s["sync_losses"])
                    );
                }
                (u(&s["fragments_sent"]), u(&s["payload_bytes_sent"]), notes)
            }
            _ => (
                u(&s["events_built"]),
                u(&s["payload_bytes_built"]),
                format!(
                    "partial {}, crc errors {}, content errors {}, duplicates {}, incomplete {}",
                    u(&s["partial_events"]),
                    u(&s["crc_errors"]),
                    u(&s["content_errors"]),
                    u(&s["duplicate_fragments"]),
                    u(&s["incomplete_at_stop"])
                ),
            ),
        };
        let mb = bytes as f64 / 1e6;
        let mbs = if secs > 0.0 && bytes > 0 {
            format!("{:.1}", mb / secs)
        } else {
            "-".into()
        };
        // the process's CPU time over the run, per event it handled (the EVM: triggered;
        // an RU: fragments sent; a BU: events built)
        let cpu = match r["cpu"]["run_s"].as_f64() {
            Some(c) if events > 0 => format!("{:.2}", c * 1e6 / events as f64),
            _ => "-".into(),
        };
        println!(
            "{id:<10} {role:<4} {state:<9} {events:>12} {mb:>12.1} {mbs:>10} {cpu:>9}  {notes}"
        );
    }
    let triggered = u(&run["evm"]["triggered"]);
    let released = u(&run["evm"]["released"]);
    // The EVM's copy of the BUs' reports is complete only after a clean Stop; an aborted
    // run has each BU's own final report instead.
    let built_bytes: u64 = if run["bus"]
        .as_array()
        .is_some_and(|b| b.iter().all(|x| !x.is_null()))
    {
        run["bus"]
            .as_array()
            .map_or(0, |b| b.iter().map(|x| u(&x["payload_bytes_built"])).sum())
    } else {
        reports
            .values()
            .filter(|r| r["role"] == "bu")
            .map(|r| u(&r["stats"]["payload_bytes_built"]))
            .sum()
    };
    println!();
    if secs > 0.0 {
        let what = if released == triggered {
            format!("{triggered} events")
        } else {
            format!("{released} of {triggered} events released")
        };
        println!(
            "{} RU x {} BU over {:?}: {what} in {secs:.2} s = {:.0} events/s, {:.3} GB/s built",
            run["n_ru"],
            run["n_bu"],
            cfg.transport.kind,
            released as f64 / secs,
            built_bytes as f64 / secs / 1e9
        );
    }
    if run["evm"]["stopped_by_request"] == true {
        println!(
            "The run was ended early by the operator (Ctrl-C): what was triggered was drained."
        );
    }
    let events: Vec<NodeEvent> =
        serde_json::from_value(run["evm"]["lost"].clone()).unwrap_or_default();
    for e in &events {
        println!("  node event: {e}");
    }
    let partial: u64 = run["bus"]
        .as_array()
        .map_or(0, |b| b.iter().map(|x| u(&x["partial_events"])).sum());
    let dropped: u64 = run["rus"]
        .as_array()
        .map_or(0, |r| r.iter().map(|x| u(&x["dropped_at_source"])).sum());
    // fragments front-ends sent that are in no event (the run ended first): the RUs' own
    // final reports, which count what was drained after Stop too
    let unbuilt: u64 = reports
        .values()
        .filter(|r| r["role"] == "ru")
        .map(|r| u(&r["stats"]["stream_fragments_unbuilt"]))
        .sum();
    let unbuilt_note = if unbuilt > 0 {
        format!("; {unbuilt} fragments the front-ends sent after the run's end counted as unbuilt")
    } else {
        String::new()
    };
    if problems.is_empty() && partial > 0 {
        println!(
            "VERDICT: OK - every triggered event ({triggered}) built exactly once, checksums valid; \
             {partial} built as partial events ({dropped} bad fragments dropped at the RUs and flagged missing){unbuilt_note}"
        );
    } else if problems.is_empty() {
        println!("VERDICT: OK - every triggered event ({triggered}) built exactly once, complete, checksums valid{unbuilt_note}");
    } else {
        println!("VERDICT: FAILED");
        for p in problems {
            println!("  - {p}");
        }
    }
}
