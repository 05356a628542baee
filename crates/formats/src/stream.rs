//! Fragments read from a byte stream (a front-end's TCP connection), as they arrive: bytes go
//! in in pieces of any size, whole fragments come out, each checked as playback checks a
//! file's (docs/formats.md §1 and §2). No sockets here: the caller reads and pushes.
//!
//! A fragment that fails a check (CRC, header marker, source id) comes out with the reason,
//! for the caller's `on_error` policy; bytes that cannot be cut into fragments at all (no
//! FED trailer within `max_fragment`, a damaged framed header, a stream closed inside a
//! fragment) are a [`StreamError`]: nothing after them can be trusted.

use std::io::Read;

use bytes::{Bytes, BytesMut};
use thiserror::Error;

use crate::{fed, framed, frames};

/// How fragments are framed on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// CMS common FED fragments back to back (what a FEROL sends).
    Fed,
    /// evb framed records back to back.
    Framed,
    /// Timestamped frames back to back, each with its prefix ([`crate::frames`]).
    Frames,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StreamError {
    #[error("at byte {offset}: {reason}")]
    Unreadable { offset: u64, reason: String },
    #[error("closed at byte {end} inside a fragment: {pending} bytes from byte {offset} without its end")]
    Truncated {
        offset: u64,
        pending: usize,
        end: u64,
    },
}

/// One fragment cut from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFragment {
    /// FED: the LV1 id; framed: the record's trigger number.
    pub trigger_number: u32,
    /// FED: the whole fragment; framed: the record's payload (what playback keeps). A share
    /// of the buffer the stream was read into: no copy, no allocation of its own.
    pub bytes: Bytes,
    /// Byte offset of the fragment in the stream.
    pub offset: u64,
    /// Why it failed its checks (`None`: valid).
    pub bad: Option<String>,
}

/// Cuts a stream into fragments. Holds at most one unfinished fragment (≤ `max_fragment`
/// plus one read) and what was read past it.
pub struct StreamDecoder {
    format: StreamFormat,
    max_fragment: usize,
    expected_source: Option<u16>,
    /// The bytes received and not yet cut (`buf[..end]`, from the unfinished fragment's first
    /// byte), then zeroed room for the next reads. A whole fragment is split off the front
    /// and shares this allocation until its last holder drops it: the bytes are copied once,
    /// by the kernel, until the RU writes them into its pool.
    buf: BytesMut,
    /// End of the bytes received in `buf`.
    end: usize,
    /// FED: words of the unfinished fragment already searched for its trailer.
    scanned: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
}

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 << 10;
/// Bytes of a fresh read buffer: one allocation serves this much of the stream.
const BUF_CHUNK: usize = 1 << 20;

impl StreamDecoder {
    /// `expected_source`: FED fragments must carry this source id (`source.check_source_id`).
    pub fn new(format: StreamFormat, max_fragment: usize, expected_source: Option<u16>) -> Self {
        StreamDecoder {
            format,
            max_fragment,
            expected_source,
            buf: BytesMut::new(),
            end: 0,
            scanned: 0,
            base: 0,
        }
    }

    /// Bytes received and not yet cut into fragments.
    pub fn pending(&self) -> usize {
        self.end
    }

    /// Stream offset of the next byte to arrive.
    pub fn position(&self) -> u64 {
        self.base + self.end as u64
    }

    /// Makes room for one more read at the end of the buffer: when too little is left, a
    /// fresh zeroed buffer takes the unfinished fragment (the old one lives on in the
    /// fragments cut from it until they are dropped).
    fn spare(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < READ_CHUNK {
            let mut fresh = BytesMut::zeroed(BUF_CHUNK.max(self.end + READ_CHUNK));
            fresh[..self.end].copy_from_slice(&self.buf[..self.end]);
            self.buf = fresh;
        }
        &mut self.buf[self.end..]
    }

    /// Cuts the first `len` received bytes off the buffer.
    fn take(&mut self, len: usize) -> Bytes {
        self.base += len as u64;
        self.end -= len;
        self.scanned = 0;
        self.buf.split_to(len).freeze()
    }

    /// Appends `bytes` as if they had been read.
    pub fn push(&mut self, bytes: &[u8]) {
        for piece in bytes.chunks(READ_CHUNK) {
            self.spare()[..piece.len()].copy_from_slice(piece);
            self.end += piece.len();
        }
    }

