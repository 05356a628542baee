//! The event builder over each transport, as real processes launched by `evb run`: a 2×2 run
//! with exact counts. (tcp is covered by tests/processes.rs.) A transport that cannot run on
//! this machine (ofi without libfabric) prints a notice and passes.

mod common;
use common::{assert_exact, evb_run};

use std::process::Output;

/// Why a transport cannot run here, if the run failed for that reason.
fn unavailable(out: &Output) -> Option<String> {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    [
        "libfabric not found",
        "built without libfabric headers",
        "offers connected message endpoints",
    ]
    .iter()
    .find(|m| text.contains(*m))
    .map(|_| {
        text.lines()
            .find(|l| l.contains("ofi"))
            .unwrap_or("")
            .to_string()
    })
}

/// A 2×2 run of `events` events of `size` bytes over `transport` (a TOML `[transport]` body).
fn exact_2x2(transport: &str, events: u64, size: u64) {
    let toml = format!(
        r#"
        [run]
        id = "e2e-2x2"
        events = {events}
        duration_s = 0
        [fragments]
        size = {size}
        [topology]
        rus = 2
        bus = 2
        [transport]
        {transport}
        "#
    );
    let (out, s) = evb_run(&toml);
    if !out.status.success() {
        if let Some(why) = unavailable(&out) {
            evb_buffers::skips::skipped(
                "transport end to end",
                &format!("the transport cannot run here: {why}"),
            );
            return;
        }
    }
    assert_exact(&out, &s, events, 2, 2);
}

#[test]
fn ofi_tcp_provider_2x2_small_events() {
    exact_2x2("kind = \"ofi\"\nprovider = \"tcp\"", 5000, 2048);
}

#[test]
fn ofi_tcp_provider_2x2_one_megabyte_events() {
    exact_2x2("kind = \"ofi\"\nprovider = \"tcp\"", 300, 1 << 20);
}

#[test]
fn ofi_with_a_provider_that_has_no_connected_endpoints_is_a_clear_error() {
    let toml = "[run]\nid = \"e2e-shm-prov\"\nevents = 10\n[topology]\nrus = 1\nbus = 1\n\
                [transport]\nkind = \"ofi\"\nprovider = \"shm\"\n";
    let (out, _) = evb_run(toml);
    assert!(!out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("FI_EP_RDM")
            || text.contains("libfabric not found")
            || text.contains("built without libfabric headers"),
        "{text}"
    );
}

#[test]
fn shm_2x2_one_megabyte_events() {
    exact_2x2("kind = \"shm\"", 300, 1 << 20);
}

#[test]
fn shm_2x2_small_fragments() {
    exact_2x2("kind = \"shm\"", 5000, 2048);
}

#[test]
fn mixed_routes_shm_on_a_host_tcp_between_hosts() {
    // Two "hosts" on one machine: 127.0.0.1 (evm, ru0, bu0) and 127.0.0.2 (ru1, bu1).
    // Routes within a host take shm, routes between them tcp.
    let toml = r#"
        [run]
        id = "e2e-mixed"
        events = 400
        duration_s = 0
        [fragments]
        size = 262144
        [transport]
        kind = "tcp"
        local = "shm"
        [evm]
        addr = "127.0.0.1:0"
        [[ru]]
        id = "ru0"
        addr = "127.0.0.1:0"
        [[ru]]
        id = "ru1"
        addr = "127.0.0.2:0"
        [[bu]]
        id = "bu0"
        addr = "127.0.0.1:0"
        [[bu]]
        id = "bu1"
        addr = "127.0.0.2:0"
    "#;
    let (out, s) = evb_run(toml);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s["run"]["evm"]["released"], 400);
    for ru in ["ru0", "ru1"] {
        let r = &s["nodes"][ru];
        let payload = r["stats"]["payload_bytes_sent"].as_u64().unwrap();
        let by_ref = r["net"]["bytes_by_reference"].as_u64().unwrap();
        // the BU on its own host got its fragments in place, the other one over tcp
        assert!(
            by_ref > payload / 4 && by_ref < payload,
            "{ru}: {by_ref} of {payload} by reference"
        );
        assert_eq!(r["net"]["bytes_copied"], 0);
    }
}
