//! `evb`: run a local event builder, run one node of a deployment, check a configuration.

mod consume;
mod ctl;
// durations on the command line, one convention for every tool
use evb_config::duration;
mod feed;
mod inspect;
mod inspect_run;
mod json_out;
mod launch;
mod man;
mod node_out;
mod pubsub;
mod rank;
mod sim;
mod sim_report;
mod slurm;
mod state_dir;
mod summary;
mod testbed;
mod up;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use evb_config::Config;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "evb",
    version,
    about = "evb: a distributed event builder for data acquisition"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Launch every node of a run on this host (one process each, or threads for inproc),
    /// show progress, then print a summary and the verdict. Exits non-zero unless every
    /// triggered event was built exactly once, complete and intact.
    Run(RunArgs),
    /// Start every node of the configuration on this host and keep them up for runs
    /// controlled with `evb ctl` or the run page (whose URL it prints), until halted.
    Up {
        /// TOML configuration (default: the built-in 1 EVM, 2 RU, 2 BU system).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Start a standby EVM too: it follows every run, takes a run over if the EVM is
        /// lost, and then becomes the run control (docs/standby.md; sets evm.standby to a
        /// free port of the EVM's host).
        #[arg(long)]
        standby: bool,
    },
    /// Control a running system: status, configure, start, pause, resume, stop, halt, reset.
    Ctl(ctl::CtlArgs),
    /// Run one node of the configuration (multi-host deployments; the launchers use it too).
    Node(NodeArgs),
    /// Print (or write with --script) an sbatch script that runs the configuration on a
    /// Slurm cluster: one task per node, rank k the k-th node, a log per node.
    Slurm(slurm::SlurmArgs),
    /// Show what data files hold (evb event files, evb framed files, CMS FED files) and
    /// check every checksum in them. Exits 1 if any file has a problem.
    Inspect {
        /// Data files, or folders (every event file in them).
        #[arg(required_unless_present = "run")]
        files: Vec<PathBuf>,
        /// Judge a run's output folder from its run manifest (docs/formats.md §7): every
        /// listed file present and intact (data and metadata), every triggered event in
        /// exactly one, and no data file there that the manifest does not list. Exits 1 if
        /// not, or if the run's verdict was FAILED.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["files", "event"])]
        run: Option<PathBuf>,
        /// With --run: remove the temporary files that BUs which died left behind.
        #[arg(long, requires = "run")]
        clean: bool,
        /// With --run: also prove the folder against the run records (docs/formats.md
        /// §7.3): the configuration copy as the manifest names it, a run record that names
        /// this manifest and configuration by digest, and the chain of the run id's records
        /// unbroken. The records are found from the configuration copy (`run.records_dir`),
        /// or given with --records.
        #[arg(long, requires = "run")]
        verify: bool,
        /// With --verify: the run records file (`<run id>.jsonl`) to check against.
        #[arg(long, value_name = "FILE", requires = "verify")]
        records: Option<PathBuf>,
        /// Also dump this event, with its fragments. In evb event files N is the event id
        /// (the EVM's number, the `ids` a file's summary shows), not the trigger number; in
        /// fragment files (FED, evb framed) it is the fragment's or record's index, from 0.
        #[arg(long, value_name = "N")]
        event: Option<u64>,
    },
    /// Stream fragment files over TCP to RUs with `source.kind = "stream"`: a front-end
    /// emulator (`--rate`, `--loop`). Prints what each stream sent.
    Feed(feed::FeedArgs),
    /// Take built events from BUs that serve them (`sink.kind = "serve"`): check each one
    /// (CRC32C, structure), optionally write event files, acknowledge, and print a summary.
    /// Exits 1 on a bad event or a BU lost without saying the run is over.
    Consume(consume::ConsumeArgs),
    /// Publish tagged messages to subscribers (`evb sub`): rates, and what the slow-subscriber
    /// policy did (blocked, dropped, disconnected). Prints `listening on ADDR` first.
    Pub(pubsub::PubArgs),
    /// Subscribe to tags at one or more publishers (`evb pub`): rates, gaps and drops.
    /// Exits 1 if a message was lost without a gap saying so.
    Sub(pubsub::SubArgs),
    /// Benchmarks: evb against iperf3, memcpy and ZeroMQ, measured in the same run.
    Bench(evb_bench::BenchArgs),
    /// A small cluster inside this machine: one network namespace per node, shaped links
    /// into a bridge as the switch; runs the configuration there and removes it all (root).
    Testbed(testbed::TestbedArgs),
    /// Simulate the network of an event builder: a switch under saturated traffic
    /// (head-of-line blocking against the barrel shifter), event building over it or a
    /// leaf-and-spine fabric (lossless or TCP), or a system in physical units at its offered
    /// rate (tables, SVG plots, JSON, reports).
    // boxed: its many options would make every command as large as it
    Sim(Box<sim::SimArgs>),
    /// Check a configuration file, or print the default one.
    Config {
        #[command(subcommand)]
        what: ConfigCmd,
    },
    /// Print a shell completion script for evb, generated from its options
    /// (e.g. `evb completions bash > ~/.local/share/bash-completion/completions/evb`).
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print evb's manual page (roff, for `man -l -`), or write one page per command into DIR.
    Man {
        /// Write evb.1 and a page for every subcommand (evb-ctl-start.1...) into this folder.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Args)]
struct RunArgs {
    /// TOML configuration (default: the built-in 1 EVM, 2 RU, 2 BU run of 10 s).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override run.events.
    #[arg(long)]
    events: Option<u64>,
    /// Override run.duration_s. [seconds, or with a unit: 500ms, 2m]
    #[arg(long, value_parser = crate::duration::secs)]
    duration: Option<f64>,
    /// Override topology.rus.
    #[arg(long)]
    rus: Option<u32>,
    /// Override topology.bus.
    #[arg(long)]
    bus: Option<u32>,
    /// Write the run summary (every node's report and the verdict) as JSON to FILE; `-` (or
    /// `--json` alone): to stdout, the table and verdict then on stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    json: Option<PathBuf>,
    /// No progress line.
    #[arg(long, short)]
    quiet: bool,
    /// Start a standby EVM too, which takes the run over if the EVM is lost
    /// (docs/standby.md; sets evm.standby to a free port of the EVM's host).
    #[arg(long)]
    standby: bool,
}

#[derive(Args)]
struct NodeArgs {
    /// TOML configuration of the whole deployment (every node is started with the same one).
    #[arg(long, short)]
    config: PathBuf,
    /// The node's id in the configuration (e.g. evm, ru0, bu1). Without it, the rank that
    /// srun or mpirun gives the process picks the node: the EVM, then the RUs, then the BUs.
    #[arg(long)]
    id: Option<String>,
    /// Started by `evb run` / `evb up`: status lines as JSON on stdout, and exit when stdin closes.
    #[arg(long)]
    supervised: bool,
    /// Which launcher started this node (`evb-run-<pid>-<run id>`): read by nobody, shown
    /// by `ps`, so that an operator (and the fault tests) can tell whose node it is.
    #[arg(long, hide = true, value_name = "TAG")]
    launched_by: Option<String>,
    /// The number of the one run, claimed by `evb run` in the run records: the EVM then
    /// keeps the run's record there (without it: run 1, recorded in memory only).
    #[arg(long = "run-number", hide = true, value_name = "N")]
    run_number: Option<u64>,
    /// Stay up after a run and run the runs the EVM's controller starts (`evb ctl start`),
    /// until halted; without it the node runs one run and exits.
    #[arg(long)]
    serve: bool,
    /// Where the EVM listens (HOST:PORT), for nodes started without addresses: overrides
    /// evm.addr. The EVM itself listens there.
    #[arg(long, value_name = "HOST:PORT")]
    evm: Option<String>,
    /// A file every host sees, where the EVM writes the address it listens on for nodes
    /// started without addresses (overrides run.rendezvous). Under srun or mpirun the
    /// default is a file beside the configuration, named after the run and the job.
    #[arg(long, value_name = "FILE")]
    rendezvous: Option<PathBuf>,
    /// A listening socket the launcher bound for this node (ADDR=FD, inherited): used
    /// instead of binding ADDR, so the port is never free between launcher and node.
    #[arg(long = "listen-fd", value_name = "ADDR=FD", hide = true)]
    listen_fd: Vec<String>,
    /// Run as the standby of the EVM given by --id: listen at evm.standby, follow the EVM,
    /// and take the run over if it is lost (docs/standby.md).
    #[arg(long)]
    standby: bool,
    /// Write the node's report (JSON) to FILE at the end of each run; stdout holds one
    /// summary line per run (`evb node ID: verdict=OK role=... key=value ...`). In FILE,
    /// `{id}` becomes the node's id and `{rank}` the launcher's rank (the id without one),
    /// so every rank of `mpirun`/`srun` writes its own: `--json reports/{id}.json`; an
    /// existing folder gets ID.json. `-` (or `--json` alone): the JSON on stdout, the
    /// summary line on stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    json: Option<String>,
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Parse and validate a configuration file.
    Check {
        /// The TOML configuration file to check.
        file: PathBuf,
    },
    /// Print the built-in default configuration.
    Default,
    /// Print a new strong secret for `run.secret` or EVB_SECRET (32 random bytes, hex).
    Secret,
}

fn init_logging() {
    let filter = EnvFilter::try_from_env("EVB_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

fn load(path: &Option<PathBuf>) -> Result<Config, String> {
    match path {
        Some(p) => Config::from_file(p).map_err(|e| e.to_string()),
        None => Ok(Config::default()),
    }
}

/// `--standby`: a standby EVM on a free port of the EVM's host, unless the configuration
/// places one already.
fn ask_for_standby(cfg: &mut evb_config::Config) {
    if !cfg.evm.standby.is_empty() {
        return;
    }
    let host = cfg
        .nodes()
        .first()
        .and_then(|e| e.addr.rsplit_once(':').map(|(h, _)| h.to_string()))
        .unwrap_or_else(|| "127.0.0.1".into());
    cfg.evm.standby = format!("{host}:0");
    cfg.evm.standby_control = format!("{host}:0");
}

/// The pools against the host's memory: a warning is printed, a refusal is exit code 2.
/// The configuration, or exit code 2 after saying what is wrong with it.
fn load_or_exit(path: &Option<PathBuf>) -> Result<Config, ExitCode> {
    load(path).map_err(|e| {
        eprintln!("evb: {e}");
        ExitCode::from(2)
    })
}

/// Every node on this host (`evb run`, `evb up`): default credits lowered to what the host's
/// memory holds, said on stderr (see `Config::fit_credits_to`).
fn fit_to_host(cfg: &mut evb_config::Config) {
    if let Some(said) = cfg.live_credits_notice() {
        eprintln!("evb: {said}");
    }
    if let Some(host) = evb_config::HostMemory::read() {
        if let Some(said) = cfg.fit_credits_to(host) {
            eprintln!("evb: {said}");
        }
    }
}

/// The files and folders a configuration names that its nodes cannot use: each RU's replay
/// files (present and readable), the file sink's folder (a folder, or creatable under one),
/// and `run.records_dir` likewise; each problem names its key.
fn files_check(c: &Config, nodes: &[evb_config::NodeSpec]) -> Vec<String> {
    use std::path::Path;
    let mut problems = Vec::new();
    for n in nodes.iter().filter(|n| n.role == evb_config::Role::Ru) {
        for (j, f) in n.files.iter().enumerate() {
            if let Err(e) = std::fs::File::open(f) {
                problems.push(format!("ru[{}].files[{j}] ({}): {f:?}: {e}", n.index, n.id));
            }
        }
    }
    // a folder that is there must be one; one that is not is made under the nearest one
    // that is, which must be writable
    let folder = |key: &str, dir: &str, problems: &mut Vec<String>| {
        if dir.is_empty() {
            return;
        }
        let mut p = Path::new(dir);
        while !p.exists() {
            match p.parent() {
                Some(up) if !up.as_os_str().is_empty() => p = up,
                _ => return,
            }
        }
        if !p.is_dir() {
            problems.push(format!("{key}: {dir:?}: {} is not a folder", p.display()));
        } else if !writable(p) {
            problems.push(format!(
                "{key}: {dir:?}: {} is not writable here",
                p.display()
            ));
        }
    };
    if matches!(
        c.sink.kind,
        evb_config::SinkKind::File | evb_config::SinkKind::Hdf5
    ) && !c.sink.dir.contains('{')
    {
        folder("sink.dir", &c.sink.dir, &mut problems);
    }
    folder("run.records_dir", &c.run.records_dir, &mut problems);
    problems
}

/// Whether this process may create files in folder `p`.
fn writable(p: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads a NUL-terminated path that lives across the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

fn memory_check(who: &str, r: Result<Option<String>, evb_config::ConfigError>) -> Option<ExitCode> {
    match r {
        Ok(None) => None,
        Ok(Some(warning)) => {
            eprintln!("{who}: warning: {warning}");
            None
        }
        Err(e) => {
            eprintln!("{who}: {e}");
            Some(ExitCode::from(2))
        }
    }
}

/// Descriptor `fd`, handed to this process by its launcher (`--listen-fd`), owned from now on.
fn inherited_fd(fd: std::os::fd::RawFd) -> Result<std::os::fd::OwnedFd, String> {
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails on one that is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err("no such open file descriptor".into());
    }
    // SAFETY: the launcher handed this descriptor to this process for exactly this use (it is
    // open, checked above), and nothing else in the process knows its number: this is its
    // only owner.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Ctl(_)
            | Command::Config { .. }
            | Command::Inspect { .. }
            | Command::Completions { .. }
            | Command::Man { .. }
    ) {
        // commands that only print: a closed pipe (`evb ctl status | head`) ends them quietly,
        // as it does any Unix tool, instead of a panic in println!
        // SAFETY: signal(2) with a valid signal and SIG_DFL, before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Run(a) => {
            if let Err(e) = json_out::claim_stdout(a.json.as_deref()) {
                eprintln!("evb: {e}");
                return ExitCode::from(2);
            }
            let mut cfg = match load_or_exit(&a.config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Some(n) = a.events {
                cfg.run.events = n;
                if a.duration.is_none() {
                    cfg.run.duration_s = 0.0;
                }
            }
            if let Some(d) = a.duration {
                cfg.run.duration_s = d;
            }
            if a.standby {
                ask_for_standby(&mut cfg);
            }
            if let Some(n) = a.rus {
                cfg.topology.rus = n;
                cfg.ru.clear();
            }
            if let Some(n) = a.bus {
                cfg.topology.bus = n;
                cfg.bu.clear();
            }
            if let Err(e) = cfg.validate_once() {
                eprintln!("evb: {e}");
                return ExitCode::from(2);
            }
            fit_to_host(&mut cfg);
            // every node's pools on this host, before anything starts
            if let Some(refused) = memory_check("evb", cfg.check_host_memory()) {
                return refused;
            }
            match launch::run(&cfg, a.quiet, a.json.as_deref()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("evb: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Up { config, standby } => {
            let mut cfg = match load_or_exit(&config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if standby {
                ask_for_standby(&mut cfg);
            }
            fit_to_host(&mut cfg);
            if let Some(refused) = memory_check("evb", cfg.check_host_memory()) {
                return refused;
            }
            match up::up(&cfg, config.as_deref()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("evb up: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Ctl(a) => match ctl::run(&a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("evb ctl: {e}");
                ExitCode::from(2)
            }
        },
        Command::Node(mut a) => {
            for spec in &a.listen_fd {
                let adopted = match spec.rsplit_once('=') {
                    Some((addr, fd)) => match fd.parse() {
                        Ok(fd) => inherited_fd(fd)
                            .map_err(|e| format!("--listen-fd {spec}: {e}"))
                            .and_then(|fd| evb_transport::inherited::adopt(addr, fd)),
                        Err(_) => Err(format!("--listen-fd {spec}: FD is not a number")),
                    },
                    None => Err(format!("--listen-fd {spec}: expected ADDR=FD")),
                };
                if let Err(e) = adopted {
                    eprintln!("evb node: {e}");
                    return ExitCode::from(2);
                }
            }
            let mut cfg = match Config::from_file(&a.config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("evb: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = rank::place(&mut cfg, &a.config, a.evm.take(), a.rendezvous.take()) {
                eprintln!("evb node: {e}");
                return ExitCode::from(2);
            }
            let id = match a.id.take() {
                Some(id) => id,
                None => match rank::node_id(&cfg, |k| std::env::var(k).ok()) {
                    Ok(id) => id,
                    Err(e) => {
                        eprintln!("evb node: {e}");
                        return ExitCode::from(2);
                    }
                },
            };

            if let Err(e) = evb_node::discovery::prepare(&mut cfg, &id) {
                // under a launcher, name the rank and host too: the log is one of many
                let at = match evb_node::discovery::launcher_rank(&|k| std::env::var(k).ok()) {
                    Some((var, _, r)) => {
                        format!(" ({var} {r}, host {})", evb_node::discovery::host_name())
                    }
                    None => String::new(),
                };
                eprintln!("evb node {id}{at}: {e}");
                return ExitCode::from(2);
            }
            if a.standby {
                if let Err(e) = evb_node::make_standby(&mut cfg, &id) {
                    eprintln!("evb node {id}: {e}");
                    return ExitCode::from(2);
                }
            }
            if a.serve && cfg.nodes().iter().any(|n| cfg.is_discovered(&n.addr)) {
                eprintln!(
                    "evb node {id}: --serve needs every node's address in the configuration \
                     (the EVM's controller calls them between runs)"
                );
                return ExitCode::from(2);
            }
            // this node's pools on this host (evb run checked the whole set already)
            if let (Some(me), Some(host)) = (
                cfg.nodes().into_iter().find(|n| n.id == id),
                evb_config::HostMemory::read(),
            ) {
                let who = format!("evb node {id}");
                if let Some(refused) = memory_check(&who, cfg.check_memory(&[me], host)) {
                    return refused;
                }
            }
            // the node's commands: a launcher's `stop`, Ctrl-C, its control API
            let control = evb_node::RunControl::new();
            if a.supervised {
                launch::exit_when_stdin_closes(control.clone());
            } else if a.serve {
                launch::exit_on_interrupt();
            } else {
                launch::stop_on_interrupt(&cfg, &id, control.clone());
            }
            let rank = evb_node::discovery::launcher_rank(&|k| std::env::var(k).ok())
                .map(|(_, _, r)| r.trim().to_string());
            let json_out = match node_out::JsonOut::new(a.json.as_deref(), &id, rank.as_deref()) {
                Ok(j) => j,
                Err(e) => {
                    eprintln!("evb node {id}: {e}");
                    return ExitCode::from(2);
                }
            };
            let lines: evb_control::Lines = if a.supervised {
                std::sync::Arc::new(|v| {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    if let Ok(line) = serde_json::to_string(&v) {
                        let _ = writeln!(out, "{line}");
                    }
                    let _ = out.flush();
                })
            } else {
                std::sync::Arc::new(move |v| {
                    if v.is_report() {
                        json_out.report(&v, rank.as_deref());
                    }
                })
            };
            let mode = if a.serve {
                evb_control::Mode::Serve
            } else {
                evb_control::Mode::Once
            };
            let every = Duration::from_millis(250);
            match evb_control::run_process(&cfg, &id, mode, lines, every, control, a.run_number) {
                Ok(end) => match end.outcome {
                    Some(Err(e)) if mode == evb_control::Mode::Once => {
                        eprintln!("evb node {id}: {e}");
                        ExitCode::FAILURE
                    }
                    _ if end.ok => ExitCode::SUCCESS,
                    _ => ExitCode::FAILURE,
                },
                Err(e) => {
                    eprintln!("evb node {id}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Slurm(a) => match slurm::run(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("evb slurm: {e}");
                ExitCode::from(2)
            }
        },
        Command::Inspect {
            files,
            event,
            run,
            clean,
            verify,
            records,
        } => {
            let good = match run {
                Some(dir) => {
                    let whole = inspect_run::run(&dir, clean);
                    let proven = !verify || inspect_run::verify(&dir, records.as_deref());
                    whole && proven
                }
                None => inspect::run(&files, event),
            };
            if good {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Consume(a) => match consume::run(&a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("evb consume: {e}");
                ExitCode::from(2)
            }
        },
        Command::Pub(a) => match pubsub::run_pub(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("evb pub: {e}");
                ExitCode::from(1)
            }
        },
        Command::Sub(a) => match pubsub::run_sub(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("evb sub: {e}");
                ExitCode::from(1)
            }
        },
        Command::Feed(a) => match feed::run(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("evb feed: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Testbed(a) => {
            if let Err(e) = json_out::claim_stdout(a.json.as_deref()) {
                eprintln!("evb testbed: {e}");
                return ExitCode::from(2);
            }
            let cfg = match load_or_exit(&a.config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match testbed::run(&a, cfg) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("evb testbed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Sim(a) => {
            match json_out::claim_stdout(a.json.as_deref()).and_then(|()| sim::run(&a)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("evb sim: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Bench(a) => match evb_bench::run(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("evb bench: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Config {
            what: ConfigCmd::Check { file },
        } => match Config::from_file(&file) {
            Ok(c) => {
                if let Some(refused) = memory_check("evb", c.check_host_memory()) {
                    return refused;
                }
                let nodes = c.nodes();
                // what the nodes will open: a configuration that parses but names a file that
                // is not there is not valid (each problem names its key)
                let missing = files_check(&c, &nodes);
                if !missing.is_empty() {
                    for m in &missing {
                        eprintln!("evb: {}: {m}", file.display());
                    }
                    return ExitCode::from(2);
                }
                let count = |r| nodes.iter().filter(|n| n.role == r).count();
                println!(
                    "{}: valid ({} RUs, {} BUs, transport {})",
                    file.display(),
                    count(evb_config::Role::Ru),
                    count(evb_config::Role::Bu),
                    c.transport.kind.name()
                );
                if !c.ends_by_itself() {
                    println!(
                        "  a run goes on until it is stopped (run.events and run.duration_s \
                         are 0): for `evb up` (`evb ctl stop`); `evb run` refuses it"
                    );
                }
                if c.builder.by == evb_config::BuildBy::Window && !c.windows.decisions.is_empty() {
                    // the file gives every window: said of its own windows, not the extents
                    let path = std::path::Path::new(&c.windows.decisions);
                    match evb_node::setup::read_decisions(path) {
                        Ok(list) => {
                            let longest = list
                                .iter()
                                .map(|d| d.end.saturating_sub(d.begin))
                                .max()
                                .unwrap_or(0);
                            println!(
                                "  built by windows: the decisions of {} ({} listed, run.events \
                                 {} of them), the longest {longest} ticks; frames of {} ticks, \
                                 fragments of up to {} bytes",
                                c.windows.decisions,
                                list.len(),
                                c.run.events,
                                c.frames.ticks,
                                c.window_fragment_of(longest)
                            );
                        }
                        Err(e) => {
                            eprintln!("evb: {}: {e}", file.display());
                            return ExitCode::from(2);
                        }
                    }
                } else if c.builder.by == evb_config::BuildBy::Window {
                    let w = &c.windows;
                    println!(
                        "  built by windows: decisions at {} Hz of [tick - {}, tick + {}) of \
                         {} Hz ticks, frames of {} ticks, buffers of {} ms, fragments of up to \
                         {} bytes",
                        c.run.rate_hz,
                        w.before_ticks,
                        w.after_ticks,
                        w.tick_hz,
                        c.frames.ticks,
                        w.buffer_ms,
                        c.max_fragment()
                    );
                } else if c.by_time() {
                    let b = &c.builder;
                    println!(
                        "  built by time: slices of {} ticks carrying {} more, frames of {} \
                         ticks, fragments of up to {} bytes",
                        b.slice_ticks,
                        b.overlap_ticks,
                        c.frames.ticks,
                        c.max_fragment()
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("evb: {e}");
                ExitCode::from(2)
            }
        },
        Command::Config {
            what: ConfigCmd::Default,
        } => {
            print!("{}", evb_config::DEFAULT_TOML);
            ExitCode::SUCCESS
        }
        Command::Config {
            what: ConfigCmd::Secret,
        } => match evb_transport::random_hex(32) {
            Some(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("evb: no randomness from the system for a secret");
                ExitCode::FAILURE
            }
        },
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "evb", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man { dir } => {
            let written = match &dir {
                Some(dir) => std::fs::create_dir_all(dir)
                    .and_then(|()| man::generate_to(Cli::command(), dir)),
                None => man::render(&Cli::command(), &mut std::io::stdout()),
            };
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("evb man: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of `cmd` and its subcommands (`path` names it) that has no help text.
    fn without_help(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            // clap's own --help / --version
            if matches!(id, "help" | "version") {
                continue;
            }
            let has = |s: Option<&clap::builder::StyledStr>| {
                s.is_some_and(|s| !s.to_string().trim().is_empty())
            };
            if !has(arg.get_help()) && !has(arg.get_long_help()) {
                let name = match arg.get_long() {
                    Some(long) => format!("--{long}"),
                    None => id.to_uppercase(),
                };
                missing.push(format!("{path} {name}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                missing.push(format!("{path} {} (the subcommand)", sub.get_name()));
            }
            without_help(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }

    #[test]
    fn completions_and_man_page_come_from_the_definitions() {
        let mut bash = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "evb",
            &mut bash,
        );
        let bash = String::from_utf8(bash).unwrap();
        assert!(
            bash.contains("--wait") && bash.contains("inspect"),
            "{bash}"
        );
        let mut man = Vec::new();
        clap_mangen::Man::new(Cli::command())
            .render(&mut man)
            .unwrap();
        let man = String::from_utf8(man).unwrap();
        assert!(man.contains(".TH evb 1"), "{man}");
        let dir = tempfile::tempdir().unwrap();
        clap_mangen::generate_to(Cli::command(), dir.path()).unwrap();
        for page in ["evb.1", "evb-ctl.1", "evb-ctl-stop.1", "evb-inspect.1"] {
            assert!(dir.path().join(page).is_file(), "no {page}");
        }
    }

    #[test]
    fn time_options_take_units_and_bare_numbers() {
        use clap::Parser;
        let run = |d: &str| match Cli::try_parse_from(["evb", "run", "--duration", d]) {
            Ok(Cli {
                command: super::Command::Run(a),
            }) => Ok(a.duration),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(run("90"), Ok(Some(90.0)));
        assert_eq!(run("2m"), Ok(Some(120.0)));
        assert_eq!(run("500ms"), Ok(Some(0.5)));
        assert!(run("5 parsecs").unwrap_err().contains("not a duration"));
        for args in [
            &["evb", "ctl", "stop", "--wait", "--timeout", "500ms"][..],
            &["evb", "ctl", "wait", "--timeout", "1m"],
            &[
                "evb",
                "sub",
                "--from",
                "h:1",
                "--slow-us",
                "1ms",
                "--timeout",
                "5s",
            ],
            &["evb", "pub", "--flush-us", "0.5ms", "--linger", "2s"],
            &[
                "evb",
                "consume",
                "--from",
                "h:1",
                "--slow-ms",
                "1s",
                "--wait-s",
                "10",
            ],
            &[
                "evb",
                "feed",
                "--to",
                "h:1",
                "f",
                "--connect-timeout-s",
                "2m",
            ],
        ] {
            assert!(Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
    }

    #[test]
    fn json_is_a_file_or_stdout_everywhere_and_old_spellings_still_parse() {
        use clap::Parser;
        use std::path::PathBuf;
        let parse = |args: &[&str]| Cli::try_parse_from(args).map_err(|e| e.to_string());
        let json_of = |args: &[&str]| match parse(args).unwrap().command {
            super::Command::Run(a) => a.json,
            super::Command::Ctl(a) => a.json().map(PathBuf::from),
            super::Command::Node(a) => a.json.map(PathBuf::from),
            _ => unreachable!(),
        };
        let dash = Some(PathBuf::from("-"));
        let file = Some(PathBuf::from("s.json"));
        // ctl's old flag form: --json alone is stdout, last or before another option
        assert_eq!(json_of(&["evb", "ctl", "status", "--json"]), dash);
        assert_eq!(json_of(&["evb", "ctl", "stop", "--json", "--wait"]), dash);
        assert_eq!(json_of(&["evb", "ctl", "status", "--json", "-"]), dash);
        assert_eq!(json_of(&["evb", "ctl", "status", "--json", "s.json"]), file);
        assert_eq!(json_of(&["evb", "ctl", "status"]), None);
        assert_eq!(json_of(&["evb", "run", "--json", "s.json"]), file);
        assert_eq!(json_of(&["evb", "run", "--json", "--quiet"]), dash);
        assert_eq!(
            json_of(&["evb", "node", "-c", "x.toml", "--json", "-"]),
            dash
        );
        // names that say what they are, the old spellings kept (hidden)
        let waits = |args: &[&str]| match parse(args).unwrap().command {
            super::Command::Pub(a) => a.waits(),
            _ => unreachable!(),
        };
        assert_eq!(
            waits(&[
                "evb",
                "pub",
                "--subscribers",
                "3",
                "--subscribers-timeout",
                "2s"
            ]),
            (3, 2.0)
        );
        assert_eq!(
            waits(&["evb", "pub", "--wait", "3", "--wait-timeout", "2"]),
            (3, 2.0)
        );
        let retry = |args: &[&str]| match parse(args).unwrap().command {
            super::Command::Consume(a) => a.retry_for(),
            _ => unreachable!(),
        };
        assert_eq!(
            retry(&["evb", "consume", "--from", "h:1", "--retry-for", "1m"]),
            60.0
        );
        assert_eq!(
            retry(&["evb", "consume", "--from", "h:1", "--wait-s", "60"]),
            60.0
        );
        for (cmd, shown) in [
            ("pub", "--subscribers <N>"),
            ("consume", "--retry-for <DURATION>"),
        ] {
            let h = parse(&["evb", cmd, "--help"]).err().unwrap_or_default();
            assert!(h.contains(shown), "{h}");
            assert!(!h.contains("--wait"), "an old spelling shown:\n{h}");
        }
        let h = parse(&["evb", "ctl", "status", "--help"])
            .err()
            .unwrap_or_default();
        assert!(h.contains("--json [<FILE>]"), "{h}");
    }

    #[test]
    fn every_argument_has_help() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        without_help(&cmd, "evb", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help text:\n  {}",
            missing.join("\n  ")
        );
    }
}
