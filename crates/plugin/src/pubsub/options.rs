//! How pub/sub sockets are made: their options (as structs, or parsed from `key=value`
//! text) and the tag-list parser.

use std::time::Duration;

use evb_messaging::pubsub::{PubSubError, PublisherConfig};

use super::{Delivery, SlowPolicy, TagRange, TransportKind, MAX_MESSAGE_LIMIT};
use crate::Error;

/// How a [`PubSocket`](super::PubSocket) is made.
#[derive(Debug, Clone)]
pub struct PubOptions {
    pub transport: TransportKind,
    /// Handshake run id: publisher and subscribers must agree.
    pub run_id: String,
    /// What to do with a subscriber that does not keep up.
    pub policy: SlowPolicy,
    /// A subscriber is slow while this many bytes wait for it
    /// ([`evb_messaging::pubsub::MAX_QUEUED_RANGE`]).
    pub max_queued: usize,
    /// Threads writing subscribers' sockets beside the publishing one (0..=16, default 0;
    /// see `PublisherConfig::send_threads`).
    pub send_threads: usize,
    /// Largest payload `publish` takes (1..=[`MAX_MESSAGE_LIMIT`]).
    pub max_message: usize,
    /// Policy `block`: how long `publish` waits for a slow subscriber before answering
    /// [`Error::Timeout`] (nothing sent). `None`: as long as it takes.
    pub block_timeout: Option<Duration>,
    /// `close`: how long to let subscribers take what is queued for them before the
    /// Goodbye.
    pub linger: Duration,
    /// Shared secret of the handshake; `None`: `EVB_SECRET` from the environment, if set.
    pub secret: Option<Vec<u8>>,
}

impl Default for PubOptions {
    fn default() -> Self {
        PubOptions {
            transport: TransportKind::Tcp,
            run_id: "pubsub".into(),
            policy: SlowPolicy::Block,
            max_queued: 4 << 20,
            send_threads: 0,
            max_message: 1 << 20,
            block_timeout: None,
            linger: Duration::from_secs(5),
            secret: None,
        }
    }
}

/// How a [`SubSocket`](super::SubSocket) is made.
#[derive(Debug, Clone)]
pub struct SubOptions {
    pub transport: TransportKind,
    /// Handshake run id: publishers and subscriber must agree.
    pub run_id: String,
    /// Each message on the wire at once (`Latency`) or packed into pages (`Throughput`).
    pub delivery: Delivery,
    /// Largest payload accepted (1..=[`MAX_MESSAGE_LIMIT`]); larger ones close the
    /// connection. Must be at least the publishers' `max_message`.
    pub max_message: usize,
    /// Shared secret of the handshake; `None`: `EVB_SECRET` from the environment, if set.
    pub secret: Option<Vec<u8>>,
}

impl Default for SubOptions {
    fn default() -> Self {
        SubOptions {
            transport: TransportKind::Tcp,
            run_id: "pubsub".into(),
            delivery: Delivery::Throughput,
            max_message: 1 << 20,
            secret: None,
        }
    }
}

/// `key=value` pairs separated by commas, semicolons or white space (empty: none).
fn pairs(text: &str) -> Result<Vec<(&str, &str)>, Error> {
    text.split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| Error::Setup(format!("option {item:?}: expected key=value")))
        })
        .collect()
}

fn number(key: &str, v: &str) -> Result<u64, Error> {
    v.parse::<u64>()
        .map_err(|_| Error::Setup(format!("option {key}={v:?}: not a whole number")))
}

fn check_max_message(n: usize) -> Result<(), Error> {
    if !(1..=MAX_MESSAGE_LIMIT).contains(&n) {
        return Err(Error::Setup(format!(
            "max_message {n} is outside 1..={MAX_MESSAGE_LIMIT}"
        )));
    }
    Ok(())
}

fn check_run_id(run_id: &str) -> Result<(), Error> {
    if run_id.is_empty() || run_id.len() > 64 {
        return Err(Error::Setup(format!(
            "run_id {run_id:?}: 1 to 64 characters"
        )));
    }
    Ok(())
}

fn millis(key: &str, v: &str) -> Result<Option<Duration>, Error> {
    if v == "-1" || v == "none" {
        return Ok(None);
    }
    let n = number(key, v)?;
    if n > 86_400_000 {
        return Err(Error::Setup(format!(
            "option {key}={n}: more than a day (86400000 ms)"
        )));
    }
    Ok(Some(Duration::from_millis(n)))
}

