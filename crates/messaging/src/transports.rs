//! Transports opened by kind name, one place for every program that picks its transport
//! from a configuration or a flag.

use evb_transport::inproc::InprocTransport;
use evb_transport::tcp::TcpTransport;
use evb_transport::{Transport, TransportConfig};

/// The kind names [`open_transport`] takes.
pub const TRANSPORT_KINDS: [&str; 5] = ["tcp", "mptcp", "inproc", "shm", "ofi"];

/// A transport of `kind`: "tcp", "mptcp" (tcp over Multipath TCP sockets: every rail the
/// hosts share), "inproc", "shm", or "ofi" on libfabric provider `ofi_provider` ("" for the
/// best available; the other kinds ignore it).
///
/// # Errors
/// The transport's own reason it cannot start (without the kind's name, which the caller
/// adds as it words its errors), or an unknown kind.
pub fn open_transport(
    kind: &str,
    cfg: TransportConfig,
    ofi_provider: &str,
) -> Result<Box<dyn Transport>, String> {
    match kind {
        "tcp" => Ok(Box::new(TcpTransport::new(cfg).map_err(|e| e.to_string())?)),
        "mptcp" => Ok(Box::new(
            TcpTransport::multipath(cfg).map_err(|e| e.to_string())?,
        )),
        "inproc" => Ok(Box::new(InprocTransport::new(cfg))),
        "shm" => evb_transport::shm::ShmTransport::new(cfg).map_err(|e| e.to_string()),
        "ofi" => {
            evb_transport::ofi::OfiTransport::new(cfg, ofi_provider).map_err(|e| e.to_string())
        }
        other => Err(format!(
            "transport {other:?}: expected one of {}",
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
