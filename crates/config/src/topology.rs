//! The topology: the nodes of a run (listed one by one or made from counts), where each
//! listens for data, control and consumers, and which of them run on this host.

use std::net::SocketAddr;

use crate::{Config, SinkKind, TransportKind};

/// The host part of a `host:port` address (a `[v6]` host keeps its brackets).
pub fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// One node of the run, after validation.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub id: String,
    pub role: Role,
    /// Index among the nodes of its role.
    pub index: u16,
    pub addr: String,
    /// host:port of the node's control API (port 0: any free one).
    pub control: String,
    pub source_id: u16,
    pub credits: u32,
    pub sink: SinkKind,
    /// Recorded files this RU replays.
    pub files: Vec<String>,
    /// Addresses this RU listens on for front-end streams, and the source id of each of its
    /// inputs: its streams, or its plug-in producers (`producer_sources`).
    pub streams: Vec<String>,
    pub stream_sources: Vec<u16>,
    /// Testing: sink delay per event (µs) and for how many events (0: all).
    pub sink_delay: Option<(u64, u64)>,
    /// A spare BU (`topology.spare_bus`, `[[bu]] spare`): the run starts without it; it
    /// joins the run under way when its process starts.
    pub spare: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Evm,
    Ru,
    Bu,
}

impl Config {
    /// The barrel shifter's slot length, µs: `traffic.slot_us`, or the time
    /// [`Config::slot_bytes`] take on a link of `traffic.link_mbps` (bits / (Mb/s) = µs),
    /// or 1000.
    pub fn slot_us(&self) -> u64 {
        let t = &self.traffic;
        match (t.slot_us, t.link_mbps) {
            (0, 0) => 1000,
            (0, mbps) => (self.slot_bytes().saturating_mul(8)).div_ceil(mbps).max(10),
            (us, _) => us,
        }
    }

    /// Most bytes an RU sends in one barrel-shifter slot: `traffic.slot_bytes`, or when that
    /// is 0 the largest fragment with its 40-byte prefix, so that a slot carries one of them
    /// and no slot's budget is left unusable (a default of a fixed 128 KiB held one 64 KiB
    /// fragment, 80 bytes short of two, and refused fragments over it).
    pub fn slot_bytes(&self) -> u64 {
        match self.traffic.slot_bytes {
            0 => self
                .max_fragment()
                .saturating_add(crate::FRAGMENT_PREFIX_BYTES),
            b => b,
        }
    }

    /// Events after which BU `bu`'s file sink closes and commits a file:
    /// `sink.commit_events`, or the BU's credits when that is 0.
    pub fn commit_events(&self, bu: &NodeSpec) -> u64 {
        match self.sink.commit_events {
            0 => (bu.credits as u64).max(1),
            n => n,
        }
    }

    /// Where BU `index` serves consumers (`sink.kind = "serve"`): its `[[bu]] serve`, or
    /// `sink.serve_host` and `sink.serve_base_port + index` (port 0: any free one).
    pub fn serve_addr(&self, index: u16) -> String {
        if let Some(b) = self.bu.get(index as usize).filter(|b| !b.serve.is_empty()) {
            return b.serve.clone();
        }
        let s = &self.sink;
        let port = if s.serve_base_port == 0 {
            0
        } else {
            s.serve_base_port as u32 + index as u32
        };
        if s.serve_host.contains(':') && !s.serve_host.starts_with('[') {
            format!("[{}]:{port}", s.serve_host)
        } else {
            format!("{}:{port}", s.serve_host)
        }
    }

    /// RUs in the run: `[[ru]]` entries, or `topology.rus` when there are none.
    pub(crate) fn n_ru(&self) -> u64 {
        if self.ru.is_empty() {
            self.topology.rus.into()
        } else {
            self.ru.len() as u64
        }
    }

    /// BUs in the run, spares included: `[[bu]]` entries, or `topology.bus` and
    /// `topology.spare_bus` when there are none.
    pub(crate) fn n_bu(&self) -> u64 {
        if self.bu.is_empty() {
            self.topology.bus as u64 + self.topology.spare_bus as u64
        } else {
            self.bu.len() as u64
        }
    }

    /// The control address node `n` gets from the control section.
    pub(crate) fn made_control(&self, n: &NodeSpec) -> String {
        let k = match n.role {
            Role::Evm => 0,
            Role::Ru => 1 + n.index as u64,
            Role::Bu => 1 + self.n_ru() + n.index as u64,
        };
        let c = &self.control;
        let port = if c.base_port == 0 {
            0
        } else {
            c.base_port as u64 + k
        };
        format!("{}:{port}", c.host)
    }

    pub(crate) fn key_of(&self, n: &NodeSpec) -> String {
        match n.role {
            Role::Evm => "evm".into(),
            Role::Ru if self.ru.is_empty() => format!("topology.rus (ru{})", n.index),
            Role::Bu if self.bu.is_empty() => format!("topology.bus (bu{})", n.index),
            Role::Ru => format!("ru[{}]", n.index),
            Role::Bu => format!("bu[{}]", n.index),
        }
    }

