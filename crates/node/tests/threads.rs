//! Whole runs with every node a thread of this test: over inproc, and over TCP loopback.

use std::time::Duration;

use evb_config::Config;
use evb_node::{run_node, NodeOutcome};

fn run_all(cfg: &Config) -> Vec<NodeOutcome> {
    let handles: Vec<_> = cfg
        .nodes()
        .into_iter()
        .map(|n| {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                run_node(&cfg, &n.id, Box::new(|_| {}), Duration::from_secs(1))
                    .expect("node failed")
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn check(outcomes: &[NodeOutcome], events: u64) {
    for o in outcomes {
        assert!(o.ok, "{}: {}", o.report.node, o.reason);
    }
    let run = outcomes[0].report.run.as_ref().expect("the EVM's report");
    assert_eq!(run.evm.triggered, events);
    assert_eq!(run.evm.released, events);
    let built: u64 = run
        .bus
        .iter()
        .map(|b| b.as_ref().unwrap().events_built)
        .sum();
    assert_eq!(built, events);
    assert_eq!(outcomes[0].report.verdict.as_deref(), Some(&[][..]));
}

#[test]
fn inproc_two_by_two_small_lognormal_fragments() {
    let cfg = Config::from_toml(
        r#"
        [run]
        id = "threads-inproc"
        events = 20000
        duration_s = 0
        [fragments]
        size = 2048
        distribution = "lognormal"
        [transport]
        kind = "inproc"
        "#,
    )
    .unwrap();
    check(&run_all(&cfg), 20000);
}

#[test]
fn tcp_three_by_two_in_threads() {
    let base = evb_messaging::free_ports(6).expect("free loopback ports");
    let cfg = Config::from_toml(&format!(
        r#"
        [run]
        id = "threads-tcp"
        events = 300
        duration_s = 0
        [fragments]
        size = 100000
        [topology]
        rus = 3
        bus = 2
        base_port = {base}
        "#
    ))
    .unwrap();
    check(&run_all(&cfg), 300);
}
