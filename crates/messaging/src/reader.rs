//! Cuts a received frame's payload into messages without copying bodies.

use evb_buffers::{Chain, Slice};
use evb_wire::pubsub::{PubSubMessage, PublishedHeader, PUBLISHED_HEADER_LEN};
use evb_wire::{
    FragmentHeader, Message, MessageHeader, MessageType, WireError, FRAGMENT_HEADER_LEN,
    MESSAGE_HEADER_LEN,
};

/// One message taken out of a frame.
#[derive(Debug)]
pub enum Received {
    Message(Message),
    /// A fragment: its header, and its payload still in the receive-pool blocks.
    Fragment {
        header: FragmentHeader,
        payload: Chain,
    },
    /// Consecutive fragment messages of one frame, in order (only when the messenger is
    /// asked to coalesce them: one hand-over per run instead of one per fragment).
    Fragments(Vec<(FragmentHeader, Chain)>),
    /// A published message: its tag and sequence, its payload still in the receive-pool
    /// blocks.
    Published {
        header: PublishedHeader,
        payload: Chain,
    },
    /// A pub/sub control message (Subscribe, Unsubscribe, Gap, Goodbye).
    PubSub(PubSubMessage),
}

fn is_pubsub_control(t: MessageType) -> bool {
    matches!(
        t,
        MessageType::Subscribe | MessageType::Unsubscribe | MessageType::Gap | MessageType::Goodbye
    )
}

/// Walks a chain front to back, handing out sub-chains (shared, no copy).
struct Cursor<'a> {
    chain: &'a Chain,
    slice: usize,
    offset: usize,
    left: usize,
}

impl<'a> Cursor<'a> {
    fn new(chain: &'a Chain) -> Self {
        Cursor {
            chain,
            slice: 0,
            offset: 0,
            left: chain.len(),
        }
    }

    /// The slice holding the next `n` bytes and their offset in it, when they do not cross
    /// into the next slice (the common case: a page read into one block).
    fn contiguous(&self, n: usize) -> Option<(&'a Slice, usize)> {
        let s = self.chain.slices().get(self.slice)?;
        (s.len() - self.offset >= n).then_some((s, self.offset))
    }

    /// Moves past `n` bytes without handing them out.
    fn skip(&mut self, mut n: usize) {
        debug_assert!(n <= self.left);
        self.left -= n;
        let slices = self.chain.slices();
        while n > 0 {
            let take = (slices[self.slice].len() - self.offset).min(n);
            n -= take;
            self.offset += take;
            if self.offset == slices[self.slice].len() {
                self.slice += 1;
                self.offset = 0;
            }
        }
    }

    fn take(&mut self, mut n: usize) -> Chain {
        debug_assert!(n <= self.left);
        self.left -= n;
        let mut out = Chain::new();
        let slices = self.chain.slices();
        while n > 0 {
            let s = &slices[self.slice];
            let take = (s.len() - self.offset).min(n);
            out.push(s.sub(self.offset, take));
            n -= take;
            self.offset += take;
            if self.offset == s.len() {
                self.slice += 1;
                self.offset = 0;
            }
        }
        out
    }
}

fn check_payload_len(header: &FragmentHeader, payload_len: usize) -> Result<(), WireError> {
    if header.payload_size as usize != payload_len {
        return Err(WireError::BadLength {
            what: "fragment payload",
            expected: header.payload_size as usize,
            got: payload_len,
        });
    }
    Ok(())
}

/// A fragment message's header from its contiguous body, and its payload length.
#[inline(always)]
fn fragment_header(body: &[u8]) -> Result<(FragmentHeader, usize), WireError> {
    if body.len() < FRAGMENT_HEADER_LEN {
        return Err(WireError::Truncated {
            what: "fragment",
            need: FRAGMENT_HEADER_LEN,
            have: body.len(),
        });
    }
    let header = FragmentHeader::decode(&body[..FRAGMENT_HEADER_LEN])?;
    let payload_len = body.len() - FRAGMENT_HEADER_LEN;
    check_payload_len(&header, payload_len)?;
    Ok((header, payload_len))
}

/// Decodes every message in a `Messages` frame of `count` messages.
pub fn split_messages(
    payload: &Chain,
    count: u32,
    out: &mut Vec<Received>,
) -> Result<(), WireError> {
    split_messages_into(payload, count, out, false)
}

/// Appends a fragment: to the run at the end of `out` when coalescing (a new run has room
/// for the `left` messages the frame still holds).
fn push_fragment(
    out: &mut Vec<Received>,
    coalesce: bool,
    left: u32,
    header: FragmentHeader,
    payload: Chain,
) {
    if !coalesce {
        out.push(Received::Fragment { header, payload });
    } else if let Some(Received::Fragments(run)) = out.last_mut() {
        run.push((header, payload));
    } else {
        let mut run = Vec::with_capacity(left as usize + 1);
        run.push((header, payload));
        out.push(Received::Fragments(run));
    }
}

