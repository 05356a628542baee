//! Nodes started without addresses (`srun -n 5 evb node --config run.toml`): where a node
//! listens, how it finds the EVM, and what it tells the EVM about itself.
//!
//! A node whose configured address has port 0 listens on this host's address
//! (`transport.interface`, or the one it uses to reach the EVM) on a free port and
//! registers the bound address with the EVM (message Register, docs/protocol.md §1.1); the
//! EVM hands the BUs' addresses to the RUs (message Peers). The EVM's own address comes
//! from the configuration or `--evm`, or from a rendezvous file the EVM writes on a
//! filesystem every host sees.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use evb_config::{Config, Interface, Role};
use evb_wire::discovery::{Registration, NO_RANK};

/// Where launchers put the rank, and the number of tasks when they say it.
pub const LAUNCHERS: [(&str, Option<&str>); 4] = [
    ("SLURM_PROCID", Some("SLURM_NTASKS")),
    ("OMPI_COMM_WORLD_RANK", Some("OMPI_COMM_WORLD_SIZE")),
    ("PMIX_RANK", None),
    ("PMI_RANK", Some("PMI_SIZE")),
];

/// The rank a launcher gave this process: the first of [`LAUNCHERS`] set, as
/// `(variable, its number-of-tasks variable, value)`.
pub fn launcher_rank(
    env: &impl Fn(&str) -> Option<String>,
) -> Option<(&'static str, Option<&'static str>, String)> {
    LAUNCHERS
        .iter()
        .find_map(|&(var, size)| env(var).map(|v| (var, size, v)))
}

/// This host's name (the kernel's), for messages naming where a node runs.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// What this process tells the EVM about itself.
pub fn registration(data: &str, control: &str) -> Registration {
    let env = |k: &str| std::env::var(k).ok();
    let rank = launcher_rank(&env)
        .and_then(|(_, _, v)| v.trim().parse().ok())
        .unwrap_or(NO_RANK);
    Registration {
        rank,
        pid: std::process::id(),
        host: host_name(),
        data: data.to_string(),
        control: control.to_string(),
    }
}

/// Why a node could not find its own address or the EVM's.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("no node {0:?} in the configuration")]
    UnknownNode(String),
    /// `transport.interface` names nothing on this host, or cannot be read.
    #[error("{0}")]
    Interface(String),
    /// No route from this host toward the EVM (or no socket to ask with).
    #[error("{0}")]
    NoRoute(String),
    /// The rendezvous file could not be written, never came, or holds no address.
    #[error("{0}")]
    Rendezvous(String),
    /// The addresses found are not safe or not reachable as configured.
    #[error("{0}")]
    Refused(String),
}

/// The address a node of this host listens on: `transport.interface` when set, else the
/// address the host uses to reach `toward` (the EVM), else `fallback`.
pub fn local_ip(
    interface: &str,
    toward: Option<SocketAddr>,
    fallback: IpAddr,
) -> Result<IpAddr, DiscoveryError> {
    if interface.is_empty() {
        return match toward {
            // connecting a UDP socket sends nothing: it only asks the kernel for a route
            Some(to) if !to.ip().is_unspecified() => {
                let any: SocketAddr = if to.is_ipv4() {
                    "0.0.0.0:0".parse().expect("an address")
                } else {
                    "[::]:0".parse().expect("an address")
                };
                let s = UdpSocket::bind(any)
                    .map_err(|e| DiscoveryError::NoRoute(format!("cannot open a socket: {e}")))?;
                s.connect(to).map_err(|e| {
                    DiscoveryError::NoRoute(format!(
                        "host {} has no route to the EVM at {to}: {e} (set transport.interface)",
                        host_name()
                    ))
                })?;
                s.local_addr().map(|a| a.ip()).map_err(|e| {
                    DiscoveryError::NoRoute(format!("no local address toward {to}: {e}"))
                })
            }
            _ => Ok(fallback),
        };
    }
    let spec = Interface::parse(interface)
        .map_err(|e| DiscoveryError::Interface(format!("transport.interface: {e}")))?;
    let addrs = if_addrs::get_if_addrs().map_err(|e| {
        DiscoveryError::Interface(format!(
            "cannot list the interfaces of host {}: {e}",
            host_name()
        ))
    })?;
    let found = match &spec {
        Interface::Name(name) => addrs
            .iter()
            .filter(|a| &a.name == name)
            .map(|a| a.ip())
            // IPv4 first: it is what most clusters route
            .min_by_key(|ip| ip.is_ipv6()),
        Interface::Addr(_) | Interface::Net(..) => {
            addrs.iter().map(|a| a.ip()).find(|ip| spec.holds(*ip))
        }
    };
    found.ok_or_else(|| {
        let mut names: Vec<String> = addrs
            .iter()
            .map(|a| format!("{} {}", a.name, a.ip()))
            .collect();
        names.dedup();
        DiscoveryError::Interface(format!(
            "transport.interface = {interface:?}: host {} has no such {} (it has {})",
            host_name(),
            match spec {
                Interface::Name(_) => "interface",
                _ => "address",
            },
            names.join(", ")
        ))
    })
}

