//! The IO driver: one event loop that connects a node's state machine to its peers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use evb_builder::{Action, BuiltEvent, FastMap, NodeRef, Path, RunState, SinkError};
use evb_config::{Config, NodeSpec, Role};
use evb_messaging::{Incoming, Messenger, Received};
use evb_transport::{CloseReason, ConnId, Transport};
use evb_wire::{Channel, Hello, Message};
use serde_json::{json, Value};
use tracing::{debug, error, info, warn};

use crate::control::{RunControl, PUBLISH_EVERY};
use crate::setup::{self, Logic};
use crate::NodeError;

/// Most of one loop pass spent handing events to the sink.
const SINK_SHARE_OF_PASS: Duration = Duration::from_millis(20);

/// Where a node's status lines and final report go (stdout for a process, a channel for a thread).
pub type StatusOut = Box<dyn FnMut(Value) + Send>;

/// How a node's run ended.
#[derive(Debug, Clone)]
pub struct NodeOutcome {
    pub ok: bool,
    pub reason: String,
    /// The node's final report (for the EVM: the whole run's report).
    pub report: Value,
}

/// An outgoing connection still being set up.
struct Dial {
    peer: NodeRef,
    addr: String,
    channel: Channel,
    retry_at: Option<Instant>,
}

pub struct Driver {
    cfg: Config,
    me: NodeSpec,
    nodes: Vec<NodeSpec>,
    logic: Logic,
    messenger: Messenger,
    peers: FastMap<ConnId, NodeRef>,
    conns: FastMap<NodeRef, ConnId>,
    dialing: FastMap<ConnId, Dial>,
    waiting_dials: Vec<Dial>,
    expected: usize,
    up: bool,
    started: Instant,
    connect_deadline: Instant,
    status: StatusOut,
    status_every: Duration,
    next_status: Instant,
    exit: Option<(bool, String)>,
    /// Built events waiting for the sink (it was busy).
    sink_queue: VecDeque<BuiltEvent>,
    sink_retry_at: Option<Instant>,
    sink_blocked: Option<String>,
    sink_stalls: u64,
    /// Until when this pass may hand events to the sink.
    sink_pass_until: Instant,
    /// Where each peer we call can be reached, to call it again after a loss.
    dial_specs: FastMap<NodeRef, (String, Channel)>,
    /// When each control peer was last heard from.
    last_heard: FastMap<NodeRef, Instant>,
    next_heartbeat: Instant,
    next_liveness_check: Instant,
    /// When this node found that it had not run for a while, and for how long.
    suspended: Option<(Instant, Duration)>,
    /// Faulting in the pools' pages; the node is ready once this is done.
    populating: Option<std::thread::JoinHandle<()>>,
    /// Commands from the control plane in, status snapshots out.
    control: RunControl,
    next_publish: Instant,
    /// The node's pools, by what they hold, for its status.
    pools: Vec<(&'static str, evb_buffers::Pool)>,
    /// An RU fed by front-end streams: their listeners, readers and assembler.
    streams: Option<crate::stream_source::StreamSource>,
    /// An RU fed by a plug-in producer in this process.
    api: Option<crate::plug::ApiSource>,
}

fn node_ref(spec: &NodeSpec) -> NodeRef {
    match spec.role {
        Role::Evm => NodeRef::Evm,
        Role::Ru => NodeRef::Ru(spec.index),
        Role::Bu => NodeRef::Bu(spec.index),
    }
}

impl Driver {
    /// Configures the node: pools allocated, listener bound, connections started.
    pub fn new(
        cfg: &Config,
        id: &str,
        make_transport: impl FnOnce(
            evb_transport::TransportConfig,
        ) -> Result<Box<dyn Transport>, NodeError>,
        status: StatusOut,
        status_every: Duration,
        control: RunControl,
        plugs: crate::plug::Plugs,
    ) -> Result<Driver, NodeError> {
        let nodes = cfg.nodes();
        let me = nodes
            .iter()
            .find(|n| n.id == id)
            .cloned()
            .ok_or_else(|| NodeError::UnknownNode(id.to_string()))?;
        let now = Instant::now();
        let (rx_pool, ru_pool) = setup::pools(cfg, &me).map_err(NodeError::Setup)?;
        // Back every pool page before the node says Ready, off the event loop (which keeps
        // connecting and sending heartbeats meanwhile), so that no page fault stalls the run.
        let named: Vec<(&'static str, evb_buffers::Pool)> =
            std::iter::once(("receive", rx_pool.clone()))
                .chain(ru_pool.clone().map(|p| ("fragments", p)))
                .collect();
        let pools: Vec<evb_buffers::Pool> = named.iter().map(|(_, p)| p.clone()).collect();
        let node_id = id.to_string();
        let populating = std::thread::Builder::new()
            .name(format!("{id}-populate"))
            .spawn(move || {
                for p in pools {
                    if let Err(e) = p.populate() {
                        debug!(node = %node_id, "pool pages are faulted in on use: {e}");
                        break;
                    }
                }
            })
            .ok();
        let transport = make_transport(evb_transport::TransportConfig {
            run_id: cfg.run.id.clone(),
            local: setup::hello(cfg, &me, Channel::Control),
            max_frame: setup::max_frame(cfg),
            rx_pool,
            secret: cfg.secret().map(|s| s.into_bytes()),
        })?;
        let mut messenger = Messenger::new(transport, setup::messenger_config(cfg));
        messenger.set_busy_poll(Duration::from_micros(cfg.messaging.busy_poll_us));
        let bound = messenger
            .listen(&setup::address(cfg, &me))
            .map_err(|e| NodeError::Listen(me.addr.clone(), e.to_string()))?;
        info!(node = %me.id, addr = %bound, "listening");

        // Who calls whom: RUs and BUs call the EVM (control); RUs call every BU (data).
        let mut dials = Vec::new();
        let evm = &nodes[0];
        let n_ru = nodes.iter().filter(|n| n.role == Role::Ru).count();
        let n_bu = nodes.iter().filter(|n| n.role == Role::Bu).count();
        let expected = match me.role {
            Role::Evm => n_ru + n_bu,
            Role::Ru => 1 + n_bu,
            Role::Bu => 1 + n_ru,
        };
        if me.role != Role::Evm {
            dials.push(Dial {
                peer: NodeRef::Evm,
                addr: setup::address(cfg, evm),
                channel: Channel::Control,
                retry_at: None,
            });
        }
        if me.role == Role::Ru {
            for b in nodes.iter().filter(|n| n.role == Role::Bu) {
                dials.push(Dial {
                    peer: node_ref(b),
                    addr: setup::address(cfg, b),
                    channel: Channel::Data,
                    retry_at: None,
                });
            }
        }
        let api_ru = me.role == Role::Ru && cfg.source.kind == evb_config::SourceKind::Api;
        let api = match (plugs.feed, api_ru) {
            (Some(feed), true) => {
                if let Some(pool) = &ru_pool {
                    // the producer writes its fragments straight into this pool
                    let _ = feed.pool.send(pool.clone());
                }
                let stall_warn = Duration::from_secs_f64(cfg.source.stall_warn_s);
                Some(crate::plug::ApiSource::new(id, feed.items, stall_warn, now))
            }
            (None, false) => None,
            (Some(_), false) => {
                return Err(NodeError::Setup(format!(
                "{id}: a producer is plugged in, but {id} is not an RU with source.kind = \"api\""
            )))
            }
            (None, true) => {
                return Err(NodeError::Setup(format!(
                    "{id}: source.kind = \"api\": this RU is fed by a producer program through \
                     the plug-in API (evb_plugin::Producer or libevb), not as `evb node`"
                )))
            }
        };
        if plugs.sink.is_some() && me.role != Role::Bu {
            return Err(NodeError::Setup(format!(
                "{id}: a consumer is plugged in, but {id} is not a BU"
            )));
        }
        let logic = setup::logic(cfg, &me, ru_pool, now, plugs.sink).map_err(NodeError::Setup)?;
        let streams = match (&logic, cfg.source.kind) {
            (Logic::Ru(_), evb_config::SourceKind::Stream) => Some(
                crate::stream_source::StreamSource::start(cfg, &me, now)
                    .map_err(NodeError::Setup)?,
            ),
            _ => None,
        };
        let dial_specs = dials
            .iter()
            .map(|d| (d.peer, (d.addr.clone(), d.channel)))
            .collect();
        Ok(Driver {
            cfg: cfg.clone(),
            me,
            nodes,
            logic,
            messenger,
            peers: FastMap::default(),
            conns: FastMap::default(),
            dialing: FastMap::default(),
            waiting_dials: dials,
            expected,
            up: false,
            started: now,
            connect_deadline: now + Duration::from_secs_f64(cfg.run.connect_timeout_s),
            status,
            status_every,
            next_status: now,
            exit: None,
            sink_queue: VecDeque::new(),
            sink_retry_at: None,
            sink_blocked: None,
            sink_stalls: 0,
            sink_pass_until: now,
            dial_specs,
            last_heard: FastMap::default(),
            next_heartbeat: now,
            next_liveness_check: now,
            suspended: None,
            populating,
            control,
            next_publish: now,
            pools: named,
            streams,
            api,
        })
    }

    fn dial(&mut self, now: Instant) -> Result<(), NodeError> {
        let due: Vec<Dial> = {
            let (ready, later): (Vec<Dial>, Vec<Dial>) = self
                .waiting_dials
                .drain(..)
                .partition(|d| d.retry_at.is_none_or(|t| t <= now));
            self.waiting_dials = later;
            ready
        };
        for d in due {
            let hello = setup::hello(&self.cfg, &self.me, d.channel);
            match self.messenger.connect(&d.addr, hello) {
                Ok(conn) => {
                    self.dialing.insert(conn, d);
                }
                Err(e) => return Err(NodeError::Connect(d.addr.clone(), e.to_string())),
            }
        }
        Ok(())
    }

    /// Checks an incoming handshake against the configuration.
    fn identify(&self, peer: &Hello) -> Option<NodeRef> {
        let role = match peer.role {
            evb_wire::Role::Evm => Role::Evm,
            evb_wire::Role::Ru => Role::Ru,
            evb_wire::Role::Bu => Role::Bu,
        };
        let spec = self
            .nodes
            .iter()
            .find(|n| n.role == role && n.index == peer.index)?;
        if spec.id != peer.node_id {
            return None;
        }
        let wanted = match (self.me.role, role) {
            (Role::Evm, Role::Ru | Role::Bu) => peer.channel == Channel::Control,
            (Role::Bu, Role::Ru) => peer.channel == Channel::Data,
            _ => false,
        };
        wanted.then(|| node_ref(spec))
    }

    fn on_incoming(&mut self, now: Instant, inc: Incoming) -> Result<(), NodeError> {
        match inc {
            Incoming::Connected { conn, peer } => {
                if let Some(d) = self.dialing.remove(&conn) {
                    debug!(node = %self.me.id, peer = %peer.node_id, "connected");
                    self.peers.insert(conn, d.peer);
                    self.conns.insert(d.peer, conn);
                    self.last_heard.insert(d.peer, now);
                }
            }
            Incoming::Accepted { conn, peer } => match self.identify(&peer) {
                Some(p) if !self.conns.contains_key(&p) => {
                    debug!(node = %self.me.id, peer = %peer.node_id, "accepted");
                    self.peers.insert(conn, p);
                    self.conns.insert(p, conn);
                    self.last_heard.insert(p, now);
                }
                Some(p) => {
                    warn!(node = %self.me.id, "second connection from {p} ({}) refused", peer.node_id);
                    self.messenger.close(conn);
                }
                None => {
                    warn!(node = %self.me.id, "connection from unexpected node {:?} ({:?} {}) refused", peer.node_id, peer.role, peer.index);
                    self.messenger.close(conn);
                }
            },
            Incoming::Received { conn, msg } => {
                let Some(&from) = self.peers.get(&conn) else {
                    return Ok(());
                };
                self.last_heard.insert(from, now);
                match (msg, &mut self.logic) {
                    (Received::Message(Message::Heartbeat), _) => {}
                    (Received::Message(m), Logic::Evm(e)) => e.handle(now, from, m),
                    (Received::Message(m), Logic::Ru(r)) => r.handle(now, from, m),
                    (Received::Message(m), Logic::Bu(b, _)) => b.handle(now, from, m),
                    (Received::Fragment { header, payload }, Logic::Bu(b, _)) => {
                        b.handle_fragment(now, from, header, payload)
                    }
                    (Received::Fragment { .. }, _) => {
                        warn!(node = %self.me.id, "fragment from {from} at a node that builds nothing; disconnecting");
                        self.messenger.close(conn);
                    }
                }
            }
            Incoming::Closed { conn, reason } => {
                if let Some(mut d) = self.dialing.remove(&conn) {
                    let rejected = matches!(reason, CloseReason::Rejected(_));
                    if self.up && !rejected {
                        // calling a lost peer again: keep trying while the run lasts
                        d.retry_at = Some(now + Duration::from_millis(200));
                        self.waiting_dials.push(d);
                    } else if !rejected && now < self.connect_deadline {
                        d.retry_at = Some(now + Duration::from_millis(50));
                        self.waiting_dials.push(d);
                    } else {
                        return Err(NodeError::Connect(d.addr, reason.to_string()));
                    }
                } else if let Some(p) = self.peers.remove(&conn) {
                    self.lose(now, p, conn, reason.to_string());
                }
            }
        }
        Ok(())
    }

    /// A peer is gone: tell the logic, and call it again if we are the caller (a restarted
    /// BU is found again this way).
    fn lose(&mut self, now: Instant, p: NodeRef, conn: ConnId, mut why: String) {
        if let Some((at, gap)) = self.suspended {
            if now.duration_since(at) < Duration::from_millis(self.cfg.run.heartbeat_timeout_ms) * 2
            {
                why = format!(
                    "{why} (after this node itself did not run for {} ms)",
                    gap.as_millis()
                );
            }
        }
        self.forget(p, conn);
        // Peers leave once the run is over; that is not news.
        let quiet = matches!(
            self.state(),
            RunState::Stopping | RunState::Halted | RunState::Aborted
        );
        if quiet {
            debug!(node = %self.me.id, "{p} left: {why}");
        } else {
            warn!(node = %self.me.id, "lost {p}: {why}");
        }
        match &mut self.logic {
            Logic::Evm(e) => e.peer_lost(now, p, &why),
            Logic::Ru(r) => r.peer_lost(p, &why),
            Logic::Bu(b, _) => b.peer_lost(p, &why),
        }
        if !quiet && p != NodeRef::Evm {
            if let Some((addr, channel)) = self.dial_specs.get(&p).cloned() {
                self.waiting_dials.push(Dial {
                    peer: p,
                    addr,
                    channel,
                    retry_at: Some(now + Duration::from_millis(200)),
                });
            }
        }
    }

    /// Drops what the driver knows of peer `p` and its connection.
    fn forget(&mut self, p: NodeRef, conn: ConnId) {
        self.peers.remove(&conn);
        self.conns.remove(&p);
        self.last_heard.remove(&p);
    }

    /// Heartbeats to the control peers; a control peer silent too long is lost.
    fn heartbeats(&mut self, now: Instant) {
        // Called every loop pass: the work runs a few times per heartbeat period only.
        if now < self.next_liveness_check {
            return;
        }
        let timeout = Duration::from_millis(self.cfg.run.heartbeat_timeout_ms);
        let check_every = Duration::from_millis(self.cfg.run.heartbeat_ms.div_ceil(4));
        // This loop itself did not run for a long while (the process was stopped, or
        // starved of CPU): peers' silence is ours, not theirs. Give them a fresh period
        // to be heard, and say so in what follows.
        let gap = now.duration_since(self.next_liveness_check) + check_every;
        if gap > timeout / 2 && self.up {
            warn!(node = %self.me.id, "this node did not run for {} ms (stopped or starved of CPU): peers get a fresh {} ms to be heard", gap.as_millis(), timeout.as_millis());
            for t in self.last_heard.values_mut() {
                *t = now;
            }
            self.suspended = Some((now, gap));
        }
        self.next_liveness_check = now + check_every;
        let control: Vec<NodeRef> = match self.me.role {
            Role::Evm => self.conns.keys().copied().collect(),
            _ => self
                .conns
                .keys()
                .copied()
                .filter(|p| *p == NodeRef::Evm)
                .collect(),
        };
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + Duration::from_millis(self.cfg.run.heartbeat_ms);
            for p in &control {
                if let Some(&conn) = self.conns.get(p) {
                    let _ = self.messenger.send_batched(conn, &Message::Heartbeat);
                }
            }
        }
        if !matches!(self.state(), RunState::Ready | RunState::Running) || !self.up {
            return;
        }
        for p in control {
            let silent = self
                .last_heard
                .get(&p)
                .is_some_and(|t| now.duration_since(*t) > timeout);
            if silent {
                if let Some(&conn) = self.conns.get(&p) {
                    self.messenger.close(conn);
                    self.lose(
                        now,
                        p,
                        conn,
                        format!("no heartbeat for {} ms", timeout.as_millis()),
                    );
                }
            }
        }
    }

