//! The file sink's tests: what becomes output and when, with the syncer's thread.

use super::*;
use evb_buffers::Pool;
use evb_formats::events::EventFile;

fn event(pool: &Pool, id: u64) -> BuiltEvent {
    let mut w = pool.try_alloc().unwrap();
    let payload = Chain::from_slice(w.append(&id.to_le_bytes()).unwrap());
    BuiltEvent::of_one_fragment(id, 1, payload)
}

fn ids_in(dir: &Path) -> Vec<(String, Vec<u64>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.extension().is_some_and(|x| x == "evb") && !name.starts_with('.') {
            let ids = EventFile::open(&p)
                .unwrap()
                .map(|e| e.unwrap().event_id)
                .collect();
            assert!(
                dir.join(format!("{name}.json")).exists(),
                "{name} has no metadata"
            );
            out.push((name, ids));
        }
    }
    out.sort();
    out
}

fn hidden(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count()
}

const EVERY_4: CommitInterval = CommitInterval {
    events: 4,
    time: Duration::from_secs(3600),
};

/// `prepare`, and the parts the syncer then makes durable of what it was given (the
/// syncs run on a thread of their own).
fn prepare_synced(s: &mut FileSink, now: Instant) -> Result<Vec<PreparedPart>, SinkError> {
    let mut parts = s.prepare(now)?;
    parts.extend(s.synced(true)?);
    Ok(parts)
}

/// `publish`, then what the syncer made of it: `Ok` once the part is in place, the
/// failure (`Busy`) when it could not be renamed.
fn publish_now(s: &mut FileSink, part: u32) -> Result<(), SinkError> {
    s.publish(part)?;
    s.collect(true);
    if s.published().contains(&part) {
        Ok(())
    } else {
        Err(SinkError::Busy(format!("part {part} not published")))
    }
}

/// The syncer publishes a committed part: until it is in place its events are
/// outstanding (the BU waits for them before it reports) and it is not said published;
/// then it is said published once, with the file and its metadata in place.
#[test]
fn a_committed_part_is_said_published_once_it_is_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    for id in 0..6 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    s.accepted(0, 6).unwrap();
    let parts = prepare_synced(&mut s, Instant::now()).unwrap();
    assert_eq!(parts.len(), 1, "the second file is still open");
    assert!(s.publishes_later());
    s.publish(parts[0].part).unwrap();
    let mut said = s.published();
    if said.is_empty() {
        assert_eq!(s.outstanding(), 4, "its events are not out yet");
        s.collect(true);
        said = s.published();
    }
    assert_eq!(said, vec![parts[0].part]);
    assert_eq!(s.outstanding(), 0);
    assert!(s.published().is_empty(), "said once");
    assert_eq!(
        ids_in(dir.path()),
        vec![("r_bu0_000000.evb".into(), vec![0, 1, 2, 3])]
    );
    assert_eq!(s.report()["events"], 4);
}

/// A part committed a second time (a standby EVM that took over, from a resync sent while
/// it was being published) is not an error: under way, it is said published once; done,
/// it is said published again.
#[test]
fn a_part_committed_again_is_said_published_again() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    for id in 0..4 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    s.accepted(0, 4).unwrap();
    let part = prepare_synced(&mut s, Instant::now()).unwrap()[0].part;
    s.publish(part).unwrap();
    s.publish(part).unwrap();
    s.collect(true);
    assert_eq!(s.published(), vec![part], "said once while under way");
    s.publish(part).unwrap();
    assert_eq!(s.published(), vec![part], "said again once done");
    assert!(publish_now(&mut s, part + 1).is_err(), "not a part of ours");
    assert_eq!(s.report()["events"], 4, "output once");
    assert_eq!(ids_in(dir.path()).len(), 1);
}

fn sink(dir: &Path, bu: u16, commit: CommitInterval) -> FileSink {
    FileSink::new(dir.into(), FileFormat::Evb, "r", bu, 0, 0, commit, 0o666).unwrap()
}

