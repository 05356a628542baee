//! The keys of `source.kind = "stream"` (front-ends over TCP) and their checks: which
//! addresses each RU listens on, which source id each stream carries, and how big a
//! super-fragment of an RU's streams can get.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{int_in, invalid, real_in, Config, ConfigError, SourceKind, MAX_FRAGMENT};

/// How fragments are framed on a front-end stream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StreamFormat {
    /// CMS common FED fragments back to back (what a FEROL sends).
    Fed,
    /// evb framed records back to back.
    Framed,
    /// Timestamped frames back to back (docs/formats.md §9), built into time slices.
    Frames,
}

/// What an RU does when its streams disagree on an event's trigger number.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnSyncLoss {
    /// Stop the run, naming the source and the two numbers.
    Stop,
    /// Build the event with that source flagged in its super-fragment.
    Flag,
}

/// Most streams one RU reads.
pub const MAX_STREAMS: usize = 64;
/// Most fragments read ahead per stream (`source.read_ahead`).
pub const MAX_READ_AHEAD: u64 = 65_536;

/// Magic, version, count and one 16-byte entry per stream in front of a super-fragment.
fn directory_len(k: u64) -> u64 {
    8 + 16 * k
}

/// The largest payload an RU of this configuration can send: one stream's fragment, or a
/// super-fragment of all its streams.
pub(crate) fn max_payload(cfg: &Config) -> u64 {
    let k = cfg
        .ru
        .iter()
        .map(|r| r.streams.len().max(r.producer_sources.len()))
        .max()
        .unwrap_or(1)
        .max(1) as u64;
    if k == 1 {
        cfg.source.max_fragment
    } else {
        k.saturating_mul(cfg.source.max_fragment)
            .saturating_add(directory_len(k))
    }
}

/// Checks the stream keys; every error names its key.
pub(crate) fn validate(cfg: &Config) -> Result<(), ConfigError> {
    let s = &cfg.source;
    int_in(
        "source.read_ahead",
        s.read_ahead,
        1,
        MAX_READ_AHEAD,
        " fragments",
    )?;
    real_in("source.stall_warn_s", s.stall_warn_s, 0.01, 3600.0, " s")?;
    validate_producers(cfg)?;
    if s.kind != SourceKind::Stream {
        for (i, ru) in cfg.ru.iter().enumerate() {
            if !ru.streams.is_empty() || !ru.stream_sources.is_empty() {
                let key = if ru.streams.is_empty() {
                    "stream_sources"
                } else {
                    "streams"
                };
                return Err(invalid(
                    format!("ru[{i}].{key}"),
                    "only read when source.kind = \"stream\"",
                ));
            }
        }
        return Ok(());
    }
    if s.looped {
        return Err(invalid(
            "source.loop",
            "not for streams: a stream ends when its front-end closes it",
        ));
    }
    let mut taken: HashMap<SocketAddr, String> = HashMap::new();
    for n in cfg.nodes_unchecked() {
        if let Ok(sa) = n.addr.parse::<SocketAddr>() {
            if sa.port() != 0 {
                taken.insert(sa, format!("node {}", n.id));
            }
        }
    }
    let mut sources: HashMap<u16, String> = HashMap::new();
    for (i, ru) in cfg.ru.iter().enumerate() {
        let key = format!("ru[{i}].streams");
        if ru.streams.is_empty() || ru.streams.len() > MAX_STREAMS {
            return Err(invalid(
                key,
                format!(
                    "source.kind = \"stream\" needs 1 to {MAX_STREAMS} addresses (IP:port) to listen on"
                ),
            ));
        }
        for (j, a) in ru.streams.iter().enumerate() {
            let key = format!("ru[{i}].streams[{j}]");
            let sa: SocketAddr = a
                .parse()
                .map_err(|_| invalid(&key, format!("{a:?} is not an IP:port address")))?;
            if sa.port() == 0 {
                return Err(invalid(
                    &key,
                    "needs a fixed port: the front-end must know where to connect",
                ));
            }
            if let Some(other) = taken.insert(sa, key.clone()) {
                return Err(invalid(&key, format!("port clash: {sa} is also {other}'s")));
            }
        }
        let ids_key = format!("ru[{i}].stream_sources");
        let ids = if ru.stream_sources.is_empty() && ru.streams.len() == 1 {
            vec![ru.source_id.unwrap_or(i as u16)]
        } else {
            ru.stream_sources.clone()
        };
        if ids.len() != ru.streams.len() {
            return Err(invalid(
                ids_key,
                format!(
                    "list the source id of each of the {} streams (the FED id its fragments carry)",
                    ru.streams.len()
                ),
            ));
        }
        for id in ids {
            if let Some(other) = sources.insert(id, ids_key.clone()) {
                return Err(invalid(
                    &ids_key,
                    format!("source id {id} is also in {other}"),
                ));
            }
        }
    }
    let largest = max_payload(cfg);
    if largest > MAX_FRAGMENT {
        return Err(invalid(
            "source.max_fragment",
            format!(
                "a super-fragment of the most streams of one RU could reach {largest} bytes, \
                 over the limit of {MAX_FRAGMENT}: lower it or read fewer streams per RU"
            ),
        ));
    }
    Ok(())
}

/// Checks `[[ru]] producer_sources` (several plug-in producers into one RU).
fn validate_producers(cfg: &Config) -> Result<(), ConfigError> {
    let mut sources: HashMap<u16, String> = HashMap::new();
    for (i, ru) in cfg.ru.iter().enumerate() {
        let key = format!("ru[{i}].producer_sources");
        if ru.producer_sources.is_empty() {
            continue;
        }
        if cfg.source.kind != SourceKind::Api {
            return Err(invalid(key, "only read when source.kind = \"api\""));
        }
        if ru.producer_sources.len() < 2 || ru.producer_sources.len() > MAX_STREAMS {
            return Err(invalid(
                key,
                format!(
                    "2 to {MAX_STREAMS} source ids, one per producer (a single producer needs \
                     none: its fragments carry the RU's source_id)"
                ),
            ));
        }
        for &id in &ru.producer_sources {
            if let Some(other) = sources.insert(id, key.clone()) {
                return Err(invalid(&key, format!("source id {id} is also in {other}")));
            }
        }
    }
    let largest = max_payload(cfg);
    if cfg.source.kind == SourceKind::Api && largest > MAX_FRAGMENT {
        return Err(invalid(
            "source.max_fragment",
            format!(
                "a super-fragment of the most producers of one RU could reach {largest} bytes, \
                 over the limit of {MAX_FRAGMENT}: lower it or use fewer producers per RU"
            ),
        ));
    }
    Ok(())
}
