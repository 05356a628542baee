//! Data file formats, byte by byte in docs/formats.md:
//! - [`fed`]: the CMS common FED fragment format (recorded detector data in),
//! - [`framed`]: evb's generic framing of fragments for any other experiment,
//! - [`events`]: the files of built events a BU writes, with their metadata,
//! - [`stream`]: fragments cut from a front-end's byte stream as it arrives.

pub mod events;
pub mod fed;
pub mod framed;
pub mod stream;

#[cfg(test)]
mod tests;
