//! A consumer taking one BU's built events through the plug-in API.
//!
//! ```sh
//! evb node --config run.toml --id evm &   # and every RU, as processes
//! cargo run --release -p evb-plugin --example consumer -- run.toml bu0
//! ```
//! `run.toml` gives `bu0` the sink `"api"`. Each event's fragments are read in place in the
//! BU's pool; dropping the event gives them back (and, through its credit, lets the next
//! event in).

use evb_plugin::{Config, Consumer, ConsumerOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, config, bu] = &args[..] else {
        return Err("usage: consumer CONFIG BU_ID".into());
    };
    let cfg = Config::from_file(config.as_ref())?;
    let mut consumer = Consumer::start(&cfg, bu, ConsumerOptions { max_held: 16 })?;
    let (mut events, mut bytes, mut bad) = (0u64, 0u64, 0u64);
    for event in consumer.by_ref() {
        for f in event.fragments() {
            let mut crc = 0;
            for chunk in f.chunks() {
                crc = crc32c::crc32c_append(crc, chunk);
            }
            bad += u64::from(crc != f.payload_crc());
            bytes += f.len() as u64;
        }
        events += 1;
    } // each event is released here, when dropped
    let outcome = consumer.finish()?;
    println!(
        "{bu}: {events} events, {bytes} payload bytes, {bad} bad checksums; {}",
        outcome.reason
    );
    if !outcome.ok || bad > 0 {
        return Err("run failed".into());
    }
    Ok(())
}