#[test]
fn a_file_is_output_only_once_the_evm_committed_it() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    for id in [10, 11, 12, 13, 14, 15, 16] {
        s.deliver(&event(&pool, id)).unwrap();
    }
    let now = Instant::now();
    // the first file (10..13) is closed but waits for the EVM's acceptance
    assert!(prepare_synced(&mut s, now).unwrap().is_empty());
    s.accepted(10, 4).unwrap();
    let parts = prepare_synced(&mut s, now).unwrap();
    assert_eq!(
        parts,
        vec![PreparedPart {
            part: 0,
            ranges: vec![(10, 4)]
        }]
    );
    // durable, not yet visible
    assert!(ids_in(dir.path()).is_empty());
    assert!(
        prepare_synced(&mut s, now).unwrap().is_empty(),
        "prepared once"
    );
    publish_now(&mut s, 0).unwrap();
    assert_eq!(
        ids_in(dir.path()),
        vec![("r_bu0_000000.evb".into(), vec![10, 11, 12, 13])]
    );
    // 14 accepted; 15 and 16 never are (the EVM dropped this BU): nothing of the
    // second file is output, and no temporary file is left
    s.accepted(14, 1).unwrap();
    s.finish().unwrap();
    assert_eq!(ids_in(dir.path()).len(), 1);
    assert_eq!(s.report()["left_out_unaccepted"], 3);
    assert_eq!(s.report()["events"], 4);
    assert_eq!(hidden(dir.path()), 0);
}

/// A run of events is written as far as the open file takes it; the rest goes to the
/// next file on the next offer, and every file holds exactly its events, in order.
#[test]
fn a_run_fills_the_open_file_and_the_rest_starts_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    s.deliver(&event(&pool, 0)).unwrap();
    let run: Vec<BuiltEvent> = (1..10).map(|id| event(&pool, id)).collect();
    let mut offered = &run[..];
    let mut takes = Vec::new();
    while !offered.is_empty() {
        let (taken, result) = s.deliver_run(offered);
        result.unwrap();
        takes.push(taken);
        offered = &offered[taken..];
    }
    assert_eq!(takes, vec![3, 4, 2], "each file takes what it has room for");
    s.accepted(0, 10).unwrap();
    let parts = prepare_synced(&mut s, Instant::now()).unwrap();
    assert_eq!(parts.len(), 2);
    for p in &parts {
        publish_now(&mut s, p.part).unwrap();
    }
    assert_eq!(
        ids_in(dir.path()),
        vec![
            ("r_bu0_000000.evb".into(), vec![0, 1, 2, 3]),
            ("r_bu0_000001.evb".into(), vec![4, 5, 6, 7]),
        ]
    );
    s.finish().unwrap();
    assert_eq!(
        s.report()["left_out_unaccepted"],
        2,
        "8 and 9: their file was open"
    );
}

/// A closed file is synced on the syncer's thread: the sink takes events meanwhile, the
/// part comes back once, and a run that ends with a sync in flight waits for it and
/// leaves no temporary file behind.
#[test]
fn events_keep_coming_while_a_part_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    for id in 0..5 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    s.accepted(0, 4).unwrap();
    let now = Instant::now();
    let mut parts = s.prepare(now).unwrap();
    for id in 5..8 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    parts.extend(prepare_synced(&mut s, now).unwrap());
    assert_eq!(
        parts,
        vec![PreparedPart {
            part: 0,
            ranges: vec![(0, 4)]
        }]
    );
    publish_now(&mut s, 0).unwrap();
    // the second file: sealed, accepted, its sync started, and the run ends at once
    s.deliver(&event(&pool, 8)).unwrap();
    s.accepted(4, 4).unwrap();
    let started = s.prepare(now).unwrap();
    assert!(started.len() <= 1);
    s.finish().unwrap();
    assert_eq!(
        ids_in(dir.path()),
        vec![("r_bu0_000000.evb".into(), vec![0, 1, 2, 3])]
    );
    assert_eq!(hidden(dir.path()), 0, "no temporary file is left");
}

