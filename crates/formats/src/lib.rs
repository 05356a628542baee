//! Data file formats, byte by byte in docs/formats.md:
//! - [`fed`]: the CMS common FED fragment format (recorded detector data in),
//! - [`framed`]: evb's generic framing of fragments for any other experiment,
//! - [`frames`]: timestamped frames as a front-end streams them (building by time),
//! - [`events`]: the files of built events a BU writes, with their metadata,
//! - `hdf5_events` (feature `hdf5`): the same events in HDF5 files,
//! - [`dune`]: DUNE's record headers byte by byte, and evb's records as DUNE's, which
//!   `hdf5_dune` (feature `hdf5`) writes with `sink.hdf5_layout = "dune"`,
//! - `hdf5_packed` (feature `hdf5`): the HDF5 layout small events afford, every event's
//!   bytes in one dataset and an index row per event (`sink.hdf5_layout = "packed"`),
//! - [`manifest`]: the run manifest, and completeness judged from the files,
//! - [`stream`]: fragments cut from a front-end's byte stream as it arrives.

mod crc_join;
pub mod dune;
pub mod events;
pub mod evidence;
pub mod fed;
mod file_crc;
pub mod framed;
pub mod frames;
mod gather_writer;
#[cfg(feature = "hdf5")]
pub mod hdf5_dune;
#[cfg(feature = "hdf5")]
pub mod hdf5_events;
#[cfg(feature = "hdf5")]
pub mod hdf5_packed;
pub mod manifest;
pub mod stream;

/// A run id as the start of its files' names (`<stem>_bu<i>_<seq>.evb`, `<stem>.manifest.json`):
/// letters, digits, `_`, `-` and `.` kept, anything else `_`, as the run folders and run
/// records name it. Under `evb up` a run id is `<id>#<run>`: a `#` in a file name needs
/// quoting in shells and URLs, and a `/` would leave the folder.
pub fn run_stem(run: &str) -> String {
    evb_config::safe_file_name(run)
}
mod zstd_pipe;

#[cfg(test)]
mod tests;