/// Keeps every cache line up to [`Prefetch::AHEAD`] bytes past the message being decoded
/// asked for, each line once: with small messages the headers of the next several are in
/// cache by the time the loop gets there (a page written by a peer on another core, or by
/// the kernel's copy, is mostly not); past a large message it starts again from its end.
#[derive(Default)]
struct Prefetch {
    /// The slice of the chain the lines below belong to.
    slice: usize,
    /// Lines before this offset in that slice were asked for.
    upto: usize,
}

impl Prefetch {
    const AHEAD: usize = 2048;
    const LINE: usize = 64;

    #[inline]
    fn ahead(&mut self, slice: usize, s: &[u8], next: usize) {
        if !cfg!(target_arch = "x86_64") {
            return; // no prefetch instruction used elsewhere: nothing to keep track of
        }
        if slice != self.slice || self.upto < next {
            (self.slice, self.upto) = (slice, next);
        }
        let until = (next + Self::AHEAD).min(s.len());
        while self.upto < until {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch has no effect on memory; the address is inside `s` anyway.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    s.as_ptr().add(self.upto) as *const i8,
                )
            };
            self.upto += Self::LINE;
        }
    }
}

/// The fragment messages that lie wholly in the cursor's current slice, one after another,
/// at most `most` of them, taken with a local offset (the common case: a page of small
/// fragments read into one block); stops before anything else (another message type, a
/// message that crosses into the next slice) and leaves it to the general loop. Returns how
/// many it took.
#[inline]
fn fragments_in_slice(
    cur: &mut Cursor<'_>,
    prefetch: &mut Prefetch,
    most: u32,
    out: &mut Vec<Received>,
    coalesce: bool,
) -> Result<u32, WireError> {
    if !coalesce {
        return take_fragments_in_slice(cur, prefetch, most, |header, payload| {
            out.push(Received::Fragment { header, payload })
        });
    }
    // a slice that does not begin with a fragment (a page of control messages) makes no run;
    // a header that does not decode is left to the general loop, which names the error
    let begins_with_fragment = cur.chain.slices().get(cur.slice).is_some_and(|s| {
        let (b, at): (&[u8], usize) = (s, cur.offset);
        b.len() - at >= MESSAGE_HEADER_LEN + FRAGMENT_HEADER_LEN
            && MessageHeader::decode(&b[at..at + MESSAGE_HEADER_LEN])
                .is_ok_and(|h| h.msg_type == MessageType::Fragment)
    });
    if !begins_with_fragment {
        return Ok(0);
    }
    // the run at the end of `out`, found (or made) once, not at every fragment
    let fresh = !matches!(out.last(), Some(Received::Fragments(_)));
    if fresh {
        out.push(Received::Fragments(Vec::with_capacity(most as usize)));
    }
    let Some(Received::Fragments(run)) = out.last_mut() else {
        unreachable!("a run was made above")
    };
    let taken = take_fragments_in_slice(cur, prefetch, most, |header, payload| {
        run.push((header, payload))
    });
    if fresh && run.is_empty() {
        out.pop();
    }
    taken
}

