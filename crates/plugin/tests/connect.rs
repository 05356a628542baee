//! A producer or consumer whose EVM cannot be reached: `wait_connected` answers the node's
//! setup error, naming the address it tried, once `run.connect_timeout_s` is over (not a
//! later, unrelated call).

use std::time::{Duration, Instant};

use evb_plugin::{Config, Consumer, ConsumerOptions, Error, Producer};

/// A base port with the next `n - 1` free as well (nothing listens on any of them), below the
/// ephemeral range (`evb_messaging::free_ports`).
fn free_base_port(n: u16) -> u16 {
    evb_messaging::free_ports(n).expect("free loopback ports")
}

fn config(extra: &str) -> (Config, String) {
    let base = free_base_port(3);
    let text = format!(
        "[run]\nid = \"connect\"\nevents = 10\nconnect_timeout_s = 0.5\n{extra}\
         [topology]\nrus = 1\nbus = 1\nbase_port = {base}\n"
    );
    (
        Config::from_toml(&text).expect("a valid configuration"),
        format!("127.0.0.1:{base}"),
    )
}

fn assert_names(r: Result<(), Error>, evm: &str, started: Instant) {
    let took = started.elapsed();
    match r {
        Err(Error::Setup(why)) => assert!(why.contains(evm) && why.contains("evm"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_producer_without_its_evm_fails_naming_the_address() {
    let (cfg, evm) = config("[source]\nkind = \"api\"\nmax_fragment = 4096\n");
    let started = Instant::now();
    let p = Producer::start(&cfg, "ru0").expect("started");
    assert!(matches!(p.connected(), Ok(false)));
    assert_names(p.wait_connected(), &evm, started);
    // the error stays: every later look says it again
    assert!(matches!(p.connected(), Err(Error::Setup(_))));
}

#[test]
fn a_consumer_without_its_evm_fails_naming_the_address() {
    let (cfg, evm) = config("[sink]\nkind = \"api\"\n");
    let started = Instant::now();
    let mut c = Consumer::start(&cfg, "bu0", ConsumerOptions::default()).expect("started");
    assert_names(c.wait_connected(), &evm, started);
}
