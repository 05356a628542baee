//! `evb sim`: the switch simulator's sweep over N, as a table, JSON and an SVG plot.

use std::path::PathBuf;

use clap::Args;
use evb_sim::eventbuilding::{Assignment, EbFabric, EbModel, Loss, Shaping, BATCHES};
use evb_sim::{hol_limit, simulate, Outcome, Policy, TABLE_VII};

#[derive(Args, Clone)]
pub struct SimArgs {
    /// Switch sizes N (N RUs × N BUs), comma-separated.
    #[arg(long, default_value = "1,2,4,8,16,32,64,128,256,512")]
    n: String,
    /// Slots simulated per point (default: about 2·10⁷ cell decisions per point, at least 2000 slots).
    #[arg(long)]
    slots: Option<u64>,
    /// Seed of the random traffic (the same seed gives the same figures).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The folder the plot goes to (made if missing; its path is printed).
    #[arg(long, value_name = "DIR", default_value = "evb-out/sim")]
    out: PathBuf,
    /// The plot's file (default: OUT/efficiency.svg).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also write every point as JSON to FILE; `-` (or `--json` alone): to stdout, the
    /// table then on stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Which model: "switch" (saturated cells: head-of-line blocking against the barrel
    /// shifter), "eb" (event building: fragments, credits, finite output buffers, lossless
    /// or TCP, on one switch or a fabric) or "clos" (a leaf-and-spine fabric under six
    /// routings, seed 003's adaptive one among them).
    #[arg(long, default_value = "switch")]
    model: String,
    /// eb: mean fragment size in cells (log-normal).
    #[arg(long, default_value_t = 8.0)]
    mean_cells: f64,
    /// eb: the fragment size's standard deviation in cells (0: every fragment --mean-cells).
    #[arg(long, default_value_t = 8.0)]
    sd_cells: f64,
    /// eb: events each BU may hold in flight.
    #[arg(long, default_value_t = 4)]
    credits: u32,
    /// eb: cells each switch output port buffers.
    #[arg(long, default_value_t = 64)]
    buffer: u32,
    /// eb: events built and measured per point, after the warm-up (0: until the measured
    /// slots hold 10 batches of twice the p99 latency, at least 2000 events and at most: the
    /// barrel shifter on one lossless switch, 64 times the events in flight, credits × BUs;
    /// unshaped there, twice them or a billion cells' worth, whichever is more; else twice
    /// them).
    #[arg(long, default_value_t = 0)]
    events: u64,
    /// eb: events built before measuring starts (0: 4 × credits × BUs, at least 1000): the
    /// start, with every credit in flight at once, is a transient.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// eb and clos: BUs (M), for N RUs × M BUs (default: M = N; for clos, folded: host k
    /// is RU k and BU k). With clos the BUs are on leaves of their own.
    #[arg(long)]
    bus: Option<usize>,
    /// clos: ports per leaf switch (half to hosts, half up to the spines).
    #[arg(long, default_value_t = 32)]
    radix: usize,
    /// clos: host ports per uplink of a leaf (1: full bisection).
    #[arg(long, default_value_t = 1)]
    oversub: usize,
    /// clos: the routings, comma-separated: static, random, local, pair, ecmp, adaptive
    /// (default: all of them, a column each). eb: one of them puts the event builder on
    /// a leaf-and-spine fabric of --radix-port leaves (--oversub, --settle) in place of one
    /// switch: folded with --folded, else the BUs on leaves of their own.
    #[arg(long)]
    routing: Option<String>,
    /// clos, adaptive routing: a route blocked inside the fabric moves after about this
    /// many blocked messages (seed 003: routes need O(1000) stable messages).
    #[arg(long, default_value_t = evb_sim::clos::SETTLE)]
    settle: u32,
    /// clos: wormhole switching with worms (packets) of L cells: a head holds every link it
    /// has taken while it waits for the next, and the tail frees them (default: off, a cell
    /// crosses in one slot or waits, holding nothing). 1 to 4096.
    #[arg(long, value_name = "L", value_parser = worm_cells)]
    wormhole: Option<std::num::NonZeroU32>,
    /// eb: RU k and BU k on host k (N × N): a host's own fragment never crosses the
    /// switch, and the barrel shifter's cycle skips it (evb's `topology.folded`).
    #[arg(long)]
    folded: bool,
    /// eb: what a full switch output does with a cell: "lossless" (it waits at its input:
    /// link-level back-pressure) or "tcp" (dropped; its RU–BU connection sends nothing for
    /// --stall slots, then again; RUs share their link among connections in turn).
    #[arg(long, default_value = "lossless")]
    loss: String,
    /// eb, with --loss tcp: slots a connection stays silent after a drop (TCP's recovery),
    /// calibrated on the testbed (docs/scaling.md, "The model against the testbed").
    #[arg(long, default_value_t = evb_sim::eventbuilding::TCP_STALL)]
    stall: u32,
    /// eb, with --loss tcp: cells an RU sends from one connection before it draws the next
    /// (a segmentation offload's chunk), calibrated with --stall.
    #[arg(long, default_value_t = evb_sim::eventbuilding::TCP_BURST)]
    burst: u32,
    /// eb, with --loss tcp: cells a connection may have in its BU's output buffer (TCP's
    /// window), calibrated with --stall.
    #[arg(long, default_value_t = evb_sim::eventbuilding::TCP_WINDOW)]
    window: u32,
    /// eb, with --loss tcp: each RU's own egress queue in cells, as a shaped host port has
    /// (0: none, the RUs send --burst by --burst); the testbed's hosts have their port's
    /// queue (docs/scaling.md, "Held out").
    #[arg(long, default_value_t = 0)]
    host_buffer: u32,
    /// eb, with --loss tcp and --host-buffer: the chance (%) that a connection offers its
    /// host's queue a cell in a slot (its pacing), calibrated with --stall.
    #[arg(long, default_value_t = evb_sim::eventbuilding::TCP_OFFER_PCT)]
    offer: u32,
    /// eb: how the EVM picks the BU: "round-robin" (the next with credit, evb's "credits")
    /// or "random" (a drawn BU, waited for when it has no credit, as evb's EVM does).
    #[arg(long, default_value = "round-robin")]
    assignment: String,
    /// A system in physical units (TOML: RUs, BUs, link rate, trigger rate, fragment sizes,
    /// credits; docs/planning.md), simulated at its offered trigger
    /// rate: throughput, whether it keeps up, build latency, RU and BU memory, throttling.
    /// The options above are for the other models.
    #[arg(long, value_name = "FILE")]
    system: Option<PathBuf>,
    /// With --system: a key of the file set to a value (TOML), e.g. `--set link_gbps=200`;
    /// repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// With --system: one key over several values (`--sweep trigger_hz=5e5,7.5e5,1e6`), a
    /// row each, the points run in parallel. Repeated, the points are every combination;
    /// the first key is the plots' x axis, a plot for each combination of the others.
    #[arg(long, value_name = "KEY=V1,V2,...")]
    sweep: Vec<String>,
    /// With --system: a report of the run, self-contained: FILE.html (the table and the
    /// plots inline) or FILE.md (the table, the plots linked).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// With --system: the least value of KEY for which the system keeps up at its trigger
    /// rate × (1 + --margin): "bus" (BUs, to one) or "link_gbps" (the link rate, to 1 %).
    /// The file's value of KEY is ignored. Prints the answer, the value below it that does
    /// not keep up, and what one BU more or fewer changes; refused, with the reason, where
    /// no value within the model's bounds keeps up.
    #[arg(long, value_name = "KEY")]
    solve: Option<String>,
    /// With --system: the headroom asked for, from 0 to 100: every row is simulated at
    /// (1 + MARGIN) × trigger_hz (0.2: 20 % more triggers), so "keeps up" is with that
    /// headroom; with --solve, the answer keeps up at that rate.
    #[arg(long, value_name = "MARGIN", allow_negative_numbers = true)]
    margin: Option<f64>,
    /// With --system: independent runs per point (seeds SEED, SEED + 1, ...): a point keeps
    /// up only if every run does, and its figures are their means, with the range (min-max)
    /// over them (default 3).
    #[arg(long, value_name = "R")]
    replications: Option<u32>,
    /// With --system: a row more for each part the system may lose (a BU, an RU, a folded
    /// system's host, a spine where `spines` is given): the run that goes on after the loss.
    #[arg(long)]
    degraded: bool,
}