    /// One `read` from `r` straight into the buffer; `Ok(0)` is the end of the stream.
    pub fn read_from(&mut self, r: &mut impl Read) -> std::io::Result<usize> {
        let n = r.read(self.spare())?;
        self.end += n;
        Ok(n)
    }

    /// The next whole fragment, `Ok(None)` until more bytes arrive.
    pub fn next_fragment(&mut self) -> Result<Option<StreamFragment>, StreamError> {
        match self.format {
            StreamFormat::Fed => self.next_fed(),
            StreamFormat::Framed => self.next_framed(),
            StreamFormat::Frames => self.next_frame(),
        }
    }

    /// The stream ended: an error if it ended inside a fragment.
    pub fn finish(&self) -> Result<(), StreamError> {
        match self.pending() {
            0 => Ok(()),
            pending => Err(StreamError::Truncated {
                offset: self.base,
                pending,
                end: self.position(),
            }),
        }
    }

    fn unreadable(&self, reason: String) -> StreamError {
        StreamError::Unreadable {
            offset: self.base,
            reason,
        }
    }

    fn next_fed(&mut self) -> Result<Option<StreamFragment>, StreamError> {
        let avail = self.end / 8;
        // The trailer is the first word (after the header) whose length field is its place.
        let from = self.scanned.max(1);
        let found = self.buf[..avail * 8]
            .chunks_exact(8)
            .enumerate()
            .skip(from)
            .find(|&(w, word)| fed::is_trailer_at(word.try_into().expect("8 bytes"), w))
            .map(|(w, _)| (w, (w + 1) * 8));
        let w = match found {
            Some((_, len)) if len <= self.max_fragment => {
                let offset = self.base;
                let frag = &self.buf[..len];
                let (trigger_number, bad) =
                    match fed::validate(frag, offset as usize, self.expected_source) {
                        Ok(info) => (info.lv1_id, None),
                        Err(e) => (fed::header_lv1(frag).unwrap_or(0), Some(e.to_string())),
                    };
                let bytes = self.take(len);
                return Ok(Some(StreamFragment {
                    trigger_number,
                    bytes,
                    offset,
                    bad,
                }));
            }
            // a trailer, but the fragment would be longer than allowed
            Some((w, _)) => w,
            None => avail.max(from),
        };
        self.scanned = w;
        if w * 8 >= self.max_fragment {
            return Err(self.unreadable(format!(
                "no FED trailer within {} bytes (source.max_fragment): not a stream of FED \
                 fragments, or a fragment larger than the limit",
                self.max_fragment
            )));
        }
        Ok(None)
    }

    fn next_framed(&mut self) -> Result<Option<StreamFragment>, StreamError> {
        let avail = &self.buf[..self.end];
        if avail.len() < framed::RECORD_HEADER_LEN {
            return Ok(None);
        }
        let offset = self.base;
        let h = framed::read_header(avail, offset as usize).map_err(|e| match e {
            framed::FramedError::Bad { reason, .. } => self.unreadable(reason),
            other => self.unreadable(other.to_string()),
        })?;
        if h.payload_len > self.max_fragment {
            return Err(self.unreadable(format!(
                "record of {} bytes exceeds source.max_fragment ({})",
                h.payload_len, self.max_fragment
            )));
        }
        let total = framed::RECORD_HEADER_LEN + h.payload_len;
        if avail.len() < total {
            return Ok(None);
        }
        let payload = &avail[framed::RECORD_HEADER_LEN..total];
        let bad = framed::check_payload(&h, payload, offset as usize).map(|e| e.to_string());
        let bytes = self.take(total).slice(framed::RECORD_HEADER_LEN..);
        Ok(Some(StreamFragment {
            trigger_number: h.trigger_number,
            bytes,
            offset,
            bad,
        }))
    }
}

