"""evb's plug-in API from Python (docs/plugin.md, "Python").

A `Producer` feeds an RU (`source.kind = "api"`), a `Consumer` takes a BU's built events
(`sink = "api"`); the node runs on a thread of the Python process, the EVM and the other
nodes are `evb node` processes started from the same configuration. `Publisher` and
`Subscriber` publish and subscribe by tag (docs/messaging.md). Payloads go through the
buffer protocol: `memoryview(buf)` and `numpy.frombuffer(buf, dtype=numpy.uint8)` write
straight into an RU's pool, and read a BU's built events in place.

Every error is an `evb.Error` (one subclass per cause), never a crash.
"""

import sys
from collections.abc import Iterable, Sequence
from os import PathLike
from types import TracebackType
from typing import Any, Final, Self, TypeAlias, TypedDict, final

if sys.version_info >= (3, 12):
    from collections.abc import Buffer as _Buffer
else:
    # Before 3.12 there is no Buffer in the standard library and not every buffer says it is
    # one in its stubs (numpy's ndarray does from 3.12 on), so any object is accepted here as
    # numpy accepts its own buffers; the buffer protocol is checked when called.
    _Buffer: TypeAlias = Any

__all__ = [
    "Error",
    "Full",
    "SizeError",
    "Refused",
    "RunOver",
    "SetupError",
    "ConfigError",
    "StateError",
    "Timeout",
    "IoError",
    "FormatError",
    "Producer",
    "Trigger",
    "Buffer",
    "Consumer",
    "Event",
    "Fragment",
    "Chunk",
    "Outcome",
    "Publisher",
    "Subscriber",
    "Message",
    "Gap",
    "Goodbye",
    "Closed",
    "EventFile",
    "EventFileIterator",
    "FileEvent",
    "FileFragment",
    "crc32c",
    "decode_window",
    "judge_run",
    "__version__",
]

__version__: Final[str]
"""The version of evb this module was built from."""

_ConfigSource: TypeAlias = str | PathLike[str]
"""A configuration: a file's path (`str` or `os.PathLike`), or its TOML text (a `str` with a
line break). Relative paths in a file are relative to the file's directory."""

_Tags: TypeAlias = str | int | Iterable[int | tuple[int, int]]
"""Tags to subscribe to: text ("0,5,10-19"), one tag, or an iterable of tags and inclusive
(first, last) ranges. A tag is an int in 0..2**64."""

_Received: TypeAlias = Message | Gap | Goodbye | Closed
"""What a `Subscriber` receives."""

# --- exceptions -----------------------------------------------------------------------

class Error(Exception):
    """Base of every evb error."""

class Full(Error):
    """The RU's pool is full (back-pressure): no buffer now, try again."""

class SizeError(Error):
    """A payload size this RU does not accept (nothing was submitted)."""

class Refused(Error):
    """A fragment failed the RU's checks (trigger number not moving forward); `run_stopped`
    says whether the run stops."""

    run_stopped: bool
    """True under `source.on_error = "stop"` (the run stops); False under `"drop"` (the
    event is built without this fragment)."""

class RunOver(Error):
    """The node's run is over (ended, stopped, aborted)."""

class SetupError(Error):
    """The node could not be set up (configuration, addresses, pools), or could not reach
    its EVM within `run.connect_timeout_s` (the message names the address tried)."""

class ConfigError(SetupError):
    """A configuration that is not valid TOML or that evb refuses: the message names the key
    (a SetupError, so code that catches those catches it too)."""

class StateError(Error):
    """A call that does not fit the object's state: a buffer submitted twice, a call after
    finish, a release while views are alive."""

class Timeout(Error):
    """Nothing within the time given: no event (the run goes on), a publisher held back by
    a slow subscriber, subscribers that did not come."""

class IoError(Error):
    """A pub/sub socket failed (its transport's poll, a request that cannot be sent)."""

class FormatError(Error):
    """A file that is not what its format says (docs/formats.md): named with the byte where
    it goes wrong."""

# --- functions ------------------------------------------------------------------------

class _Window(TypedDict):
    begin: int
    end: int
    core_end: int
    status: str
    frames: list[tuple[int, int, int, int, int, int]]

