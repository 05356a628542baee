//! The eb model's cost at N × N, as `evb sim --model eb --n N` runs it (no shaping and the
//! barrel shifter, a thread each; its defaults: 4 credits, 64-cell buffers, fragments 8 ± 8
//! cells), stepped (`evb sim`'s model) or slotted (the model before it stepped by what
//! moves, kept as its test oracle):
//!
//! ```sh
//! cargo run --release -p evb-sim --example eb_scale -- 512 stepped 0
//! /usr/bin/time -v target/release/examples/eb_scale 512 slotted 2000
//! ```
//!
//! Arguments: N, `stepped` or `slotted`, the events measured (0: until ten batches fit).

use evb_sim::eventbuilding::{Assignment, EbModel, EbOutcome, Loss, Shaping};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let slotted = args.get(2).is_some_and(|s| s == "slotted");
    let events: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    let t0 = std::time::Instant::now();
    let run = |shaping| {
        let m = EbModel {
            rus: n,
            bus: n,
            mean_cells: 8.0,
            sd_cells: 8.0,
            credits: 4,
            buffer: 64,
            shaping,
            assignment: Assignment::RoundRobin,
            folded: false,
            loss: Loss::Lossless,
            fabric: None,
            events,
            warmup: 0,
            seed: 1,
        };
        if slotted {
            m.run_slotted()
        } else {
            m.run()
        }
    };
    let (none, barrel): (EbOutcome, EbOutcome) = std::thread::scope(|s| {
        let a = s.spawn(|| run(Shaping::None));
        let b = s.spawn(|| run(Shaping::Barrel));
        (a.join().unwrap(), b.join().unwrap())
    });
    for o in [&none, &barrel] {
        println!(
            "N = {n} {:?}: {:.2} ± {:.2} %, latency p50/p99 {}/{}, {} events measured after {}, {} batches, {} slots",
            o.model.shaping,
            o.efficiency * 100.0,
            o.efficiency_ci95 * 100.0,
            o.latency_p50,
            o.latency_p99,
            o.events_built,
            o.warmup_events,
            o.batches,
            o.slots
        );
    }
    println!("{:.1} s", t0.elapsed().as_secs_f64());
}