impl PubOptions {
    /// Options from `key=value` text (the C ABI's form): `transport` (tcp, shm), `run_id`,
    /// `policy` (block, drop, disconnect), `max_queued`, `send_threads`, `max_message`
    /// (bytes), `block_timeout_ms` (-1: none), `linger_ms`, `secret`. Keys not given keep
    /// their defaults.
    ///
    /// # Errors
    /// [`Error::Setup`] naming the key and the value at fault.
    pub fn parse(text: &str) -> Result<PubOptions, Error> {
        let mut o = PubOptions::default();
        for (k, v) in pairs(text)? {
            match k {
                "transport" => o.transport = v.parse()?,
                "run_id" => o.run_id = v.to_string(),
                "policy" => o.policy = v.parse().map_err(Error::Setup)?,
                "max_queued" => o.max_queued = number(k, v)? as usize,
                "send_threads" => o.send_threads = number(k, v)? as usize,
                "max_message" => o.max_message = number(k, v)? as usize,
                "block_timeout_ms" => o.block_timeout = millis(k, v)?,
                "linger_ms" => o.linger = millis(k, v)?.unwrap_or(Duration::ZERO),
                "secret" => o.secret = Some(v.as_bytes().to_vec()),
                other => {
                    return Err(Error::Setup(format!(
                        "unknown publisher option {other:?} (transport, run_id, policy, max_queued, send_threads, max_message, block_timeout_ms, linger_ms, secret)"
                    )))
                }
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// # Errors
    /// [`Error::Setup`] naming the option out of range.
    pub fn validate(&self) -> Result<(), Error> {
        check_run_id(&self.run_id)?;
        check_max_message(self.max_message)?;
        // the publisher's own ranges, checked where they are defined
        PublisherConfig {
            max_queued: self.max_queued,
            send_threads: self.send_threads,
            ..PublisherConfig::default()
        }
        .validate()
        .map_err(|e| match e {
            PubSubError::Config(why) => Error::Setup(why),
            other => Error::Setup(other.to_string()),
        })
    }
}

impl SubOptions {
    /// Options from `key=value` text (the C ABI's form): `transport` (tcp, shm), `run_id`,
    /// `delivery` (latency, throughput), `max_message` (bytes), `secret`.
    ///
    /// # Errors
    /// [`Error::Setup`] naming the key and the value at fault.
    pub fn parse(text: &str) -> Result<SubOptions, Error> {
        let mut o = SubOptions::default();
        for (k, v) in pairs(text)? {
            match k {
                "transport" => o.transport = v.parse()?,
                "run_id" => o.run_id = v.to_string(),
                "delivery" => o.delivery = parse_delivery(v)?,
                "max_message" => o.max_message = number(k, v)? as usize,
                "secret" => o.secret = Some(v.as_bytes().to_vec()),
                other => {
                    return Err(Error::Setup(format!(
                        "unknown subscriber option {other:?} (transport, run_id, delivery, max_message, secret)"
                    )))
                }
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// # Errors
    /// [`Error::Setup`] naming the option out of range.
    pub fn validate(&self) -> Result<(), Error> {
        check_run_id(&self.run_id)?;
        check_max_message(self.max_message)
    }
}

/// `latency` or `throughput`.
///
/// # Errors
/// [`Error::Setup`] for anything else.
pub fn parse_delivery(s: &str) -> Result<Delivery, Error> {
    match s {
        "latency" => Ok(Delivery::Latency),
        "throughput" => Ok(Delivery::Throughput),
        other => Err(Error::Setup(format!(
            "delivery {other:?}: expected latency or throughput"
        ))),
    }
}

/// Most items [`parse_tags`] takes.
pub const MAX_TAG_ITEMS: usize = 65_536;

/// Tags as text: a list of tags and ranges, `0,5,10-19` (white space allowed).
///
/// # Errors
/// [`Error::Setup`] naming the item at fault (not a u64, an empty range, no tags at all,
/// more than [`MAX_TAG_ITEMS`]).
pub fn parse_tags(s: &str) -> Result<Vec<TagRange>, Error> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        if out.len() >= MAX_TAG_ITEMS {
            return Err(Error::Setup(format!(
                "tags: more than {MAX_TAG_ITEMS} items"
            )));
        }
        let num = |x: &str| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| Error::Setup(format!("tags: {x:?} is not a tag (0..2^64)")))
        };
        let r = match item.split_once('-') {
            Some((a, b)) => TagRange {
                first: num(a)?,
                last: num(b)?,
            },
            None => TagRange::one(num(item)?),
        };
        if r.first > r.last {
            return Err(Error::Setup(format!("tags: range {item:?} is empty")));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err(Error::Setup(format!("tags {s:?}: no tags")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_tags_parse_and_name_what_is_wrong() {
        let o = PubOptions::parse(
            "transport=shm, policy=drop max_queued=8192;block_timeout_ms=50 send_threads=2",
        )
        .unwrap();
        assert_eq!(o.send_threads, 2);
        assert_eq!(o.transport, TransportKind::Shm);
        assert_eq!(o.policy, SlowPolicy::Drop);
        assert_eq!(o.max_queued, 8192);
        assert_eq!(o.block_timeout, Some(Duration::from_millis(50)));
        assert!(PubOptions::parse("").is_ok());
        let e = PubOptions::parse("policy=sometimes")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"sometimes\"") && e.contains("block, drop or disconnect"),
            "{e}"
        );
        let e = PubOptions::parse("max_queued=10").unwrap_err().to_string();
        assert!(e.contains("max_queued 10 is outside"), "{e}");
        let e = PubOptions::parse("send_threads=17")
            .unwrap_err()
            .to_string();
        assert!(e.contains("send_threads 17 is outside 0..=16"), "{e}");
        let e = PubOptions::parse("colour=blue").unwrap_err().to_string();
        assert!(e.contains("\"colour\""), "{e}");
        let e = PubOptions::parse("policy").unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
        let e = PubOptions::parse("max_message=x").unwrap_err().to_string();
        assert!(e.contains("max_message=\"x\""), "{e}");
        let s = SubOptions::parse("delivery=latency run_id=abc").unwrap();
        assert_eq!((s.delivery, s.run_id.as_str()), (Delivery::Latency, "abc"));
        let e = SubOptions::parse("transport=udp").unwrap_err().to_string();
        assert!(e.contains("\"udp\""), "{e}");
        assert_eq!(
            parse_tags(" 1, 5-7 ,18446744073709551615").unwrap(),
            vec![
                TagRange::one(1),
                TagRange { first: 5, last: 7 },
                TagRange::one(u64::MAX)
            ]
        );
        for (bad, says) in [
            ("", "no tags"),
            ("7-3", "empty"),
            ("x", "\"x\""),
            ("-1", "\"\""),
        ] {
            let e = parse_tags(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
