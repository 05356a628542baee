//! The testbed's two-level fabric: hosts under leaf switches, every leaf joined to every
//! spine by a shaped uplink (a folded Clos, as `evb sim --model clos` models it). A leaf is a
//! namespace with a bridge for its hosts and a router towards the spines; a spine is a
//! router. Routing picks the spine as a switch fabric would: by destination (`static`, the
//! source-routing tables seed 003 describes) or by a hash of each connection (`hash`: Linux
//! ECMP over the uplinks, what an Ethernet fabric does). Routing per message, or adaptive,
//! would reorder a TCP stream and has no place here.

use clap::ValueEnum;

/// How a leaf picks the spine for a packet to a host on another leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Routing {
    /// Spine = the destination's key (its BU index, else its host number) mod spines.
    Static,
    /// ECMP over all spines, hashed on addresses and ports: one spine per connection.
    Hash,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::Static => "static",
            Routing::Hash => "hash",
        }
    }
}

/// Where the hosts' links go: one switch (`leaves` = 1) or leaves and spines.
#[derive(Clone, Debug)]
pub struct Fabric {
    pub leaves: usize,
    pub spines: usize,
    /// Every uplink's rate, both ways, as tc writes it.
    pub uplink: String,
    pub routing: Routing,
    /// Each host's leaf.
    pub leaf: Vec<usize>,
    /// Each host's routing key (see [`Routing::Static`]).
    pub key: Vec<usize>,
}

impl Fabric {
    /// One switch for every host.
    pub fn single(hosts: usize) -> Fabric {
        Fabric {
            leaves: 1,
            spines: 0,
            uplink: String::new(),
            routing: Routing::Static,
            leaf: vec![0; hosts],
            key: (0..hosts).collect(),
        }
    }

    pub fn two_level(&self) -> bool {
        self.leaves > 1
    }

    /// Host `h`'s address. One switch: 10.250.0.(h+1), as before leaves existed; leaf l's
    /// hosts: 10.250.(l+1).(h+1), their gateway 10.250.(l+1).254.
    pub fn addr(&self, h: usize) -> String {
        if self.two_level() {
            format!("10.250.{}.{}", self.leaf[h] + 1, h + 1)
        } else {
            format!("10.250.0.{}", h + 1)
        }
    }

    /// The network every host's address is in.
    pub fn network(&self) -> &'static str {
        if self.two_level() {
            "10.250.0.0/16"
        } else {
            "10.250.0.0/24"
        }
    }

    /// The uplink between leaf `l` and spine `s`: its index, the leaf side's and the spine
    /// side's address (10.251.index.1 and .2).
    fn uplink_index(&self, l: usize, s: usize) -> usize {
        l * self.spines + s
    }

    /// A line that says what was built.
    pub fn describe(&self, hosts: usize) -> String {
        if self.two_level() {
            format!(
                "{hosts} hosts under {} leaf switches, each joined to {} spine{} by uplinks \
                 shaped to {} ({} routing)",
                self.leaves,
                self.spines,
                if self.spines == 1 { "" } else { "s" },
                self.uplink,
                self.routing.name()
            )
        } else {
            format!("{hosts} hosts on one switch")
        }
    }
}

/// The names of leaf `l`'s and spine `s`'s devices on the uplink between them.
fn uplink_devs(name: &str, l: usize, s: usize) -> (String, String) {
    (format!("{name}u{l}x{s}"), format!("{name}d{l}x{s}"))
}

/// The tbf of a shaped port: `rate`, a burst of at least one tick's worth of it (and a few
/// full frames), and `queue` bytes of buffer.
pub fn shape(ns: &str, dev: &str, rate: &str, queue: &str) -> Result<(), String> {
    let burst = format!(
        "{}b",
        ((super::rate_bps(rate) / 8.0 / 250.0) as u64).max(16 * 1514)
    );
    super::sh(&[
        "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
        "burst", &burst, "limit", queue,
    ])
}

/// The bytes a shaped port may queue, as tc writes them: a switch's output port (leaves'
/// and spines' too), and a host's own port (its NIC's ring and qdisc).
#[derive(Clone, Copy)]
pub struct Queues<'a> {
    pub switch: &'a str,
    pub host: &'a str,
}

