//! Memory planning: the credits a BU gets by default, the pools each node makes for what
//! the credits allow in flight, and their sum against the host's memory.

use crate::{invalid, stream, Config, ConfigError, Content, NodeSpec, Role, SourceKind};

impl Config {
    /// Credits of a BU without its own: `builder.credits`, or when that is 0 enough events to
    /// hold about 16 MiB (16 to 4096): small events need many in flight to keep the pipes full.
    pub fn default_credits(&self) -> u32 {
        if self.builder.credits > 0 {
            return self.builder.credits;
        }
        let n_ru = if self.ru.is_empty() {
            self.topology.rus as u64
        } else {
            self.ru.len() as u64
        };
        let event = n_ru
            .max(1)
            .saturating_mul(self.max_fragment().saturating_add(64));
        ((16u64 << 20) / event).clamp(16, 4096) as u32
    }

    /// Said (not changed) where the BUs of a live source (streams, producers) get the fewest
    /// default credits only because `source.max_fragment` is large: the credits are sized
    /// for the largest fragment allowed, and fragments far smaller then wait on round trips.
    /// Not in a run built by time: its records come at the slices' (or windows') pace, each
    /// a span of time, and the fewest credits still hold 16 of them in flight.
    pub fn live_credits_notice(&self) -> Option<String> {
        let live =
            matches!(self.source.kind, SourceKind::Stream | SourceKind::Api) && !self.by_time();
        let defaulted = self.builder.credits == 0 && self.bu.iter().all(|b| b.credits.is_none());
        let credits = self.default_credits();
        (live && defaulted && credits <= 16).then(|| {
            format!(
                "builder.credits defaults to {credits} per BU here, sized for fragments of \
                 source.max_fragment = {} bytes: far smaller fragments then wait on round \
                 trips (docs/performance.md, \"The real pipeline\"); set source.max_fragment \
                 to the largest fragment the front-ends send, or builder.credits",
                self.source.max_fragment
            )
        })
    }

    /// The largest fragment payload any RU can send.
    pub fn max_fragment(&self) -> u64 {
        match self.source.kind {
            SourceKind::Generator | SourceKind::Stream | SourceKind::Api if self.by_time() => {
                self.max_window_fragment()
            }
            SourceKind::Generator => self.fragments.max_size(),
            SourceKind::Stream | SourceKind::Api => stream::max_payload(self),
            _ => self.source.max_fragment,
        }
    }

    /// Bytes an RU and a BU must be able to hold for everything the credits allow in flight.
    ///
    /// # Errors
    /// If the sizes overflow (only for a configuration that fails [`Config::validate`]).
    pub fn pool_needs(&self) -> Result<(u64, u64), ConfigError> {
        let nodes = self.nodes_unchecked();
        let bus = nodes.iter().filter(|n| n.role == Role::Bu);
        let total_credits: u64 = bus.clone().map(|n| n.credits as u64).sum();
        // A BU whose sink commits leaves its accepted events with the RUs until its part is
        // committed: up to a part being filled and one with the EVM.
        let committing: u64 = bus
            .clone()
            .filter(|n| n.sink.commits())
            .map(|n| 2 * self.commit_events(n))
            .sum();
        let max_credits: u64 = bus.map(|n| n.credits as u64).max().unwrap_or(0);
        let n_ru = self.n_ru();
        let block = self.buffers.block_size.max(1);
        let too_big = || {
            invalid(
                "builder.credits",
                "the pools these credits, fragment sizes and node counts need overflow 64 bits",
            )
        };
        let frag = self.max_fragment().checked_add(64).ok_or_else(too_big)?;
        let blocks = |bytes: Option<u64>| {
            bytes
                .map(|b| b.div_ceil(block))
                .and_then(|n| n.checked_mul(block))
        };
        let add = |a: Option<u64>, b: Option<u64>| a?.checked_add(b?);
        let mul = |a: Option<u64>, b: u64| a?.checked_mul(b);
        // Small fragments share blocks and a block is freed with its last fragment, so
        // allow twice the live bytes, plus the blocks being filled.
        // Static content adds its template, held for the whole run.
        let template = match self.fragments.content {
            Content::Static => blocks(Some(frag)),
            Content::Unique => Some(0),
        };
        let ru = add(
            add(
                mul(blocks(total_credits.checked_mul(frag)), 2),
                blocks(committing.checked_mul(frag)),
            ),
            add(4u64.checked_mul(block), template),
        );
        let bu_live = max_credits
            .checked_mul(n_ru)
            .and_then(|k| k.checked_mul(frag));
        let bu = add(mul(blocks(bu_live), 2), mul(mul(Some(n_ru + 4), 2), block));
        Ok((ru.ok_or_else(too_big)?, bu.ok_or_else(too_big)?))
    }

