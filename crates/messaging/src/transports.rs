//! Transports opened by kind name, one place for every program that picks its transport
//! from a configuration or a flag.

use evb_transport::inproc::InprocTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::{Transport, TransportConfig};

/// Opens a transport of one kind: the configuration, and the libfabric provider (ofi only).
type Open = fn(TransportConfig, &str) -> Result<Box<dyn Transport>, String>;

/// Every transport, by the name a configuration or a flag gives it, with its constructor:
/// one table, so a kind is added in one row (docs/architecture.md, "Adding a transport").
/// `mptcp` is tcp over Multipath TCP sockets (`transport.multipath`: every rail the hosts
/// share).
pub const TRANSPORTS: [(&str, Open); 5] = [
    ("tcp", |cfg, _| {
        Ok(Box::new(TcpTransport::new(cfg).map_err(|e| e.to_string())?))
    }),
    ("mptcp", |cfg, _| {
        Ok(Box::new(
            TcpTransport::multipath(cfg).map_err(|e| e.to_string())?,
        ))
    }),
    ("inproc", |cfg, _| Ok(Box::new(InprocTransport::new(cfg)))),
    ("shm", |cfg, _| {
        evb_transport::shm::ShmTransport::new(cfg).map_err(|e| e.to_string())
    }),
    ("ofi", |cfg, provider| {
        evb_transport::ofi::OfiTransport::new(cfg, provider).map_err(|e| e.to_string())
    }),
];

/// The kind names [`open_transport`] takes, in the table's order.
pub const TRANSPORT_KINDS: [&str; 5] = {
    let mut names = [""; 5];
    let mut i = 0;
    while i < TRANSPORTS.len() {
        names[i] = TRANSPORTS[i].0;
        i += 1;
    }
    names
};

/// A transport of `kind` (a name of [`TRANSPORTS`]); `ofi_provider` is libfabric's
/// provider for "ofi" ("" for the best available; the other kinds ignore it).
///
/// # Errors
/// The transport's own reason it cannot start (without the kind's name, which the caller
/// adds as it words its errors), or an unknown kind.
pub fn open_transport(
    kind: &str,
    cfg: TransportConfig,
    ofi_provider: &str,
) -> Result<Box<dyn Transport>, String> {
    match TRANSPORTS.iter().find(|(name, _)| *name == kind) {
        Some((_, open)) => open(cfg, ofi_provider),
        None => Err(format!(
            "transport {kind:?}: expected one of {}",
            TRANSPORT_KINDS.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_buffers::Pool;
    use evb_wire::{Channel, Hello, Role};

    fn cfg() -> TransportConfig {
        TransportConfig {
            run_id: "r".into(),
            local: Hello::new(Channel::Data, Role::Ru, 0, "r", "n"),
            max_frame: 1 << 16,
            rx_pool: Pool::new("n", 1 << 16, 4),
            secret: None,
        }
    }

    #[test]
    fn kinds_are_opened_by_name_and_an_unknown_one_is_named() {
        for kind in ["tcp", "inproc"] {
            assert!(open_transport(kind, cfg(), "").is_ok(), "{kind}");
        }
        let e = open_transport("udp", cfg(), "").err().unwrap();
        assert!(
            e.contains("\"udp\"") && e.contains("tcp, inproc, shm, ofi"),
            "{e}"
        );
    }
}