def decode_window(data: _Buffer) -> _Window:
    """A window fragment (a fragment flagged WINDOW in a run built by time,
    docs/protocol.md §10.2) read and checked: its window (`begin`, `end`, `core_end`),
    `status` ("complete", "late", "missing", "empty") and `frames`, each `(begin, end,
    source_id, flags, offset, length)` whose payload is `data[offset:offset + length]`
    (slice a memoryview for no copy). Raises ValueError, saying why, for damaged input."""

def crc32c(data: _Buffer) -> int:
    """CRC32C (Castagnoli) of a buffer-protocol object's bytes (bytes, bytearray,
    memoryview, numpy array): what the fragment headers' `payload_crc` is."""

def judge_run(folder: str | PathLike[str], run: str | None = None) -> dict[str, Any]:
    """Judges a run's output folder from its run manifest (docs/formats.md §7), as `evb
    inspect --run` does: a dict with `run`, `verdict`, `complete`, `triggered`, `released`,
    `events`, `missing` and `twice` (lists of `(first, last)` id runs), `bad_files` and
    `temporaries`. `run` names the run when the folder holds several manifests."""

# --- run outcome ----------------------------------------------------------------------

@final
class Outcome:
    """How a node's run ended (from `Producer.finish`, `Consumer.finish`)."""

    @property
    def ok(self) -> bool:
        """The run ended as it should."""

    @property
    def reason(self) -> str:
        """Why it ended, in words."""

    @property
    def report(self) -> dict[str, Any]:
        """The node's final report: the JSON `evb node` prints (docs/control.md)."""

# --- producer -------------------------------------------------------------------------

@final
class Buffer:
    """Room for one fragment in the RU's pool, from `Producer.buffer(size)`.

    It supports the writable buffer protocol: `memoryview(buf)`,
    `numpy.frombuffer(buf, dtype=numpy.uint8)` write straight into the pool block (zero
    copy). Submit it once with `Producer.submit`; views of it must be gone by then (`del`
    them, or `with memoryview(buf) as m:`), else `submit` raises `evb.StateError`. Dropped
    unsubmitted, its room goes back to the pool.
    """

    def __buffer__(self, flags: int, /) -> memoryview:
        """A writable view of the payload (raises `BufferError` once submitted)."""

    def __release_buffer__(self, view: memoryview, /) -> None: ...
    def __len__(self) -> int:
        """Payload length (initially the size asked for; `set_len` shortens it); 0 once
        submitted."""

    @property
    def capacity(self) -> int:
        """The most payload it can hold (the size asked for)."""

    @property
    def submitted(self) -> bool:
        """True once submitted (it can no longer be written or submitted)."""

    def set_len(self, n: int) -> None:
        """Makes the fragment `n` bytes long (at most its capacity, else `evb.SizeError`)."""

@final
class Trigger:
    """An outside trigger program's handle on its EVM: `Trigger(config)`.

    `config` is the configuration file's path or its TOML text (`builder.by = "window"`,
    `windows.outside = true`). The EVM runs on a thread of this process; the RUs and BUs are
    `evb node` processes. The constructor returns once the run's nodes are connected.
    """

    def __new__(cls, config: _ConfigSource) -> Self: ...
    def decide(self, begin: int, end: int, components: Sequence[int] = ...) -> int:
        """Decides a record: window `[begin, end)` in ticks over the source ids in
        `components` (empty: every source); returns its record number. `evb.Refused` (the
        run goes on, nothing taken) for a window that does not end after it begins, is
        longer than `windows.longest_ticks`, or names a source no RU reads or one twice."""

    @property
    def decided(self) -> int:
        """Decisions made so far."""

    def status(self) -> dict[str, Any] | None:
        """The EVM's latest status (the JSON line `evb node` prints)."""

    def stop(self) -> None:
        """Ends the run now: decisions not yet triggered are counted, not built."""

    def finish(self) -> Outcome:
        """Waits for the run's end and returns the EVM's outcome (its report holds the
        run's)."""

