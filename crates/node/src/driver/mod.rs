//! The IO driver: one event loop that connects a node's state machine to its peers.
//!
//! One idea: the loop and the actions it carries out; its parts (links, sink queue, reporter)
//! are the files beside it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use evb_builder::{
    Action, BuiltEvent, FastMap, FastSet, NodeRef, NodeStatus, Path, RunState, SinkError,
    StatusKind,
};
use evb_config::{Config, NodeSpec, Role};
use evb_messaging::{Incoming, Messenger, Received};
use evb_transport::{CloseReason, ConnId, Transport};
use evb_wire::{Channel, Hello, Message};
use tracing::{debug, error, info, warn};

use crate::control::{RunControl, PUBLISH_EVERY};
use crate::setup::{self, Logic};
use crate::NodeError;

mod liveness;
mod peers;
mod sink;
mod standby;
mod status;

/// How much longer than `run.connect_timeout_s` an RU or BU connected to the EVM waits for
/// the EVM to name the peers that never came (see `Driver::own_connect_deadline`).
const EVM_NAMES_GRACE: Duration = Duration::from_secs(2);

/// Where a node's status lines and final report go (stdout for a process, a channel for a thread).
pub type StatusOut = Box<dyn FnMut(NodeStatus) + Send>;

/// How a node's run ended.
#[derive(Debug, Clone)]
pub struct NodeOutcome {
    pub ok: bool,
    pub reason: String,
    /// The node's final report (for the EVM: with the whole run's report and verdict).
    pub report: NodeStatus,
    /// An EVM replaced by a standby that the nodes followed: the epoch that fenced it. Its
    /// report is then not the run's (docs/standby.md).
    pub fenced: Option<u16>,
}

pub struct Driver {
    cfg: Config,
    me: NodeSpec,
    nodes: Vec<NodeSpec>,
    logic: Logic,
    messenger: Messenger,
    /// Connections to the peers, calls, liveness.
    links: peers::Links,
    /// Status lines, snapshots, and the figures they carry of their own.
    reporter: status::Reporter,
    exit: Option<(bool, String)>,
    /// A BU: built events on their way to the sink, and a Stop held for its output.
    sink: sink::SinkQueue,
    /// Faulting in the pools' pages; the node is ready once this is done.
    populating: Option<std::thread::JoinHandle<()>>,
    /// Commands from the control plane (status snapshots go out through `reporter`).
    control: RunControl,
    /// An RU: where its fragments come from and how they leave.
    ru: RuSide,
    /// The EVM: the registry of nodes and the rendezvous file.
    evm: EvmSide,
    /// This process's part in a run with a standby EVM.
    standby: standby::Standby,
    /// When this driver was made: time 0 of the session's machines.
    origin: Instant,
}

/// What only an RU has (all `None` elsewhere).
struct RuSide {
    /// Fed by front-end streams: their listeners, readers and assembler.
    streams: Option<crate::stream_source::StreamSource>,
    /// Fed by a plug-in producer in this process.
    api: Option<crate::plug::ApiSource>,
    /// Under `traffic.shaping = "barrel"`: fragments wait for their BU's slot.
    shaper: Option<evb_builder::shaping::BarrelShaper>,
    /// Fragments for a BU process that joined the run and whose connection this RU has not
    /// counted yet (see [`evb_builder::Awaiting`]).
    awaiting: evb_builder::Awaiting,
}

impl RuSide {
    /// Takes in what the front-end streams and the producer have ready.
    fn pump(&mut self, now: Instant, logic: &mut Logic) {
        if let Logic::Ru(r) = logic {
            if let Some(s) = &mut self.streams {
                s.pump(now, r);
            }
            if let Some(a) = &mut self.api {
                a.pump(now, r);
            }
        }
    }

    /// Input arrives between socket events (front-end streams, a producer).
    fn fed(&self) -> bool {
        self.streams.is_some() || self.api.is_some()
    }
}

/// What only the EVM has (empty elsewhere).
struct EvmSide {
    /// What each node said about itself (Register).
    registry: FastMap<NodeRef, evb_wire::discovery::Registration>,
    /// The rendezvous file it wrote, removed at the end.
    rendezvous: Option<std::path::PathBuf>,
    /// When the node started: output files older than this belong to an earlier run.
    since: std::time::SystemTime,
}

