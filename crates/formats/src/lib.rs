//! Data file formats, byte by byte in docs/formats.md:
//! - [`fed`]: the CMS common FED fragment format (recorded detector data in),
//! - [`framed`]: evb's generic framing of fragments for any other experiment,
//! - [`events`]: the files of built events a BU writes, with their metadata.

pub mod events;
pub mod fed;
pub mod framed;

#[cfg(test)]
mod tests;