@final
class Producer:
    """A readout program's handle on its RU: `Producer(config, "ru0")`.

    `config` is the configuration file's path or its TOML text (`source.kind = "api"`). The
    RU runs on a thread of this process; the EVM and BUs are `evb node` processes. The
    constructor returns once the RU is connected to its EVM; it raises `evb.SetupError`
    (naming the address tried) when the EVM cannot be reached within
    `run.connect_timeout_s`, or the configuration does not fit.

    Used as a context manager, leaving the block ends the feed without waiting (call
    `finish` for the outcome).
    """

    def __new__(cls, config: _ConfigSource, ru_id: str) -> Self: ...
    @staticmethod
    def many(config: _ConfigSource, ru_id: str) -> list[Producer]:
        """The producers of an RU with `[[ru]] producer_sources` (2 or more), one per entry
        and in that order. Each may be used from a thread of its own; the RU joins their
        k-th fragments into event k's super-fragment. Returns once the RU is connected to
        its EVM, as the constructor."""

    @property
    def source_id(self) -> int:
        """The source id this producer's fragments carry."""

    def buffer(self, size: int, block: bool = True) -> Buffer:
        """Room for a payload of `size` bytes in the RU's pool. With `block=True` it waits
        while the pool is full (back-pressure); with `block=False` it raises `evb.Full`.
        `evb.SizeError`: more than `max_fragment`."""

    def submit(self, buf: Buffer, trigger: int) -> int:
        """Submits `buf` as the fragment of the next event with `trigger` (which must move
        forward, wrapping at 2**32). Returns the event id. `evb.Refused`: the trigger number
        does not move forward."""

    def submit_copy(self, data: _Buffer, trigger: int, block: bool = True) -> int:
        """Copies `data` (any buffer-protocol object: bytes, bytearray, memoryview, numpy
        array; one copy, two when it is not C-contiguous) into the RU's pool and submits it.
        Returns the event id."""

    def submit_frame(self, begin: int, end: int, data: _Buffer, block: bool = True) -> int:
        """A run built by time (`builder.by = "time"` or `"window"`): submits the next frame
        of this producer's stream, ticks `[begin, end)` and `data` (copied once, its time
        frame header in front). The stream begins at tick 0 and each frame lasts
        `frames.ticks`, beginning where the last one ended; one that does not stops the run,
        named. Returns the frame's number, from 0. Raises `evb.StateError` in a run by
        event, `evb.Full` with `block=False` while the RU holds `source.read_ahead`
        frames it has not cut."""

    def finish(self) -> Outcome:
        """Ends the feed (the run ends after the events submitted), waits for the RU's run
        to end and returns its outcome. A second call raises `evb.StateError`."""

    def status(self) -> dict[str, Any] | None:
        """The RU's latest status: the JSON line `evb node` prints (docs/control.md);
        None before the first."""

    @property
    def events_submitted(self) -> int:
        """Events submitted so far (the next one submitted is this event id)."""

    @property
    def max_fragment(self) -> int:
        """The largest payload this RU accepts (`source.max_fragment`)."""

    @property
    def finished(self) -> bool:
        """True once `finish` was called."""

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool: ...

# --- consumer -------------------------------------------------------------------------

@final
class Chunk:
    """One slice of a fragment's payload, in place in the BU's pool (read-only buffer
    protocol)."""

    def __buffer__(self, flags: int, /) -> memoryview:
        """A read-only view of the slice (raises `BufferError` once the event is
        released)."""

    def __release_buffer__(self, view: memoryview, /) -> None: ...

@final
class Fragment:
    """One fragment of an event: its header's fields and its payload through the read-only
    buffer protocol (`memoryview(f)`, `numpy.frombuffer(f, dtype=numpy.uint8)`): in place
    in the BU's pool when it is one slice (`contiguous`), else a copy made once. `chunks()`
    gives the slices in place whatever the layout."""

    @property
    def index(self) -> int:
        """Index among the event's fragments."""

    @property
    def source_id(self) -> int: ...
    @property
    def trigger_number(self) -> int: ...
    @property
    def flags(self) -> int:
        """Fragment header flags (MISSING = 1, ...)."""

    @property
    def payload_crc(self) -> int:
        """CRC32C of the payload as its RU computed it (the BU checked it)."""

    @property
    def contiguous(self) -> bool:
        """The payload is one slice of the BU's pool (its buffer is then zero-copy)."""

    @property
    def event(self) -> Event:
        """The event it belongs to."""

    def __len__(self) -> int:
        """Payload length in bytes."""

    def chunks(self) -> list[Chunk]:
        """The payload as chunks in place (several when it spans blocks)."""

    def tobytes(self) -> bytes:
        """The payload copied into `bytes`."""

    def __buffer__(self, flags: int, /) -> memoryview:
        """A read-only view of the payload (raises `BufferError` once the event is
        released)."""

    def __release_buffer__(self, view: memoryview, /) -> None: ...

