//! The `ofi` transport: libfabric connected message endpoints (FI_EP_MSG).
//!
//! libfabric is loaded at run time (`libfabric.so.1`, or the library named by the
//! `EVB_LIBFABRIC` environment variable), never linked: a machine without it runs every other
//! transport, and choosing `ofi` there fails with a clear error. The data-path calls go
//! through a small C shim (csrc/evb_ofi.c) compiled against libfabric's headers when they are
//! present at build time (Debian: `libfabric-dev`); without them the crate builds and `new`
//! says so.
//!
//! The receive pool is registered once; receives are whole pool blocks posted per connection;
//! one completion queue and one event queue are driven from `poll`. Frames, sequence numbers,
//! the handshake and the optional shared secret are those of `tcp` (docs/protocol.md); see
//! docs/transports.md for the design.

#[cfg(not(evb_ofi_stub))]
mod imp;
#[cfg(not(evb_ofi_stub))]
mod sys;

use thiserror::Error;

use crate::{TransportConfig, TransportError};

/// Why libfabric, or the `ofi` transport on it, is not available or failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OfiError {
    #[error(
        "evb was built without libfabric headers, so the ofi transport is not available: \
         install libfabric-dev (Debian) and rebuild"
    )]
    NotBuilt,
    /// The library did not load (what the loader said).
    #[error(
        "libfabric not found ({0}): install libfabric1 (Debian: apt-get install \
         libfabric1) or choose another transport"
    )]
    NotFound(Box<OfiError>),
    /// A provider with datagram endpoints only, asked for the connected endpoints evb uses.
    #[error(
        "{reason}; the {provider} provider offers only reliable-datagram (FI_EP_RDM) \
         endpoints, and evb's ofi transport uses connected ones: use tcp here, verbs on \
         InfiniBand/RoCE, or evb's own shm transport"
    )]
    DatagramOnly {
        provider: String,
        reason: Box<OfiError>,
    },
    #[error("{0:?} contains a NUL byte")]
    Nul(String),
    #[error("out of memory")]
    OutOfMemory,
    /// What libfabric (or evb's shim around it) said.
    #[error("{0}")]
    Libfabric(String),
}

/// The library loaded unless `EVB_LIBFABRIC` names another.
pub const LIBFABRIC: &str = "libfabric.so.1";

pub struct OfiTransport;

impl OfiTransport {
    /// An `ofi` transport on `provider` ("" for the best available: libfabric's own order,
    /// so `verbs` where there is InfiniBand or RoCE).
    #[allow(clippy::new_ret_no_self)] // the node builds every transport as a `Box<dyn Transport>`
    pub fn new(
        cfg: TransportConfig,
        provider: &str,
    ) -> Result<Box<dyn crate::Transport>, TransportError> {
        let chosen = probe(provider).map_err(|e| TransportError::Unavailable(e.to_string()))?;
        #[cfg(not(evb_ofi_stub))]
        {
            let _ = &chosen;
            Ok(Box::new(imp::Ofi::new(cfg, provider.to_string())?))
        }
        #[cfg(evb_ofi_stub)]
        {
            let _ = (cfg, chosen);
            unreachable!("probe fails in a build without libfabric")
        }
    }
}

/// Whether the `ofi` transport can run here with `provider`: the provider libfabric would use,
/// or why not (no headers at build time, no libfabric at run time, no such provider).
pub fn probe(provider: &str) -> Result<String, OfiError> {
    #[cfg(evb_ofi_stub)]
    {
        let _ = provider;
        Err(OfiError::NotBuilt)
    }
    #[cfg(not(evb_ofi_stub))]
    {
        let lib = std::env::var("EVB_LIBFABRIC").unwrap_or_else(|_| LIBFABRIC.to_string());
        sys::load(&lib).map_err(|e| OfiError::NotFound(Box::new(e)))?;
        sys::check(provider).map_err(|e| {
            if provider == "shm" || provider == "udp" {
                OfiError::DatagramOnly {
                    provider: provider.to_string(),
                    reason: Box::new(e),
                }
            } else {
                e
            }
        })
    }
}

#[cfg(all(test, not(evb_ofi_stub)))]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        // Even after the real library has loaded (other tests, or this line), a name that
        // does not load is an error.
        let _ = sys::load(LIBFABRIC);
        let e = sys::load("libfabric-that-does-not-exist.so.9").unwrap_err();
        assert!(
            e.to_string().contains("libfabric-that-does-not-exist"),
            "{e}"
        );
    }

    #[test]
    fn unknown_provider_is_refused() {
        if probe("").is_err() {
            eprintln!("libfabric unavailable: skipped");
            return;
        }
        let e = probe("no-such-provider").unwrap_err();
        assert!(e.to_string().contains("no-such-provider"), "{e}");
        let e = probe("shm").unwrap_err();
        assert!(e.to_string().contains("FI_EP_RDM"), "{e}");
    }
}