    fn state(&self) -> RunState {
        match &self.logic {
            Logic::Evm(e) => e.state(),
            Logic::Ru(r) => r.state(),
            Logic::Bu(b, _) => b.state(),
        }
    }

    fn next_action(&mut self) -> Option<Action> {
        match &mut self.logic {
            Logic::Evm(e) => e.next_action(),
            Logic::Ru(r) => r.next_action(),
            Logic::Bu(b, _) => b.next_action(),
        }
    }

    fn run_actions(&mut self) {
        while let Some(a) = self.next_action() {
            match a {
                Action::Send { to, msg, path } => {
                    let Some(&conn) = self.conns.get(&to) else {
                        debug!(node = %self.me.id, "no connection to {to}; {:?} dropped", msg.msg_type());
                        continue;
                    };
                    let r = match path {
                        Path::Now => self.messenger.send_now(conn, &msg),
                        Path::Batched => self.messenger.send_batched(conn, &msg),
                    };
                    if let Err(e) = r {
                        debug!(node = %self.me.id, "send to {to} failed: {e}");
                    }
                }
                Action::SendFragment { to, data } => {
                    if let Some(&conn) = self.conns.get(&to) {
                        if let Err(e) = self.messenger.send_fragment(conn, &data) {
                            debug!(node = %self.me.id, "fragment to {to} failed: {e}");
                        }
                    }
                }
                Action::Deliver(ev) => {
                    self.sink_queue.push_back(ev);
                    self.drain_sink(Instant::now());
                }
                Action::Accepted(r) => {
                    if let Logic::Bu(_, sink) = &mut self.logic {
                        if let Err(SinkError::Busy(why) | SinkError::Fatal(why)) =
                            sink.accepted(r.first, r.count)
                        {
                            // the sink keeps the output and tries again on its next call
                            if self.sink_blocked.is_none() {
                                warn!(node = %self.me.id, "sink cannot complete a file yet: {why}");
                            }
                            self.sink_stalls += 1;
                        }
                    }
                }
                Action::Disconnect(p) => {
                    if let Some(&conn) = self.conns.get(&p) {
                        self.messenger.close(conn);
                        self.forget(p, conn);
                    }
                }
                Action::Exit { ok, reason } => {
                    if self.exit.is_none() {
                        self.exit = Some((ok, reason));
                    }
                }
            }
        }
    }

