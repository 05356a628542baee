//! libevb from C: the example producer and consumer (crates/capi/examples) compiled with
//! `cc` against include/evb.h and the built libevb.so, each its own process, with the EVM
//! and another BU as `evb node` processes: every event built once, every byte checked.

mod common;
use common::cc::{compile, compile_c, lib_dir, SONAME};
use common::nodes::{assert_verdict_ok, events_in, Run};

use std::path::Path;
use std::process::{Command, Output};

/// libevb.so says its SONAME and carries no debug information.
#[test]
fn the_library_has_its_soname_and_no_debug_info() {
    let lib = lib_dir().join("libevb.so");
    let Ok(o) = Command::new("readelf").arg("-dS").arg(&lib).output() else {
        return eprintln!("no readelf: test skipped");
    };
    let text = finished(o, "readelf");
    assert!(
        text.contains(&format!("Library soname: [{SONAME}]")),
        "{text}"
    );
    assert!(
        !text.contains(".debug_info"),
        "debug information in {}",
        lib.display()
    );
}

fn finished(o: Output, what: &str) -> String {
    let t = common::text(&o);
    assert!(o.status.success(), "{what}: {t}");
    t
}

#[test]
fn c_producer_and_c_consumer_in_a_multi_process_run() {
    const EVENTS: u64 = 5000;
    // the programs first: a node's connect timeout starts when its process does, and
    // compiling on a loaded machine can take longer than that
    let bins = common::out_dir();
    let Some(producer) = compile("producer", bins.path()) else {
        return;
    };
    let consumer = compile("consumer", bins.path()).unwrap();
    let mut run = Run::start(
        "[run]\nid = \"capi\"\nduration_s = 0\n[source]\nkind = \"api\"\nmax_fragment = 4096\n\
         [builder]\ncredits = 8\n[topology]\nrus = 1\n\
         [[bu]]\nid = \"bu0\"\nsink = \"api\"\n[[bu]]\nid = \"bu1\"\nsink_delay_us = 100\n",
        &["evm", "bu1"],
    );
    // the consumer works 50 µs on each event: the builder keeps to its pace
    let c = Command::new(&consumer)
        .arg(&run.cfg)
        .args(["bu0", "50"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let p = Command::new(&producer)
        .arg(&run.cfg)
        .args(["ru0", &EVENTS.to_string()])
        .output()
        .unwrap();
    let p = finished(p, "producer");
    // the example is a clean template: its output is its count and the run's end
    assert_eq!(
        p.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        [format!("submitted {EVENTS} fragments").as_str(), "run: ok"],
        "{p}"
    );
    assert!(
        p.contains(&format!("submitted {EVENTS} fragments")) && p.contains("run: ok"),
        "{p}"
    );
    let c = finished(c.wait_with_output().unwrap(), "consumer");
    let report = run.evm_report();
    assert_verdict_ok(&report, EVENTS);
    let bu1 = &report["run"]["bus"][1];
    let (n1, sum1) = (
        bu1["events_built"].as_u64().unwrap(),
        bu1["event_id_sum"].as_u64().unwrap(),
    );
    // bu0's events are the consumer's: together with bu1's, every id once, every byte right
    let line = c.lines().find(|l| l.starts_with("consumed")).expect(&c);
    let n0: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
    let sum0: u64 = line
        .split("id sum ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    eprintln!("bu0 (C consumer): {line}; bu1: {n1} events");
    assert!(line.ends_with(" 0 bad; run: ok"), "{line}");
    assert_eq!(n0 + n1, EVENTS, "{line}");
    assert_eq!(sum0 + sum1, (0..EVENTS).sum::<u64>(), "{line}");
    assert!(n0 > 0, "the C consumer's BU built events too: {line}");
}

/// Every error a producer can get, each its own code (crates/capi/tests/c/producer_errors.c,
/// started from the configuration as TOML text with evb_producer_start_toml): text that is
/// not TOML or not a valid configuration, NULL, an RU the configuration lacks, a buffer
/// larger than source.max_fragment, a buffer submitted twice or released after its submit,
/// a buffer after finish; and between them a run that is exact.
#[test]
fn c_producer_errors_are_their_codes_and_a_toml_started_run_is_exact() {
    const EVENTS: u64 = 500;
    let bins = common::out_dir();
    let Some(prog) = compile_c("tests/c/producer_errors.c", bins.path()) else {
        return;
    };
    let mut run = Run::start(
        "[run]\nid = \"cerrors\"\nduration_s = 0\n[source]\nkind = \"api\"\nmax_fragment = 4096\n\
         [topology]\nrus = 1\nbus = 1\n",
        &["evm", "bu0"],
    );
    let out = Command::new(&prog)
        .arg(&run.cfg)
        .args(["ru0", &EVENTS.to_string()])
        .output()
        .unwrap();
    let t = finished(out, "producer_errors");
    // each check's line: NAME: CODE (MESSAGE)
    let said = |name: &str| -> (i32, String) {
        let line = t
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name:?} in:\n{t}"));
        let (code, msg) = line.split_once(' ').unwrap();
        (code.parse().unwrap(), msg.to_string())
    };
    let (code, msg) = said("text that is not TOML");
    assert_eq!(code, -11, "EVB_ERR_CONFIG");
    assert!(msg.starts_with("(configuration text: "), "{msg}");
    let (code, msg) = said("an invalid configuration");
    assert_eq!(code, -11);
    assert!(msg.contains("fragments.size"), "{msg}");
    assert_eq!(said("a NULL configuration").0, -7, "EVB_ERR_ARG");
    let (code, msg) = said("no such RU");
    assert_eq!(code, -6, "EVB_ERR_SETUP");
    assert!(msg.contains("no RU \"ru99\""), "{msg}");
    assert_eq!(said("start from TOML text").0, 0);
    let (code, msg) = said("1 GiB buffer");
    assert_eq!(code, -1, "EVB_ERR_SIZE");
    assert!(
        msg.contains("fragment of 1073741824 bytes: larger than source.max_fragment (4096"),
        "{msg}"
    );
    for name in [
        "release of a buffer never given",
        "submitted twice",
        "released after its submit",
    ] {
        let (code, msg) = said(name);
        assert_eq!(code, -3, "{name}: EVB_ERR_UNKNOWN_BUFFER");
        assert!(msg.contains("not an outstanding buffer"), "{name}: {msg}");
    }
    assert_eq!(said("finish").0, 0);
    assert_eq!(said("a buffer after finish").0, -4, "EVB_ERR_STATE");
    assert!(t.contains("all checks passed"), "{t}");
    let report = run.evm_report();
    assert_verdict_ok(&report, EVENTS);
}

/// A C producer of frames (`evb_producer_submit_frame`) in a multi-process run built by time
/// slices: every frame in exactly one slice core (the outside reader of docs/formats.md §8),
/// the cores' bytes those the program submitted; a fragment's buffer in such a run is
/// EVB_ERR_STATE, a frame that ends where it begins EVB_ERR_SIZE.
#[test]
fn c_producer_frames_are_built_into_time_slices() {
    const SLICES: u64 = 30;
    let bins = common::out_dir();
    let Some(prog) = compile_c("tests/c/producer_frames.c", bins.path()) else {
        return;
    };
    let mut run = Run::start(
        "[run]\nid = \"cframes\"\nduration_s = 0\n\
         [source]\nkind = \"api\"\nmax_fragment = 4096\nread_ahead = 8\n\
         [builder]\nby = \"time\"\nslice_ticks = 10000\noverlap_ticks = 1000\n\
         [frames]\nticks = 500\n\
         [sink]\nkind = \"file\"\ndir = \"out\"\nfile_max_events = 16\n\
         [topology]\nrus = 1\nbus = 1\n",
        &["evm", "bu0"],
    );
    let frames = SLICES * 20;
    let out = Command::new(&prog)
        .arg(&run.cfg)
        .args(["ru0", &frames.to_string(), "500"])
        .output()
        .unwrap();
    let t = finished(out, "producer_frames");
    let bytes: u64 = (0..frames).map(|j| j * 397 % 4000).sum();
    assert!(
        t.contains(&format!("frames: {frames} bytes: {bytes}")),
        "{t}"
    );
    let report = run.evm_report();
    assert_verdict_ok(&report, SLICES);
    let args = ["--slice", "10000", "--overlap", "1000", "--frame", "500"];
    let Some(r) = common::check_slices(&run.dir.path().join("out"), &args) else {
        return;
    };
    assert_eq!(r["problems"], 0, "{r}");
    assert_eq!(r["sources"]["0"]["core_frames"], frames, "{r}");
    assert_eq!(r["sources"]["0"]["core_bytes"], bytes, "{r}");
}

/// An outside trigger program in C (`evb_trigger_*`): the EVM in its process, two RUs of
/// the generator's frames and a BU as `evb node` processes; its 40 decisions become the
/// run's 40 records, every other one over source 1 only (source 0's fragment EMPTY), and
/// bad windows are refused with their code.
#[test]
fn a_c_trigger_program_decides_the_run_s_records() {
    let bins = common::out_dir();
    let Some(prog) = compile_c("tests/c/trigger.c", bins.path()) else {
        return;
    };
    let mut run = Run::start(
        "[run]\nid = \"ctrigger\"\nevents = 40\nduration_s = 0\n\
         [builder]\nby = \"window\"\n[frames]\nticks = 100\nsize = 64\n\
         [windows]\noutside = true\nlongest_ticks = 1000\ntick_hz = 1000000\n\
         buffer_ms = 3600000\nwait_ms = 1000\n\
         [sink]\nkind = \"file\"\ndir = \"out\"\n[topology]\nrus = 2\nbus = 1\n",
        &["ru0", "ru1", "bu0"],
    );
    let out = Command::new(&prog)
        .arg(&run.cfg)
        .arg("40")
        .current_dir(run.dir.path())
        .output()
        .unwrap();
    let t = finished(out, "trigger");
    assert!(t.contains("decided: 40"), "{t}");
    let _ = run.evm_report_allowing(&[]);
    let events = events_in(&run.dir.path().join("out"));
    assert_eq!(events.len(), 40);
    let empty = events
        .values()
        .flat_map(|(_, _, frags)| frags)
        .filter(|p| p.len() >= 26 && u16::from_le_bytes([p[24], p[25]]) == 3)
        .count();
    assert_eq!(empty, 20, "source 0's fragment of every odd record");
}

#[test]
fn several_c_producers_on_threads_feed_one_ru() {
    const EVENTS: u64 = 3000;
    // the program first (see above)
    let bins = common::out_dir();
    let Some(boards) = compile("boards", bins.path()) else {
        return;
    };
    let mut run = Run::start(
        "[run]\nid = \"boards\"\nduration_s = 0\n[source]\nkind = \"api\"\nmax_fragment = 4096\n\
         [topology]\nbus = 2\n[[ru]]\nid = \"ru0\"\nproducer_sources = [841, 843, 845]\n",
        &["evm", "bu0", "bu1"],
    );
    let out = Command::new(&boards)
        .arg(&run.cfg)
        .args(["ru0", &EVENTS.to_string()])
        .output()
        .unwrap();
    let t = finished(out, "boards");
    assert!(t.contains("boards: 3, run: ok"), "{t}");
    let report = run.evm_report();
    assert_verdict_ok(&report, EVENTS);
    let bus = report["run"]["bus"].as_array().unwrap();
    assert!(
        bus.iter().all(|b| b["super_fragment_errors"] == 0),
        "{report}"
    );
    // every event: a directory of 8 + 3 x 16 bytes and the three boards' payloads
    let want: u64 = (0..EVENTS).map(|k| 56 + 3 * (k * 397 % 1000 + 1)).sum();
    let built: u64 = bus
        .iter()
        .map(|b| b["payload_bytes_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, want);
}

/// scripts/install-libevb.sh puts the library, header and evb.pc under a prefix, and a C
/// program builds from what pkg-config says.
#[test]
fn install_script_and_pkg_config_build_a_c_program() {
    let prefix = common::out_dir();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-libevb.sh");
    let o = Command::new("sh")
        .arg(&script)
        .arg(prefix.path())
        .env("EVB_LIB", lib_dir().join("libevb.so"))
        .output()
        .unwrap();
    finished(o, "install-libevb.sh");
    for f in ["lib/libevb.so", "include/evb.h", "lib/pkgconfig/evb.pc"] {
        assert!(prefix.path().join(f).exists(), "{f} installed");
    }
    // the SONAME's link, to the versioned file
    let so = prefix.path().join("lib").join(SONAME);
    let target = std::fs::read_link(&so).unwrap_or_else(|e| panic!("{}: {e}", so.display()));
    assert_eq!(
        target.to_str().unwrap(),
        concat!("libevb.so.", env!("CARGO_PKG_VERSION"))
    );
    let flags = match Command::new("pkg-config")
        .args(["--cflags", "--libs", "evb"])
        .env("PKG_CONFIG_PATH", prefix.path().join("lib/pkgconfig"))
        .output()
    {
        Ok(o) => finished(o, "pkg-config"),
        Err(e) => return eprintln!("no pkg-config ({e}): test skipped"),
    };
    let capi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capi");
    let exe = prefix.path().join("consumer");
    let o = Command::new("cc")
        .arg(capi.join("examples/consumer.c"))
        .args(["-std=c11", "-Wpedantic", "-o"])
        .arg(&exe)
        .args(flags.split_whitespace())
        .output()
        .unwrap();
    finished(o, "cc with pkg-config's flags");
    // it runs against the installed library: bad usage answers its usage line
    let o = Command::new(&exe).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", common::text(&o));
}

/// crates/capi/examples/pubsub.c: a C publisher of tags 0..9 and two C subscribers (threads)
/// of tags 2,5-7 and 0,9, over tcp and shm under policy block: each subscriber gets every
/// message of its tags, in order, every byte as published, and nothing else.
#[test]
fn c_publisher_and_subscribers_get_exactly_their_tags_in_order() {
    let dir = common::out_dir();
    let Some(exe) = compile("pubsub", dir.path()) else {
        return;
    };
    for (transport, n) in [("tcp", 2000u64), ("shm", 1000)] {
        let o = Command::new(&exe)
            .args([transport, &n.to_string()])
            .output()
            .unwrap();
        let t = finished(o, &format!("pubsub {transport}"));
        assert!(
            t.contains("bad option: -6 (policy \"sometimes\": expected block, drop or disconnect)"),
            "{t}"
        );
        let (all, six) = (10 * n, 6 * n);
        assert!(
            t.contains(&format!(
                "published {all} messages on 10 tags: delivered {six}, dropped 0 (stats: {all}, {six}, 0)"
            )),
            "{t}"
        );
        let done = "0 missed, 0 out of order, 0 bad, 0 other tags; goodbye: the C example is done";
        assert!(
            t.contains(&format!(
                "subscriber A (tags 2,5-7): 2:{n} 5:{n} 6:{n} 7:{n}; {} messages, {done}",
                4 * n
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "subscriber B (tags 0,9): 0:{n} 9:{n}; {} messages, {done}",
                2 * n
            )),
            "{t}"
        );
    }
}

/// The same program under policy drop with subscriber A slow (1 ms per message, the
/// publisher's max_queued at its least): A misses messages, each announced by a gap, B
/// misses none, and on both sides received + missed adds up to what was published.
#[test]
fn c_subscriber_too_slow_under_policy_drop_is_told_what_it_missed() {
    let dir = common::out_dir();
    let Some(exe) = compile("pubsub", dir.path()) else {
        return;
    };
    let n = 300u64;
    let o = Command::new(&exe)
        .args(["tcp", &n.to_string(), "drop", "1000"])
        .output()
        .unwrap();
    let t = finished(o, "pubsub tcp drop");
    assert!(
        t.contains("received") && t.contains("= published on the subscribed tags: yes"),
        "{t}"
    );
    let line = t
        .lines()
        .find(|l| l.starts_with("subscriber A"))
        .unwrap_or_else(|| panic!("{t}"));
    let missed: u64 = line
        .split(", ")
        .find_map(|w| w.strip_suffix(" missed"))
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(missed > 0, "the slow subscriber never fell behind: {t}");
    assert!(
        t.contains(&format!(
            "subscriber B (tags 0,9): 0:{n} 9:{n}; {} messages, 0 missed, 0 out of order",
            2 * n
        )),
        "{t}"
    );
}