    /// Where the standby EVM's control API listens: `evm.standby_control`, or a free port on
    /// the standby's host (empty without a standby).
    pub fn standby_control(&self) -> String {
        if self.evm.standby.is_empty() || !self.evm.standby_control.is_empty() {
            return self.evm.standby_control.clone();
        }
        let host = self
            .evm
            .standby
            .rsplit_once(':')
            .map_or("127.0.0.1", |(h, _)| h);
        format!("{host}:0")
    }

    /// The configuration once the standby EVM has taken the run control over (`evb up
    /// --standby`): the roles swap. The standby's addresses are the EVM's, the old EVM's
    /// are where the next standby listens (`evb up` starts one there once the old process
    /// is gone), and `evm.control_epoch` is one more. `None` without a standby.
    pub fn with_standby_promoted(&self) -> Option<Config> {
        if self.evm.standby.is_empty() {
            return None;
        }
        // the EVM replaced: the one this configuration names, or, in a standby's own copy,
        // the one it follows
        let evm = self.nodes().into_iter().next()?;
        let (old, old_control) = if self.evm.follow.is_empty() {
            (evm.addr, evm.control)
        } else {
            (self.evm.follow.clone(), self.evm.follow_control.clone())
        };
        let mut out = self.clone();
        out.evm.addr = self.evm.standby.clone();
        out.evm.control = self.standby_control();
        out.evm.standby = old;
        out.evm.standby_control = old_control;
        out.evm.follow.clear();
        out.evm.follow_control.clear();
        out.evm.control_epoch = self.evm.control_epoch.wrapping_add(1);
        Some(out)
    }

    /// A node's own configuration brought up to a run's `run` started by a control that a
    /// standby took over (once or more): as many promotions of this one as `run`'s control
    /// epoch is above its own, if `run` is exactly that (its EVM, the nodes, transport and
    /// secret). `None` when `run`'s epoch is not above this one's, or it names another
    /// system: a node keeps its own configuration then, and a run from an old EVM (a lower
    /// epoch) differs from it in `evm.control_epoch` at least.
    pub fn promoted_to(&self, run: &Config) -> Option<Config> {
        if run.evm.control_epoch <= self.evm.control_epoch {
            return None;
        }
        let mut p = self.clone();
        while p.evm.control_epoch < run.evm.control_epoch {
            p = p.with_standby_promoted()?;
        }
        (run.evm.addr == p.evm.addr && p.restart_needed(run).is_empty()).then_some(p)
    }