impl StreamDecoder {
    /// A frame: `bytes` its header and payload (the prefix cut off), `trigger_number` the
    /// low word of its first tick; a CRC that does not match is `bad`. A prefix that is not
    /// one, or a frame longer than `max_fragment`, leaves nothing after it to trust.
    fn next_frame(&mut self) -> Result<Option<StreamFragment>, StreamError> {
        let avail = &self.buf[..self.end];
        let Some(prefix) = avail.first_chunk::<{ frames::FRAME_PREFIX_LEN }>() else {
            return Ok(None);
        };
        let len = frames::read_prefix(prefix).map_err(|e| self.unreadable(e.to_string()))?;
        if len > self.max_fragment {
            return Err(self.unreadable(format!(
                "frame of {len} bytes exceeds source.max_fragment ({})",
                self.max_fragment
            )));
        }
        let total = frames::FRAME_PREFIX_LEN + len;
        if avail.len() < total {
            return Ok(None);
        }
        let offset = self.base;
        let (trigger_number, bad) = match frames::check(&avail[frames::FRAME_PREFIX_LEN..total]) {
            Ok(h) => (h.begin as u32, None),
            Err(e) => (0, Some(e.to_string())),
        };
        let bytes = self.take(total).slice(frames::FRAME_PREFIX_LEN..);
        Ok(Some(StreamFragment {
            trigger_number,
            bytes,
            offset,
            bad,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed_stream(n: u32) -> Vec<u8> {
        (1..=n)
            .flat_map(|i| fed::build(i, 841, &vec![i as u64 * 0x0101; (i % 5) as usize]))
            .collect()
    }

    fn drain(d: &mut StreamDecoder, out: &mut Vec<StreamFragment>) {
        while let Some(f) = d.next_fragment().unwrap() {
            out.push(f);
        }
    }

    /// Every way of cutting the stream into reads gives the same fragments.
    fn decode_in_pieces(format: StreamFormat, data: &[u8], piece: usize) -> Vec<StreamFragment> {
        let mut d = StreamDecoder::new(format, 1 << 20, Some(841));
        let mut out = Vec::new();
        for p in data.chunks(piece) {
            d.push(p);
            drain(&mut d, &mut out);
        }
        d.finish().unwrap();
        out
    }

    #[test]
    fn fed_fragments_come_out_whole_whatever_the_reads() {
        let data = fed_stream(40);
        let whole = decode_in_pieces(StreamFormat::Fed, &data, data.len());
        assert_eq!(whole.len(), 40);
        assert_eq!(
            whole.iter().map(|f| f.trigger_number).collect::<Vec<_>>(),
            (1..=40).collect::<Vec<_>>()
        );
        assert!(whole.iter().all(|f| f.bad.is_none()));
        assert_eq!(
            whole.iter().map(|f| f.bytes.len()).sum::<usize>(),
            data.len()
        );
        for piece in [1, 3, 7, 8, 9, 24, 100, 4095] {
            assert_eq!(
                decode_in_pieces(StreamFormat::Fed, &data, piece),
                whole,
                "{piece}"
            );
        }
    }

    /// A fragment is a share of the buffer its bytes were read into (the next one follows
    /// it in the same allocation: no copy), and fragments held across many buffer renewals
    /// keep their bytes.
    #[test]
    fn fragments_share_the_read_buffer_and_outlive_it() {
        let n = 120_000;
        let data = fed_stream(n); // about 3.8 MB: several fresh buffers
        assert!(data.len() > 3 * BUF_CHUNK);
        let mut d = StreamDecoder::new(StreamFormat::Fed, 1 << 20, Some(841));
        let mut out = Vec::new();
        for p in data.chunks(50_000) {
            d.push(p);
            drain(&mut d, &mut out);
        }
        assert_eq!(out.len(), n as usize);
        let adjacent = out
            .windows(2)
            .filter(|w| w[0].bytes.as_ptr_range().end == w[1].bytes.as_ptr())
            .count();
        // all but those that start a fresh buffer
        assert!(
            adjacent >= out.len() - 10,
            "only {adjacent} fragments follow their predecessor"
        );
        let joined: Vec<u8> = out.iter().flat_map(|f| f.bytes.iter().copied()).collect();
        assert_eq!(joined, data);
        let offsets: Vec<u64> = out.iter().map(|f| f.offset).collect();
        let mut at = 0u64;
        for (f, off) in out.iter().zip(offsets) {
            assert_eq!(off, at);
            at += f.bytes.len() as u64;
        }
    }

    #[test]
    fn framed_records_come_out_whole_whatever_the_reads() {
        let data: Vec<u8> = (0..30u32)
            .flat_map(|i| framed::encode(i + 100, &vec![i as u8; i as usize * 13]))
            .collect();
        let whole = decode_in_pieces(StreamFormat::Framed, &data, data.len());
        assert_eq!(whole.len(), 30);
        assert_eq!(whole[7].trigger_number, 107);
        assert_eq!(whole[7].bytes, vec![7u8; 91]);
        for piece in [1, 5, 23, 24, 25, 1000] {
            assert_eq!(
                decode_in_pieces(StreamFormat::Framed, &data, piece),
                whole,
                "{piece}"
            );
        }
    }

    #[test]
    fn frames_come_out_whole_whatever_the_reads() {
        let data: Vec<u8> = (0..30u64)
            .flat_map(|i| frames::encode(i * 10, i * 10 + 10, 3, 0, &vec![i as u8; i as usize * 7]))
            .collect();
        let whole = decode_in_pieces(StreamFormat::Frames, &data, data.len());
        assert_eq!(whole.len(), 30);
        assert!(whole.iter().all(|f| f.bad.is_none()));
        assert_eq!(whole[7].trigger_number, 70);
        assert_eq!(&whole[7].bytes[24..], &[7u8; 49][..]);
        for piece in [1, 5, 8, 23, 24, 25, 1000] {
            assert_eq!(
                decode_in_pieces(StreamFormat::Frames, &data, piece),
                whole,
                "{piece}"
            );
        }
        // a damaged payload is one bad frame; a damaged prefix ends the stream
        let mut bad = data.clone();
        bad[32 + 8] ^= 1; // frame 0 is 32 bytes (empty payload): frame 1's first tick
        let out = decode_in_pieces(StreamFormat::Frames, &bad, 9);
        assert!(
            out[1].bad.as_deref().unwrap().contains("CRC"),
            "{:?}",
            out[1].bad
        );
        let mut bad = data;
        bad[0] = b'X';
        let mut d = StreamDecoder::new(StreamFormat::Frames, 1 << 20, None);
        d.push(&bad);
        assert!(d.next_fragment().is_err());
    }

    #[test]
    fn a_bad_crc_marks_one_fragment_and_the_next_is_read() {
        let mut data = fed_stream(3);
        let first = fed::build(1, 841, &[1; 1]).len();
        data[first + 8] ^= 0x40; // payload word of fragment 2
        let out = decode_in_pieces(StreamFormat::Fed, &data, 5);
        assert_eq!(out.len(), 3);
        assert!(out[0].bad.is_none() && out[2].bad.is_none());
        let why = out[1].bad.as_deref().unwrap();
        assert!(why.contains("CRC"), "{why}");
        assert_eq!(out[1].trigger_number, 2);
    }

    #[test]
    fn a_wrong_source_id_is_reported() {
        let data = fed::build(1, 842, &[0; 3]);
        let out = decode_in_pieces(StreamFormat::Fed, &data, 4);
        assert!(out[0].bad.as_deref().unwrap().contains("source id 842"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let junk: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut d = StreamDecoder::new(StreamFormat::Fed, 64 << 10, None);
        let mut err = None;
        for p in junk.chunks(1000) {
            d.push(p);
            match d.next_fragment() {
                Ok(_) => {}
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let e = err.expect("garbage must be refused").to_string();
        assert!(e.contains("no FED trailer within 65536 bytes"), "{e}");

        let mut d = StreamDecoder::new(StreamFormat::Framed, 1 << 20, None);
        d.push(&junk[..100]);
        let e = d.next_fragment().unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
    }

    #[test]
    fn a_stream_closed_inside_a_fragment_is_truncated() {
        let data = fed_stream(2);
        let mut d = StreamDecoder::new(StreamFormat::Fed, 1 << 20, None);
        d.push(&data[..data.len() - 3]);
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        assert_eq!(out.len(), 1);
        let e = d.finish().unwrap_err();
        assert!(matches!(e, StreamError::Truncated { .. }), "{e}");
        assert!(e.to_string().contains("inside a fragment"), "{e}");
    }

    #[test]
    fn reads_from_a_reader_in_small_pieces() {
        /// A reader that hands out at most 3 bytes per read.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(3).min(out.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let data = fed_stream(25);
        let mut r = Trickle(&data);
        let mut d = StreamDecoder::new(StreamFormat::Fed, 1 << 20, Some(841));
        let mut out = Vec::new();
        while d.read_from(&mut r).unwrap() > 0 {
            drain(&mut d, &mut out);
        }
        d.finish().unwrap();
        assert_eq!(out.len(), 25);
        assert_eq!(
            out.last().unwrap().offset as usize + out.last().unwrap().bytes.len(),
            data.len()
        );
    }
}