/// CPU seconds (user and system) this process has used so far, all its threads.
pub(crate) fn process_cpu_s() -> f64 {
    // SAFETY: rusage is plain old data; all-zero is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a pointer to a live rusage is getrusage's documented use.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// Wall-clock nanoseconds since the epoch: the barrel shifter's slots, which every node of
/// the run counts alike.
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How the loop waits when a barrel slot may decide its wake-up (`slot_wait`: until the next
/// slot, with bytes queued; `now_ns`: the wall clock). The poll rounds a wait up to whole
/// milliseconds (mio), which started each slot up to 1 ms late and, with slots shorter than
/// a millisecond, left most of them unused. Where the slot decides, the poll waits the whole
/// milliseconds and the rest is slept, precisely, if nothing came meanwhile. Returns the
/// poll's timeout, and the slot's start (wall-clock ns) to sleep until after an empty poll.
fn slot_poll(
    timeout: Duration,
    slot_wait: Option<Duration>,
    now_ns: u64,
) -> (Duration, Option<u64>) {
    match slot_wait.filter(|w| *w == timeout && !w.is_zero()) {
        Some(w) => (
            Duration::from_millis(w.as_millis() as u64),
            Some(now_ns + w.as_nanos() as u64),
        ),
        None => (timeout, None),
    }
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
        let (rx_pool, ru_pool) = setup::pools(cfg, &me).map_err(NodeError::Setup)?;
        let incarnation = if me.role == Role::Bu {
            setup::incarnation()
        } else {
            0
        };
        // The connect timeout runs from here: making the pools is not connecting (their pages
        // are backed by the thread below, while the node connects).
        let now = Instant::now();
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
        let watched_rx_pool = rx_pool.clone();
        let mut transport = make_transport(evb_transport::TransportConfig {
            run_id: cfg.run.id.clone(),
            local: setup::hello(cfg, &me, Channel::Control, incarnation),
            max_frame: setup::max_frame(cfg),
            rx_pool,
            secret: cfg.secret().map(|s| s.into_bytes()),
        })?;
        // every other node may dial this one at once, all from one IP on a single host
        transport.expect_peers(nodes.len());
        let mut messenger = Messenger::new(transport, setup::messenger_config(cfg));
        messenger.set_busy_poll(Duration::from_micros(cfg.messaging.busy_poll_us));
        // a BU takes an RU's run of fragments in one go
        messenger.set_coalesce_fragments(me.role == Role::Bu);
        let bound = messenger
            .listen(&setup::address(cfg, &me))
            .map_err(|e| NodeError::Listen(me.addr.clone(), e.to_string()))?;
        info!(node = %me.id, addr = %bound, "listening");
        let rendezvous = if me.role == Role::Evm && !cfg.run.rendezvous.is_empty() {
            let path = std::path::PathBuf::from(&cfg.run.rendezvous);
            crate::discovery::publish_evm(&path, &bound)
                .map_err(|e| NodeError::Setup(e.to_string()))?;
            info!(node = %me.id, "wrote the EVM's address to {}", path.display());
            Some(path)
        } else {
            None
        };

        // Who calls whom: RUs and BUs call the EVM (control); RUs call every BU (data).
        let mut dials = Vec::new();
        let evm = &nodes[0];
        let n_ru = nodes.iter().filter(|n| n.role == Role::Ru).count();
        // the set awaited at the start: the spare BUs join later, each when it starts
        let n_bu = nodes
            .iter()
            .filter(|n| n.role == Role::Bu && !n.spare)
            .count();
        let expected = match me.role {
            Role::Evm => n_ru + n_bu,
            Role::Ru => 1 + n_bu,
            Role::Bu => 1 + n_ru,
        };
        if me.role != Role::Evm {
            if cfg.is_discovered(&evm.addr) {
                return Err(NodeError::Setup(format!(
                    "{id}: the EVM's address is not known (port 0): set evm.addr, give --evm \
                     HOST:PORT, or a rendezvous file (run.rendezvous, --rendezvous)"
                )));
            }
            dials.push(peers::Dial {
                peer: NodeRef::Evm,
                addr: setup::address(cfg, evm),
                channel: Channel::Control,
                retry_at: None,
            });
        }
        if me.role == Role::Ru {
            // BUs without an address are called once the EVM says where they are (Peers)
            for b in nodes
                .iter()
                .filter(|n| n.role == Role::Bu && !cfg.is_discovered(&n.addr))
            {
                dials.push(peers::Dial {
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
                    // the producers write their fragments straight into this pool
                    let _ = feed.pool.send(pool.clone());
                }
                Some(crate::plug::ApiSource::new(
                    cfg,
                    &me,
                    feed.inputs,
                    ru_pool.clone(),
                    now,
                ))
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
        let mut logic =
            setup::logic(cfg, &me, ru_pool, now, plugs.sink).map_err(NodeError::Setup)?;
        let standby = standby::Standby::new(cfg, &me, &nodes);
        if let (true, Logic::Evm(e)) = (standby.following(), &mut logic) {
            e.set_following(true);
        }
        let mut sink_queue = sink::SinkQueue::new(now);
        if matches!(standby, standby::Standby::Node { .. }) {
            match &mut logic {
                Logic::Ru(r) => r.set_standby(true),
                Logic::Bu(b, s) => {
                    b.set_standby(true);
                    if s.commits() {
                        sink_queue.track_commits();
                    }
                }
                Logic::Evm(_) => {}
            }
        }
        let streams = match (&logic, cfg.source.kind) {
            (Logic::Ru(_), evb_config::SourceKind::Stream) => Some(
                crate::stream_source::StreamSource::start(cfg, &me, now)
                    .map_err(NodeError::Setup)?,
            ),
            _ => None,
        };
        let n_ru = nodes.iter().filter(|n| n.role == Role::Ru).count();
        let n_bu = nodes.iter().filter(|n| n.role == Role::Bu).count();
        let shaper = (me.role == Role::Ru && cfg.traffic.shaping == evb_config::Shaping::Barrel)
            .then(|| {
                evb_builder::shaping::BarrelShaper::new(
                    me.index as usize,
                    n_ru,
                    n_bu,
                    Duration::from_micros(cfg.slot_us()),
                    cfg.slot_bytes() as usize,
                    cfg.topology.folded,
                )
            });
        // the spare BUs an RU calls and the EVM admits (a BU has no BU peers)
        let spares: Vec<NodeRef> = nodes.iter().filter(|n| n.spare).map(node_ref).collect();
        Ok(Driver {
            cfg: cfg.clone(),
            me,
            nodes,
            logic,
            messenger,
            links: {
                let mut links = peers::Links::new(
                    bound,
                    incarnation,
                    dials,
                    expected,
                    now + Duration::from_secs_f64(cfg.run.connect_timeout_s),
                    Duration::from_millis(cfg.run.heartbeat_ms),
                    Duration::from_millis(cfg.run.heartbeat_timeout_ms),
                    now,
                );
                links.watch_rx_pool(watched_rx_pool);
                links.set_spares(spares);
                links
            },
            reporter: status::Reporter::new(status, status_every, control.clone(), named, now),
            exit: None,
            sink: sink_queue,
            populating,
            control,
            ru: RuSide {
                streams,
                api,
                shaper,
                awaiting: evb_builder::Awaiting::default(),
            },
            evm: EvmSide {
                registry: FastMap::default(),
                rendezvous,
                since: std::time::SystemTime::now(),
            },
            standby,
            origin: now,
        })
    }

    /// Sends what the barrel shifter lets go in this slot.
    fn release_shaped(&mut self) {
        let Some(shaper) = &mut self.ru.shaper else {
            return;
        };
        let (links, messenger, me) = (&self.links, &mut self.messenger, &self.me.id);
        let mut unsent = Vec::new();
        shaper.due(wall_ns(), |bu, inc, data, count| {
            let to = NodeRef::Bu(bu as u16);
            if let Some(conn) = links.conn_to_incarnation(to, inc) {
                if let Err(e) = messenger.send_fragments(conn, &data, count) {
                    debug!(node = %me, "fragment to {to} failed: {e}");
                }
            } else {
                unsent.push((bu as u16, inc, data, count));
            }
        });
        let timing = shaper.timing();
        if let Logic::Ru(r) = &mut self.logic {
            r.note_slot_timing(timing);
        }
        // a process not reached yet gets them when its connection is up (out of its slot:
        // a few fragments, once)
        let now = Instant::now();
        for (bu, inc, data, count) in unsent {
            self.ru.awaiting.keep(now, bu, inc, data, count);
        }
    }

    /// This node is connected to `p`, of incarnation `inc` (a BU's): what an RU kept for
    /// that process leaves now, in order (see [`evb_builder::Awaiting`]).
    fn reached(&mut self, p: NodeRef, inc: u16) {
        let NodeRef::Bu(bu) = p else { return };
        let due = self.ru.awaiting.reached(bu, inc);
        if due.is_empty() {
            return;
        }
        info!(node = %self.me.id, "{p} (incarnation {inc}) reached: {} sends that waited for it go out", due.len());
        let Some(conn) = self.links.conn_to_incarnation(p, inc) else {
            return;
        };
        for (data, count) in due {
            if let Err(e) = self.messenger.send_fragments(conn, &data, count) {
                debug!(node = %self.me.id, "fragment to {p} failed: {e}");
            }
        }
    }

    /// Ends the wait of fragments kept longer than [`evb_builder::AWAIT_LIMIT`].
    fn expire_awaiting(&mut self, now: Instant) {
        if !self.ru.awaiting.is_empty() {
            let n = self.ru.awaiting.expire(now);
            if n > 0 {
                warn!(node = %self.me.id, "{n} sends waited {:?} for a BU process that accepted this RU's call and never answered it: dropped (the RU holds their fragments for the EVM's reassignment)", evb_builder::AWAIT_LIMIT);
            }
        }
    }

    /// Hands a held Stop to the BU once its sink's output is complete (see
    /// [`sink::SinkQueue::try_stop`]).
    fn try_stop(&mut self, now: Instant) {
        if let Logic::Bu(b, sink) = &mut self.logic {
            self.sink.try_stop(now, b, sink.as_mut());
        }
    }

    /// Offers queued events to a BU's sink (see [`sink::SinkQueue::drain`]).
    fn drain_sink(&mut self, now: Instant) {
        if let Logic::Bu(b, sink) = &mut self.logic {
            self.sink.drain(now, &self.me.id, b, sink.as_mut());
        }
    }

    /// Sends a committing sink's durable parts to the EVM (see [`sink::SinkQueue::commit`]).
    fn commit_sink(&mut self, now: Instant) {
        if let Logic::Bu(b, sink) = &mut self.logic {
            self.sink.commit(now, &self.me.id, b, sink.as_mut());
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
        // Built events are offered to the sink once the queued actions are done, all of them
        // at one clock reading (one per event was a visible share of a small-event run).
        let mut now: Option<Instant> = None;
        loop {
            while let Some(a) = self.next_action() {
                if matches!(a, Action::Exit { .. }) {
                    // what was built before the end goes where it went before it
                    self.take_built();
                }
                self.run_action(a);
            }
            if !self.take_built() {
                break;
            }
            let now = *now.get_or_insert_with(Instant::now);
            self.drain_sink(now);
        }
    }

    /// A BU's newly built events, to the sink's queue; whether there were any.
    fn take_built(&mut self) -> bool {
        match &mut self.logic {
            Logic::Bu(b, _) => self.sink.take_built(b),
            _ => false,
        }
    }

    fn run_action(&mut self, a: Action) {
        if self.standby.fenced().is_some() && !matches!(a, Action::Exit { .. }) {
            // a fenced EVM's decisions never reach a node or the output
            return;
        }
        match a {
            Action::Send { to, msg, path } => {
                let Some(conn) = self.links.conn(to) else {
                    debug!(node = %self.me.id, "no connection to {to}; {:?} dropped", msg.msg_type());
                    return;
                };
                let r = match path {
                    Path::Now => self.messenger.send_now(conn, &msg),
                    Path::Batched => self.messenger.send_batched(conn, &msg),
                };
                if let Err(e) = r {
                    debug!(node = %self.me.id, "send to {to} failed: {e}");
                }
            }
            Action::SendFragments {
                to,
                inc,
                data,
                count,
            } => {
                if let (Some(shaper), NodeRef::Bu(bu)) = (&mut self.ru.shaper, to) {
                    shaper.push(bu as usize, inc, data, count, wall_ns());
                    return;
                }
                // only to the incarnation the EVM assigned them to: a restarted BU never
                // gets its predecessor's work (the fragments stay held for the reassignment);
                // a process not reached yet gets them once its connection is up
                if let Some(conn) = self.links.conn_to_incarnation(to, inc) {
                    if let Err(e) = self.messenger.send_fragments(conn, &data, count) {
                        debug!(node = %self.me.id, "fragment to {to} failed: {e}");
                    }
                } else if let NodeRef::Bu(bu) = to {
                    self.ru.awaiting.keep(Instant::now(), bu, inc, data, count);
                }
            }
            Action::Accepted(r) => {
                self.sink.tracked_accept(r.first, r.count);
                if let Logic::Bu(_, sink) = &mut self.logic {
                    if let Err(SinkError::Busy(why) | SinkError::Fatal(why)) =
                        sink.accepted(r.first, r.count)
                    {
                        // the sink keeps the output and tries again on its next call
                        self.sink.accept_failed(&self.me.id, &why);
                    }
                }
            }
            Action::Publish(part) => {
                if let Logic::Bu(b, sink) = &mut self.logic {
                    self.sink.publish(&self.me.id, part, b, sink.as_mut());
                }
            }
            Action::PublishFor { bu, part } => {
                let dir = std::path::Path::new(&self.cfg.sink.dir);
                let run = &self.cfg.run.id;
                // a serving BU's part is what its consumers acknowledged: it is out already,
                // with no file to rename
                let serving = self.nodes.iter().any(|n| {
                    n.role == Role::Bu && n.index == bu && n.sink == evb_config::SinkKind::Serve
                });
                let published = if serving {
                    true
                } else {
                    match evb_formats::events::publish_prepared(dir, run, bu, part) {
                        Ok(done) => done,
                        Err(e) => {
                            warn!(node = %self.me.id, "cannot publish part {part} of lost bu[{bu}]: {e}");
                            false
                        }
                    }
                };
                if published {
                    info!(node = %self.me.id, "published part {part} of lost bu[{bu}] for it");
                }
                if let Logic::Evm(e) = &mut self.logic {
                    e.published_for(bu, part, published);
                }
            }
            Action::Disconnect(p) => {
                // the standby hears of a drop before anyone acts on it
                self.tell_follower(false);
                if let Some(conn) = self.links.conn(p) {
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

    /// When this node gives up waiting for its peers. The EVM aborts the launch at
    /// `run.connect_timeout_s` and names every missing node to every node that started; an
    /// RU or BU that reaches the EVM waits [`EVM_NAMES_GRACE`] longer for that word, so a
    /// node whose own timer fires first (it started a moment later, or the EVM was not
    /// scheduled) does not exit and make the EVM report it as lost instead of naming the
    /// node that never came.
    fn own_connect_deadline(&self) -> Instant {
        self.links.connect_deadline(self.me.role)
    }

    /// `now` as the session's machines count time (since this driver was made).
    fn at(&self, now: Instant) -> crate::session::Time {
        now.saturating_duration_since(self.origin)
    }

    /// Runs the node until its state machine says the run is over for it.
    pub fn run(mut self) -> Result<NodeOutcome, NodeError> {
        let mut incoming = Vec::new();
        if self.ru.shaper.is_some() {
            // a slot's start is slept to (see `slot_poll`): the kernel's default slack of
            // 50 µs on this thread's timers would start every slot that much later
            // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only this
            // thread's timer slack; no memory is passed.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
        }
        loop {
            let now = Instant::now();
            self.sink.begin_pass(now);
            self.dial(now)?;
            if self.standby_pass(now) {
                // a standby EVM that has not taken over: it follows, and gathers resyncs
                self.heartbeats(now);
                self.messenger.flush_due(now);
                if self.exit.is_some() {
                    break;
                }
                incoming.clear();
                let wait = self.standby_wait(now, Duration::from_millis(10));
                self.messenger
                    .poll(&mut incoming, Some(wait))
                    .map_err(|e| NodeError::Io(e.to_string()))?;
                let now = Instant::now();
                for inc in incoming.drain(..) {
                    self.on_incoming(now, inc)?;
                }
                continue;
            }
            let populated = self.populating.as_ref().is_none_or(|t| t.is_finished());
            if !self.links.is_up() && self.links.complete() && populated {
                if let Some(t) = self.populating.take() {
                    let _ = t.join();
                }
                self.links.mark_up();
                let (_, expected) = self.links.connected();
                info!(node = %self.me.id, "all {expected} connections up");
                match &mut self.logic {
                    Logic::Ru(r) => r.connections_up(),
                    Logic::Bu(b, _) => b.connections_up(),
                    Logic::Evm(_) => {}
                }
            }
            if !self.links.is_up()
                && !self.links.complete()
                && now > self.own_connect_deadline()
                && self.exit.is_none()
            {
                let (connected, expected) = self.links.connected();
                let why = format!(
                    "only {connected} of {expected} connections up after {} s; not connected: {}",
                    self.cfg.run.connect_timeout_s,
                    self.missing_peers().join(", ")
                );
                if matches!(self.logic, Logic::Evm(_)) {
                    // every node that did start hears why the run cannot
                    self.abort_launch(why);
                    continue;
                }
                return Err(NodeError::Connect("peers".into(), why));
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
            let mut pause_changed = false;
            let mut copies = Vec::new();
            if let Logic::Evm(e) = &mut self.logic {
                if self.control.stop_requested() {
                    e.request_stop(now);
                }
                let decisions = self.control.take_decisions();
                let first = e.next_decision_id();
                if !decisions.is_empty() && !e.decide(now, &decisions) {
                    warn!(
                        "{} decisions from outside in a run that does not take them",
                        decisions.len()
                    );
                } else if !decisions.is_empty() {
                    // the standby keeps a copy: they outlive this EVM
                    copies = Message::windows(first, &decisions);
                }
                for b in self.control.take_retirements() {
                    match e.retire(now, b) {
                        Ok(()) => tracing::info!("bu[{b}] retiring: it is given no more events"),
                        Err(why) => warn!("retiring refused: {why}"),
                    }
                }
                let paused = self.control.paused();
                pause_changed = e.is_paused() != paused;
                e.set_paused(now, paused);
            }
            self.copy_to_follower(copies);
            if pause_changed {
                // the standby hears of a pause at once: a loss right after it keeps it
                self.tell_follower(false);
            }
            self.ru.pump(now, &mut self.logic);
            match &mut self.logic {
                Logic::Evm(e) => e.poll(now),
                Logic::Ru(r) => r.poll(now),
                Logic::Bu(b, _) => b.poll(now),
            }
            let state = self.state();
            self.reporter.note_state(state);
            self.heartbeats(now);
            self.try_stop(now);
            self.run_actions();
            self.drain_sink(now);
            self.commit_sink(now);
            self.run_actions();
            self.release_shaped();
            self.expire_awaiting(now);
            self.messenger.flush_due(now);
            if self.reporter.due(now) {
                let line = self.status_line(StatusKind::Status, now);
                self.reporter.send(now, line);
            }
            if self.exit.is_some() {
                break;
            }
            let busy = match &self.logic {
                Logic::Ru(r) => r.has_work(),
                Logic::Evm(e) => e.has_work(),
                Logic::Bu(..) => self.sink.has_work(),
            };
            let slot_wait = self
                .ru
                .shaper
                .as_ref()
                .filter(|_| !busy)
                .and_then(|s| s.next_slot_in(wall_ns()));
            let timeout = if busy {
                Duration::ZERO
            } else {
                // paced triggers and front-end streams arrive between socket events
                let paced = self.cfg.run.rate_hz > 0.0 || self.ru.fed();
                let cap = Duration::from_millis(if paced { 1 } else { 10 });
                // a busy sink is offered its events again when its retry is due
                let cap = self
                    .sink
                    .retry_at()
                    .map_or(cap, |t| t.saturating_duration_since(now).min(cap));
                // fragments waiting for their slot go when it begins
                let cap = slot_wait.map_or(cap, |t| t.min(cap));
                self.messenger
                    .next_flush_in(now)
                    .map_or(cap, |t| t.min(cap))
            };
            incoming.clear();
            let (timeout, slot_at) = slot_poll(timeout, slot_wait, wall_ns());
            self.messenger
                .poll(&mut incoming, Some(timeout))
                .map_err(|e| NodeError::Io(e.to_string()))?;
            if let (Some(at), true) = (slot_at, incoming.is_empty()) {
                let left = at.saturating_sub(wall_ns());
                if left > 0 && left < 1_000_000 {
                    std::thread::sleep(Duration::from_nanos(left));
                }
            }
            let now = Instant::now();
            // a fence in this batch is heard before anything else in it is acted on
            self.fence_first(&incoming);
            // A BU builds and delivers what each page of fragments completed before it files
            // the next page: a pass can bring megabytes, and events finished while their
            // fragments are still in the cache cost less than a whole pass's worth later.
            for inc in incoming.drain(..) {
                let page = matches!(
                    inc,
                    Incoming::Received {
                        msg: Received::Fragments(_),
                        ..
                    }
                );
                self.on_incoming(now, inc)?;
                if page {
                    self.run_actions();
                }
            }
            self.run_actions();
        }
        self.finish()
    }

    /// The EVM of a run whose BUs write files leaves the run's manifest beside them
    /// (docs/formats.md §7): its counts and verdict, and every file it published.
    fn write_manifest(&self, run: &evb_builder::RunReport, ok: bool, reason: &str) {
        let files = self
            .nodes
            .iter()
            .any(|n| n.role == Role::Bu && n.sink.writes_files());
        if !files || self.cfg.sink.dir.is_empty() {
            return;
        }
        let dir = std::path::Path::new(&self.cfg.sink.dir);
        let (parts, temporaries) =
            evb_formats::manifest::scan(dir, &self.cfg.run.id, Some(self.evm.since));
        let mut problems = run.verdict();
        if !ok && problems.is_empty() {
            problems.push(reason.to_string());
        }
        let m = evb_formats::manifest::RunManifest {
            format: evb_formats::manifest::MANIFEST_FORMAT.into(),
            version: evb_formats::manifest::MANIFEST_VERSION,
            run: self.cfg.run.id.clone(),
            verdict: if ok && problems.is_empty() {
                "OK"
            } else {
                "FAILED"
            }
            .into(),
            problems,
            triggered: run.evm.triggered,
            released: run.evm.released,
            partial: run.bus.iter().flatten().map(|b| b.partial_events).sum(),
            parts,
            temporaries,
            config: self.write_run_config(dir),
            node_events: run
                .evm
                .lost
                .iter()
                .map(|e| evb_formats::manifest::ManifestNodeEvent {
                    node: e.node.clone(),
                    at_s: e.at_s,
                    kind: serde_json::to_value(e.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                })
                .collect(),
            spares_out: run.evm.spares_out.clone(),
        };
        match evb_formats::manifest::write(dir, &m, self.cfg.output_file_mode()) {
            Ok(path) => info!(node = %self.me.id, "run manifest: {}", path.display()),
            Err(e) => {
                warn!(node = %self.me.id, "cannot write the run manifest in {}: {e}", dir.display())
            }
        }
    }

    /// The configuration this run ran, less its secret, beside its files (docs/formats.md
    /// §7.3): what the manifest names with its digest.
    fn write_run_config(
        &self,
        dir: &std::path::Path,
    ) -> Option<evb_formats::evidence::ManifestFile> {
        let mut cfg = self.cfg.clone();
        cfg.run.secret.clear();
        let text = cfg.to_toml();
        match evb_formats::evidence::write_config(
            dir,
            &self.cfg.run.id,
            &text,
            self.cfg.output_file_mode(),
        ) {
            Ok(f) => Some(f),
            Err(e) => {
                warn!(node = %self.me.id, "cannot write the run's configuration in {}: {e}", dir.display());
                None
            }
        }
    }

    /// Sends what is queued (the last reports and Halts), says Bye, and reports.
    fn finish(mut self) -> Result<NodeOutcome, NodeError> {
        if self.exit.as_ref().is_some_and(|(ok, _)| !ok) {
            // an EVM that fails a run while a standby follows may have been replaced: a
            // fence on its way is heard before the report is made
            self.await_fence(Duration::from_millis(300));
        }
        let (mut ok, mut reason) = self.exit.take().unwrap_or((false, "no exit".into()));
        // the standby hears that the run is over, and does not take it over
        self.tell_follower(true);
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
        let conns: Vec<ConnId> = self.links.conns().map(|(_, c)| c).collect();
        let mut sink = Vec::new();
        while Instant::now() < deadline && conns.iter().any(|c| self.messenger.queued_bytes(*c) > 0)
        {
            sink.clear();
            let _ = self
                .messenger
                .poll(&mut sink, Some(Duration::from_millis(1)));
            for e in &sink {
                self.answer_late_follower(e);
            }
        }
        for c in &conns {
            self.messenger.close(*c);
        }
        // Let the Byes go out: until every peer has closed its side too (counted over the
        // passes: one pass rarely holds every close, and counting a pass alone waited the
        // whole 200 ms at every node's exit).
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut open: std::collections::HashSet<ConnId> = conns.iter().copied().collect();
        while Instant::now() < deadline && !open.is_empty() {
            sink.clear();
            let _ = self
                .messenger
                .poll(&mut sink, Some(Duration::from_millis(5)));
            for e in &sink {
                if let Incoming::Closed { conn, .. } = e {
                    open.remove(conn);
                }
                self.answer_late_follower(e);
            }
        }
        let now = Instant::now();
        let mut report = self.status_line(StatusKind::Report, now);
        report.ok = Some(ok);
        report.reason = Some(reason.clone());
        if let Logic::Evm(e) = &self.logic {
            let run = e.report(now);
            report.verdict = Some(match self.standby.fenced() {
                // whatever this EVM counted, the run is the standby's: no reader may take
                // this report's verdict, OK or not, for the run's
                Some(_) => vec![reason.clone()],
                None => run.verdict(),
            });
            // only the run's EVM: not one fenced by a newer, nor a standby that only followed
            // (its ledger is empty; it would overwrite the run's manifest with nothing)
            if self.standby.fenced().is_none() && !run.evm.following {
                self.write_manifest(&run, ok, &reason);
            }
            report.run = Some(run);
        }
        if ok {
            info!(node = %self.me.id, "{reason}");
        } else {
            error!(node = %self.me.id, "{reason}");
        }
        if let Some(path) = &self.evm.rendezvous {
            // only the file this EVM wrote: a later run's EVM may have replaced it
            let mine = crate::discovery::peek_evm(path)
                .is_some_and(|a| a.to_string() == self.links.bound());
            if mine {
                let _ = std::fs::remove_file(path);
            }
        }
        self.reporter.report(report.clone());
        Ok(NodeOutcome {
            ok,
            reason,
            report,
            fenced: self.standby.fenced(),
        })
    }
}

#[cfg(test)]
mod slot_poll_tests {
    use super::*;

    #[test]
    fn a_slot_s_start_is_polled_in_whole_milliseconds_and_the_rest_slept() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        // the slot decides: 2.4 ms polled as 2 ms, then slept to the slot's start
        assert_eq!(
            slot_poll(us(2400), Some(us(2400)), 1_000),
            (ms(2), Some(2_401_000))
        );
        // under a millisecond: no wait in the poll at all, the whole of it slept
        assert_eq!(slot_poll(us(300), Some(us(300)), 0), (ms(0), Some(300_000)));
        // something else wakes the loop sooner: as it was
        assert_eq!(slot_poll(ms(1), Some(ms(3)), 0), (ms(1), None));
        // no slot to wait for, or busy
        assert_eq!(slot_poll(ms(10), None, 0), (ms(10), None));
        assert_eq!(slot_poll(ms(0), Some(ms(0)), 0), (ms(0), None));
    }
}