    /// Every node: the EVM first, then the RUs, then the BUs.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        let mut v = self.nodes_unchecked();
        for n in &mut v {
            if let Some(a) = self.learnt.get(&n.id) {
                n.addr = a.clone();
            }
        }
        v
    }

    /// Whether node address `addr` is to be discovered at start rather than dialled as
    /// written: port 0 outside `inproc` (`evb run` and `evb up` choose ports before they
    /// start nodes, so only nodes started one by one see it).
    pub fn is_discovered(&self, addr: &str) -> bool {
        self.transport.kind != TransportKind::Inproc
            && addr.parse::<SocketAddr>().is_ok_and(|a| a.port() == 0)
    }

    pub(crate) fn nodes_unchecked(&self) -> Vec<NodeSpec> {
        let t = &self.topology;
        let c = &self.control;
        // the k-th node (EVM 0, then RUs, then BUs): its address, or one made from a scheme
        let made = |host: &str, base: u16, k: u32| {
            let port = if base == 0 { 0 } else { base as u32 + k };
            format!("{host}:{port}")
        };
        let pick = |given: &str, host: &str, base: u16, k: u32| {
            if given.is_empty() {
                made(host, base, k)
            } else {
                given.to_string()
            }
        };
        let data = |given: &str, k: u32| pick(given, &t.host, t.base_port, k);
        let control = |given: &str, k: u32| pick(given, &c.host, c.base_port, k);
        let mut v = vec![NodeSpec {
            id: self.evm.id.clone(),
            role: Role::Evm,
            index: 0,
            addr: data(&self.evm.addr, 0),
            control: control(&self.evm.control, 0),
            source_id: 0,
            credits: 0,
            sink: SinkKind::Discard,
            files: Vec::new(),
            streams: Vec::new(),
            stream_sources: Vec::new(),
            sink_delay: None,
            spare: false,
        }];
        let n_ru = if self.ru.is_empty() {
            t.rus
        } else {
            self.ru.len() as u32
        };
        for i in 0..n_ru {
            let k = 1 + i;
            let (id, addr, ctl, source_id, files, streams, mut stream_sources) =
                match self.ru.get(i as usize) {
                    Some(r) => (
                        r.id.clone(),
                        data(&r.addr, k),
                        control(&r.control, k),
                        r.source_id.unwrap_or(i as u16),
                        r.files.clone(),
                        r.streams.clone(),
                        if r.producer_sources.is_empty() {
                            r.stream_sources.clone()
                        } else {
                            r.producer_sources.clone()
                        },
                    ),
                    None => (
                        format!("ru{i}"),
                        data("", k),
                        control("", k),
                        i as u16,
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                    ),
                };
            if streams.len() == 1 && stream_sources.is_empty() {
                stream_sources.push(source_id);
            }
            v.push(NodeSpec {
                id,
                role: Role::Ru,
                index: i as u16,
                addr,
                control: ctl,
                source_id,
                credits: 0,
                sink: SinkKind::Discard,
                files,
                streams,
                stream_sources,
                sink_delay: None,
                spare: false,
            });
        }
        let n_bu = if self.bu.is_empty() {
            t.bus + t.spare_bus
        } else {
            self.bu.len() as u32
        };
        for i in 0..n_bu {
            let k = 1 + n_ru + i;
            let (id, addr, ctl, credits, sink) = match self.bu.get(i as usize) {
                Some(b) => (
                    b.id.clone(),
                    data(&b.addr, k),
                    control(&b.control, k),
                    b.credits.unwrap_or_else(|| self.default_credits()),
                    b.sink.unwrap_or(self.sink.kind),
                ),
                None => (
                    format!("bu{i}"),
                    data("", k),
                    control("", k),
                    self.default_credits(),
                    self.sink.kind,
                ),
            };
            let sink_delay = self.bu.get(i as usize).and_then(|b| {
                b.sink_delay_us
                    .map(|d| (d, b.sink_delay_events.unwrap_or(0)))
            });
            v.push(NodeSpec {
                id,
                role: Role::Bu,
                index: i as u16,
                addr,
                control: ctl,
                source_id: 0,
                credits,
                sink,
                files: Vec::new(),
                streams: Vec::new(),
                stream_sources: Vec::new(),
                sink_delay,
                spare: match self.bu.get(i as usize) {
                    Some(b) => b.spare,
                    None => i >= t.bus,
                },
            });
        }
        v
    }

    /// The keys whose change needs the nodes restarted (who the nodes are, where they
    /// listen, how they connect): a running system refuses a new configuration that
    /// changes any of them, naming them. Everything else may change between runs.
    pub fn restart_needed(&self, new: &Config) -> Vec<String> {
        let mut keys = Vec::new();
        let (a, b) = (self.nodes(), new.nodes());
        if a.len() != b.len() {
            keys.push("topology (the number of nodes)".to_string());
        }
        for (x, y) in a.iter().zip(&b) {
            let key = self.key_of(x);
            if x.id != y.id || x.role != y.role {
                keys.push(format!("{key}.id"));
            }
            if x.addr != y.addr {
                keys.push(format!("{key}.addr"));
            }
            if x.control != y.control {
                keys.push(format!("{key}.control"));
            }
            if x.spare != y.spare {
                keys.push(format!("{key}.spare"));
            }
        }
        if self.transport != new.transport {
            keys.push("transport".into());
        }
        if self.control != new.control {
            keys.push("control".into());
        }
        if self.secret() != new.secret() {
            keys.push("run.secret".into());
        }
        if self.affinity != new.affinity {
            keys.push("affinity".into());
        }
        if self.evm.control_epoch != new.evm.control_epoch {
            keys.push("evm.control_epoch".into());
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The nodes that would run on this host: every node for `inproc`; otherwise those whose
    /// address is loopback, unspecified or one of this host's addresses (an address that
    /// does not parse counts as local: the memory check errs on the safe side).
    pub fn local_nodes(&self) -> Vec<NodeSpec> {
        let inproc = self.transport.kind == TransportKind::Inproc;
        self.nodes()
            .into_iter()
            .filter(|n| {
                inproc
                    || match n.addr.parse::<SocketAddr>() {
                        Ok(sa) => {
                            sa.ip().is_loopback()
                                || sa.ip().is_unspecified()
                                || std::net::UdpSocket::bind((sa.ip(), 0)).is_ok()
                        }
                        Err(_) => true,
                    }
            })
            .collect()
    }
}

impl Config {
    /// Every source a decision window may name, in RU order: each RU's streams' (or
    /// producers') source ids when it reads several, else the RU's `source_id` (default
    /// its index).
    pub fn ru_source_ids(&self) -> Vec<u16> {
        self.nodes()
            .iter()
            .filter(|n| n.role == crate::Role::Ru)
            .flat_map(NodeSpec::time_sources)
            .collect()
    }
}

impl NodeSpec {
    /// The sources of an RU's records by time: one per stream or producer
    /// (`stream_sources`), or the RU's own `source_id`.
    pub fn time_sources(&self) -> Vec<u16> {
        if self.stream_sources.len() > 1 {
            self.stream_sources.clone()
        } else {
            vec![self.source_id]
        }
    }
}