    /// The pools a node of `role` makes, as `evb-node` makes them.
    ///
    /// # Errors
    /// If the sizes overflow (only for a configuration that fails [`Config::validate`]).
    pub fn pool_plan(&self, role: Role) -> Result<PoolPlan, ConfigError> {
        let block = self.buffers.block_size.max(1);
        let nodes = 1 + self.n_ru() + self.n_bu();
        // Control traffic only: a few blocks per peer.
        let small = 4 * nodes + 8;
        let blocks = |bytes: u64| bytes.div_ceil(block).max(4);
        let (ru_need, bu_need) = self.pool_needs()?;
        let explicit = |mib: u64| (mib > 0).then(|| mib.checked_mul(1 << 20)).flatten();
        let plan = match role {
            Role::Evm => PoolPlan {
                block_size: block,
                rx_blocks: small,
                fragment_blocks: 0,
            },
            Role::Ru => PoolPlan {
                block_size: block,
                rx_blocks: small,
                fragment_blocks: blocks(explicit(self.buffers.ru_pool_mib).unwrap_or(ru_need)),
            },
            Role::Bu => PoolPlan {
                block_size: block,
                rx_blocks: blocks(explicit(self.buffers.bu_pool_mib).unwrap_or(bu_need)),
                fragment_blocks: 0,
            },
        };
        plan.checked_bytes().ok_or_else(|| {
            invalid(
                "builder.credits",
                "the pools these credits, fragment sizes and node counts need overflow 64 bits",
            )
        })?;
        Ok(plan)
    }

    /// Bytes of pool memory `nodes` make together.
    ///
    /// # Errors
    /// If the sum overflows (only for a configuration that fails [`Config::validate`]).
    pub fn pool_bytes(&self, nodes: &[NodeSpec]) -> Result<u64, ConfigError> {
        let mut by_role = [(Role::Evm, 0u64), (Role::Ru, 0), (Role::Bu, 0)];
        for n in nodes {
            by_role
                .iter_mut()
                .find(|(r, _)| *r == n.role)
                .expect("every role")
                .1 += 1;
        }
        let mut total = 0u64;
        for (role, count) in by_role {
            if count > 0 {
                total = self
                    .pool_plan(role)?
                    .checked_bytes()
                    .and_then(|b| b.checked_mul(count))
                    .and_then(|b| b.checked_add(total))
                    .ok_or_else(|| {
                        invalid(
                            "builder.credits",
                            format!("the pools of {} nodes overflow 64 bits", nodes.len()),
                        )
                    })?;
            }
        }
        Ok(total)
    }

    /// Compares the pools `nodes` make (see [`Config::pool_plan`]) with `host`'s memory:
    /// an error naming `builder.credits` or the `buffers.*` key at fault when they exceed its
    /// total memory, `Ok(Some(warning))` when they exceed what is available now, `Ok(None)`
    /// when they fit.
    pub fn check_memory(
        &self,
        nodes: &[NodeSpec],
        host: HostMemory,
    ) -> Result<Option<String>, ConfigError> {
        let need = self.pool_bytes(nodes)?;
        let count = |role| nodes.iter().filter(|n| n.role == role).count() as u64;
        let part = |role| {
            self.pool_plan(role).map(|p| {
                p.checked_bytes()
                    .unwrap_or(u64::MAX)
                    .saturating_mul(count(role))
            })
        };
        let (ru, bu) = (part(Role::Ru)?, part(Role::Bu)?);
        let what = format!(
            "the pools of the {} node(s) on this host need {} (RUs {}, BUs {})",
            nodes.len(),
            human(need),
            human(ru),
            human(bu)
        );
        let knobs = "lower builder.credits (or [[bu]] credits), buffers.ru_pool_mib / \
                     buffers.bu_pool_mib, or the fragment sizes, or run fewer nodes here";
        if need > host.total {
            let key = if bu >= ru && self.buffers.bu_pool_mib > 0 {
                "buffers.bu_pool_mib"
            } else if ru > bu && self.buffers.ru_pool_mib > 0 {
                "buffers.ru_pool_mib"
            } else {
                "builder.credits"
            };
            return Err(invalid(
                key,
                format!(
                    "{what}, more than this host's memory ({}): {knobs}",
                    human(host.total)
                ),
            ));
        }
        Ok((need > host.available).then(|| {
            format!(
                "{what}, more than the {} available now (of {}): the nodes may be swapped \
                 out or killed; {knobs}",
                human(host.available),
                human(host.total)
            )
        }))
    }