    /// Offers queued events to the sink. A busy sink keeps them (and so the BU's credits)
    /// until a retry succeeds: back-pressure instead of loss.
    fn drain_sink(&mut self, now: Instant) {
        let Logic::Bu(b, sink) = &mut self.logic else {
            return;
        };
        if self.sink_retry_at.is_some_and(|t| now < t) {
            return;
        }
        self.sink_retry_at = None;
        while let Some(ev) = self.sink_queue.front() {
            // A slow sink gets a share of each pass, not all of it: the loop must go on
            // reading its sockets and sending heartbeats, or a slow node is taken for dead.
            if Instant::now() >= self.sink_pass_until {
                break;
            }
            let news = sink.busy_is_news();
            match sink.deliver(ev) {
                Ok(()) => {
                    if let Some(why) = self.sink_blocked.take().filter(|_| news) {
                        info!(node = %self.me.id, "sink accepts events again (was: {why})");
                    }
                    let ev = self.sink_queue.pop_front().expect("front exists");
                    b.delivered(ev.event_id, ev.bytes);
                }
                Err(SinkError::Busy(why)) => {
                    if self.sink_blocked.is_none() && news {
                        warn!(
                            node = %self.me.id,
                            "sink blocked, holding {} events and their credits: {why}",
                            self.sink_queue.len()
                        );
                    }
                    self.sink_stalls += 1;
                    self.sink_blocked = Some(why);
                    self.sink_retry_at = Some(now + sink.retry_after());
                    break;
                }
                Err(SinkError::Fatal(why)) => {
                    error!(node = %self.me.id, "sink failed: {why}");
                    b.fail(format!("sink failed: {why}"));
                    self.sink_queue.clear();
                    break;
                }
            }
        }
    }