@final
class Event:
    """One built event (checked by the BU).

    Its fragments' payloads stay in the BU's pool until the event is released: by
    `release()`, at the end of a `with` block, or when the object is garbage collected.
    Views of its payloads keep it alive; `release()` while some are alive raises
    `evb.StateError`, a `with` block's end releases it when the last one goes.
    """

    @property
    def event_id(self) -> int: ...
    @property
    def trigger_number(self) -> int: ...
    @property
    def is_partial(self) -> bool:
        """A source's fragment is a MISSING placeholder, or a source gave less than its share
        (a super-fragment left a stream out, a decision window came LATE or MISSING)."""

    @property
    def is_corrupt(self) -> bool:
        """A fragment failed its CRC or content check."""

    @property
    def trigger_mismatch(self) -> bool:
        """The fragments' trigger numbers disagree."""

    @property
    def bytes(self) -> int:
        """Payload bytes over all fragments."""

    @property
    def fragment_count(self) -> int: ...
    @property
    def fragments(self) -> list[Fragment]:
        """The fragments, one per RU in RU order (`evb.StateError` once released)."""

    @property
    def released(self) -> bool:
        """True once released."""

    def __len__(self) -> int:
        """Number of fragments (one per RU)."""

    def release(self) -> None:
        """Gives the event's blocks back to the BU (and its place among the `max_held`).
        Raises `evb.StateError` while views of its payloads are alive; a second call does
        nothing."""

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool:
        """Releases the event, or, views of it being alive, marks it to be released when
        the last one goes."""

