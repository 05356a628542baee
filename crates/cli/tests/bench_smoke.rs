//! `evb bench all --quick`: the suite runs end to end and leaves its CSV, JSON and SVG
//! behind, with a row for every benchmark and reference. No timing is asserted: the figures
//! depend on the machine; this only checks that they were measured and written.

use std::process::Command;

use serde_json::Value;

const EVB: &str = env!("CARGO_BIN_EXE_evb");

#[test]
fn quick_bench_writes_every_point_and_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(EVB)
        .args(["bench", "all", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "evb bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let csv = std::fs::read_to_string(dir.path().join("bench.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header[0], "bench");
    assert!(header.contains(&"gb_per_s") && header.contains(&"p50_us"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let has = |bench: &str, system: &str, transport: &str, variant: &str, size: &str| {
        rows.iter().any(|r| {
            r[0] == bench
                && r[1] == system
                && r[2] == transport
                && r[3].starts_with(variant)
                && (size.is_empty() || r[4] == size)
        })
    };
    for (bench, system, transport, variant, size) in [
        ("ref", "memcpy", "memory", "cache-warm", "1048576"),
        ("ref", "memcpy", "memory", "memory", "67108864"),
        ("p2p", "evb", "tcp", "fragment", "64"),
        ("p2p", "evb", "tcp", "fragment", "1048576"),
        ("p2p", "evb", "tcp", "batched", "64"),
        ("p2p", "evb", "inproc", "fragment", "64"),
        ("p2p", "zmq", "tcp", "push-pull", "64"),
        ("p2p", "zmq", "tcp", "push-pull", "1048576"),
        ("lat", "evb", "tcp", "blocking", "64"),
        ("lat", "evb", "tcp", "busy-poll", "64"),
        ("lat", "zmq", "tcp", "pair", "64"),
        ("nxn", "evb", "tcp", "fragment", "524288"),
        ("pubsub", "evb", "tcp", "block k=2", "64"),
        ("pubsub", "evb", "tcp", "block k=1", "1048576"),
        ("pubsub", "zmq", "tcp", "pub-sub k=2", "64"),
        ("build", "evb", "tcp", "fixed", "524288"),
        // the same run scraped every second (the cost of monitoring)
        (
            "build",
            "evb",
            "tcp",
            "fixed static verify=crc scraped",
            "524288",
        ),
    ] {
        assert!(
            has(bench, system, transport, variant, size),
            "no row {bench} {system} {transport} {variant} {size} in\n{csv}"
        );
    }
    // Every throughput row carries a figure (its value is not checked).
    for r in rows.iter().filter(|r| r[0] != "lat") {
        assert!(r[10].parse::<f64>().is_ok(), "row without GB/s: {r:?}");
    }
    // iperf3 is there, or the run says why not.
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("bench.json")).unwrap())
            .unwrap();
    let iperf_row = has("ref", "iperf3", "tcp", "", "");
    let iperf_note = json["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap_or("").contains("iperf3"));
    assert!(iperf_row || iperf_note, "neither an iperf3 row nor a note");
    assert_eq!(
        json["points"].as_array().unwrap().len(),
        rows.len(),
        "JSON and CSV disagree"
    );
    let ratios = json["ratios"].as_array().unwrap();
    for name in ["ZeroMQ PUSH-PULL", "send_batched", "p50", "nxn"] {
        assert!(
            ratios
                .iter()
                .any(|r| r["name"].as_str().unwrap().contains(name)),
            "no ratio naming {name}: {ratios:?}"
        );
    }

    // The real pipeline (recorded data streamed into the RUs) where the data is here, with
    // its ratio against the mesh of the same fragment size; a note saying why not otherwise.
    let pipeline_row = has("pipeline", "evb", "tcp", "feed->discard", "");
    let pipeline_note = json["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap_or("").starts_with("pipeline skipped"));
    assert!(
        pipeline_row || pipeline_note,
        "neither a pipeline row nor a note"
    );
    if pipeline_row {
        assert!(
            ratios.iter().any(|r| r["name"]
                .as_str()
                .unwrap()
                .starts_with("pipeline feed->discard")),
            "no pipeline ratio: {ratios:?}"
        );
    }

    let svg = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("</svg>"));
    assert!(svg.contains("evb tcp fragment"), "legend missing");
    assert!(
        stdout.contains("ratios"),
        "no table on the terminal:\n{stdout}"
    );
}

/// `evb bench sinks --quick`: a row per sink (HDF5 where evb has it), a write limit beside
/// each sink that writes files, and every sink's ratios against both references with the
/// targets judged, all within CI's time.
#[test]
fn quick_sinks_bench_rows_every_sink_beside_both_references() {
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let out = Command::new(EVB)
        .args(["bench", "sinks", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "evb bench sinks failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        t.elapsed().as_secs() < 60,
        "the quick mode took {:?}",
        t.elapsed()
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("bench.json")).unwrap())
            .unwrap();
    let points = json["points"].as_array().unwrap();
    let gbs = |system: &str, variant: &str| {
        points
            .iter()
            .find(|p| p["bench"] == "sink" && p["system"] == system && p["variant"] == variant)
            .and_then(|p| p["gb_per_s"].as_f64())
    };
    let hdf5 = cfg!(feature = "hdf5");
    let mut sinks = vec!["discard", "count", "file", "file-zstd"];
    if hdf5 {
        sinks.push("hdf5-packed");
    }
    for s in &sinks {
        let g = gbs("evb", s).unwrap_or_else(|| panic!("no {s} row:\n{stdout}"));
        assert!(g > 0.0, "{s}: {g} GB/s");
        if *s != "discard" && *s != "count" {
            let w = gbs("plain", &format!("write limit for {s}"))
                .unwrap_or_else(|| panic!("no write limit for {s}:\n{stdout}"));
            assert!(w > 0.0, "{s}'s write limit: {w} GB/s");
        }
    }
    let ratios = json["ratios"].as_array().unwrap();
    let ratio = |name: &str| {
        ratios
            .iter()
            .find(|r| r["name"].as_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("no ratio {name}: {ratios:?}"))
    };
    assert_eq!(ratio("sink file / discard")["target"], 0.6);
    assert_eq!(ratio("sink file / plain writer")["target"], 0.8);
    ratio("sink file-zstd / discard");
    if hdf5 {
        assert_eq!(ratio("sink hdf5-packed / file")["target"], 0.9);
    } else {
        assert!(stdout.contains("without the hdf5 feature"), "{stdout}");
    }
    assert!(
        stdout.contains("sink file / discard") && stdout.contains("target >= 0.6"),
        "no judged row on the terminal:\n{stdout}"
    );
    // nothing is left where the sinks wrote
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("evb-bench-sinks-{}", out_pid(&json)))
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The process id in the folder note of a `bench sinks` run (its scratch folder's suffix).
fn out_pid(json: &Value) -> String {
    json["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .find_map(|n| n.split("evb-bench-sinks-").nth(1))
        .map(|rest| rest.chars().take_while(|c| c.is_ascii_digit()).collect())
        .unwrap_or_default()
}