    fn status_line(&self, kind: &str, now: Instant) -> Value {
        let stats = match &self.logic {
            Logic::Evm(e) => serde_json::to_value(e.stats()),
            Logic::Ru(r) => serde_json::to_value(r.stats()),
            Logic::Bu(b, _) => serde_json::to_value(b.stats()),
        }
        .unwrap_or(Value::Null);
        let m = self.messenger.stats();
        let t = self.messenger.transport_counters();
        json!({
            "kind": kind,
            "node": self.me.id,
            "role": format!("{:?}", self.me.role).to_lowercase(),
            "state": self.state(),
            "t": now.duration_since(self.started).as_secs_f64(),
            "stats": stats,
            "sink": match &self.logic {
                Logic::Bu(_, sink) => json!({
                    "kind": sink.name(),
                    "report": sink.report(),
                    "blocked": self.sink_blocked,
                    "queued": self.sink_queue.len(),
                    "stalls": self.sink_stalls,
                }),
                _ => Value::Null,
            },
            "net": {
                "bytes_sent": m.payload_bytes_sent,
                "bytes_received": m.payload_bytes_received,
                "frames_sent": m.frames_sent,
                "messages_sent": m.messages_sent,
                "protocol_errors": m.protocol_errors,
                "bytes_copied": t.bytes_copied,
                "bytes_by_reference": t.bytes_by_reference,
            },
            "run_id": self.cfg.run.id,
            "pools": self.pools.iter().map(|(what, p)| {
                let st = p.stats();
                json!({
                    "pool": what,
                    "blocks": st.blocks,
                    "block_size": st.block_size,
                    "in_use": st.blocks - st.free,
                    "high_water": st.high_water,
                    "exhausted": st.exhausted,
                })
            }).collect::<Vec<Value>>(),
            "peers": self.conns.iter().map(|(p, c)| json!({
                "peer": p.to_string(),
                "queued_bytes": self.messenger.queued_bytes(*c),
            })).collect::<Vec<Value>>(),
        })
    }

