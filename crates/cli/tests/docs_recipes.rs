//! The docs' recipes run as written: the configuration and the commands are read from the
//! markdown's fenced blocks, not copied here, so a recipe that stops working (or a sample
//! output that no longer adds up) fails this test. Only what names a site is changed: a
//! host name (`bu-host` is this host), fixed ports (moved to free ones, so that runs beside
//! each other do not collide) and a data folder (a temporary one).
//!
//! - docs/plugin.md, "Configuration": `daq.toml`, two `evb node` processes, the C consumer
//!   and two C producers (crates/capi/examples) standing for `./consumer` and `./producer`.
//! - docs/operations/data.md, "A filter farm": `farm.toml`, `evb run` and two `evb consume`.
//! - docs/operations/streaming.md, "Streaming readout: time slices", "Triggered readout
//!   windows" and "Slices and windows from front-end streams": `slices.toml`, `windows.toml`
//!   and `live.toml`, `evb config check`, `evb run`, `evb feed --frames` and the outside
//!   checkers of docs/formats.md §8.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::{free_base_port, python3, EVB};

/// The `n`-th fenced block of language `lang` after the heading `heading` in `doc`
/// (docs/...), as written.
fn fenced(doc: &str, heading: &str, lang: &str, n: usize) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(doc);
    let text = std::fs::read_to_string(&path).unwrap();
    let from = text
        .lines()
        .position(|l| l.trim_end() == heading)
        .unwrap_or_else(|| panic!("no heading {heading:?} in {doc}"));
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines().skip(from + 1) {
        if line.starts_with("## ") && current.is_none() {
            break;
        }
        match &mut current {
            None if line.trim_end() == format!("```{lang}") => current = Some(Vec::new()),
            Some(_) if line.trim_end() == "```" => blocks.push(current.take().unwrap().join("\n")),
            Some(b) => b.push(line),
            None => {}
        }
    }
    blocks
        .get(n)
        .cloned()
        .unwrap_or_else(|| panic!("no {lang} block {n} after {heading:?} in {doc}"))
}

/// A recipe's command lines (comments and blank lines left out), each cut at `&` into the
/// commands it starts, each a list of words.
fn commands(sh: &str) -> Vec<Vec<String>> {
    sh.lines()
        .map(|l| l.split(" #").next().unwrap_or(""))
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split('&').map(str::to_string).collect::<Vec<_>>())
        .map(|c| c.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|c| !c.is_empty())
        .collect()
}

/// The sample output a recipe shows: its comment lines that start with `prefix`.
fn sample<'a>(sh: &'a str, prefix: &str) -> Vec<&'a str> {
    sh.lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| l.starts_with(prefix))
        .collect()
}

