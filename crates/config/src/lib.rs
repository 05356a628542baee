//! The declarative description of a run: a TOML file, parsed with unknown keys refused and
//! then validated, so every mistake comes back as an error that names the key.
//!
//! Nodes are listed one by one (`[[ru]]`, `[[bu]]`, for a multi-host deployment) or made
//! from counts (`[topology] rus = 2, bus = 2`, for a local test system).
//!
//! One idea a file: `schema` (the sections and their defaults), `net` (the addresses and
//! networks a configuration names), [`limits`] (the range of every number), `validate` (the
//! checks, each naming its key), `topology` (the nodes and where they listen), `memory` (the
//! pools the nodes make, against the host's memory), `stream` and `api` (the checks of the
//! stream and plug-in sources); this file reads and writes a configuration.

use thiserror::Error;

mod api;
pub mod duration;
/// The range of every number in a configuration, checked by [`Config::validate`] (the table
/// in `default.toml` and docs/operations/configuration.md lists the same). Bounds keep every
/// value that passes validation clear of overflows and panics in the nodes (durations, pool sizes,
/// ports), with room to spare for any real run.
pub mod limits;
mod memory;
mod net;
mod schema;
mod stream;
mod time;
mod topology;
mod validate;
pub use api::API_PREFIX_LEN;

/// Message and fragment headers in front of every fragment on the wire (as `evb-wire`
/// writes them: 8 + 32 bytes; `evb-node` checks the two agree).
pub const FRAGMENT_PREFIX_BYTES: u64 = 40;
#[cfg(test)]
mod tests;

pub use memory::{HostMemory, PoolPlan};
pub use net::{AllowedNet, Interface};
pub use schema::{
    Assignment, BuSection, BufferSection, BuildBy, BuilderSection, Compress, Config, Content,
    ControlSection, Distribution, EvmSection, FragmentSection, FramesSection, Hdf5Layout,
    MessagingSection, OnError, Placement, Priority, RuLossPolicy, RuSection, RunSection, Shaping,
    SinkKind, SinkSection, SourceKind, SourceSection, TopologySection, TrafficSection,
    TransportKind, TransportSection, VerifyLevel, WindowsSection, MAX_CPUS,
};
pub use stream::{OnSyncLoss, StreamFormat};
pub use topology::{host_of, NodeSpec, Role};
use validate::{int_in, real_in};
pub use validate::{weak_secret, SECRET_MIN_CHARS, SECRET_MIN_DISTINCT};

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    /// Bad TOML, an unknown key, or a value of the wrong type (the message names the key).
    #[error("{0}")]
    Parse(String),
    #[error("invalid configuration: `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// The default configuration as a commented TOML file (`evb config default`).
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// Largest single fragment accepted in a configuration.
pub const MAX_FRAGMENT: u64 = limits::MAX_FRAGMENT;

impl Config {
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg = Config::parse_unvalidated(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses without validating: for a configuration that is completed before it is
    /// validated (a node puts its own secret into the one its EVM sent).
    pub fn parse_unvalidated(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string().trim_end().to_string()))
    }

    /// Reads a file; relative paths in it (`[[ru]] files`, `sink.dir`, `run.records_dir`) are taken relative
    /// to the file's own directory.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut cfg = Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })?;
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let base = std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf());
        let rebase = |p: &mut String| {
            if !p.is_empty() && std::path::Path::new(p.as_str()).is_relative() {
                *p = base.join(p.as_str()).display().to_string();
            }
        };
        for ru in &mut cfg.ru {
            ru.files.iter_mut().for_each(rebase);
        }
        rebase(&mut cfg.sink.dir);
        rebase(&mut cfg.run.records_dir);
        Ok(cfg)
    }

    /// Run `run`'s output folder: `sink.dir` with `{run}` as the run number in six digits
    /// and `{run_id}` as the run id (characters outside `[A-Za-z0-9_.-]` as `_`), so that
    /// `dir = "out/{run}"` gives every run a folder of its own. `None` when `sink.dir` has
    /// neither: the files of every run go to `sink.dir` itself.
    pub fn run_folder(&self, run_id: &str, run: u64) -> Option<String> {
        let dir = &self.sink.dir;
        (dir.contains(RUN_PLACEHOLDER) || dir.contains(RUN_ID_PLACEHOLDER)).then(|| {
            dir.replace(RUN_ID_PLACEHOLDER, &safe_file_name(run_id))
                .replace(RUN_PLACEHOLDER, &format!("{run:06}"))
        })
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a Config always serialises")
    }

    /// Permission bits of the event files a BU writes: with a secret, only the run's user
    /// (0o600) or its group too (0o640, `sink.file_group_read`); without one, as the umask
    /// has it (0o666 less the umask).
    pub fn output_file_mode(&self) -> u32 {
        match (self.secret().is_some(), self.sink.file_group_read) {
            (false, _) => 0o666,
            (true, false) => 0o600,
            (true, true) => 0o640,
        }
    }

    /// The shared secret in force: EVB_SECRET if set, else `run.secret`; `None` if neither.
    pub fn secret(&self) -> Option<String> {
        match std::env::var("EVB_SECRET") {
            Ok(s) if !s.is_empty() => Some(s),
            _ => (!self.run.secret.is_empty()).then(|| self.run.secret.clone()),
        }
    }
}

/// `name` with every character outside `[A-Za-z0-9_.-]` as `_`, and never `.` or `..`: a
/// run id made safe to name a file or folder.
pub fn safe_file_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.chars().all(|c| c == '.') {
        safe.replace('.', "_") + "_"
    } else {
        safe
    }
}

/// In `sink.dir`: the run number (six digits).
pub const RUN_PLACEHOLDER: &str = "{run}";
/// In `sink.dir`: the run id, made safe for a file name.
pub const RUN_ID_PLACEHOLDER: &str = "{run_id}";