/// A host's link into a switch: a veth from namespace `host` (device `dev`, address `addr`
/// with its prefix) to bridge `br0` of namespace `switch` (port `port`), both ends shaped to
/// `rate`, the host's with `q.host` of queue and the switch's output port towards it with
/// `q.switch`. `hd` is the host end's name until it is renamed `dev` inside the host.
#[allow(clippy::too_many_arguments)]
pub fn host_link(
    host: &str,
    hd: &str,
    dev: &str,
    addr: &str,
    switch: &str,
    port: &str,
    rate: &str,
    q: Queues,
) -> Result<(), String> {
    let sh = super::sh;
    sh(&[
        "ip", "link", "add", hd, "type", "veth", "peer", "name", port,
    ])?;
    sh(&["ip", "link", "set", hd, "netns", host])?;
    sh(&["ip", "link", "set", port, "netns", switch])?;
    sh(&["ip", "-n", host, "link", "set", hd, "name", dev])?;
    sh(&["ip", "-n", host, "addr", "add", addr, "dev", dev])?;
    sh(&["ip", "-n", host, "link", "set", dev, "up"])?;
    sh(&["ip", "-n", switch, "link", "set", port, "master", "br0"])?;
    sh(&["ip", "-n", switch, "link", "set", port, "up"])?;
    shape(host, dev, rate, q.host)?;
    shape(switch, port, rate, q.switch)
}

/// What command `cmd` prints run inside namespace `ns` (empty where it cannot run).
pub fn stdout_in(ns: &str, cmd: &[&str]) -> String {
    std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Bytes device `dev` of namespace `ns` has sent (0 where unreadable).
pub fn tx_bytes(ns: &str, dev: &str) -> u64 {
    let path = format!("/sys/class/net/{dev}/statistics/tx_bytes");
    stdout_in(ns, &["cat", &path]).trim().parse().unwrap_or(0)
}

/// Packets the shaped qdisc of device `dev` in namespace `ns` sent and dropped (its
/// `tc -s` counters; 0 where unreadable).
pub fn qdisc_packets(ns: &str, dev: &str) -> (u64, u64) {
    sent_and_dropped(&stdout_in(ns, &["tc", "-s", "qdisc", "show", "dev", dev]))
}

/// The first qdisc's "Sent B bytes P pkt (dropped D, ..." of `tc -s qdisc show`: (P, D).
fn sent_and_dropped(tc: &str) -> (u64, u64) {
    let Some(at) = tc.find("Sent ") else {
        return (0, 0);
    };
    let words: Vec<&str> = tc[at..].split_whitespace().collect();
    let num = |w: Option<&&str>| {
        w.map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()))
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    };
    // Sent <bytes> bytes <packets> pkt (dropped <drops>, ...
    (num(words.get(3)), num(words.get(6)))
}

/// A router namespace: forwards, and drops nothing for arriving on another path than it
/// would leave by (static routing is asymmetric).
fn router(ns: &str) -> Result<(), String> {
    super::sh(&["ip", "netns", "add", ns])?;
    for key in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
        // ECMP hashes on ports too, so that connections between the same two hosts spread
        "net.ipv4.fib_multipath_hash_policy=1",
    ] {
        super::sh(&["ip", "netns", "exec", ns, "sysctl", "-q", "-w", key])?;
    }
    super::sh(&["ip", "-n", ns, "link", "set", "lo", "up"])
}