    /// The fewest credits [`Config::fit_credits_to`] lowers the default to.
    pub const FIT_MIN_CREDITS: u32 = 2;

    /// For a launcher that puts every node on this host (`evb run`, `evb up`): when the
    /// credits are the default (`builder.credits = 0`, no `[[bu]] credits`, no explicit pool
    /// sizes) and the pools of the nodes on this host need more than three quarters of the
    /// memory `host` has available, lowers `builder.credits` to the most that fit (never below
    /// [`Config::FIT_MIN_CREDITS`]) and says so. A configuration that sets credits or pool
    /// sizes is the operator's word and is left as it is (`check_memory` judges it).
    pub fn fit_credits_to(&mut self, host: HostMemory) -> Option<String> {
        let defaulted = self.builder.credits == 0
            && self.bu.iter().all(|b| b.credits.is_none())
            && self.buffers.ru_pool_mib == 0
            && self.buffers.bu_pool_mib == 0;
        if !defaulted {
            return None;
        }
        let budget = host.available / 4 * 3;
        let need = |c: &Config| c.pool_bytes(&c.local_nodes()).unwrap_or(u64::MAX);
        let before = need(self);
        if before <= budget {
            return None;
        }
        let default = self.default_credits();
        let mut trial = self.clone();
        let fits = |credits: u32, trial: &mut Config| {
            trial.builder.credits = credits;
            need(trial) <= budget
        };
        if default <= Self::FIT_MIN_CREDITS || !fits(Self::FIT_MIN_CREDITS, &mut trial) {
            return None;
        }
        // the most credits that fit, between the least and the default
        let (mut lo, mut hi) = (Self::FIT_MIN_CREDITS, default);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid, &mut trial) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.builder.credits = lo;
        Some(format!(
            "the pools of the {} node(s) on this host need {} at the default credits \
             ({default} per BU), more than three quarters of the {} available: \
             builder.credits lowered to {lo} ({} in all; set builder.credits to choose)",
            self.local_nodes().len(),
            human(before),
            human(host.available),
            human(need(self)),
        ))
    }

    /// [`Config::check_memory`] for [`Config::local_nodes`] against this host's
    /// /proc/meminfo; `Ok(None)` where the host does not say how much memory it has.
    pub fn check_host_memory(&self) -> Result<Option<String>, ConfigError> {
        match HostMemory::read() {
            Some(host) => self.check_memory(&self.local_nodes(), host),
            None => Ok(None),
        }
    }
}

/// The pools one node makes, in blocks of `block_size` bytes: every node a receive pool
/// (control messages for the EVM and the RUs, fragments for a BU), an RU also its fragment
/// pool. `evb-node` allocates exactly this; [`Config::check_memory`] adds it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    pub block_size: u64,
    pub rx_blocks: u64,
    /// 0 for the EVM and the BUs.
    pub fragment_blocks: u64,
}

impl PoolPlan {
    /// Bytes of both pools (`None` if that overflows).
    pub fn checked_bytes(&self) -> Option<u64> {
        self.rx_blocks
            .checked_add(self.fragment_blocks)?
            .checked_mul(self.block_size)
    }
}

/// A host's memory, from /proc/meminfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// `MemTotal`, bytes.
    pub total: u64,
    /// `MemAvailable`, bytes.
    pub available: u64,
}

impl HostMemory {
    /// This host's memory; `None` where /proc/meminfo cannot be read or lacks the fields.
    pub fn read() -> Option<HostMemory> {
        HostMemory::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    /// Reads `MemTotal` and `MemAvailable` (kB) from the text of /proc/meminfo.
    pub fn parse(meminfo: &str) -> Option<HostMemory> {
        let field = |name: &str| -> Option<u64> {
            let line = meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?;
            let mut words = line.split_whitespace();
            let kb: u64 = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") | None => kb.checked_mul(1024),
                Some(_) => None,
            }
        };
        let total = field("MemTotal")?;
        Some(HostMemory {
            total,
            available: field("MemAvailable").unwrap_or(total),
        })
    }
}

/// Bytes for a person: MiB below 1 GiB, GiB above.
fn human(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}
