//! The `shm` transport: processes on one host. Not built yet.

use crate::{TransportConfig, TransportError};

pub struct ShmTransport;

impl ShmTransport {
    pub fn new(_cfg: TransportConfig) -> Result<Box<dyn crate::Transport>, TransportError> {
        Err(TransportError::Unavailable(
            "the shm transport is not implemented yet".into(),
        ))
    }
}