/// Builds the leaves, the spines and the uplinks, and each host's link into its leaf
/// (host h's link shaped to `rates[h]`).
pub fn build(name: &str, f: &Fabric, rates: &[String], q: Queues) -> Result<(), String> {
    let sh = super::sh;
    for l in 0..f.leaves {
        let ns = format!("{name}-l{l}");
        router(&ns)?;
        sh(&["ip", "-n", &ns, "link", "add", "br0", "type", "bridge"])?;
        let gw = format!("10.250.{}.254/24", l + 1);
        sh(&["ip", "-n", &ns, "addr", "add", &gw, "dev", "br0"])?;
        sh(&["ip", "-n", &ns, "link", "set", "br0", "up"])?;
    }
    for s in 0..f.spines {
        router(&format!("{name}-s{s}"))?;
    }
    for (h, rate) in rates.iter().enumerate() {
        let (host, leaf) = (format!("{name}-h{h}"), format!("{name}-l{}", f.leaf[h]));
        sh(&["ip", "netns", "add", &host])?;
        sh(&["ip", "-n", &host, "link", "set", "lo", "up"])?;
        let (hd, port, addr) = (format!("{name}h{h}"), format!("{name}p{h}"), f.addr(h));
        host_link(
            &host,
            &hd,
            "eth0",
            &format!("{addr}/24"),
            &leaf,
            &port,
            rate,
            q,
        )?;
        let gw = format!("10.250.{}.254", f.leaf[h] + 1);
        sh(&["ip", "-n", &host, "route", "add", "default", "via", &gw])?;
    }
    for l in 0..f.leaves {
        for s in 0..f.spines {
            let (leaf, spine) = (format!("{name}-l{l}"), format!("{name}-s{s}"));
            let (ld, sd) = uplink_devs(name, l, s);
            let i = f.uplink_index(l, s);
            sh(&[
                "ip", "link", "add", &ld, "type", "veth", "peer", "name", &sd,
            ])?;
            sh(&["ip", "link", "set", &ld, "netns", &leaf])?;
            sh(&["ip", "link", "set", &sd, "netns", &spine])?;
            let (la, sa) = (format!("10.251.{i}.1/24"), format!("10.251.{i}.2/24"));
            sh(&["ip", "-n", &leaf, "addr", "add", &la, "dev", &ld])?;
            sh(&["ip", "-n", &spine, "addr", "add", &sa, "dev", &sd])?;
            sh(&["ip", "-n", &leaf, "link", "set", &ld, "up"])?;
            sh(&["ip", "-n", &spine, "link", "set", &sd, "up"])?;
            shape(&leaf, &ld, &f.uplink, q.switch)?;
            shape(&spine, &sd, &f.uplink, q.switch)?;
            // the spine reaches leaf l's hosts over this link
            let net = format!("10.250.{}.0/24", l + 1);
            let via = format!("10.251.{i}.1");
            sh(&["ip", "-n", &spine, "route", "add", &net, "via", &via])?;
        }
    }
    // every leaf's way to the other leaves' hosts
    for l in 0..f.leaves {
        let leaf = format!("{name}-l{l}");
        let via = |s: usize| format!("10.251.{}.2", f.uplink_index(l, s));
        for m in (0..f.leaves).filter(|&m| m != l) {
            match f.routing {
                Routing::Static => {
                    for h in (0..rates.len()).filter(|&h| f.leaf[h] == m) {
                        let dst = format!("{}/32", f.addr(h));
                        let v = via(f.key[h] % f.spines);
                        sh(&["ip", "-n", &leaf, "route", "add", &dst, "via", &v])?;
                    }
                }
                Routing::Hash => {
                    let net = format!("10.250.{}.0/24", m + 1);
                    let mut cmd = vec!["ip", "-n", &leaf, "route", "add", &net];
                    let hops: Vec<String> = (0..f.spines).map(via).collect();
                    for v in &hops {
                        cmd.extend(["nexthop", "via", v.as_str()]);
                    }
                    sh(&cmd)?;
                }
            }
        }
    }
    Ok(())
}

/// Bytes each uplink carried, up (leaf to spine) and down, read before the fabric goes.
pub fn uplink_bytes(name: &str, f: &Fabric) -> Vec<(usize, usize, u64, u64)> {
    let mut out = Vec::new();
    for l in 0..f.leaves {
        for s in 0..f.spines {
            let (ld, sd) = uplink_devs(name, l, s);
            out.push((
                l,
                s,
                tx_bytes(&format!("{name}-l{l}"), &ld),
                tx_bytes(&format!("{name}-s{s}"), &sd),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qdisc_s_sent_and_dropped_packets_are_read_from_tc() {
        let tc = "qdisc tbf 8001: root refcnt 2 rate 100Mbit burst 50000b lat 5.2ms \n \
                  Sent 55357412 bytes 36698 pkt (dropped 9006, overlimits 51 requeues 0) \n \
                  backlog 0b 0p requeues 0\n";
        assert_eq!(sent_and_dropped(tc), (36698, 9006));
        assert_eq!(sent_and_dropped(""), (0, 0));
    }

    #[test]
    fn hosts_of_a_two_level_fabric_get_their_leafs_network() {
        let f = Fabric {
            leaves: 2,
            spines: 2,
            uplink: "100mbit".into(),
            routing: Routing::Static,
            leaf: vec![0, 0, 1],
            key: vec![0, 1, 2],
        };
        assert_eq!(f.addr(0), "10.250.1.1");
        assert_eq!(f.addr(2), "10.250.2.3");
        assert_eq!(f.network(), "10.250.0.0/16");
        let one = Fabric::single(3);
        assert_eq!(one.addr(2), "10.250.0.3");
        assert_eq!(one.network(), "10.250.0.0/24");
        assert_eq!(f.uplink_index(1, 1), 3);
    }
}