/// The rendezvous file a launcher's job uses by default: beside the configuration file
/// (which every task reads, so every host sees its folder), named after the run and the
/// job, so that runs and jobs never read each other's.
pub fn default_rendezvous(
    config_file: &Path,
    run_id: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Option<PathBuf> {
    let job = if let Some(j) = env("SLURM_JOB_ID") {
        format!("slurm-{j}.{}", env("SLURM_STEP_ID").unwrap_or_default())
    } else if let Some(ns) = env("PMIX_NAMESPACE") {
        format!("pmix-{ns}")
    } else {
        format!("ompi-{}", env("OMPI_MCA_ess_base_jobid")?)
    };
    let safe = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let dir = config_file.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    Some(dir.join(format!(".evb-{}-{}.evm", safe(run_id), safe(&job))))
}

/// The EVM says where it listens: `addr host pid`, written whole (a reader never sees half).
pub fn publish_evm(path: &Path, addr: &str) -> Result<(), DiscoveryError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let text = format!("{addr} {} {}\n", host_name(), std::process::id());
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| {
            DiscoveryError::Rendezvous(format!(
                "cannot write the rendezvous file {}: {e}",
                path.display()
            ))
        })
}

/// A rendezvous file's `address host pid`: the address (with a port) and the host.
fn parse_rendezvous(text: &str) -> Option<(SocketAddr, String)> {
    let mut f = text.split_whitespace();
    let a: SocketAddr = f.next()?.parse().ok()?;
    (a.port() != 0).then(|| (a, f.next().unwrap_or("").to_string()))
}

/// The EVM address in the rendezvous file now, if it holds one.
pub fn peek_evm(path: &Path) -> Option<SocketAddr> {
    parse_rendezvous(&std::fs::read_to_string(path).ok()?).map(|(a, _)| a)
}

/// Where the EVM listens and its host, from the rendezvous file, waiting for it until
/// `deadline`.
pub fn read_evm(path: &Path, deadline: Instant) -> Result<(SocketAddr, String), DiscoveryError> {
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                return parse_rendezvous(&text).ok_or_else(|| {
                    DiscoveryError::Rendezvous(format!(
                        "the rendezvous file {} does not hold an EVM address ({:?})",
                        path.display(),
                        text.trim()
                    ))
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(DiscoveryError::Rendezvous(format!(
                    "the EVM did not write the rendezvous file {} within run.connect_timeout_s: \
                     {e} (is rank 0, the EVM, running?)",
                    path.display()
                )))
            }
        }
    }
}