    /// Runs the node until its state machine says the run is over for it.
    pub fn run(mut self) -> Result<NodeOutcome, NodeError> {
        let mut incoming = Vec::new();
        loop {
            let now = Instant::now();
            self.sink_pass_until = now + SINK_SHARE_OF_PASS;
            self.dial(now)?;
            let populated = self.populating.as_ref().is_none_or(|t| t.is_finished());
            if !self.up && self.conns.len() == self.expected && populated {
                if let Some(t) = self.populating.take() {
                    let _ = t.join();
                }
                self.up = true;
                info!(node = %self.me.id, "all {} connections up", self.expected);
                match &mut self.logic {
                    Logic::Ru(r) => r.connections_up(),
                    Logic::Bu(b, _) => b.connections_up(),
                    Logic::Evm(_) => {}
                }
            }
            if !self.up && self.conns.len() < self.expected && now > self.connect_deadline {
                return Err(NodeError::Connect(
                    "peers".into(),
                    format!(
                        "only {} of {} connections up after {:?}",
                        self.conns.len(),
                        self.expected,
                        self.cfg.run.connect_timeout_s
                    ),
                ));
            }
            if let Some(why) = self.control.take_abort() {
                match &mut self.logic {
                    Logic::Evm(e) => e.abort(why),
                    _ => {
                        if self.exit.is_none() {
                            self.exit = Some((false, why));
                        }
                    }
                }
            }
            if let Logic::Evm(e) = &mut self.logic {
                if crate::stop_requested() || self.control.stop_requested() {
                    e.request_stop(now);
                }
                e.set_paused(now, self.control.paused());
            }
            if let (Some(s), Logic::Ru(r)) = (&mut self.streams, &mut self.logic) {
                s.pump(now, r);
            }
            if let (Some(a), Logic::Ru(r)) = (&mut self.api, &mut self.logic) {
                a.pump(now, r);
            }
            match &mut self.logic {
                Logic::Evm(e) => e.poll(now),
                Logic::Ru(r) => r.poll(now),
                Logic::Bu(b, _) => b.poll(now),
            }
            self.heartbeats(now);
            self.run_actions();
            self.drain_sink(now);
            self.run_actions();
            self.messenger.flush_due(now);
            if now >= self.next_status || now >= self.next_publish {
                let line = self.status_line("status", now);
                if now >= self.next_publish {
                    self.control.publish(line.clone());
                    self.next_publish = now + PUBLISH_EVERY;
                }
                if now >= self.next_status {
                    (self.status)(line);
                    self.next_status = now + self.status_every;
                }
            }
            if self.exit.is_some() {
                break;
            }
            let busy = match &self.logic {
                Logic::Ru(r) => r.has_work(),
                Logic::Evm(e) => e.has_work(),
                Logic::Bu(..) => !self.sink_queue.is_empty() && self.sink_retry_at.is_none(),
            };
            let timeout = if busy {
                Duration::ZERO
            } else {
                // paced triggers and front-end streams arrive between socket events
                let paced =
                    self.cfg.run.rate_hz > 0.0 || self.streams.is_some() || self.api.is_some();
                let cap = Duration::from_millis(if paced { 1 } else { 10 });
                // a busy sink is offered its events again when its retry is due
                let cap = self
                    .sink_retry_at
                    .map_or(cap, |t| t.saturating_duration_since(now).min(cap));
                self.messenger
                    .next_flush_in(now)
                    .map_or(cap, |t| t.min(cap))
            };
            incoming.clear();
            self.messenger
                .poll(&mut incoming, Some(timeout))
                .map_err(|e| NodeError::Io(e.to_string()))?;
            let now = Instant::now();
            for inc in incoming.drain(..) {
                self.on_incoming(now, inc)?;
            }
            self.run_actions();
        }
        self.finish()
    }