/// With two files waiting for the syncer (a disk slower than the builder), the sink
/// takes no event into a new file: the BU holds them (back-pressure), is told to offer
/// them again soon, and no warning is due; once the syncer catches up it takes them.
#[test]
fn a_syncer_behind_holds_the_events_back() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    let other = tempfile::tempdir().unwrap();
    for seq in 100..100 + MAX_UNSYNCED as u32 {
        let mut w = EventFileWriter::create(other.path(), "x", 0, seq).unwrap();
        s.syncer.start(
            seq,
            Job::Prepare(Box::new(w.begin_prepare().unwrap().unwrap())),
        );
    }
    match s.deliver(&event(&pool, 0)) {
        Err(SinkError::Busy(why)) => assert!(why.contains("synced"), "{why}"),
        other => panic!("taken while the syncer is behind: {other:?}"),
    }
    assert!(!s.busy_is_news());
    assert_eq!(s.retry_after(), Duration::from_millis(1));
    while s.syncer.next(true).is_some() {}
    s.deliver(&event(&pool, 0)).unwrap();
    assert!(s.busy_is_news(), "a failed write is news again");
}

#[test]
fn a_part_prepared_and_never_committed_is_not_output() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    for id in 0..4 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    s.accepted(0, 4).unwrap();
    assert_eq!(prepare_synced(&mut s, Instant::now()).unwrap().len(), 1);
    // the EVM dropped this BU before it committed the part: it never says Committed
    s.finish().unwrap();
    assert!(ids_in(dir.path()).is_empty());
    assert_eq!(hidden(dir.path()), 0);
    assert!(matches!(publish_now(&mut s, 0), Err(SinkError::Fatal(_))));
}

#[test]
fn a_file_is_committed_when_its_time_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let every_50ms = CommitInterval {
        events: 0,
        time: Duration::from_millis(50),
    };
    let mut s = sink(dir.path(), 0, every_50ms);
    let t0 = Instant::now();
    s.deliver(&event(&pool, 0)).unwrap();
    s.deliver(&event(&pool, 2)).unwrap();
    s.accepted(0, 1).unwrap();
    s.accepted(2, 1).unwrap();
    assert!(
        prepare_synced(&mut s, t0).unwrap().is_empty(),
        "not due yet"
    );
    let parts = prepare_synced(&mut s, t0 + Duration::from_millis(60)).unwrap();
    assert_eq!(parts[0].ranges, vec![(0, 1), (2, 1)]);
    publish_now(&mut s, parts[0].part).unwrap();
    assert_eq!(
        ids_in(dir.path()),
        vec![("r_bu0_000000.evb".into(), vec![0, 2])]
    );
}

#[test]
fn a_file_that_cannot_be_published_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let mut s = sink(dir.path(), 0, EVERY_4);
    for id in 0..4 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    s.accepted(0, 4).unwrap();
    let parts = prepare_synced(&mut s, Instant::now()).unwrap();
    // something occupies the final name: publishing must fail, keep the data, not replace
    let blocker = dir.path().join("r_bu0_000000.evb");
    std::fs::write(&blocker, b"not ours").unwrap();
    assert!(matches!(
        publish_now(&mut s, parts[0].part),
        Err(SinkError::Busy(_))
    ));
    assert_eq!(std::fs::read(&blocker).unwrap(), b"not ours");
    std::fs::remove_file(&blocker).unwrap();
    // committed output is published at the end at the latest
    s.finish().unwrap();
    assert_eq!(
        ids_in(dir.path()),
        vec![("r_bu0_000000.evb".into(), vec![0, 1, 2, 3])]
    );
    assert_eq!(s.report()["files"][0], "r_bu0_000000.evb");
}

