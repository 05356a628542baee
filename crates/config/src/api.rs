//! The keys of the plug-in API (`source.kind = "api"`, `sink = "api"`) and their checks: a
//! producer writes each fragment into one pool block, headers included, so the largest
//! fragment must fit in a block.

use crate::{invalid, Config, ConfigError, SourceKind};

/// Message and fragment headers in front of every fragment in its block.
pub const API_PREFIX_LEN: u64 = crate::FRAGMENT_PREFIX_BYTES;

pub(crate) fn validate(cfg: &Config) -> Result<(), ConfigError> {
    let s = &cfg.source;
    if s.kind != SourceKind::Api {
        return Ok(());
    }
    if s.looped {
        return Err(invalid(
            "source.loop",
            "only for file sources: an API source ends when its producer finishes",
        ));
    }
    let block = cfg.buffers.block_size;
    if s.max_fragment.saturating_add(API_PREFIX_LEN) > block {
        return Err(invalid(
            "source.max_fragment",
            format!(
                "with source.kind = \"api\" a fragment and its {API_PREFIX_LEN} header bytes \
                 are written into one pool block: at most buffers.block_size - {API_PREFIX_LEN} \
                 = {} bytes (or raise buffers.block_size)",
                block.saturating_sub(API_PREFIX_LEN)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{Config, SinkKind, SourceKind};

    fn api() -> Config {
        let mut c = Config::default();
        c.source.kind = SourceKind::Api;
        c.source.max_fragment = 4096;
        c.run.duration_s = 0.0;
        c
    }

    /// Only the configuration: that a run with an API source ends when its producer finishes
    /// is shown by a real run in crates/cli/tests/plugin.rs
    /// (`rust_producer_feeds_an_ru_in_a_multi_process_run`: no event count, the run ends
    /// with exactly the producer's events).
    #[test]
    fn an_api_source_and_an_api_sink_need_no_ru_entries() {
        api().validate().unwrap();
        let mut c = api();
        c.sink.kind = SinkKind::Api;
        c.validate().unwrap();
    }

    #[test]
    fn a_fragment_must_fit_in_one_block_with_its_headers() {
        let mut c = api();
        c.source.max_fragment = c.buffers.block_size - 39;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("source.max_fragment") && e.contains("block_size"),
            "{e}"
        );
        c.source.max_fragment -= 1;
        c.validate().unwrap();
    }

    #[test]
    fn an_api_source_does_not_loop() {
        let mut c = api();
        c.source.looped = true;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("source.loop"), "{e}");
    }
}
