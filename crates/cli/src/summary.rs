//! The end-of-run table and verdict.

use std::collections::BTreeMap;

use evb_builder::{NodeStatus, RoleStats, RunReport};
use evb_config::Config;

pub fn print(
    cfg: &Config,
    ids: &[String],
    reports: &BTreeMap<String, NodeStatus>,
    run: Option<&RunReport>,
    problems: &[String],
    steady_events_per_s: Option<f64>,
) {
    let secs = run.map_or(0.0, |r| r.seconds);
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
        let role = r.role.name();
        let state = r.state.name();
        let (events, bytes, notes) = match &r.stats {
            RoleStats::Evm(s) => (
                s.triggered,
                0,
                format!(
                    "released {}, most in flight {}, duplicate releases {}",
                    s.released, s.in_flight_high_water, s.duplicate_releases
                ),
            ),
            RoleStats::Ru(s) => {
                let mut notes = format!(
                    "still held {}, waits for memory {}",
                    s.retained, s.pool_waits
                );
                if s.frame_buffer_bytes_high_water > 0 {
                    // a stream of frames built by time: frames, and the latency buffer's peak
                    notes += &format!(
                        ", frames from the stream {} (unbuilt {}), latency buffer at most {:.1} kB",
                        s.stream_fragments_received,
                        s.stream_fragments_unbuilt,
                        s.frame_buffer_bytes_high_water as f64 / 1e3
                    );
                    if let Some(words) = s.frame_account_words() {
                        notes += &format!(", {words}");
                    }
                } else if s.stream_fragments_received > 0 {
                    notes += &format!(
                        ", from streams {} (unbuilt {}, dropped {}, sync losses {})",
                        s.stream_fragments_received,
                        s.stream_fragments_unbuilt,
                        s.dropped_at_source,
                        s.sync_losses
                    );
                }
                (s.fragments_sent, s.payload_bytes_sent, notes)
            }
            RoleStats::Bu(s) => (
                s.events_built,
                s.payload_bytes_built,
                format!(
                    "partial {}, crc errors {}, content errors {}, duplicates {}, incomplete {}",
                    s.partial_events,
                    s.crc_errors,
                    s.content_errors,
                    s.duplicate_fragments,
                    s.incomplete_at_stop
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
        let cpu = match r.cpu.run_s {
            Some(c) if events > 0 => format!("{:.2}", c * 1e6 / events as f64),
            _ => "-".into(),
        };
        println!(
            "{id:<10} {role:<4} {state:<9} {events:>12} {mb:>12.1} {mbs:>10} {cpu:>9}  {notes}"
        );
    }
    let triggered = run.map_or(0, |r| r.evm.triggered);
    let released = run.map_or(0, |r| r.evm.released);
    // The EVM's copy of the BUs' reports is complete only after a clean Stop; an aborted
    // run has each BU's own final report instead.
    let built_bytes: u64 = match run {
        Some(r) if r.every_bu_reported() => {
            r.bus.iter().flatten().map(|b| b.payload_bytes_built).sum()
        }
        _ => reports
            .values()
            .filter_map(|r| r.bu())
            .map(|b| b.payload_bytes_built)
            .sum(),
    };
    // a record is an event, or a time slice of the streams (builder.by = "time")
    let (records, every) = if cfg.builder.by == evb_config::BuildBy::Window {
        (
            "windows",
            format!("every trigger decision's window ({triggered})"),
        )
    } else if cfg.by_time() {
        // from the run's first tick (frames.first_tick), where every stream begins
        let start = cfg.frames.first_tick;
        let end = start.saturating_add(triggered.saturating_mul(cfg.builder.slice_ticks));
        (
            "slices",
            format!("every time slice ({triggered}: ticks [{start}, {end}) of every stream)"),
        )
    } else {
        ("events", format!("every triggered event ({triggered})"))
    };
    println!();
    if let Some(r) = run.filter(|_| secs > 0.0) {
        let what = if released == triggered {
            format!("{triggered} {records}")
        } else {
            format!("{released} of {triggered} {records} released")
        };
        println!(
            "{} RU x {} BU over {}: {what} in {secs:.2} s = {:.0} {records}/s, {:.3} GB/s built",
            r.n_ru,
            // the BUs that took part (a spare that never joined took none)
            r.n_bu as usize - r.evm.spares_out.len(),
            cfg.transport.kind.name(),
            released as f64 / secs,
            built_bytes as f64 / secs / 1e9
        );
        // (none where the BUs built nothing past their first second: a short run whose
        // records were all built in it has no steady state to speak of)
        if let Some(rate) = steady_events_per_s.filter(|r| *r >= 0.5) {
            println!(
                "  steady state (the BUs' counts from {:.0} s into the run): {rate:.0} {records}/s",
                crate::launch::STEADY_AFTER_S
            );
        }
        let h = &r.evm.record_latency;
        if let (Some(p50), Some(p99), Some(p999)) = (
            h.quantile_us(0.5),
            h.quantile_us(0.99),
            h.quantile_us(0.999),
        ) {
            // one clock, the EVM's: from the trigger (its entry into the EVM, evb-builder's
            // entered.rs) to the release by the BU that built it (and committed it, with a
            // committing sink)
            let commits = cfg
                .nodes()
                .iter()
                .any(|n| n.role == evb_config::Role::Bu && n.sink.commits());
            let to = if commits {
                "committed (files synced, or consumers' acknowledgement)"
            } else {
                "built"
            };
            println!(
                "  latency from trigger to {to} (the EVM's clock, to the BU's release): p50 {p50} us, p99 {p99} us, p99.9 {p999} us"
            );
        }
    }
    if run.is_some_and(|r| r.evm.stopped_by_request) {
        println!(
            "The run was ended early by the operator (Ctrl-C): what was triggered was drained."
        );
    }
    for e in run.map(|r| r.evm.lost.as_slice()).unwrap_or_default() {
        println!("  node event: {e}");
    }
    let partial: u64 = run.map_or(0, |r| {
        r.bus.iter().flatten().map(|b| b.partial_events).sum()
    });
    let dropped: u64 = run.map_or(0, |r| {
        r.rus.iter().flatten().map(|x| x.dropped_at_source).sum()
    });
    // fragments front-ends sent that are in no event (the run ended first): the RUs' own
    // final reports, which count what was drained after Stop too
    let unbuilt: u64 = reports
        .values()
        .filter_map(|r| r.ru())
        .map(|r| r.stream_fragments_unbuilt)
        .sum();
    let unbuilt_note = if unbuilt > 0 {
        format!("; {unbuilt} fragments the front-ends sent after the run's end counted as unbuilt")
    } else {
        String::new()
    };
    let (late, missing, empty) = run.map_or((0, 0, 0), |r| {
        r.bus.iter().flatten().fold((0, 0, 0), |(l, m, e), b| {
            (
                l + b.late_components,
                m + b.missing_components,
                e + b.empty_components,
            )
        })
    });
    // windows over some components: the others' EMPTY fragments leave nothing out
    let unbuilt_note = if empty > 0 {
        format!(
            "{unbuilt_note}; {empty} components EMPTY (not named by their decision, nothing \
             asked of them)"
        )
    } else {
        unbuilt_note
    };
    if problems.is_empty() && partial > 0 && cfg.by_time() {
        println!(
            "VERDICT: OK - {every} built exactly once, checksums valid; {partial} built \
             partial: {late} components LATE (their data had not arrived within \
             windows.wait_ms), {missing} MISSING (evicted from the RUs' latency \
             buffers){unbuilt_note}"
        );
    } else if problems.is_empty() && partial > 0 {
        println!(
            "VERDICT: OK - {every} built exactly once, checksums valid; \
             {partial} built as partial events ({dropped} bad fragments dropped at the RUs and flagged missing){unbuilt_note}"
        );
    } else if problems.is_empty() {
        println!(
            "VERDICT: OK - {every} built exactly once, complete, checksums valid{unbuilt_note}"
        );
    } else {
        println!("VERDICT: FAILED");
        for p in problems {
            println!("  - {p}");
        }
    }
}