@final
class Consumer:
    """A consumer program's handle on its BU: `Consumer(config, "bu0", max_held=8)`.

    `config` is the configuration file's path or its TOML text (the BU's sink `"api"`);
    `max_held` is how many events it may hold unreleased at once. The constructor returns
    once the BU is connected to its EVM; it raises `evb.SetupError` (naming the address
    tried) when the EVM cannot be reached within `run.connect_timeout_s`. Iterate it for
    events (the iteration ends with the run), or call `next(timeout)`.
    """

    def __new__(cls, config: _ConfigSource, bu_id: str, max_held: int = 8) -> Self: ...
    def next(self, timeout: float | None = None) -> Event | None:
        """The next built event; None once the run is over. With a `timeout` (seconds) it
        raises `evb.Timeout` when no event came in that time (the run goes on)."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> Event: ...
    def finish(self) -> Outcome:
        """Waits for the BU's run to end and returns its outcome (events still coming are
        released unread)."""

    def status(self) -> dict[str, Any] | None:
        """The BU's latest status: the JSON line `evb node` prints (docs/control.md); None
        before the first."""

    @property
    def events_taken(self) -> int:
        """Events taken so far."""

# --- publish / subscribe --------------------------------------------------------------

@final
class Publisher:
    """A publishing socket (docs/messaging.md).

    `Publisher("127.0.0.1:0", transport="tcp", policy="block", ...)` listens (tcp:
    "HOST:PORT", port 0 for any; shm: a name, "NAME:0" for any); `address` is what
    subscribers connect to. `publish(tag, data)` sends to every subscriber of the tag.

    Options: `transport` ("tcp" or "shm"), `run_id` (the handshake's; subscribers must
    agree), `policy` ("block", "drop" or "disconnect": what to do with a subscriber that
    has `max_queued` bytes waiting), `send_threads` (threads writing subscribers' sockets
    beside the publishing one over tcp, 0..=16), `max_message` (largest payload),
    `block_timeout` (seconds `publish` waits under policy block, None: no limit), `linger`
    (seconds `close` lets subscribers drain), `secret` (str or bytes; else `EVB_SECRET`).
    """

    def __new__(
        cls,
        address: str = "127.0.0.1:0",
        *,
        transport: str = "tcp",
        run_id: str = "pubsub",
        policy: str = "block",
        max_queued: int = 4 << 20,
        send_threads: int = 0,
        max_message: int = 1 << 20,
        block_timeout: float | None = None,
        linger: float = 5.0,
        secret: str | bytes | None = None,
    ) -> Self: ...
    @property
    def address(self) -> str:
        """The address bound."""

    def publish(self, tag: int, data: _Buffer) -> tuple[int, int]:
        """Publishes `data` (bytes or any buffer) under `tag` to every subscriber of `tag`;
        returns `(delivered, dropped)`: the subscribers it went to, and those whose copy was
        dropped (policy drop; they are told by a gap) or who were cut off (policy
        disconnect). Under policy block it waits while a subscriber of the tag is slow, at
        most `block_timeout` (then `evb.Timeout`, nothing sent). `evb.SizeError`: more than
        `max_message`."""

    def wait_subscribers(self, n: int = 1, timeout: float | None = None) -> int:
        """Waits until `n` subscribers have subscribed to something (polling); returns how
        many have. `evb.Timeout` after `timeout` seconds (None: no limit)."""

    def poll(self, timeout: float = 0.0) -> None:
        """Makes progress (new subscribers and subscriptions, queued messages out), waiting
        at most `timeout` seconds for something to happen. A publisher with nothing to send
        calls it now and then."""

    def flush(self) -> None:
        """Sends every batched page now (messages to throughput subscribers wait in a page
        until the next publish, poll or flush)."""

    def drain(self, timeout: float = 10.0) -> bool:
        """Waits until every subscriber has taken what is queued for it, at most `timeout`
        seconds; returns whether everything went."""

    @property
    def subscribers(self) -> int:
        """Subscribers connected now."""

    @property
    def subscribed(self) -> int:
        """Subscribers that subscribe to at least one tag."""

    def subscribers_of(self, tag: int) -> int:
        """Subscribers of `tag`."""

    @property
    def stats(self) -> dict[str, int]:
        """The counters: published, delivered, dropped, gaps_sent, would_block,
        disconnected_slow, disconnected_bad, send_failures, subscribers_joined,
        subscribers_left, subscribers."""

    def close(self, reason: str = "closed") -> dict[str, int] | None:
        """Lets subscribers take what is queued for them (at most `linger` seconds), tells
        each Goodbye with `reason` and closes; returns the final counters. Later calls raise
        `evb.StateError`; a second `close` returns None."""

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool:
        """Closes it (reason "closed")."""

@final
class Message:
    """A message: from publisher `publisher` (its index in the addresses given), its `tag`,
    the publisher's sequence number `seq` for that tag (0, 1, ...), and `payload`."""

    @property
    def publisher(self) -> int: ...
    @property
    def tag(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def payload(self) -> bytes: ...
    def __len__(self) -> int:
        """Payload length in bytes."""

@final
class Gap:
    """`missed` messages of `tag` were dropped for this subscriber by publisher `publisher`
    (its policy drop): the next message of that tag has `seq` = last + 1 + missed."""

    @property
    def publisher(self) -> int: ...
    @property
    def tag(self) -> int: ...
    @property
    def missed(self) -> int: ...

@final
class Goodbye:
    """Publisher `publisher` cut this subscriber off: `code` (1 slow subscriber, 2 bad
    request, 3 shutdown, 4 send failed) and `reason`. A `Closed` follows."""

    @property
    def publisher(self) -> int: ...
    @property
    def code(self) -> int: ...
    @property
    def reason(self) -> str: ...

@final
class Closed:
    """The connection to publisher `publisher` is gone (or could not be made): `reason`."""

    @property
    def publisher(self) -> int: ...
    @property
    def reason(self) -> str: ...

@final
class Subscriber:
    """A subscribing socket (docs/messaging.md).

    `Subscriber(addresses, tags, transport="tcp", delivery="throughput", ...)` connects to
    each publisher (`addresses`: a str, comma-separated, or a sequence of str) and
    subscribes to `tags` there. `recv(timeout)` gives a `Message`, `Gap`, `Goodbye` or
    `Closed`; iterate it to take everything until every publisher has closed.

    Options: `transport` ("tcp" or "shm"), `run_id`, `delivery` ("latency": each message at
    once; "throughput": packed into pages), `max_message`, `secret` (str or bytes; else
    `EVB_SECRET`).
    """

    def __new__(
        cls,
        addresses: str | Sequence[str],
        tags: _Tags,
        *,
        transport: str = "tcp",
        run_id: str = "pubsub",
        delivery: str = "throughput",
        max_message: int = 1 << 20,
        secret: str | bytes | None = None,
    ) -> Self: ...
    def recv(self, timeout: float | None = None) -> _Received | None:
        """The next `Message`, `Gap`, `Goodbye` or `Closed`; None once every publisher's
        connection is closed and everything was taken. With `timeout` (seconds) it raises
        `evb.Timeout` when nothing came in that time."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> _Received: ...
    def subscribe(self, tags: _Tags) -> None:
        """Subscribes to more tags at every publisher still connected."""

    def unsubscribe(self, tags: _Tags) -> None:
        """Unsubscribes from tags at every publisher still connected (messages a publisher
        sent before it read this still arrive)."""

    @property
    def open_publishers(self) -> int:
        """Publishers still connected (or connecting)."""

    @property
    def stats(self) -> dict[str, int]:
        """The counters: received, payload_bytes, missed, gaps, goodbyes,
        protocol_errors."""

    def close(self) -> None:
        """Closes the connections; later calls raise `evb.StateError` (a second close does
        nothing)."""

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool: ...

# --- reading output files -------------------------------------------------------------

@final
class EventFile:
    """A built-event file (`.evb`, docs/formats.md §3), every checksum checked when it is
    opened (`evb.FormatError` names the byte where it goes wrong). With `mmap=True` (the
    default) the file is mapped into memory and fragments are buffers in place in it
    (`numpy.frombuffer(fragment, dtype=numpy.uint8)` copies nothing); a file truncated by
    someone else while it is mapped ends the process with SIGBUS, as for any mapped reader
    (evb never changes a published file). With `mmap=False` it is read into memory once."""

    def __new__(cls, path: str | PathLike[str], mmap: bool = True) -> Self: ...
    @property
    def path(self) -> str: ...
    @property
    def run(self) -> str:
        """The run id in its header."""

    @property
    def bu(self) -> int: ...
    @property
    def sequence(self) -> int: ...
    def __len__(self) -> int:
        """Events in the file."""

    def __getitem__(self, index: int, /) -> FileEvent:
        """The `index`-th event in file order (negative from the end)."""

    def __iter__(self) -> EventFileIterator: ...
    def event(self, event_id: int) -> FileEvent:
        """The event with event id `event_id` (KeyError if the file has none)."""

    def event_ids(self) -> list[int]:
        """The event ids in file order."""

@final
class EventFileIterator:
    """Iterates an `EventFile`'s events in file order."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> FileEvent: ...

@final
class FileEvent:
    """One event of an `EventFile`: its header's fields and its fragments."""

    @property
    def event_id(self) -> int: ...
    @property
    def trigger_number(self) -> int: ...
    @property
    def flags(self) -> int:
        """Event flags: 1 partial (a source MISSING or short of its share), 2 trigger-number
        mismatch, 4 corrupt."""

    @property
    def partial(self) -> bool:
        """Flag 1: the event was built partial (a source MISSING, a super-fragment that left a
        stream out, or a decision window that came LATE or MISSING)."""

    @property
    def fragments(self) -> list[FileFragment]:
        """Its fragments in RU order."""

    def fragment(self, source_id: int) -> FileFragment:
        """The fragment from source `source_id` (KeyError if none)."""

    def __len__(self) -> int:
        """Number of fragments."""

@final
class FileFragment:
    """One fragment of a `FileEvent`: its header's fields and its payload through the
    read-only buffer protocol, in place in the file's bytes."""

    @property
    def source_id(self) -> int: ...
    @property
    def trigger_number(self) -> int: ...
    @property
    def flags(self) -> int:
        """Fragment header flags (MISSING = 1, GENERATED = 2, SUPER = 4, SYNC_LOSS = 8)."""

    @property
    def payload_crc(self) -> int:
        """CRC32C of the payload (checked when the file was opened)."""

    @property
    def missing(self) -> bool:
        """A placeholder for a source that sent nothing (flag MISSING): no payload."""

    def __len__(self) -> int:
        """Payload length in bytes."""

    def tobytes(self) -> bytes:
        """The payload copied into `bytes`."""

    def __buffer__(self, flags: int, /) -> memoryview:
        """A read-only view of the payload, in place in the file's bytes."""
