//! The `ofi` transport: libfabric. Not built yet.

use crate::{TransportConfig, TransportError};

pub struct OfiTransport;

impl OfiTransport {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        _cfg: TransportConfig,
        _provider: &str,
    ) -> Result<Box<dyn crate::Transport>, TransportError> {
        Err(TransportError::Unavailable(
            "the ofi transport is not implemented yet".into(),
        ))
    }
}