pub fn run(a: &SimArgs) -> Result<(), String> {
    let sizes: Vec<usize> =
        a.n.split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| format!("--n: {s:?} is not a size from 1 to 4096"))
            })
            .collect::<Result<_, _>>()?;
    if let Some(file) = &a.system {
        return run_system(a, file);
    }
    if a.solve.is_some() || a.margin.is_some() {
        return Err("--solve and --margin: only with --system FILE".into());
    }
    if a.replications.is_some() {
        return Err("--replications: only with --system FILE".into());
    }
    if a.bus.is_some() && a.model == "switch" {
        return Err(
            "--bus: the \"switch\" model has N × N ports; --model eb and clos take M BUs".into(),
        );
    }
    if a.wormhole.is_some() && a.model != "clos" {
        return Err("--wormhole: only with --model clos".into());
    }
    if a.model == "eb" {
        return run_eb(a, &sizes);
    }
    if a.model == "clos" {
        return run_clos(a, &sizes);
    }
    if a.model != "switch" {
        return Err(format!(
            "--model: {:?} is not \"switch\", \"eb\" or \"clos\"",
            a.model
        ));
    }
    let t0 = std::time::Instant::now();
    let mut points: Vec<Outcome> = Vec::new();
    println!(
        "{:>5} {:>10} {:>12} {:>8}",
        "N", "table VII", "random-fifo", "barrel"
    );
    for &n in &sizes {
        let slots = a
            .slots
            .unwrap_or_else(|| (20_000_000 / n as u64).max(2_000));
        let row: Vec<Outcome> = Policy::ALL
            .into_iter()
            .map(|p| simulate(p, n, n, slots, a.seed))
            .collect();
        let published = TABLE_VII
            .iter()
            .find(|(k, _)| *k == n)
            .map_or("-".to_string(), |(_, v)| format!("{:.2} %", v * 100.0));
        println!(
            "{n:>5} {published:>10} {:>10.2} % {:>6.2} %",
            row[0].efficiency * 100.0,
            row[1].efficiency * 100.0
        );
        points.extend(row);
    }
    println!("  inf {:>8.2} %   (2 - sqrt 2)", hol_limit() * 100.0);
    let svg = a
        .svg
        .clone()
        .unwrap_or_else(|| a.out.join("efficiency.svg"));
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    evb_sim::plot::efficiency_svg(&points, &svg)?;
    if let Some(path) = &a.json {
        crate::json_out::write(path, &points)?;
    }
    println!(
        "wrote {} ({:.1} s)",
        svg.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--wormhole L`: cells per worm, 1 to 4096.
fn worm_cells(s: &str) -> Result<std::num::NonZeroU32, String> {
    s.parse::<u32>()
        .ok()
        .filter(|l| (1..=4096).contains(l))
        .and_then(std::num::NonZeroU32::new)
        .ok_or_else(|| format!("{s:?} is not a worm length from 1 to 4096 cells"))
}

/// The Clos model over the sizes: random FIFO traffic and the barrel shifter, under each
/// routing.
fn run_clos(a: &SimArgs, sizes: &[usize]) -> Result<(), String> {
    use evb_sim::clos::{ClosModel, Routing};
    if !(2..=1024).contains(&a.radix) || !(1..=64).contains(&a.oversub) {
        return Err("--radix: 2 to 1024; --oversub: 1 to 64".into());
    }
    let routings: Vec<Routing> = match &a.routing {
        None => Routing::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|r| {
                Routing::parse(r.trim()).ok_or_else(|| {
                    format!(
                        "--routing: {r:?} is not one of static, random, local, pair, ecmp, adaptive"
                    )
                })
            })
            .collect::<Result<_, _>>()?,
    };
    if !(1..=1_000_000).contains(&a.settle) {
        return Err("--settle: 1 to 1000000 messages".into());
    }
    let t0 = std::time::Instant::now();
    println!(
        "{}: leaves of {} ports ({} to hosts), oversubscription {}:1{}; efficiency = cells / (slots x {})",
        match a.bus {
            None => "folded Clos (host k: RU k and BU k)".to_string(),
            Some(m) => format!("Clos, N RUs and {m} BUs on leaves of their own"),
        },
        a.radix,
        a.radix / 2,
        a.oversub,
        match a.wormhole {
            Some(l) => format!(", wormhole: worms of {l} cells hold their links"),
            None => String::new(),
        },
        if a.bus.is_some() { "min(N, M)" } else { "hosts" }
    );
    let mut head = format!("{:>6} {:>7} {:>7}", "N", "leaves", "spines");
    for p in ["fifo", "barrel"] {
        head.push_str(" |");
        for r in &routings {
            head.push_str(&format!(" {:>15}", format!("{p} {}", r.name())));
        }
    }
    println!("{head}");
    let mut all = Vec::new();
    for &n in sizes {
        let slots = a
            .slots
            .unwrap_or((20_000_000 / n as u64).clamp(2_000, 200_000));
        let mut row = Vec::new();
        for policy in [evb_sim::Policy::RandomFifo, evb_sim::Policy::Barrel] {
            for &routing in &routings {
                let model = ClosModel {
                    hosts: n,
                    bus: a.bus,
                    radix: a.radix,
                    oversubscription: a.oversub,
                    routing,
                    settle: a.settle,
                    policy,
                    repeat: false,
                    slots,
                    seed: a.seed,
                };
                let o = match a.wormhole {
                    Some(l) => model.run_wormhole(l.get()),
                    None => model.run(),
                };
                row.push(o);
            }
        }
        let mut line = format!("{n:>6} {:>7} {:>7}", row[0].leaves, row[0].spines);
        for (k, o) in row.iter().enumerate() {
            if k % routings.len() == 0 {
                line.push_str(" |");
            }
            line.push_str(&format!(" {:>13.2} %", o.efficiency * 100.0));
        }
        println!("{line}");
        all.extend(row);
    }
    // a curve per traffic and routing against N
    let mut curves = Vec::new();
    for (p, policy) in [(0, "random FIFO"), (1, "barrel")] {
        for (r, routing) in routings.iter().enumerate() {
            let pts = all
                .chunks(2 * routings.len())
                .map(|row| {
                    let o = &row[p * routings.len() + r];
                    (o.model.hosts as f64, o.efficiency)
                })
                .collect();
            curves.push((format!("{policy}, {}", routing.name()), pts));
        }
    }
    let svg = a.svg.clone().unwrap_or_else(|| a.out.join("clos.svg"));
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    evb_sim::plot::curves_svg(
        &format!("Clos of {}-port leaves: efficiency against N", a.radix),
        "N (hosts; log scale)",
        &curves,
        true,
        &svg,
    )?;
    println!("wrote {}", svg.display());
    if let Some(path) = &a.json {
        crate::json_out::write(path, &all)?;
    }
    println!("({:.1} s)", t0.elapsed().as_secs_f64());
    Ok(())
}

/// The event-building model over the sizes, without and with the barrel shifter; with
/// `--sweep KEY=V1,...` also over one of its parameters, with a plot.
fn run_eb(a: &SimArgs, sizes: &[usize]) -> Result<(), String> {
    // the variants: the flags as given, or one per value of the swept key
    let variants: Vec<(String, EbModel)> = match a.sweep.as_slice() {
        [] => vec![(String::new(), eb_template(a, sizes)?)],
        [sw] => {
            let (k, vs) = sw
                .split_once('=')
                .ok_or_else(|| format!("--sweep {sw:?}: KEY=V1,V2,... expected"))?;
            let k = k.trim();
            vs.split(',')
                .map(|v| {
                    let mut b = a.clone();
                    set_eb_key(&mut b, k, v.trim())?;
                    Ok((format!("{k}={}", v.trim()), eb_template(&b, sizes)?))
                })
                .collect::<Result<_, String>>()?
        }
        _ => return Err("--sweep: one key with --model eb".into()),
    };
    let m0 = &variants[0].1;
    let t0 = std::time::Instant::now();
    println!(
        "event building: fragments {} ± {} cells, {} credits per BU, output buffers of {} cells, {} assignment, {}{}{}{}",
        m0.mean_cells,
        m0.sd_cells,
        m0.credits,
        m0.buffer,
        a.assignment,
        match m0.loss {
            Loss::Lossless => "lossless".to_string(),
            Loss::Tcp {
                stall,
                burst,
                window,
                host_buffer: 0,
                ..
            } => format!(
                "tcp (a drop silences its connection {stall} slots; bursts of {burst} cells, windows of {window})"
            ),
            Loss::Tcp {
                stall,
                window,
                host_buffer,
                offer_pct,
                ..
            } => format!(
                "tcp (a drop silences its connection {stall} slots; windows of {window}; host queues of {host_buffer} cells, each connection offering a cell {offer_pct} % of slots)"
            ),
        },
        if a.folded { ", folded" } else { "" },
        match a.sweep.first().and_then(|sw| sw.split_once('=')) {
            Some((k, _)) => format!(", over {}: a row each", k.trim()),
            None => String::new(),
        },
        match &m0.fabric {
            None => String::new(),
            Some(f) => format!(
                ", through a Clos of {}-port leaves ({}:1), {} routing",
                f.radix,
                f.oversubscription,
                f.routing.name()
            ),
        }
    );
    // every point, run in parallel
    let mut jobs = Vec::new();
    for &n in sizes {
        for (_, m) in &variants {
            for shaping in [Shaping::None, Shaping::Barrel] {
                jobs.push(EbModel {
                    rus: n,
                    bus: a.bus.unwrap_or(n),
                    shaping,
                    ..m.clone()
                });
            }
        }
    }
    let all = parallel(&jobs, |m| m.run());
    println!(
        "{:>9} {:<16} {:>18} {:>16} {:>18} {:>16}",
        "N", "point", "no shaping", "latency p50/p99", "barrel", "latency p50/p99"
    );
    let (mut short, mut dropping) = (false, false);
    for (k, pair) in all.chunks(2).enumerate() {
        let (none, barrel) = (&pair[0], &pair[1]);
        let n = none.model.rus;
        let shape = match a.bus {
            Some(m) => format!("{n}x{m}"),
            None => n.to_string(),
        };
        let label = &variants[k % variants.len()].0;
        println!(
            "{shape:>9} {:<16} {:>8.2} ± {:<5.2} % {:>16} {:>8.2} ± {:<5.2} % {:>16}",
            if label.is_empty() { "as given" } else { label },
            none.efficiency * 100.0,
            none.efficiency_ci95 * 100.0,
            format!("{}/{}", none.latency_p50, none.latency_p99),
            barrel.efficiency * 100.0,
            barrel.efficiency_ci95 * 100.0,
            format!("{}/{}", barrel.latency_p50, barrel.latency_p99)
        );
        short |= none.batches < BATCHES || barrel.batches < BATCHES;
        if none.batches < BATCHES || barrel.batches < BATCHES {
            println!(
                "{:>9} {:<16} {} and {} batches *",
                "", "", none.batches, barrel.batches
            );
        }
        if none.dropped_cells + barrel.dropped_cells > 0 {
            dropping = true;
            println!(
                "{:>9} {:<16} {} and {} cells dropped †",
                "", "", none.dropped_cells, barrel.dropped_cells
            );
        }
    }
    if short {
        println!(
            "*: the run spans fewer than {BATCHES} times twice the p99 latency, so its interval \
             rests on fewer batches and the figure may still move: run longer (--events)"
        );
    }
    if dropping {
        println!(
            "†: the model dropped cells, so TCP's recovery decides the figure: against the \
             testbed such rows were off by up to 18.5 points at a queue depth the model was not \
             calibrated on (docs/scaling.md, \"Held out again\"); it says that the ports drop, \
             not by how much the run then loses"
        );
    }
    if let Some(sw) = a.sweep.first() {
        // a curve per shaping and size against the swept key
        let (k, vs) = sw.split_once('=').unwrap_or((sw, ""));
        let xs: Vec<f64> = vs
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        let mut curves = Vec::new();
        for (si, &n) in sizes.iter().enumerate() {
            for (h, name) in ["no shaping", "barrel"].into_iter().enumerate() {
                let pts: Vec<(f64, f64)> = xs
                    .iter()
                    .enumerate()
                    .map(|(vi, &x)| (x, all[(si * variants.len() + vi) * 2 + h].efficiency))
                    .collect();
                let label = if sizes.len() > 1 {
                    format!("{name}, N = {n}")
                } else {
                    name.to_string()
                };
                curves.push((label, pts));
            }
        }
        let svg = a
            .svg
            .clone()
            .unwrap_or_else(|| a.out.join(format!("eb-{}.svg", k.trim())));
        if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let unit = match k.trim() {
            "credits" => "events per BU",
            "stall" => "slots",
            _ => "cells",
        };
        evb_sim::plot::curves_svg(
            &format!("event building over {}", k.trim()),
            &format!("{} ({unit})", k.trim()),
            &curves,
            false,
            &svg,
        )?;
        println!("wrote {}", svg.display());
    }
    if let Some(path) = &a.json {
        crate::json_out::write(path, &all)?;
    }
    println!("({:.1} s; latencies in slots)", t0.elapsed().as_secs_f64());
    Ok(())
}

/// A key of the eb model set for one point of `--sweep`: its flag's name without `--`.
fn set_eb_key(a: &mut SimArgs, key: &str, v: &str) -> Result<(), String> {
    let bad = || format!("--sweep {key}={v}: not a number");
    match key {
        "buffer" => a.buffer = v.parse().map_err(|_| bad())?,
        "credits" => a.credits = v.parse().map_err(|_| bad())?,
        "mean-cells" => a.mean_cells = v.parse().map_err(|_| bad())?,
        "sd-cells" => a.sd_cells = v.parse().map_err(|_| bad())?,
        "stall" => a.stall = v.parse().map_err(|_| bad())?,
        "burst" => a.burst = v.parse().map_err(|_| bad())?,
        "window" => a.window = v.parse().map_err(|_| bad())?,
        "host-buffer" => a.host_buffer = v.parse().map_err(|_| bad())?,
        "offer" => a.offer = v.parse().map_err(|_| bad())?,
        "settle" => a.settle = v.parse().map_err(|_| bad())?,
        _ => {
            return Err(format!(
                "--sweep {key:?}: with --model eb one of buffer, credits, mean-cells, sd-cells, \
                 stall, burst, window, host-buffer, offer, settle (N is --n)"
            ))
        }
    }
    Ok(())
}

/// The eb model the flags describe (its sizes and shaping set per point), or why not.
fn eb_template(a: &SimArgs, sizes: &[usize]) -> Result<EbModel, String> {
    let assignment = match a.assignment.as_str() {
        "round-robin" => Assignment::RoundRobin,
        "random" => Assignment::Random,
        other => {
            return Err(format!(
                "--assignment: {other:?} is not round-robin or random"
            ))
        }
    };
    if !(a.mean_cells >= 1.0 && a.mean_cells <= 1e4) {
        return Err("--mean-cells: from 1 to 10000".into());
    }
    if !(a.sd_cells >= 0.0 && a.sd_cells <= 1e5) {
        return Err("--sd-cells: from 0 to 100000".into());
    }
    if !(1..=4096).contains(&a.credits) || !(1..=1 << 20).contains(&a.buffer) {
        return Err("--credits: 1 to 4096; --buffer: 1 to 1048576 cells".into());
    }
    if a.events > 10_000_000 || a.warmup > 10_000_000 {
        return Err("--events: 0 to 10000000; --warmup: 0 to 10000000".into());
    }
    if a.bus.is_some_and(|m| !(1..=4096).contains(&m)) {
        return Err("--bus: 1 to 4096".into());
    }
    let loss = match a.loss.as_str() {
        "lossless" => Loss::Lossless,
        "tcp"
            if (1..=1_000_000).contains(&a.stall)
                && (1..=4096).contains(&a.burst)
                && (1..=1 << 20).contains(&a.window)
                && a.host_buffer <= 1 << 20
                && (1..=100).contains(&a.offer) =>
        {
            Loss::Tcp {
                stall: a.stall,
                burst: a.burst,
                window: a.window,
                host_buffer: a.host_buffer,
                offer_pct: a.offer,
            }
        }
        "tcp" => return Err(
            "--stall: 1 to 1000000 slots; --burst: 1 to 4096 cells; --window: 1 to 1048576 cells; \
             --host-buffer: 0 to 1048576 cells; --offer: 1 to 100 %"
                .into(),
        ),
        other => return Err(format!("--loss: {other:?} is not lossless or tcp")),
    };
    if a.host_buffer > 0 && (loss == Loss::Lossless || a.routing.is_some()) {
        // the host queue is a TCP host's on one switch: it would do nothing here
        return Err("--host-buffer: only with --loss tcp on one switch (without --routing)".into());
    }
    if a.folded && a.bus.is_some_and(|m| m != 0) && sizes.iter().any(|&n| Some(n) != a.bus) {
        return Err("--folded: N × N only (RU k and BU k share host k); leave --bus out".into());
    }
    let fabric = match &a.routing {
        None => None,
        Some(r) => {
            let routing = evb_sim::clos::Routing::parse(r.trim()).ok_or_else(|| {
                format!(
                    "--routing: {r:?} is not one of static, random, local, pair, ecmp, adaptive (one, with --model eb)"
                )
            })?;
            if !(2..=1024).contains(&a.radix) || !(1..=64).contains(&a.oversub) {
                return Err("--radix: 2 to 1024; --oversub: 1 to 64".into());
            }
            if !(1..=1_000_000).contains(&a.settle) {
                return Err("--settle: 1 to 1000000 messages".into());
            }
            Some(EbFabric {
                radix: a.radix,
                oversubscription: a.oversub,
                routing,
                settle: a.settle,
            })
        }
    };
    if a.folded && sizes.contains(&1) {
        return Err("--folded: N from 2 (with one host nothing crosses the switch)".into());
    }
    Ok(EbModel {
        rus: 0,
        bus: 0,
        mean_cells: a.mean_cells,
        sd_cells: a.sd_cells,
        credits: a.credits,
        buffer: a.buffer,
        shaping: Shaping::None,
        assignment,
        folded: a.folded,
        loss,
        fabric,
        events: a.events,
        warmup: a.warmup,
        seed: a.seed,
    })
}

/// `f` over `items` on every core, the results in order.
fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|sc| {
        for _ in 0..cores.min(items.len()) {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(k) else {
                    break;
                };
                let r = f(item);
                *results[k].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .filter_map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

/// `--system FILE`: the system at its offered rate, once or over `--sweep`.
fn run_system(a: &SimArgs, file: &std::path::Path) -> Result<(), String> {
    use evb_sim::offered::System;
    let mut text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    for kv in &a.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set {kv:?}: KEY=VALUE expected"))?;
        text = evb_sim::offered::with_key(&text, k.trim(), v.trim())?;
    }
    // the sweeps' keys and values; the points are every combination, the first key
    // varying fastest
    let sweeps: Vec<(String, Vec<String>)> = a
        .sweep
        .iter()
        .map(|sw| {
            let (k, vs) = sw
                .split_once('=')
                .ok_or_else(|| format!("--sweep {sw:?}: KEY=V1,V2,... expected"))?;
            Ok((
                k.trim().to_string(),
                vs.split(',').map(|v| v.trim().to_string()).collect(),
            ))
        })
        .collect::<Result<_, String>>()?;
    let solve = solve_key(a, &sweeps)?;
    if a.degraded && (!sweeps.is_empty() || solve.is_some()) {
        return Err("--degraded: not with --sweep or --solve (its rows are the system's own, each with a part lost)".into());
    }
    let replications = a.replications.unwrap_or(REPLICATIONS);
    if !(1..=evb_sim::confidence::MAX_REPLICATIONS).contains(&replications) {
        return Err(format!(
            "--replications {replications}: from 1 to {}",
            evb_sim::confidence::MAX_REPLICATIONS
        ));
    }
    let margin = a.margin.unwrap_or(0.0);
    let combos: usize = sweeps.iter().map(|(_, vs)| vs.len()).product();
    if combos > 10_000 {
        return Err(format!("--sweep: {combos} points; at most 10000"));
    }
    let mut systems: Vec<(String, System)> = Vec::new();
    for c in 0..combos {
        let (mut t, mut label, mut rest) = (text.clone(), Vec::new(), c);
        for (k, vs) in &sweeps {
            let v = &vs[rest % vs.len()];
            rest /= vs.len();
            t = evb_sim::offered::with_key(&t, k, v)?;
            label.push(format!("{k}={v}"));
        }
        let sys = System::from_toml(&t).map_err(|e| format!("{}: {e}", file.display()))?;
        // --solve applies its margin itself
        let sys = if solve.is_some() {
            sys
        } else {
            evb_sim::confidence::at_margin(&sys, margin)?
        };
        systems.push((label.join(" "), sys));
    }
    if a.degraded {
        let lost = evb_sim::offered::degraded(&systems[0].1);
        if lost.is_empty() {
            return Err("--degraded: a system of one RU and one BU has no part it can lose".into());
        }
        systems.extend(lost);
    }
    if let Some(r) = &a.report {
        if !matches!(
            r.extension().and_then(|e| e.to_str()),
            Some("html" | "htm" | "md")
        ) {
            return Err(format!("--report {}: FILE.html or FILE.md", r.display()));
        }
    }
    if a.report.is_some() && a.json.as_deref() == Some(std::path::Path::new("-")) {
        return Err("--report: not with --json - (stdout is the JSON)".into());
    }
    if let Some((key, margin)) = solve {
        return run_solve(a, &systems[0].1, key, margin, replications);
    }
    let t0 = std::time::Instant::now();
    let plain: Vec<System> = systems.iter().map(|(_, s)| s.clone()).collect();
    let planned = plan_all(&plain, replications, margin);
    let first = &systems[0].1;
    print_system(first, &sweeps);
    if margin > 0.0 {
        println!(
            "every row at (1 + {margin}) × trigger_hz: \"keeps up\" is with {:.0} % headroom",
            margin * 100.0
        );
    }
    print_header();
    for ((label, _), p) in systems.iter().zip(&planned) {
        print_row(if label.is_empty() { "as given" } else { label }, p);
    }
    println!(
        "{LEGEND}; {}; {:.1} s",
        replication_note(replications, first.seed),
        t0.elapsed().as_secs_f64()
    );
    // plots of the sweep when the first key's values are numbers: one per combination of
    // the other keys
    let mut plots: Vec<(String, PathBuf)> = Vec::new();
    if let Some((k, vs)) = sweeps.first() {
        let xs: Option<Vec<f64>> = vs.iter().map(|v| v.parse::<f64>().ok()).collect();
        if let Some(xs) = xs {
            let groups = combos / xs.len();
            for g in 0..groups {
                let idx: Vec<usize> = (0..xs.len()).map(|x| g * xs.len() + x).collect();
                let group = systems[idx[0]]
                    .0
                    .split(' ')
                    .skip(1)
                    .collect::<Vec<_>>()
                    .join(" ");
                let svg = match (&a.svg, groups) {
                    (Some(f), 1) => f.clone(),
                    (Some(f), _) => f.with_file_name(format!(
                        "{}-{}.svg",
                        f.file_stem().map_or("plan".into(), |s| s.to_string_lossy()),
                        group.replace([' ', '='], "-")
                    )),
                    (None, 1) => a.out.join(format!("plan-{k}.svg")),
                    (None, _) => a
                        .out
                        .join(format!("plan-{k}-{}.svg", group.replace([' ', '='], "-"))),
                };
                if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                }
                let pts: Vec<_> = idx.iter().map(|&i| planned[i].clone()).collect();
                evb_sim::plot::sweep_svg(k, &group, &xs, &pts, &svg)?;
                println!("wrote {}", svg.display());
                plots.push((group, svg));
            }
        }
    }
    if let Some(path) = &a.report {
        let rows: Vec<(&str, &evb_sim::offered::Planned)> = systems
            .iter()
            .map(|(l, _)| l.as_str())
            .zip(&planned)
            .collect();
        crate::sim_report::write(path, &file.display().to_string(), &sweeps, &rows, &plots)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.json {
        crate::json_out::write(path, &planned)?;
    }
    Ok(())
}

/// Runs per point of `--system` unless `--replications` says otherwise: enough to see a
/// verdict that depends on the seed, cheap enough for a sweep.
const REPLICATIONS: u32 = 3;

/// What the table's columns mean.
const LEGEND: &str = "load: what the offered rate needs of the busiest link; memory: one RU's \
                      and one BU's bytes held (fragments of events not yet released)";

/// The system's line above its table: the swept keys as ‹key›, and their values.
fn print_system(s: &evb_sim::offered::System, sweeps: &[(String, Vec<String>)]) {
    let name = if s.name.is_empty() { "system" } else { &s.name };
    let keys: Vec<&str> = sweeps.iter().map(|(k, _)| k.as_str()).collect();
    println!("{name}: {}", s.shape_with(&keys));
    if !sweeps.is_empty() {
        println!("{}", sweep_line(sweeps));
    }
}

/// `a sweep over link_gbps (100, 200, 400) and credits (2, 4)`.
pub(crate) fn sweep_line(sweeps: &[(String, Vec<String>)]) -> String {
    let parts: Vec<String> = sweeps
        .iter()
        .map(|(k, vs)| format!("{k} ({})", vs.join(", ")))
        .collect();
    format!("a sweep over {}", parts.join(" and "))
}

/// What the keeps column's count and the ranges are.
pub(crate) fn replication_note(r: u32, seed: u64) -> String {
    if r <= 1 {
        return format!("one run per point (seed {seed})");
    }
    format!(
        "keeps: runs that kept up, of {r} (seeds {seed} to {}), yes only if all did; \
         figures: their mean, [min–max] over them",
        seed.wrapping_add(u64::from(r) - 1)
    )
}

/// Every system over `r` replications, all runs in parallel; a point each.
fn plan_all(
    systems: &[evb_sim::offered::System],
    r: u32,
    margin: f64,
) -> Vec<evb_sim::offered::Planned> {
    use evb_sim::confidence::{combine, replicas};
    let runs: Vec<_> = systems.iter().flat_map(|s| replicas(s, r)).collect();
    let done = parallel(&runs, evb_sim::offered::plan);
    done.chunks(r.max(1) as usize)
        .zip(systems)
        .map(|(c, s)| combine(c, margin).unwrap_or_else(|| evb_sim::offered::plan(s)))
        .collect()
}

fn print_header() {
    println!(
        "{:<22} {:>6} {:>11} {:>9} {:>7} {:>9} {:>9} {:>10} {:>24} {:>10} {:>12} {:>12}",
        "point",
        "load",
        "built Hz",
        "Gb/s",
        "BU link",
        "throttled",
        "keeps",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "RU mem p99",
        "BU mem p99"
    );
}

fn print_row(label: &str, p: &evb_sim::offered::Planned) {
    println!(
        "{label:<22} {:>5.1}% {:>11.0} {:>9.1} {:>6.1}% {:>8.3}% {:>9} {:>10.1} {:>24} {:>10.1} {:>12} {:>12}",
        p.offered_link_load * 100.0,
        p.built_hz,
        p.built_gbps,
        p.bu_link_busy * 100.0,
        p.throttled * 100.0,
        keeps(p),
        p.latency_us.p50,
        with_range(
            p.latency_us.p99,
            p.confidence.as_ref().map(|c| c.latency_p99_us)
        ),
        p.latency_us.p999,
        bytes(p.ru_buffer_bytes.p99),
        bytes(p.bu_buffer_bytes.p99)
    );
}

/// The verdict with its count: `yes (3/3)`, `NO (1/3)`; one run: `yes`.
pub(crate) fn keeps(p: &evb_sim::offered::Planned) -> String {
    let word = if p.keeps_up { "yes" } else { "NO" };
    match &p.confidence {
        Some(c) if c.replications > 1 => format!("{word} ({}/{})", c.kept_up, c.replications),
        _ => word.to_string(),
    }
}

/// A figure to a tenth with its range over replications: `412.0 [398.1–430.2]`.
pub(crate) fn with_range(v: f64, iv: Option<evb_sim::confidence::Interval>) -> String {
    match iv {
        Some(i) if i.hi > i.lo => format!("{v:.1} [{:.1}–{:.1}]", i.lo, i.hi),
        _ => format!("{v:.1}"),
    }
}

/// `--solve KEY [--margin M]` checked against the other flags: the key and the margin, or
/// none without --solve.
fn solve_key(
    a: &SimArgs,
    sweeps: &[(String, Vec<String>)],
) -> Result<Option<(evb_sim::solve::Key, f64)>, String> {
    use evb_sim::solve::Key;
    let Some(k) = a.solve.as_deref() else {
        return Ok(None);
    };
    let key = Key::parse(k.trim())
        .ok_or_else(|| format!("--solve {k:?}: bus or link_gbps (the key solved for)"))?;
    let margin = a.margin.unwrap_or(0.0);
    if !(0.0..=100.0).contains(&margin) {
        return Err(format!(
            "--margin {margin}: from 0 to 100 (0.2: keep up at 1.2 × trigger_hz)"
        ));
    }
    if let Some((swept, _)) = sweeps.iter().find(|(s, _)| s == key.name()) {
        return Err(format!(
            "--solve {k}: not with --sweep {swept}=... (the search sets {swept} itself)"
        ));
    }
    if !sweeps.is_empty() {
        return Err(
            "--solve: not with --sweep (one system per solve: fix the other keys with --set)"
                .into(),
        );
    }
    if a.report.is_some() {
        return Err("--report: not with --solve (a report is of a table of points)".into());
    }
    Ok(Some((key, margin)))
}

/// `--solve`: the least value of the key that keeps up at the margin, the value below it,
/// and what one BU more or fewer changes.
fn run_solve(
    a: &SimArgs,
    s: &evb_sim::offered::System,
    key: evb_sim::solve::Key,
    margin: f64,
    replications: u32,
) -> Result<(), String> {
    use evb_sim::solve::{solve, Role, Solved};
    let t0 = std::time::Instant::now();
    let eval = |systems: &[evb_sim::offered::System]| plan_all(systems, replications, margin);
    let got = solve(s, key, margin, &eval).map_err(|e| format!("--solve {}: {e}", key.name()))?;
    print_system(s, &[]);
    println!("{}", solve_line(&got));
    print_header();
    for r in &got.rows {
        let label = match (key, r.role) {
            (evb_sim::solve::Key::LinkGbps, Role::Below | Role::Answer) => {
                format!("link_gbps={}", key.text(r.planned.system.link_gbps))
            }
            _ => format!("bus={}", r.planned.system.bus),
        };
        print_row(&label, &r.planned);
    }
    for c in &got.changes {
        println!("{}", change_line(&got, c));
    }
    println!(
        "{LEGEND}; {}; every row at {:.0} Hz; {} systems simulated, {:.1} s",
        replication_note(replications, s.seed),
        got.solved_at_hz,
        got.evaluated,
        t0.elapsed().as_secs_f64()
    );
    if let Some(path) = &a.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            solve: &'a Solved,
        }
        crate::json_out::write(path, &Out { solve: &got })?;
    }
    Ok(())
}

/// The answer in one line: `solve bus: 12 BUs keep up at 1.2 × 750000 Hz (load 83.1 %);
/// 11 do not (load 102.4 %)`.
fn solve_line(got: &evb_sim::solve::Solved) -> String {
    use evb_sim::solve::{Key, Role};
    let what = |v: f64| match got.key {
        Key::Bus if v == 1.0 => "1 BU".to_string(),
        Key::Bus => format!("{v:.0} BUs"),
        Key::LinkGbps => format!("{} Gb/s links", got.key.text(v)),
    };
    let Some(answer) = got.row(Role::Answer) else {
        return String::new();
    };
    let rate = if got.margin > 0.0 {
        format!(
            "{} × {:.0} Hz = {:.0} Hz",
            1.0 + got.margin,
            got.trigger_hz,
            got.solved_at_hz
        )
    } else {
        format!("{:.0} Hz", got.trigger_hz)
    };
    let mut line = format!(
        "solve {}: {} keep up at {rate} (load {:.2} %)",
        got.key.name(),
        what(got.value),
        answer.offered_link_load * 100.0
    );
    if let (Some(v), Some(p)) = (got.below, got.row(Role::Below)) {
        let v = match got.key {
            Key::Bus => format!("{v:.0}"),
            Key::LinkGbps => format!("{} Gb/s", got.key.text(v)),
        };
        line.push_str(&format!("; {v} {}", verdict(p)));
    }
    line
}

/// Whether a row keeps up, and if not, why: the links' load, throttled triggers or a
/// latency that grows.
fn verdict(p: &evb_sim::offered::Planned) -> String {
    if p.keeps_up {
        format!("keep up too (load {:.2} %)", p.offered_link_load * 100.0)
    } else if let Some(c) = p.confidence.as_ref().filter(|c| c.kept_up > 0) {
        // some runs kept up: the seed decides, and that is the reason
        format!("do not ({} of {} runs keep up)", c.kept_up, c.replications)
    } else if p.offered_link_load >= 1.0 {
        format!("do not (load {:.2} %)", p.offered_link_load * 100.0)
    } else if p.throttled >= 1e-3 {
        format!("do not (throttled {:.3} %)", p.throttled * 100.0)
    } else {
        "do not (the latency grows)".to_string()
    }
}

/// What one BU more or fewer than the answer changes: `+1 BU (13): p50 −3.0 %, ...`.
fn change_line(got: &evb_sim::solve::Solved, c: &evb_sim::solve::Change) -> String {
    let answer_bus = got
        .row(evb_sim::solve::Role::Answer)
        .map_or(0, |p| p.system.bus);
    let pct = |x: f64| {
        // to a tenth of a percent, signed; a change that rounds to nothing is +0.0
        let v = (x * 1000.0).round() / 10.0;
        if v < 0.0 {
            format!("−{:.1} %", -v)
        } else {
            format!("+{:.1} %", v.abs())
        }
    };
    format!(
        "{} BU ({} BUs): latency p50 {}, p99 {}; RU mem p99 {}; BU mem p99 {}",
        if c.bus > answer_bus { "+1" } else { "−1" },
        c.bus,
        pct(c.latency_p50),
        pct(c.latency_p99),
        pct(c.ru_mem_p99),
        pct(c.bu_mem_p99)
    )
}

/// Bytes in the unit that reads best (kB, MB, GB: powers of 10).
pub(crate) fn bytes(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}