/// [`fragments_in_slice`]'s loop, each fragment handed to `push`.
#[inline]
fn take_fragments_in_slice(
    cur: &mut Cursor<'_>,
    prefetch: &mut Prefetch,
    most: u32,
    mut push: impl FnMut(FragmentHeader, Chain),
) -> Result<u32, WireError> {
    let Some(s) = cur.chain.slices().get(cur.slice) else {
        return Ok(0);
    };
    let bytes: &[u8] = s;
    let start = cur.offset;
    let mut at = start;
    let mut taken = 0u32;
    let mut result = Ok(());
    while taken < most && bytes.len() - at >= MESSAGE_HEADER_LEN + FRAGMENT_HEADER_LEN {
        let h = match MessageHeader::decode(&bytes[at..at + MESSAGE_HEADER_LEN]) {
            Ok(h) => h,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        let len = h.length as usize;
        let body = at + MESSAGE_HEADER_LEN;
        if h.msg_type != MessageType::Fragment || len > bytes.len() - body {
            break;
        }
        prefetch.ahead(cur.slice, bytes, body + len);
        let (header, payload_len) = match fragment_header(&bytes[body..body + len]) {
            Ok(x) => x,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        push(
            header,
            Chain::from_slice(s.sub(body + FRAGMENT_HEADER_LEN, payload_len)),
        );
        taken += 1;
        at = body + len;
    }
    cur.skip(at - start);
    result.map(|()| taken)
}

/// [`split_messages`]; with `coalesce`, consecutive fragments come as one
/// [`Received::Fragments`].
pub fn split_messages_into(
    payload: &Chain,
    count: u32,
    out: &mut Vec<Received>,
    coalesce: bool,
) -> Result<(), WireError> {
    let mut cur = Cursor::new(payload);
    let mut prefetch = Prefetch::default();
    let mut found = 0u32;
    while cur.left > 0 {
        if found < count {
            found += fragments_in_slice(&mut cur, &mut prefetch, count - found, out, coalesce)?;
            if cur.left == 0 {
                break;
            }
        }
        if found == count {
            return Err(WireError::MessageCount {
                declared: count,
                found: found + 1,
            });
        }
        if cur.left < MESSAGE_HEADER_LEN {
            return Err(WireError::Truncated {
                what: "message header",
                need: MESSAGE_HEADER_LEN,
                have: cur.left,
            });
        }
        let mut hb = [0u8; MESSAGE_HEADER_LEN];
        match cur.contiguous(MESSAGE_HEADER_LEN) {
            Some((s, at)) => {
                hb.copy_from_slice(&s[at..at + MESSAGE_HEADER_LEN]);
                cur.skip(MESSAGE_HEADER_LEN);
            }
            None => {
                cur.take(MESSAGE_HEADER_LEN).copy_prefix(&mut hb);
            }
        }
        let h = MessageHeader::decode(&hb)?;
        let len = h.length as usize;
        if len > cur.left {
            return Err(WireError::Truncated {
                what: "message body",
                need: len,
                have: cur.left,
            });
        }
        found += 1;
        // Fast path: the whole body in one slice. Messages are decoded in place, without
        // building intermediate chains. (Fragments wholly in one slice were taken by
        // `fragments_in_slice`; one here had its message header across two slices, and
        // takes the general path below.)
        let contiguous = match h.msg_type {
            MessageType::Fragment => None,
            _ => cur.contiguous(len),
        };
        if let Some((s, at)) = contiguous {
            prefetch.ahead(cur.slice, s, at + len);
            if h.msg_type == MessageType::Published {
                let header = PublishedHeader::decode(&s[at..at + len])?;
                out.push(Received::Published {
                    header,
                    payload: Chain::from_slice(
                        s.sub(at + PUBLISHED_HEADER_LEN, len - PUBLISHED_HEADER_LEN),
                    ),
                });
            } else if is_pubsub_control(h.msg_type) {
                out.push(Received::PubSub(PubSubMessage::decode(
                    h.msg_type,
                    &s[at..at + len],
                )?));
            } else {
                out.push(Received::Message(Message::decode(
                    h.msg_type,
                    &s[at..at + len],
                )?));
            }
            cur.skip(len);
            continue;
        }
        let body = cur.take(len);
        if h.msg_type == MessageType::Fragment {
            if len < FRAGMENT_HEADER_LEN {
                return Err(WireError::Truncated {
                    what: "fragment",
                    need: FRAGMENT_HEADER_LEN,
                    have: len,
                });
            }
            let mut fb = [0u8; FRAGMENT_HEADER_LEN];
            body.copy_prefix(&mut fb);
            let header = FragmentHeader::decode(&fb)?;
            let payload_len = len - FRAGMENT_HEADER_LEN;
            check_payload_len(&header, payload_len)?;
            let payload = body.sub(FRAGMENT_HEADER_LEN, payload_len);
            push_fragment(out, coalesce, count - found, header, payload);
        } else if h.msg_type == MessageType::Published {
            let mut hb = [0u8; PUBLISHED_HEADER_LEN];
            if len < PUBLISHED_HEADER_LEN {
                return Err(WireError::Truncated {
                    what: "published header",
                    need: PUBLISHED_HEADER_LEN,
                    have: len,
                });
            }
            body.copy_prefix(&mut hb);
            out.push(Received::Published {
                header: PublishedHeader::decode(&hb)?,
                payload: body.sub(PUBLISHED_HEADER_LEN, len - PUBLISHED_HEADER_LEN),
            });
        } else {
            // Control messages are small; decoding them from a flat copy keeps decoders simple.
            // (A Subscribe is at most 64 KiB: its range count is bounded.)
            let flat = body.to_vec();
            if is_pubsub_control(h.msg_type) {
                out.push(Received::PubSub(PubSubMessage::decode(h.msg_type, &flat)?));
            } else {
                out.push(Received::Message(Message::decode(h.msg_type, &flat)?));
            }
        }
    }
    if found != count {
        return Err(WireError::MessageCount {
            declared: count,
            found,
        });
    }
    Ok(())
}