/// Makes `cfg` ready for node `id` to start without addresses: the EVM's address (from the
/// rendezvous file, unless configured) and this node's own listen address (this host's, on
/// a free port). Nodes with configured addresses are left as they are.
pub fn prepare(cfg: &mut Config, id: &str) -> Result<(), DiscoveryError> {
    let nodes = cfg.nodes();
    let me = nodes
        .iter()
        .find(|n| n.id == id)
        .ok_or_else(|| DiscoveryError::UnknownNode(id.to_string()))?;
    let evm = &nodes[0];
    let evm_discovered = cfg.is_discovered(&evm.addr);
    if !cfg.is_discovered(&me.addr) && !evm_discovered {
        return Ok(());
    }
    let configured = |a: &str| a.parse::<SocketAddr>().ok();
    // a named interface is checked before anything waits on the EVM: a host without it
    // fails at once
    let mut own_ip = None;
    if cfg.is_discovered(&me.addr) && !cfg.transport.interface.is_empty() {
        own_ip = Some(local_ip(
            &cfg.transport.interface,
            None,
            IpAddr::from([127, 0, 0, 1]),
        )?);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(cfg.run.connect_timeout_s);
    let toward = if me.role == Role::Evm {
        None
    } else if evm_discovered {
        if cfg.run.rendezvous.is_empty() {
            return Err(DiscoveryError::Rendezvous(
                "the EVM's address is not known: set evm.addr (with a port), give \
                 --evm HOST:PORT, or run.rendezvous / --rendezvous FILE (a file every host sees)"
                    .to_string(),
            ));
        }
        let (addr, host) = read_evm(Path::new(&cfg.run.rendezvous), deadline)?;
        if addr.ip().is_loopback() && !host.is_empty() && host != host_name() {
            return Err(DiscoveryError::Refused(format!(
                "the EVM listens on {addr}, a loopback address of host {host}, but this \
                 is host {}: set transport.interface so that nodes listen where other hosts \
                 reach them",
                host_name()
            )));
        }
        // learnt, not configured: the driver reads the file again if the address is stale
        cfg.learnt.insert(evm.id.clone(), addr.to_string());
        Some(addr)
    } else {
        configured(&evm.addr)
    };
    if cfg.is_discovered(&me.addr) {
        let fallback = configured(&me.addr)
            .map(|a| a.ip())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let ip = match own_ip {
            Some(ip) => ip,
            None => local_ip("", toward, fallback)?,
        };
        if !ip.is_loopback() && cfg.secret().is_none() {
            return Err(DiscoveryError::Refused(format!(
                "would listen on {ip}, beyond loopback: set run.secret (or EVB_SECRET) \
                 so strangers cannot join the run"
            )));
        }
        cfg.learnt
            .insert(id.to_string(), SocketAddr::new(ip, 0).to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_by_name_address_and_network() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let none = IpAddr::from([0, 0, 0, 0]);
        assert_eq!(local_ip("lo", None, none).unwrap(), lo);
        assert_eq!(local_ip("127.0.0.1", None, none).unwrap(), lo);
        assert_eq!(local_ip("127.0.0.0/8", None, none).unwrap(), lo);
        let to = "127.0.0.1:9".parse().ok();
        assert_eq!(local_ip("", to, none).unwrap(), lo);
        assert_eq!(local_ip("", None, lo).unwrap(), lo);
        let e = local_ip("nosuch0", None, none).unwrap_err().to_string();
        assert!(
            e.contains("nosuch0") && e.contains("no such interface") && e.contains("lo 127.0.0.1"),
            "{e}"
        );
        let e = local_ip("198.51.100.0/24", None, none).unwrap_err();
        assert!(matches!(e, DiscoveryError::Interface(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("no such address"), "{e}");
    }

    #[test]
    fn rendezvous_files_by_job() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
        };
        let cfg = Path::new("/shared/runs/x.toml");
        let p = default_rendezvous(
            cfg,
            "my run",
            &env(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "0")]),
        );
        assert_eq!(
            p.unwrap(),
            Path::new("/shared/runs/.evb-my_run-slurm-77.0.evm")
        );
        let p = default_rendezvous(
            Path::new("x.toml"),
            "r",
            &env(&[("PMIX_NAMESPACE", "prterun-h-1@1")]),
        );
        assert_eq!(p.unwrap(), Path::new("./.evb-r-pmix-prterun-h-1_1.evm"));
        assert!(default_rendezvous(cfg, "r", &env(&[])).is_none());
    }

    #[test]
    fn the_evm_address_goes_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.evm");
        let soon = Instant::now() + Duration::from_millis(100);
        let e = read_evm(&f, soon).unwrap_err();
        assert!(matches!(e, DiscoveryError::Rendezvous(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("did not write the rendezvous file"), "{e}");
        publish_evm(&f, "127.0.0.1:4321").unwrap();
        let (a, host) = read_evm(&f, soon).unwrap();
        assert_eq!(a, "127.0.0.1:4321".parse().unwrap());
        assert_eq!(host, host_name());
        std::fs::write(&f, "nonsense\n").unwrap();
        assert!(read_evm(&f, soon)
            .unwrap_err()
            .to_string()
            .contains("does not hold"));
    }
}