#[test]
fn a_restarted_bu_never_replaces_its_earlier_files() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let one = CommitInterval {
        events: 1,
        ..EVERY_4
    };
    let mut first = sink(dir.path(), 3, one);
    first.deliver(&event(&pool, 1)).unwrap();
    first.accepted(1, 1).unwrap();
    first.deliver(&event(&pool, 2)).unwrap(); // closes the first file
    let p = prepare_synced(&mut first, Instant::now()).unwrap();
    publish_now(&mut first, p[0].part).unwrap();
    // killed with a file open: its temporary file stays behind
    std::mem::forget(first);
    let mut again = sink(dir.path(), 3, one);
    again.deliver(&event(&pool, 3)).unwrap();
    again.accepted(3, 1).unwrap();
    again.deliver(&event(&pool, 4)).unwrap();
    let p = prepare_synced(&mut again, Instant::now()).unwrap();
    publish_now(&mut again, p[0].part).unwrap();
    assert_eq!(
        ids_in(dir.path()),
        vec![
            ("r_bu3_000000.evb".into(), vec![1]),
            ("r_bu3_000002.evb".into(), vec![3]),
        ]
    );
}

/// A writer whose file can no longer be completed (HDF5's after a failed write).
struct Broken;

impl PartWriter for Broken {
    fn append_event(
        &mut self,
        _: u64,
        _: u32,
        _: u16,
        _: &[(FragmentHeader, &Chain)],
    ) -> Result<(), EventFileError> {
        Ok(())
    }
    fn flush_events(&mut self) -> Result<(), EventFileError> {
        Ok(())
    }
    fn events(&self) -> u64 {
        1
    }
    fn bytes(&self) -> u64 {
        1
    }
    fn begin_prepare(&mut self) -> Result<Option<evb_formats::events::PrepareJob>, EventFileError> {
        Err(EventFileError::Damaged {
            path: "broken".into(),
            reason: "No space left on device".into(),
        })
    }
    fn prepared(&mut self) {}
    fn publish(&mut self) -> Result<evb_formats::events::FileMeta, EventFileError> {
        unreachable!("never prepared")
    }
    fn discard(self: Box<Self>) {}
    fn name(&self) -> &str {
        "broken"
    }
    fn set_ranges(&mut self, _: &[(u64, u32)]) {}
}

/// Accepted events in a file that cannot be completed are lost to this BU: the sink
/// fails loudly instead of retrying for ever (the run would stall in silence).
#[test]
fn a_file_that_cannot_be_completed_fails_the_sink() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = sink(dir.path(), 0, EVERY_4);
    s.open.push_back(OpenFile {
        w: Box::new(Broken),
        seq: 0,
        stage: Stage::Sealed,
        pending: VecDeque::new(),
        accepted: true,
        ranges: vec![(0, 1)],
        runs: 1,
        last_id: Some(0),
        since: Instant::now(),
    });
    match s.prepare(Instant::now()) {
        Err(SinkError::Fatal(why)) => assert!(why.contains("No space"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// The HDF5 layout goes through the same stages, and a restarted BU carries on after its
/// earlier incarnation's `.h5` files.
#[cfg(feature = "hdf5")]
#[test]
fn hdf5_files_are_committed_and_numbered_like_evb_files() {
    use evb_formats::hdf5_events::Hdf5Layout;
    for (layout, format) in [
        (Hdf5Layout::Evb, "evb-hdf5"),
        (Hdf5Layout::Packed, "evb-hdf5-packed"),
    ] {
        hdf5_files_committed(layout, format);
    }
}

#[cfg(feature = "hdf5")]
fn hdf5_files_committed(layout: evb_formats::hdf5_events::Hdf5Layout, format: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 64);
    let h5 = FileFormat::Hdf5 {
        deflate: Some(1),
        record_type: "event",
        layout,
    };
    let mut s = FileSink::new(dir.path().into(), h5, "r", 2, 0, 0, EVERY_4, 0o600).unwrap();
    for id in 0..4 {
        s.deliver(&event(&pool, id)).unwrap();
    }
    s.accepted(0, 4).unwrap();
    let parts = prepare_synced(&mut s, Instant::now()).unwrap();
    assert_eq!(parts.len(), 1);
    assert!(
        !dir.path().join("r_bu2_000000.h5").exists(),
        "published early"
    );
    publish_now(&mut s, 0).unwrap();
    s.finish().unwrap();
    let meta: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("r_bu2_000000.h5.json")).unwrap())
            .unwrap();
    let data = std::fs::read(dir.path().join("r_bu2_000000.h5")).unwrap();
    assert_eq!(meta["format"], format);
    assert_eq!(meta["events"], 4);
    assert_eq!(meta["bytes"], data.len() as u64);
    assert_eq!(meta["crc32c"], crc32c::crc32c(&data));
    assert_eq!(&data[..8], b"\x89HDF\r\n\x1a\n", "an HDF5 signature");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("r_bu2_000000.h5"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "readable by others: {mode:o}");
    assert_eq!(s.report()["events"], 4);
    assert_eq!(hidden(dir.path()), 0);
    let again = FileSink::new(dir.path().into(), h5, "r", 2, 0, 0, EVERY_4, 0o600).unwrap();
    assert_eq!(again.next_seq, 1);
}

