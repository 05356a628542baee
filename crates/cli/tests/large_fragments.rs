//! Recorded fragments far larger than the generator's `fragments.size` (issue #16): the frame
//! limit and the pools are sized from `source.max_fragment`, so a replayed ~1 MiB fragment
//! is sent and built (it used to be refused by `send` as too large, and the run aborted as
//! stalled).

mod common;
use common::{evb_run_in, text};

use std::path::{Path, PathBuf};

use evb_formats::{fed, framed};
use serde_json::Value;

fn sum(s: &Value, role: &str, key: &str) -> u64 {
    s["run"][role]
        .as_array()
        .unwrap_or_else(|| panic!("no {role} in {s}"))
        .iter()
        .map(|x| x[key].as_u64().unwrap())
        .sum()
}

/// Playback of `files` (source id, files) into one BU, with small generator fragments.
fn toml(kind: &str, files: &[(u16, PathBuf)], extra: &str) -> String {
    let mut t = format!(
        "[run]\nid = \"large\"\nduration_s = 0\nstall_timeout_s = 20\n\
         [fragments]\nsize = 1024\n[source]\nkind = \"{kind}\"\n{extra}\n[topology]\nbus = 1\n"
    );
    for (i, (src, f)) in files.iter().enumerate() {
        t += &format!(
            "[[ru]]\nid = \"ru{i}\"\nsource_id = {src}\nfiles = [{:?}]\n",
            f.display().to_string()
        );
    }
    t
}

/// Framed records 0..n: every fourth is `big` bytes, the others a few hundred.
fn framed_file(path: &Path, src: u8, n: u32, big: usize) {
    let data: Vec<u8> = (0..n)
        .flat_map(|k| {
            let len = if k % 4 == 1 {
                big
            } else {
                100 + k as usize * 7
            };
            let payload: Vec<u8> = (0..len).map(|b| (b as u32 ^ k) as u8 ^ src).collect();
            framed::encode(k, &payload)
        })
        .collect();
    std::fs::write(path, data).unwrap();
}

fn assert_built(out: &std::process::Output, s: &Value, events: u64) {
    assert!(out.status.success(), "{}", text(out));
    assert_eq!(s["run"]["evm"]["triggered"], events, "{s}");
    assert_eq!(sum(s, "bus", "events_built"), events);
    assert_eq!(sum(s, "bus", "crc_errors"), 0);
    assert_eq!(sum(s, "bus", "trigger_mismatches"), 0);
    assert_eq!(sum(s, "bus", "partial_events"), 0);
}

#[test]
fn framed_fragments_of_a_mebibyte_are_replayed() {
    let d = common::out_dir();
    let (a, b) = (d.path().join("a.frm"), d.path().join("b.frm"));
    // just under the default source.max_fragment of 1 MiB
    framed_file(&a, 1, 24, 1_048_000);
    framed_file(&b, 2, 24, 1_000_000);
    let (out, s) = evb_run_in(d.path(), &toml("framed", &[(1, a), (2, b)], ""));
    assert_built(&out, &s, 24);
}

#[test]
fn fed_fragments_of_a_mebibyte_are_replayed() {
    let d = common::out_dir();
    let mut files = Vec::new();
    for src in [841u16, 843] {
        let mut data = Vec::new();
        for k in 0..12u32 {
            // 131 000 words: 1 048 016 bytes with header and trailer
            let n = if k % 3 == 0 { 131_000 } else { 10 + k as u64 };
            let words: Vec<u64> = (0..n).map(|w| w << 16 | src as u64).collect();
            data.extend(fed::build(1 + k, src, &words));
        }
        let p = d.path().join(format!("fed{src}.raw"));
        std::fs::write(&p, data).unwrap();
        files.push((src, p));
    }
    let (out, s) = evb_run_in(d.path(), &toml("fed", &files, ""));
    assert_built(&out, &s, 12);
}

/// A larger `source.max_fragment` raises the limit with it.
#[test]
fn the_limit_follows_source_max_fragment() {
    let d = common::out_dir();
    let (a, b) = (d.path().join("a.frm"), d.path().join("b.frm"));
    framed_file(&a, 1, 8, 3_000_000);
    framed_file(&b, 2, 8, 100);
    let extra = "max_fragment = 4194304\n[builder]\ncredits = 4";
    let (out, s) = evb_run_in(d.path(), &toml("framed", &[(1, a), (2, b)], extra));
    assert_built(&out, &s, 8);
}