    /// Sends what is queued (the last reports and Halts), says Bye, and reports.
    fn finish(mut self) -> Result<NodeOutcome, NodeError> {
        let (mut ok, mut reason) = self.exit.take().unwrap_or((false, "no exit".into()));
        if let Logic::Bu(_, sink) = &mut self.logic {
            // Completing output can fail for a while (a full disk): try for a few seconds.
            let give_up = Instant::now() + Duration::from_secs(3);
            loop {
                match sink.finish() {
                    Ok(()) => break,
                    Err(SinkError::Busy(e)) if Instant::now() < give_up => {
                        warn!(node = %self.me.id, "sink cannot complete its output yet: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(SinkError::Busy(e) | SinkError::Fatal(e)) => {
                        ok = false;
                        reason = format!("{reason}; sink could not complete its output: {e}");
                        break;
                    }
                }
            }
        }
        self.messenger.flush_due(Instant::now());
        let deadline = Instant::now() + Duration::from_secs(2);
        let conns: Vec<ConnId> = self.conns.values().copied().collect();
        let mut sink = Vec::new();
        while Instant::now() < deadline && conns.iter().any(|c| self.messenger.queued_bytes(*c) > 0)
        {
            sink.clear();
            let _ = self
                .messenger
                .poll(&mut sink, Some(Duration::from_millis(1)));
        }
        for c in &conns {
            self.messenger.close(*c);
        }
        // Let the Byes go out.
        let deadline = Instant::now() + Duration::from_millis(200);
        while Instant::now() < deadline {
            sink.clear();
            let _ = self
                .messenger
                .poll(&mut sink, Some(Duration::from_millis(5)));
            if sink
                .iter()
                .filter(|e| matches!(e, Incoming::Closed { .. }))
                .count()
                >= conns.len()
            {
                break;
            }
        }
        let now = Instant::now();
        let mut report = self.status_line("report", now);
        report["ok"] = json!(ok);
        report["reason"] = json!(reason);
        if let Logic::Evm(e) = &self.logic {
            report["run"] = serde_json::to_value(e.report(now)).unwrap_or(Value::Null);
            report["verdict"] = json!(evb_builder::verdict(&e.report(now)));
        }
        if ok {
            info!(node = %self.me.id, "{reason}");
        } else {
            error!(node = %self.me.id, "{reason}");
        }
        self.control.publish(report.clone());
        (self.status)(report.clone());
        Ok(NodeOutcome { ok, reason, report })
    }
}