/// How many of `path`'s pages are in the page cache, of how many (mincore(2) on a
/// read-only mapping, which reads no byte and so brings none in).
fn resident_pages(path: &Path) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: sysconf with a valid name.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mut pages = vec![0u8; len.div_ceil(page)];
    // SAFETY: a fresh read-only shared mapping of a file held open, of its length; nothing
    // reads through it, and it is unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: `pages` holds a byte for each page of the `len` bytes mapped at `p`.
    let rc = unsafe { libc::mincore(p, len, pages.as_mut_ptr()) };
    // SAFETY: the mapping made above, of that length, no longer used.
    unsafe { libc::munmap(p, len) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    (pages.iter().filter(|b| *b & 1 == 1).count(), pages.len())
}

/// Whether `dir` is on tmpfs, where a file's pages are the file and cannot be given back.
fn on_tmpfs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut s = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: statfs with a NUL-terminated path and room for its answer.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), s.as_mut_ptr()) }, 0);
    // SAFETY: statfs returned 0, so it filled `s`.
    let s = unsafe { s.assume_init() };
    s.f_type == libc::TMPFS_MAGIC
}

/// `sink.keep_in_page_cache = false` (the default): a committed file's pages leave the page
/// cache once it is synced, and the file reads back whole; kept, they stay. On tmpfs the
/// pages are the file and stay either way. The folder is the build's own (a disk, where
/// /tmp may be tmpfs); /dev/shm, where there is one, is the tmpfs case.
#[test]
fn a_committed_files_pages_leave_the_page_cache_unless_kept() {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&target).unwrap();
    let mut places = vec![tempfile::tempdir_in(&target).unwrap()];
    if Path::new("/dev/shm").is_dir() {
        places.push(tempfile::tempdir_in("/dev/shm").unwrap());
    }
    let pool = Pool::new("t", 256 << 10, 64);
    for place in &places {
        for drop in [true, false] {
            let dir = place.path().join(if drop { "dropped" } else { "kept" });
            let mut s = sink(&dir, 0, EVERY_4).dropping_pages(drop);
            for id in 0..4 {
                let mut w = pool.try_alloc().unwrap();
                let body = vec![id as u8; 200 << 10];
                let payload = Chain::from_slice(w.append(&body).unwrap());
                s.deliver(&BuiltEvent::of_one_fragment(id, 1, payload))
                    .unwrap();
            }
            s.accepted(0, 4).unwrap();
            let part = prepare_synced(&mut s, Instant::now()).unwrap()[0].part;
            publish_now(&mut s, part).unwrap();
            let file = dir.join("r_bu0_000000.evb");
            let (resident, pages) = resident_pages(&file);
            let tmpfs = on_tmpfs(&dir);
            eprintln!("{}: {resident} of {pages} pages resident", dir.display());
            if drop && !tmpfs {
                assert_eq!(resident, 0, "{}: the pages stayed", dir.display());
            } else {
                assert_eq!(resident, pages, "{}: pages were dropped", dir.display());
            }
            assert_eq!(
                ids_in(&dir),
                vec![("r_bu0_000000.evb".into(), vec![0, 1, 2, 3])]
            );
        }
    }
}
