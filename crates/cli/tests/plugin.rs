//! The plug-in API in real multi-process runs: a Rust producer feeding an RU and a Rust
//! consumer taking a BU's events in this test's process, the EVM and the other nodes as
//! `evb node` processes on 127.0.0.1. Exact counts, every payload byte checked, bad input
//! answered with typed errors, a slow consumer slowing the trigger without loss.

mod common;
use common::nodes::{assert_verdict_ok, events_in, payload, Run};

use std::time::{Duration, Instant};

use evb_plugin::{Consumer, ConsumerOptions, Error, Next, Producer, WhenFull};

const API_SOURCE: &str = "[run]\nid = \"plug\"\nduration_s = 0\n\
    [source]\nkind = \"api\"\nmax_fragment = 4096\n";

#[test]
fn rust_producer_feeds_an_ru_in_a_multi_process_run() {
    const EVENTS: u64 = 20_000;
    let mut run = Run::start(
        &format!(
            "{API_SOURCE}[sink]\nkind = \"file\"\ndir = \"out\"\nfile_max_events = 5000\n\
             [builder]\ncredits = 8\n[topology]\nrus = 1\nbus = 2\n"
        ),
        &["evm", "bu0", "bu1"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    for k in 0..EVENTS {
        let bytes = payload(k);
        let mut buf = p.buffer(bytes.len(), WhenFull::Block).unwrap();
        buf.payload_mut().copy_from_slice(&bytes);
        assert_eq!(p.submit(buf, k as u32 + 1).unwrap(), k);
    }
    let ru = p.finish().unwrap();
    assert!(ru.ok, "{}", ru.reason);
    assert_eq!(ru.report.ru().unwrap().fragments_sent, EVENTS);
    assert_eq!(ru.report.ru().unwrap().retained, 0);
    let out = run.dir.path().join("out");
    let report = run.evm_report();
    assert_verdict_ok(&report, EVENTS);
    // every event once, each with exactly the bytes the producer wrote
    let events = events_in(&out);
    assert_eq!(events.len() as u64, EVENTS);
    for (k, (trigger, flags, frags)) in events {
        assert_eq!((trigger, flags), (k as u32 + 1, 0), "event {k}");
        assert_eq!(frags, vec![payload(k)], "event {k}'s payload");
    }
}

#[test]
fn bad_producer_input_gets_typed_errors_and_stops_the_run() {
    let mut run = Run::start(
        &format!("{API_SOURCE}[topology]\nrus = 1\nbus = 1\n"),
        &["evm", "bu0"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    // too large for source.max_fragment: refused before anything is written
    assert!(matches!(
        p.buffer(4097, WhenFull::Block),
        Err(Error::Size { size: 4097, .. })
    ));
    let mut b = p.buffer(100, WhenFull::ReturnFull).unwrap();
    assert!(matches!(b.set_len(101), Err(Error::Size { .. })));
    b.set_len(10).unwrap();
    p.submit(b, 7).unwrap();
    p.submit_copy(b"next", 8, WhenFull::Block).unwrap();
    // a trigger number going backwards: on_error = "stop" stops the run, naming it
    let e = p.submit_copy(b"late", 3, WhenFull::Block).unwrap_err();
    assert_eq!(
        e,
        Error::Refused {
            why: "trigger number 3 after 8: out of order".into(),
            run_stopped: true
        }
    );
    assert!(matches!(
        p.submit_copy(b"more", 9, WhenFull::Block),
        Err(Error::RunOver(_))
    ));
    let ru = p.finish().unwrap();
    assert!(!ru.ok);
    assert!(ru.reason.contains("out of order"), "{}", ru.reason);
    // the EVM and BU end too, the EVM naming the producer's error
    let mut kids = std::mem::take(&mut { run }.kids);
    let evm = kids.remove("evm").unwrap().wait_with_output().unwrap();
    assert!(!evm.status.success());
    let text = common::text(&evm);
    assert!(text.contains("trigger number 3 after 8"), "{text}");
}

#[test]
fn trigger_going_backwards_under_drop_builds_the_event_without_it() {
    let mut run = Run::start(
        &format!("{API_SOURCE}on_error = \"drop\"\n[sink]\nkind = \"file\"\ndir = \"out\"\n[topology]\nrus = 1\nbus = 1\n"),
        &["evm", "bu0"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    p.submit_copy(b"one", 10, WhenFull::Block).unwrap();
    let e = p.submit_copy(b"two", 10, WhenFull::Block).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Refused {
                run_stopped: false,
                ..
            }
        ),
        "{e}"
    );
    p.submit_copy(b"three", 11, WhenFull::Block).unwrap();
    assert_eq!(p.events_submitted(), 3);
    assert!(p.finish().unwrap().ok);
    let out = run.dir.path().join("out");
    let report = run.evm_report();
    assert_verdict_ok(&report, 3);
    assert_eq!(report["run"]["bus"][0]["partial_events"], 1);
    let events = events_in(&out);
    assert_eq!(events[&0].2, vec![b"one".to_vec()]);
    assert!(events[&1].2[0].is_empty(), "the refused fragment left out");
    assert_eq!(events[&2].2, vec![b"three".to_vec()]);
}

#[test]
fn a_stalled_producer_shows_as_the_ru_waiting_for_it() {
    let mut run = Run::start(
        &format!("{API_SOURCE}stall_warn_s = 0.2\n[topology]\nrus = 1\nbus = 1\n"),
        &["evm", "bu0"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    p.submit_copy(b"first", 1, WhenFull::Block).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let s = p.status();
        if let Some(w) = s.as_ref().and_then(|s| s.ru()?.waiting_for.first()) {
            break w.clone();
        }
        assert!(Instant::now() < until, "never shown waiting: {s:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        waiting.starts_with("producer since") && waiting.ends_with("no fragment submitted after 1"),
        "{waiting}"
    );
    // it goes away when the producer goes on: the RU shows no wait, or (once `stall_warn_s`
    // has passed again, which a loaded host's status updates can outlast) a wait for the
    // fragment after the new one; never again the one after the first
    p.submit_copy(b"second", 2, WhenFull::Block).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while p.status().is_some_and(|s| {
        s.ru().is_some_and(|r| {
            r.waiting_for
                .first()
                .is_some_and(|w| !w.ends_with("no fragment submitted after 2"))
        })
    }) {
        assert!(Instant::now() < until, "still shown waiting");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(p.finish().unwrap().ok);
    assert_verdict_ok(&run.evm_report(), 2);
}

#[test]
fn rust_consumer_takes_every_event_and_a_slow_one_slows_the_trigger() {
    const EVENTS: u64 = 600;
    const SLOW: Duration = Duration::from_millis(2);
    let mut run = Run::start(
        &format!(
            "[run]\nid = \"cons\"\nevents = {EVENTS}\nduration_s = 0\n\
             [fragments]\nsize = 2048\n[builder]\ncredits = 4\n\
             [topology]\nrus = 2\nbus = 1\n[sink]\nkind = \"api\"\n"
        ),
        &["evm", "ru0", "ru1"],
    );
    let started = Instant::now();
    let mut c = Consumer::start(&run.config(), "bu0", ConsumerOptions { max_held: 2 }).unwrap();
    let mut ids = Vec::new();
    let mut held = Vec::new();
    let mut bytes = 0;
    loop {
        match c.next_timeout(Duration::from_secs(30)) {
            Next::Event(ev) => {
                assert_eq!(ev.fragment_count(), 2);
                for f in ev.fragments() {
                    let mut crc = 0;
                    for chunk in f.chunks() {
                        crc = crc32c::crc32c_append(crc, chunk);
                    }
                    assert_eq!(crc, f.payload_crc(), "event {}", ev.event_id());
                    assert_eq!(f.len(), 2048);
                    let whole = f.contiguous().map_or_else(|| f.to_vec(), <[u8]>::to_vec);
                    assert_eq!(whole, f.to_vec());
                }
                assert!(!ev.is_partial() && !ev.is_corrupt() && !ev.trigger_mismatch());
                bytes += ev.bytes();
                ids.push(ev.event_id());
                // a consumer that keeps two events and works slowly on each
                held.push(ev);
                if held.len() == 2 {
                    std::thread::sleep(SLOW);
                    held.clear();
                }
            }
            Next::Timeout => panic!("no event for 30 s"),
            Next::End => break,
        }
    }
    drop(held);
    let elapsed = started.elapsed();
    let bu = c.finish().unwrap();
    assert!(bu.ok, "{}", bu.reason);
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..EVENTS).collect::<Vec<_>>(),
        "every event exactly once"
    );
    assert_eq!(bytes as u64, EVENTS * 2 * 2048);
    // the consumer set the pace: the BU was held back (busy), the run took at least as long
    // as the consumer's work, and nothing was lost
    assert!(
        bu.report.sink.as_ref().unwrap().report["consumer_busy"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(elapsed >= SLOW * (EVENTS / 2) as u32, "{elapsed:?}");
    assert_verdict_ok(&run.evm_report(), EVENTS);
}

#[test]
fn rust_producer_to_rust_consumer_through_processes() {
    const EVENTS: u64 = 3000;
    let mut run = Run::start(
        &format!(
            "{API_SOURCE}[topology]\nrus = 1\n[[bu]]\nid = \"bu0\"\nsink = \"api\"\n\
             [[bu]]\nid = \"bu1\"\n"
        ),
        &["evm", "bu1"],
    );
    let cfg = run.config();
    let consumer = std::thread::spawn(move || {
        let mut c = Consumer::start(&cfg, "bu0", ConsumerOptions::default()).unwrap();
        let mut seen = Vec::new();
        for ev in c.by_ref() {
            let f = ev.fragment(0).unwrap();
            assert_eq!(
                f.to_vec(),
                payload(ev.event_id()),
                "event {}",
                ev.event_id()
            );
            seen.push(ev.event_id());
        }
        (seen, c.finish().unwrap())
    });
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    for k in 0..EVENTS {
        p.submit_copy(&payload(k), k as u32, WhenFull::Block)
            .unwrap();
    }
    assert!(p.finish().unwrap().ok);
    let (seen, bu0) = consumer.join().unwrap();
    assert!(bu0.ok, "{}", bu0.reason);
    let report = run.evm_report();
    assert_verdict_ok(&report, EVENTS);
    let bu1 = report["run"]["bus"][1]["events_built"].as_u64().unwrap();
    assert_eq!(seen.len() as u64 + bu1, EVENTS, "{}", report["run"]["bus"]);
    assert!(
        !seen.is_empty(),
        "the consumer's BU built events too (bu1: {bu1})"
    );
}

/// Producer `i`'s payload of event `k`: the common one with its index appended.
fn part(k: u64, i: usize) -> Vec<u8> {
    let mut b = payload(k);
    b.truncate(1000);
    b.push(i as u8);
    b
}

#[test]
fn several_producers_into_one_ru_make_super_fragments_on_threads() {
    const EVENTS: u64 = 5_000;
    let mut run = Run::start(
        &format!(
            "{API_SOURCE}[sink]\nkind = \"file\"\ndir = \"out\"\n[topology]\nbus = 2\n\
             [[ru]]\nid = \"ru0\"\nsource_id = 7\nproducer_sources = [841, 843, 845]\n"
        ),
        &["evm", "bu0", "bu1"],
    );
    let cfg = run.config();
    assert!(
        matches!(Producer::start(&cfg, "ru0"), Err(Error::Setup(e)) if e.contains("start_many"))
    );
    let producers = Producer::start_many(&cfg, "ru0").unwrap();
    assert_eq!(
        producers
            .iter()
            .map(Producer::source_id)
            .collect::<Vec<_>>(),
        [841, 843, 845]
    );
    // one thread per producer, as one per front-end board
    let threads: Vec<_> = producers
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            std::thread::spawn(move || {
                for k in 0..EVENTS {
                    let bytes = part(k, i);
                    let mut buf = p.buffer(bytes.len(), WhenFull::Block).unwrap();
                    buf.payload_mut().copy_from_slice(&bytes);
                    assert_eq!(p.submit(buf, k as u32 + 1).unwrap(), k);
                }
                p.finish().unwrap()
            })
        })
        .collect();
    for t in threads {
        let ru = t.join().unwrap();
        assert!(ru.ok, "{}", ru.reason);
        assert_eq!(ru.report.ru().unwrap().fragments_sent, EVENTS);
    }
    let report = run.evm_report();
    assert_verdict_ok(&report, EVENTS);
    let events = events_in(&run.dir.path().join("out"));
    assert_eq!(events.len() as u64, EVENTS);
    for (k, (trigger, _, frags)) in events {
        assert_eq!(trigger, k as u32 + 1);
        let sf = &frags[0];
        let dir = evb_wire::super_fragment::decode_directory(sf, sf.len()).unwrap();
        let mut at = 8 + 16 * dir.len();
        for (i, e) in dir.iter().enumerate() {
            assert_eq!(
                (e.source_id, e.trigger_number, e.flags),
                (841 + 2 * i as u16, k as u32 + 1, 0)
            );
            let len = e.length as usize;
            assert_eq!(sf[at..at + len], part(k, i)[..], "event {k}, producer {i}");
            at += len;
        }
        assert_eq!(at, sf.len());
    }
}

#[test]
fn producers_that_disagree_on_a_trigger_number_are_a_sync_loss() {
    for policy in ["stop", "flag"] {
        let mut run = Run::start(
            &format!(
                "{API_SOURCE}on_sync_loss = \"{policy}\"\n[sink]\nkind = \"file\"\ndir = \"out\"\n\
                 [topology]\nbus = 1\n[[ru]]\nid = \"ru0\"\nproducer_sources = [841, 843]\n"
            ),
            &["evm", "bu0"],
        );
        let mut ps = Producer::start_many(&run.config(), "ru0").unwrap();
        for k in 1..=20u32 {
            ps[0].submit_copy(b"first", k, WhenFull::Block).unwrap();
            // from event 9 on the second board is 90 ahead of the first (it lost sync)
            let t = if k >= 10 { k + 90 } else { k };
            if ps[1].submit_copy(b"second", t, WhenFull::Block).is_err() {
                break;
            }
        }
        let p1 = ps.pop().unwrap();
        let p0 = ps.pop().unwrap();
        let first = std::thread::spawn(move || p0.finish());
        let _ = p1.finish();
        let ru = first.join().unwrap().unwrap();
        if policy == "stop" {
            assert!(!ru.ok);
            assert!(
                ru.reason.contains("sync loss at event 9: producer 1 (source 843) sent trigger number 100 where producer 0 (source 841) sent trigger number 10"),
                "{}",
                ru.reason
            );
            continue;
        }
        assert!(ru.ok, "{}", ru.reason);
        // flag builds every event and names the flagged ones: a degraded run, not an OK one
        let report = run.evm_report_allowing(&["evm"]);
        assert_eq!(report["ok"], false, "{report}");
        let run_r = &report["run"];
        assert_eq!(run_r["evm"]["triggered"], 20, "{run_r}");
        assert_eq!(run_r["evm"]["released"], 20);
        let verdict = report["verdict"].as_array().unwrap();
        assert_eq!(verdict.len(), 1, "{verdict:?}");
        assert!(
            verdict[0]
                .as_str()
                .unwrap()
                .starts_with("ru[0]: 11 events flagged for sync loss"),
            "{verdict:?}"
        );
        assert_eq!(report["run"]["bus"][0]["sync_loss_events"], 11, "{report}");
        assert_eq!(events_in(&run.dir.path().join("out")).len(), 20);
    }
}

/// A Rust producer of timestamped frames (issue 54: "the plug-in producers: submit a frame
/// with its time range") in a multi-process run built by time slices: every frame it
/// submitted is in exactly one slice core, its bytes as sent (each frame's CRC, made by the
/// producer, checked by the BU and by the outside reader of docs/formats.md §8), and the
/// slice cores hold exactly the payload bytes submitted.
#[test]
fn rust_producer_frames_are_built_into_time_slices() {
    const SLICES: u64 = 60;
    const FRAME: u64 = 500;
    let mut run = Run::start(
        "[run]\nid = \"plug-frames\"\nduration_s = 0\n\
         [source]\nkind = \"api\"\nmax_fragment = 4096\nread_ahead = 8\n\
         [builder]\nby = \"time\"\nslice_ticks = 10000\noverlap_ticks = 1000\n\
         [frames]\nticks = 500\n\
         [sink]\nkind = \"file\"\ndir = \"out\"\nfile_max_events = 16\n\
         [topology]\nrus = 1\nbus = 2\n",
        &["evm", "bu0", "bu1"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    let frames = SLICES * 10_000 / FRAME;
    let mut bytes = 0;
    for j in 0..frames {
        let pl = payload(j);
        bytes += pl.len() as u64;
        let n = p
            .submit_frame(j * FRAME, (j + 1) * FRAME, &pl, WhenFull::Block)
            .unwrap();
        assert_eq!(n, j);
    }
    // a fragment in a run by time is a mistake, answered as one
    assert!(matches!(
        p.submit_copy(b"x", 1, WhenFull::Block),
        Err(Error::State(_))
    ));
    let ru = p.finish().unwrap();
    assert!(ru.ok, "{}", ru.reason);
    let st = ru.report.ru().unwrap();
    assert_eq!(st.fragments_sent, SLICES);
    assert_eq!(st.stream_fragments_received, frames);
    assert_eq!(st.stream_fragments_unbuilt, 0);
    let report = run.evm_report();
    assert_verdict_ok(&report, SLICES);
    let args = ["--slice", "10000", "--overlap", "1000", "--frame", "500"];
    let Some(r) = common::check_slices(&run.dir.path().join("out"), &args) else {
        return;
    };
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], SLICES, "{r}");
    assert_eq!(r["sources"]["0"]["core_frames"], frames, "{r}");
    assert_eq!(r["sources"]["0"]["core_bytes"], bytes, "{r}");
}

/// Several producers into one RU by time (`[[ru]] producer_sources`, one thread each): the
/// RU cuts each slice once every producer's is whole and sends it as one super-fragment of
/// their window fragments; every frame of both producers is in exactly one slice core (the
/// outside reader), the cores hold exactly the bytes each submitted, and the RU's byte
/// account adds up.
#[test]
fn several_rust_producers_of_frames_into_one_ru_build_every_slice() {
    const SLICES: u64 = 40;
    const FRAME: u64 = 500;
    let mut run = Run::start(
        "[run]\nid = \"plug-frames-many\"\nduration_s = 0\n\
         [source]\nkind = \"api\"\nmax_fragment = 4096\nread_ahead = 8\n\
         [builder]\nby = \"time\"\nslice_ticks = 10000\noverlap_ticks = 1000\n\
         [frames]\nticks = 500\n\
         [sink]\nkind = \"file\"\ndir = \"out\"\nfile_max_events = 16\n\
         [[ru]]\nid = \"ru0\"\nproducer_sources = [5, 6]\n\
         [topology]\nrus = 1\nbus = 2\n",
        &["evm", "bu0", "bu1"],
    );
    let producers = Producer::start_many(&run.config(), "ru0").unwrap();
    let frames = SLICES * 10_000 / FRAME;
    let threads: Vec<_> = producers
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            std::thread::spawn(move || {
                let mut bytes = 0;
                for j in 0..frames {
                    let full = payload(j + 1000 * i as u64);
                    let pl = &full[..(j as usize * 13 + i) % (full.len() + 1)];
                    bytes += pl.len() as u64;
                    p.submit_frame(j * FRAME, (j + 1) * FRAME, pl, WhenFull::Block)
                        .unwrap();
                }
                (bytes, p.finish())
            })
        })
        .collect();
    let mut bytes = Vec::new();
    for t in threads {
        let (b, outcome) = t.join().unwrap();
        let ru = outcome.unwrap();
        assert!(ru.ok, "{}", ru.reason);
        let st = ru.report.ru().unwrap();
        assert_eq!(st.fragments_sent, SLICES);
        assert_eq!(st.stream_fragments_received, 2 * frames);
        assert_eq!(st.frame_bytes_in, st.frame_bytes_in_slice_cores);
        bytes.push(b);
    }
    let report = run.evm_report();
    assert_verdict_ok(&report, SLICES);
    let args = ["--slice", "10000", "--overlap", "1000", "--frame", "500"];
    let Some(r) = common::check_slices(&run.dir.path().join("out"), &args) else {
        return;
    };
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["records"], SLICES, "{r}");
    for (src, b) in ["5", "6"].into_iter().zip(bytes) {
        assert_eq!(r["sources"][src]["core_frames"], frames, "{r}");
        assert_eq!(r["sources"][src]["core_bytes"], b, "{r}");
    }
}

/// A producer whose frames leave a gap stops the run, the RU naming the frame; the producer
/// hears that the run is over.
#[test]
fn a_producer_frame_out_of_place_stops_the_run_by_name() {
    let mut run = Run::start(
        "[run]\nid = \"plug-gap\"\nduration_s = 0\n\
         [source]\nkind = \"api\"\nmax_fragment = 4096\n\
         [builder]\nby = \"time\"\nslice_ticks = 10000\noverlap_ticks = 1000\n\
         [frames]\nticks = 500\n[topology]\nrus = 1\nbus = 1\n",
        &["evm", "bu0"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    // the producer refuses what it can tell alone: a frame that ends before it begins
    assert!(matches!(
        p.submit_frame(500, 500, b"", WhenFull::Block),
        Err(Error::Size { .. })
    ));
    for j in 0..10 {
        p.submit_frame(j * 500, (j + 1) * 500, b"abc", WhenFull::Block)
            .unwrap();
    }
    let _ = p.submit_frame(6000, 6500, b"abc", WhenFull::Block);
    let until = Instant::now() + Duration::from_secs(20);
    let over = loop {
        match p.submit_frame(6500, 7000, b"abc", WhenFull::ReturnFull) {
            Err(Error::RunOver(why)) => break why,
            _ if Instant::now() > until => panic!("the run did not stop"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert!(
        over.contains("frame [6000, 6500)") && over.contains("ended at tick 5000"),
        "{over}"
    );
    let report = run.evm_report_allowing(&["evm", "bu0"]);
    assert_eq!(report["ok"], false, "{report}");
}

/// A Rust producer of frames in a run built by decision windows (from a file of decisions):
/// windows near the stream's newest data are complete, one over data long evicted from the
/// RU's latency buffer is MISSING, one past the end of the stream LATE; the BUs' counts say
/// so, and the RU's byte account adds up.
#[test]
fn rust_producer_frames_into_decision_windows() {
    let dir = common::out_dir();
    let decisions = dir.path().join("decisions.txt");
    std::fs::write(
        &decisions,
        "1950000 1960000\n1955500 1958000\n1990000 2000000\n0 5000\n2500000 2600000\n",
    )
    .unwrap();
    let mut run = Run::start(
        &format!(
            "[run]\nid = \"plug-windows\"\nevents = 5\nduration_s = 0\nrate_hz = 100\n\
             [source]\nkind = \"api\"\nmax_fragment = 4096\n\
             [builder]\nby = \"window\"\n[frames]\nticks = 1000\n\
             [windows]\ntick_hz = 1000000\nbuffer_ms = 100\nwait_ms = 5000\ndecisions = \"{}\"\n\
             [topology]\nrus = 1\nbus = 1\n",
            decisions.display()
        ),
        &["evm", "bu0"],
    );
    let mut p = Producer::start(&run.config(), "ru0").unwrap();
    for j in 0..2000u64 {
        p.submit_frame(
            j * 1000,
            (j + 1) * 1000,
            &payload(j)[..100.min(payload(j).len())],
            WhenFull::Block,
        )
        .unwrap();
    }
    let ru = p.finish().unwrap();
    assert!(ru.ok, "{}", ru.reason);
    let st = ru.report.ru().unwrap();
    assert_eq!(st.fragments_sent, 5);
    assert_eq!(st.stream_fragments_received, 2000);
    assert!(st.frames_evicted >= 1800, "{st:?}");
    assert_eq!(
        st.frame_bytes_in,
        st.frame_bytes_in_windows + st.frame_bytes_evicted_unused + st.frame_bytes_held_unused
    );
    let report = run.evm_report();
    let bu = &report["run"]["bus"][0];
    assert_eq!(bu["late_components"], 1, "{report}");
    assert_eq!(bu["missing_components"], 1, "{report}");
    assert_eq!(bu["partial_events"], 2, "{report}");
    assert_eq!(bu["window_errors"], 0, "{report}");
}

/// An outside trigger program (issue 54: "the plug-in API: an external trigger program
/// submits decisions"): the EVM runs in this process under `evb_plugin::Trigger`, the RUs
/// and the BU as `evb node` processes. Once the streams have flowed 1.3 s it decides a
/// window in the RUs' buffers (complete), one long evicted (MISSING), one far ahead of the
/// data (LATE) and one over source 1 only (source 0 EMPTY); the EVM's verdict counts each.
/// Windows it cannot be given are refused, typed, and nothing of them is taken.
#[test]
fn an_outside_trigger_program_decides_the_records_through_the_plugin_api() {
    use evb_plugin::Trigger;
    let mut run = Run::start(
        "[run]\nid = \"plug-trigger\"\nevents = 4\nduration_s = 0\n\
         [builder]\nby = \"window\"\n[frames]\nticks = 1000\nsize = 100\n\
         [windows]\noutside = true\nlongest_ticks = 10000\ntick_hz = 1000000\n\
         buffer_ms = 1000\nwait_ms = 100\n[topology]\nrus = 2\nbus = 1\n",
        &["ru0", "ru1", "bu0"],
    );
    let mut t = Trigger::start(&run.config()).unwrap();
    t.wait_connected().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while t
        .status()
        .is_none_or(|s| s.state != evb_builder::RunState::Running)
    {
        assert!(Instant::now() < until, "the run did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(1300));
    for (window, why) in [
        ((5, 5, vec![]), "must end after it begins"),
        ((0, 20_000, vec![]), "windows.longest_ticks = 10000"),
        ((0, 10, vec![1, 7]), "names source 7, which no RU"),
        ((0, 10, vec![1, 1]), "named twice"),
    ] {
        match t.decide(window.0, window.1, &window.2) {
            Err(Error::Refused { why: w, .. }) => assert!(w.contains(why), "{w}"),
            other => panic!("{window:?}: {other:?}"),
        }
    }
    assert_eq!(t.decide(1_200_000, 1_205_000, &[]).unwrap(), 0);
    assert_eq!(t.decide(0, 5000, &[]).unwrap(), 1);
    assert_eq!(t.decide(100_000_000, 100_005_000, &[]).unwrap(), 2);
    assert_eq!(t.decide(1_200_000, 1_205_000, &[1]).unwrap(), 3);
    let evm = t.finish().unwrap();
    let report = serde_json::to_value(&evm.report).unwrap();
    assert!(evm.ok, "{}: {report}", evm.reason);
    let run_report = &report["run"];
    assert_eq!(run_report["evm"]["triggered"], 4, "{report}");
    let bu = &run_report["bus"][0];
    // two RUs: the complete window's two components, MISSING's two, LATE's two, then one
    // complete and one EMPTY
    assert_eq!(bu["missing_components"], 2, "{report}");
    assert_eq!(bu["late_components"], 2, "{report}");
    assert_eq!(bu["empty_components"], 1, "{report}");
    assert_eq!(bu["partial_events"], 2, "{report}");
    assert_eq!(bu["window_errors"], 0, "{report}");
    for id in ["ru0", "ru1", "bu0"] {
        let out = run.kids.remove(id).unwrap().wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
