//! A readout producer feeding one RU through the plug-in API.
//!
//! ```sh
//! evb node --config run.toml --id evm &   # and every BU, as processes
//! cargo run --release -p evb-plugin --example producer -- run.toml ru0 100000 4096
//! ```
//! `run.toml` says `source.kind = "api"`. Each fragment is written straight into the RU's
//! pool (zero copy) and submitted with a trigger number counting from 1.

use evb_plugin::{Config, Producer, WhenFull};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, config, ru, events, size] = &args[..] else {
        return Err("usage: producer CONFIG RU_ID EVENTS FRAGMENT_BYTES".into());
    };
    let (events, size): (u32, usize) = (events.parse()?, size.parse()?);
    let cfg = Config::from_file(config.as_ref())?;
    let mut producer = Producer::start(&cfg, ru)?;
    let started = std::time::Instant::now();
    for trigger in 1..=events {
        // waits while the RU's pool is full: back-pressure from the builder
        let mut buf = producer.buffer(size, WhenFull::Block)?;
        for (i, b) in buf.payload_mut().iter_mut().enumerate() {
            *b = (trigger as usize).wrapping_mul(31).wrapping_add(i) as u8;
        }
        producer.submit(buf, trigger)?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "submitted {events} fragments of {size} bytes in {secs:.2} s: {:.0} fragments/s",
        events as f64 / secs
    );
    let outcome = producer.finish()?;
    println!("{ru}: {}", outcome.reason);
    if !outcome.ok {
        return Err(outcome.reason.into());
    }
    Ok(())
}