/// Starts `words` in `cwd`, the program looked up in `programs` (`evb`, `./producer`...).
fn start(words: &[String], cwd: &Path, programs: &BTreeMap<&str, PathBuf>) -> Child {
    let exe = programs
        .get(words[0].as_str())
        .unwrap_or_else(|| panic!("a program the test does not know: {words:?}"));
    Command::new(exe)
        .args(&words[1..])
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

/// Waits for every process, by its command line: each must exit 0.
fn all_ok(kids: Vec<(String, Child)>) -> Vec<(String, String)> {
    let outs: Vec<(String, Output)> = kids
        .into_iter()
        .map(|(cmd, c)| (cmd, c.wait_with_output().unwrap()))
        .collect();
    let report: String = outs
        .iter()
        .map(|(cmd, o)| format!("--- {cmd}: {:?}\n{}", o.status, common::text(o)))
        .collect();
    for (cmd, o) in &outs {
        assert!(o.status.success(), "{cmd} failed:\n{report}");
    }
    outs.into_iter()
        .map(|(cmd, o)| (cmd, common::text(&o)))
        .collect()
}

/// `key=value` fields of a summary line (`evb node ID: k=v ...`).
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The number before `what` in `line` (`consumed 317 events` -> 317 for " events").
fn number_before(line: &str, what: &str) -> u64 {
    let head = &line[..line
        .find(what)
        .unwrap_or_else(|| panic!("{what:?} in {line}"))];
    head.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn plugin_md_daq_recipe_runs_as_written() {
    let toml = fenced("docs/plugin.md", "## Configuration", "toml", 0);
    let sh = fenced("docs/plugin.md", "## Configuration", "sh", 0);
    // the programs first: a node's connect timeout starts when its process does
    let bins = common::out_dir();
    let Some(producer) = common::cc::compile("producer", bins.path()) else {
        return;
    };
    let consumer = common::cc::compile("consumer", bins.path()).unwrap();
    let dir = common::out_dir();
    assert!(toml.contains("\nbase_port = 7300 "), "{toml}");
    let base = free_base_port(16);
    let toml = toml.replace("\nbase_port = 7300 ", &format!("\nbase_port = {base} "));
    std::fs::write(dir.path().join("daq.toml"), &toml).unwrap();
    let programs = BTreeMap::from([
        ("evb", PathBuf::from(EVB)),
        ("./consumer", consumer),
        ("./producer", producer),
    ]);
    let cmds = commands(&sh);
    assert_eq!(cmds.len(), 5, "{cmds:?}");
    let kids: Vec<(String, Child)> = cmds
        .iter()
        .map(|c| (c.join(" "), start(c, dir.path(), &programs)))
        .collect();
    let outs = all_ok(kids);
    let out_of = |prefix: &str| -> Vec<&String> {
        outs.iter()
            .filter(|(cmd, _)| cmd.starts_with(prefix))
            .map(|(_, o)| o)
            .collect()
    };
    // the producers' count, as the recipe gives it
    let events: u64 = cmds
        .iter()
        .find(|c| c[0] == "./producer")
        .and_then(|c| c.last()?.parse().ok())
        .unwrap();
    for p in out_of("./producer") {
        assert!(
            p.contains(&format!("submitted {events} fragments")) && p.contains("run: ok"),
            "{p}"
        );
    }
    // the EVM's line says what the doc's sample says, but for the times
    let evm = out_of("evb node --config daq.toml --id evm")[0];
    let evm_line = evm
        .lines()
        .find(|l| l.starts_with("evb node evm: "))
        .unwrap_or_else(|| panic!("{evm}"));
    let doc_line = sample(&sh, "evb node evm: ");
    assert_eq!(doc_line.len(), 1, "{sh}");
    let (mut got, mut want) = (fields(evm_line), fields(doc_line[0]));
    got.remove("seconds");
    want.remove("seconds");
    assert_eq!(got, want, "{evm_line}\nthe doc: {}", doc_line[0]);
    assert_eq!(got["triggered"], events.to_string());
    // every event once: the C consumer's (bu0) and bu1's add up, nothing bad
    let c = out_of("./consumer")[0];
    let c_line = c
        .lines()
        .find(|l| l.starts_with("consumed "))
        .unwrap_or_else(|| panic!("{c}"));
    assert!(c_line.ends_with(" 0 bad; run: ok"), "{c_line}");
    let bu1 = out_of("evb node --config daq.toml --id bu1")[0];
    let bu1 = fields(
        bu1.lines()
            .find(|l| l.starts_with("evb node bu1: "))
            .unwrap_or_else(|| panic!("{bu1}")),
    );
    assert_eq!(bu1["verdict"], "OK");
    let built1: u64 = bu1["built"].parse().unwrap();
    assert_eq!(
        number_before(c_line, " events") + built1,
        events,
        "{c_line}"
    );
    // and the doc's sample adds up the same way
    let doc_c = sample(&sh, "consumer: consumed ");
    let doc_bu1 = sample(&sh, "evb node bu1: ");
    assert_eq!((doc_c.len(), doc_bu1.len()), (1, 1), "{sh}");
    let doc_built1: u64 = fields(doc_bu1[0])["built"].parse().unwrap();
    assert_eq!(
        number_before(doc_c[0], " events") + doc_built1,
        events,
        "{sh}"
    );
}

#[test]
fn operations_md_farm_recipe_runs_as_written() {
    let heading = "## A filter farm: built events over the network";
    let toml = fenced("docs/operations/data.md", heading, "toml", 0);
    let sh = fenced("docs/operations/data.md", heading, "sh", 0);
    let dir = common::out_dir();
    assert!(toml.contains("serve_base_port = 7400 "), "{toml}");
    let port = free_base_port(2);
    let toml = toml.replace(
        "serve_base_port = 7400 ",
        &format!("serve_base_port = {port} "),
    );
    std::fs::write(dir.path().join("farm.toml"), &toml).unwrap();
    let cfg = evb_config::Config::from_toml(&toml).unwrap();
    let events = cfg.run.events;
    let data = dir.path().join("farm-data");
    let site = |w: &String| -> String {
        w.replace("bu-host:7400", &format!("127.0.0.1:{port}"))
            .replace("bu-host:7401", &format!("127.0.0.1:{}", port + 1))
            .replace("/data/farm", data.to_str().unwrap())
    };
    let cmds: Vec<Vec<String>> = commands(&sh)
        .iter()
        .map(|c| c.iter().map(site).collect())
        .collect();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert_eq!(cmds[0][..2], ["evb", "run"], "{cmds:?}");
    assert_eq!(cmds[1][..2], ["evb", "consume"], "{cmds:?}");
    let programs = BTreeMap::from([("evb", PathBuf::from(EVB))]);
    // the run, then two consumers ("one or more"), each from every BU
    let kids = vec![
        ("run".to_string(), start(&cmds[0], dir.path(), &programs)),
        ("consumer 1".into(), start(&cmds[1], dir.path(), &programs)),
        ("consumer 2".into(), start(&cmds[1], dir.path(), &programs)),
    ];
    let outs = all_ok(kids);
    assert!(
        outs[0]
            .1
            .contains(&format!("VERDICT: OK - every triggered event ({events})")),
        "{}",
        outs[0].1
    );
    // each consumer's summary; together every event once, each 4 KiB as the doc's sample
    let summary = |text: &str| -> (u64, f64) {
        let l = text
            .lines()
            .find(|l| l.starts_with("evb consume: ") && l.contains(" events, "))
            .unwrap_or_else(|| panic!("no summary:\n{text}"));
        assert!(l.contains(" MB, 0 errors in "), "{l}");
        let mb: f64 = l[..l.find(" MB,").unwrap()]
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        (number_before(l, " events, "), mb)
    };
    let (mut total, mut mb) = (0, 0.0);
    for (_, text) in &outs[1..] {
        let (n, m) = summary(text);
        total += n;
        mb += m;
    }
    assert_eq!(total, events, "{outs:?}");
    let per_event = |n: u64, mb: f64| mb * 1e6 / n as f64;
    let doc_lines = sample(&sh, "evb consume: ");
    let doc_summary: Vec<&&str> = doc_lines
        .iter()
        .filter(|l| l.contains(" events, "))
        .collect();
    assert_eq!(doc_summary.len(), 1, "{sh}");
    let (doc_n, doc_mb) = summary(doc_summary[0]);
    assert!(
        (per_event(doc_n, doc_mb) - 4096.0).abs() < 10.0,
        "the doc's sample: {}",
        doc_summary[0]
    );
    assert!(
        (per_event(total, mb) - 4096.0).abs() < 10.0,
        "{total} events, {mb} MB"
    );
    // the BUs' acknowledged events: the run's, in the doc's sample and in this run
    let acked = |text: &str| -> u64 {
        text.lines()
            .filter(|l| l.contains("the BU's consumers acknowledged "))
            .map(|l| number_before(l, " events"))
            .sum()
    };
    assert_eq!(acked(&doc_lines.join("\n")), events, "{sh}");
    assert_eq!(acked(&outs[1].1), events, "{}", outs[1].1);
    // what the consumers wrote is there, one folder each
    let folders = std::fs::read_dir(&data).unwrap().count();
    assert_eq!(folders, 2, "{}", data.display());
}

/// A recipe's configuration with only the site changed: free ports for the nodes and their
/// control APIs (up to 7 nodes).
fn on_free_ports(toml: &str) -> String {
    let base = free_base_port(14);
    toml.replacen(
        "[topology]\n",
        &format!(
            "[control]\nbase_port = {}\n[topology]\nbase_port = {base}\n",
            base + 7
        ),
        1,
    )
}

/// docs/operations/streaming.md, "Streaming readout: time slices": `slices.toml`, `evb config
/// check`, `evb run` and the outside checker, each printing what the doc's sample says.
#[test]
fn streaming_recipe_runs_as_written() {
    let heading = "## Streaming readout: time slices";
    let toml = fenced("docs/operations/streaming.md", heading, "toml", 0);
    let sh = fenced("docs/operations/streaming.md", heading, "sh", 0);
    if !python3("streaming recipe") {
        return;
    }
    let dir = common::out_dir();
    let toml = on_free_ports(&toml);
    std::fs::write(dir.path().join("slices.toml"), &toml).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cmds = commands(&sh);
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    let mut said = Vec::new();
    for c in &cmds {
        let o = match c[0].as_str() {
            "evb" => Command::new(EVB)
                .args(&c[1..])
                .current_dir(dir.path())
                .output()
                .unwrap(),
            "python3" => Command::new("python3")
                .arg(repo.join(&c[1]))
                .args(&c[2..])
                .current_dir(dir.path())
                .output()
                .unwrap(),
            other => panic!("a program the test does not know: {other}"),
        };
        assert!(o.status.success(), "{c:?}:\n{}", common::text(&o));
        said.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    // the doc's sample lines, as printed (the checker's: its fields, the elided ones aside)
    for line in sample(&sh, "slices.toml: ")
        .into_iter()
        .chain(sample(&sh, "  built by time: "))
    {
        assert!(said[0].contains(line), "{line:?} not in\n{}", said[0]);
    }
    let verdict = sample(&sh, "VERDICT: ");
    assert_eq!(verdict.len(), 1, "{sh}");
    assert!(
        said[1].contains(verdict[0]),
        "{}\nnot in\n{}",
        verdict[0],
        said[1]
    );
    let got: serde_json::Value = serde_json::from_str(said[2].trim()).unwrap();
    let doc = sample(&sh, "{\"records\": ")[0];
    assert_eq!(got["problems"], 0, "{got}");
    for key in ["records", "overlap_frames"] {
        assert!(
            doc.contains(&format!("\"{key}\": {}", got[key])),
            "{key}: {got} against the doc's {doc}"
        );
    }
    let sources = got["sources"].as_object().unwrap();
    assert_eq!(sources.len(), 4, "{got}");
    for s in sources.values() {
        assert!(
            doc.contains(&format!("\"core_frames\": {}", s["core_frames"])),
            "{got}"
        );
    }
}

/// docs/operations/streaming.md, "Triggered readout windows": `windows.toml`, `evb run` and
/// the outside checker; the counts vary from run to run, so what must hold is the sample's
/// shape: the verdict line's words, the checker finding no problem, every decision read,
/// LATE and MISSING both there, the verdict's counts the checker's.
#[test]
fn windows_recipe_runs_as_written() {
    let heading = "### Triggered readout windows";
    let toml = fenced("docs/operations/streaming.md", heading, "toml", 0);
    let sh = fenced("docs/operations/streaming.md", heading, "sh", 0);
    if !python3("windows recipe") {
        return;
    }
    let dir = common::out_dir();
    let toml = on_free_ports(&toml);
    std::fs::write(dir.path().join("windows.toml"), &toml).unwrap();
    let cfg = evb_config::Config::from_toml(&toml).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cmds = commands(&sh);
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    let run = Command::new(EVB)
        .args(&cmds[0][1..])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", common::text(&run));
    let said = String::from_utf8_lossy(&run.stdout).into_owned();
    let check = Command::new("python3")
        .arg(repo.join(&cmds[1][1]))
        .args(&cmds[1][2..])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", common::text(&check));
    let got: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(got["problems"], 0, "{got}");
    assert_eq!(got["records"], cfg.run.events, "{got}");
    let (late, missing) = (&got["components"]["late"], &got["components"]["missing"]);
    assert!(
        late.as_u64() > Some(0) && missing.as_u64() > Some(0),
        "{got}"
    );
    // the verdict's words as the doc's sample has them, with this run's counts
    let doc = sample(&sh, "VERDICT: ")[0];
    let shape = |l: &str| -> String { l.split(|c: char| c.is_ascii_digit()).collect() };
    let line = said
        .lines()
        .find(|l| l.starts_with("VERDICT: "))
        .unwrap_or_else(|| panic!("no verdict:\n{said}"));
    assert_eq!(shape(line), shape(doc), "{line}\nagainst the doc's\n{doc}");
    assert!(
        line.contains(&format!("{late} components LATE"))
            && line.contains(&format!("{missing} MISSING")),
        "{line} against the checker's {got}"
    );
}

/// docs/operations/streaming.md, "Slices and windows from front-end streams": `live.toml`,
/// `evb run` beside `evb feed --frames`, and the outside checker, each printing what the doc's sample
/// says. Only the site changes: free ports for the two streams.
#[test]
fn live_streams_recipe_runs_as_written() {
    let heading = "### Slices and windows from front-end streams";
    let toml = fenced("docs/operations/streaming.md", heading, "toml", 0);
    let sh = fenced("docs/operations/streaming.md", heading, "sh", 0);
    if !python3("live streams recipe") {
        return;
    }
    let dir = common::out_dir();
    let port = free_base_port(2);
    let site = |w: &str| -> String {
        w.replace("127.0.0.1:7301", &format!("127.0.0.1:{port}"))
            .replace("127.0.0.1:7302", &format!("127.0.0.1:{}", port + 1))
    };
    std::fs::write(dir.path().join("live.toml"), site(&toml)).unwrap();
    let cmds: Vec<Vec<String>> = commands(&sh)
        .iter()
        .map(|c| c.iter().map(|w| site(w)).collect())
        .collect();
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    assert_eq!(cmds[0][..2], ["evb", "run"], "{cmds:?}");
    assert_eq!(cmds[1][..2], ["evb", "feed"], "{cmds:?}");
    let programs = BTreeMap::from([("evb", PathBuf::from(EVB))]);
    let kids = vec![
        ("run".to_string(), start(&cmds[0], dir.path(), &programs)),
        ("feed".into(), start(&cmds[1], dir.path(), &programs)),
    ];
    let outs = all_ok(kids);
    let verdict = sample(&sh, "VERDICT: ");
    assert_eq!(verdict.len(), 1, "{sh}");
    assert!(outs[0].1.contains(verdict[0]), "{}", outs[0].1);
    let fed = sample(&sh, "127.0.0.1:7301: sent ")[0];
    let sent = &fed[..fed.find(" MB").unwrap()];
    assert!(outs[1].1.contains(&site(sent)), "{sent}\n{}", outs[1].1);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let c = &cmds[2];
    assert_eq!(c[0], "python3");
    let o = Command::new("python3")
        .arg(repo.join(&c[1]))
        .args(&c[2..])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::text(&o));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let doc = sample(&sh, "{\"records\": ")[0];
    assert_eq!(got["problems"], 0, "{got}");
    for key in ["records", "overlap_frames"] {
        assert!(
            doc.contains(&format!("\"{key}\": {}", got[key])),
            "{key}: {got} against the doc's {doc}"
        );
    }
    for s in got["sources"].as_object().unwrap().values() {
        assert!(
            doc.contains(&format!("\"core_frames\": {}", s["core_frames"])),
            "{got}"
        );
    }
}
