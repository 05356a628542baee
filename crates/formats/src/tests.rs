use evb_buffers::{Chain, Pool};
use evb_wire::FragmentHeader;

use crate::events::{
    publish_prepared, EventFile, EventFileWriter, FileMeta, EVENT_CORRUPT, EVENT_PARTIAL,
};
use crate::fed::{self, FedError};
use crate::framed::{self, FramedError};

#[test]
fn fed_fragments_validate_and_split() {
    let a = fed::build(1, 841, &[1, 2, 3]);
    let b = fed::build(2, 841, &[0xa000_0005_0000_0000]); // a payload word that looks like a trailer
    let c = fed::build(3, 841, &[]);
    let file = [a.clone(), b.clone(), c.clone()].concat();
    let ranges = fed::split(&file).unwrap();
    assert_eq!(ranges, vec![0..40, 40..64, 64..80]);
    let info = fed::validate(&file[ranges[1].clone()], 40, Some(841)).unwrap();
    assert_eq!((info.lv1_id, info.source_id, info.words), (2, 841, 3));
    assert!(matches!(
        fed::validate(&a, 0, Some(843)),
        Err(FedError::Source {
            got: 841,
            expected: 843,
            ..
        })
    ));
}

#[test]
fn fed_corruption_is_caught_and_boundaries_survive() {
    let good = fed::build(7, 10, &[5, 6, 7, 8]);
    let mut bad_crc = good.clone();
    bad_crc[12] ^= 0x40; // a payload bit
    assert!(matches!(
        fed::validate(&bad_crc, 0, None),
        Err(FedError::Crc { .. })
    ));
    let mut bad_marker = good.clone();
    bad_marker[7] = 0x30; // header's top nibble
    assert!(matches!(
        fed::validate(&bad_marker, 0, None),
        Err(FedError::HeaderMarker { marker: 3, .. })
    ));
    // a damaged header does not lose the next fragment
    let file = [bad_marker, good.clone()].concat();
    assert_eq!(fed::split(&file).unwrap().len(), 2);
    // a file cut in the middle of a fragment
    assert!(fed::split(&[good.clone(), good[..24].to_vec()].concat()).is_err());
    assert!(fed::split(&good[..20]).is_err());
}

#[test]
fn framed_records_round_trip_and_reject_damage() {
    let file = [framed::encode(5, b"hello"), framed::encode(6, b"")].concat();
    let (r, crc) = framed::read_at(&file, 0).unwrap();
    assert_eq!(
        (r.trigger_number, &file[r.payload.clone()]),
        (5, &b"hello"[..])
    );
    assert!(crc.is_none());
    let (r2, _) = framed::read_at(&file, r.payload.end).unwrap();
    assert_eq!(r2.trigger_number, 6);
    let mut damaged = file.clone();
    damaged[24] ^= 1; // payload byte
    assert!(matches!(
        framed::read_at(&damaged, 0).unwrap().1,
        Some(FramedError::Crc { .. })
    ));
    let mut damaged = file.clone();
    damaged[9] ^= 1; // length: header checksum catches it
    assert!(framed::read_at(&damaged, 0).is_err());
    assert!(
        framed::read_at(&file[..27], 0).is_err(),
        "truncated payload"
    );
    assert!(framed::read_at(&file[..20], 0).is_err(), "truncated header");
}

fn chain(pool: &Pool, bytes: &[u8]) -> Chain {
    let mut w = pool.try_alloc().unwrap();
    Chain::from_slice(w.append(bytes).unwrap())
}

fn header(event_id: u64, source_id: u16, payload: &[u8]) -> FragmentHeader {
    FragmentHeader {
        event_id,
        trigger_number: event_id as u32 + 1,
        source_id,
        flags: 0,
        payload_size: payload.len() as u32,
        payload_crc: crc32c::crc32c(payload),
    }
}

#[test]
fn event_files_round_trip_with_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 16);
    let mut w = EventFileWriter::create(dir.path(), "run7", 1, 3).unwrap();
    let mut expect = Vec::new();
    for e in 0..3u64 {
        let p0 = vec![e as u8; 100 + e as usize];
        let p1 = vec![0xee; 7];
        let frags = [
            (header(e, 841, &p0), chain(&pool, &p0)),
            (header(e, 843, &p1), chain(&pool, &p1)),
        ];
        let refs: Vec<(FragmentHeader, &Chain)> = frags.iter().map(|(h, c)| (*h, c)).collect();
        w.write_event(
            e,
            e as u32 + 1,
            if e == 1 { EVENT_PARTIAL } else { 0 },
            &refs,
        )
        .unwrap();
        expect.push((e, vec![p0, p1]));
    }
    // while open, only the hidden temporary file exists
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec![".run7_bu1_000003.evb.tmp"]);
    let meta = w.finish().unwrap();
    assert_eq!(
        (meta.events, meta.first_event, meta.last_event),
        (3, Some(0), Some(2))
    );
    let path = dir.path().join("run7_bu1_000003.evb");
    let data = std::fs::read(&path).unwrap();
    assert_eq!(meta.bytes, data.len() as u64);
    assert_eq!(meta.crc32c, crc32c::crc32c(&data));
    let on_disk: FileMeta = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("run7_bu1_000003.evb.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(on_disk, meta);

    let f = EventFile::open(&path).unwrap();
    assert_eq!((f.run.as_str(), f.bu, f.sequence), ("run7", 1, 3));
    let events: Vec<_> = f.map(Result::unwrap).collect();
    assert_eq!(events.len(), 3);
    for (got, (id, payloads)) in events.iter().zip(&expect) {
        assert_eq!(got.event_id, *id);
        assert_eq!(got.fragments.len(), 2);
        assert_eq!(&got.fragments[0].1, &payloads[0]);
        assert_eq!(&got.fragments[1].1, &payloads[1]);
    }
    assert_eq!(events[1].flags, EVENT_PARTIAL);

    // damage one byte of the second event's payload: that event is reported, the first still reads
    let mut bad = data.clone();
    let at = events[1].offset as usize + 32 + 32 + 5;
    bad[at] ^= 0xff;
    let read: Vec<_> = EventFile::parse(bad, "x".into()).unwrap().collect();
    assert!(read[0].is_ok());
    assert!(read[1].is_err());
    assert!(read[2].is_ok());
    assert!(EventFile::parse(b"nope, not a file".to_vec(), "x".into()).is_err());
}

/// The real CMS files of the repository (data/cms).
#[test]
fn real_cms_files_validate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cms");
    let files = [
        ("csc_00307511_EmuRUI01_Local_000.raw", 841),
        ("csc_00307511_EmuRUI03_Local_000.raw", 843),
    ];
    assert!(
        dir.join(files[0].0).exists(),
        "the recorded CMS data is part of the repository (data/cms, its README): {} lacks it",
        dir.display()
    );
    for (name, source) in files {
        let data = std::fs::read(dir.join(name)).unwrap();
        let ranges = fed::split(&data).unwrap();
        assert_eq!(ranges.len(), 4685, "{name}");
        for (k, r) in ranges.iter().enumerate() {
            let info = fed::validate(&data[r.clone()], r.start, Some(source)).unwrap();
            assert_eq!(info.lv1_id, k as u32 + 1);
        }
    }
}

mod props {
    use proptest::prelude::*;

    use crate::events::EventFile;
    use crate::{fed, framed};

    /// Every length from 1 to 70 words, each bit of a word flipped in turn: the folding
    /// route's every way through (the pairs, a 16-byte block left, a word left, the trailer)
    /// agrees with the byte-wise CRC, and a flipped bit changes the CRC.
    #[test]
    fn crc16_routes_agree_at_every_length() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for words in 1..=70usize {
            let mut bytes: Vec<u8> = (0..words)
                .flat_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x.to_le_bytes()
                })
                .collect();
            let crc = fed::crc16(&bytes);
            assert_eq!(crc, fed::crc16_bytewise(&bytes), "{words} words");
            assert_eq!(fed::crc16_portable(&bytes), crc, "{words} words");
            for bit in [0, 63, words * 32 + 5, words * 64 - 1] {
                if bit / 64 == words - 1 && (16..32).contains(&(bit % 64)) {
                    continue; // the trailer's CRC field counts as zero
                }
                bytes[bit / 8] ^= 1 << (bit % 8);
                assert_ne!(fed::crc16(&bytes), crc, "{words} words, bit {bit} flipped");
                assert_eq!(fed::crc16(&bytes), fed::crc16_bytewise(&bytes));
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
        }
    }

    proptest! {
        /// Both routes of the CRC-16 (carry-less folding where the CPU has it, tables
        /// elsewhere) equal the byte-wise one on any whole number of words, a partial last
        /// word ignored (the real files' CRCs, made by CMS hardware, are checked in
        /// real_cms_files_validate).
        #[test]
        fn crc16_equals_bytewise(
            words in proptest::collection::vec(any::<u64>(), 1..600),
            tail in 0usize..8,
        ) {
            let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let whole = bytes.len();
            bytes.extend(std::iter::repeat_n(0xa5, tail));
            prop_assert_eq!(fed::crc16(&bytes), fed::crc16_bytewise(&bytes[..whole]));
            prop_assert_eq!(fed::crc16_portable(&bytes), fed::crc16_bytewise(&bytes[..whole]));
        }
    }

    proptest! {
        #[test]
        fn readers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(ranges) = fed::split(&bytes) {
                for r in ranges {
                    let _ = fed::validate(&bytes[r.clone()], r.start, Some(1));
                }
            }
            let _ = framed::read_at(&bytes, 0);
            let mut with_magic = b"EVBE\x01\x00".to_vec();
            with_magic.extend_from_slice(&bytes);
            for data in [bytes.clone(), with_magic] {
                if let Ok(f) = EventFile::parse(data, "x".into()) {
                    for _ in f.take(100) {}
                }
            }
        }

        #[test]
        fn fed_fragments_round_trip(lv1 in 0u32..(1 << 24), source in 0u16..4096, words in proptest::collection::vec(any::<u64>(), 0..40)) {
            let f = fed::build(lv1, source, &words);
            let info = fed::validate(&f, 0, Some(source)).unwrap();
            prop_assert_eq!((info.lv1_id, info.source_id, info.words), (lv1, source, words.len() + 2));
        }
    }
}

/// A dropped BU's committed part published by the EVM for it (`publish_prepared`), then by
/// the BU itself, still alive: the second is the same file, not an error that repeats (a
/// chaos trial's BU retried it until the run's end and left its next part's temporary).
/// A name in place from elsewhere (the temporary still there) is still refused.
#[test]
fn a_part_published_for_its_bu_is_published_for_the_bu_too() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 4096, 16);
    let mut w = EventFileWriter::create(dir.path(), "r", 1, 46).unwrap();
    let p = vec![7u8; 64];
    let c = chain(&pool, &p);
    w.write_event(5, 6, 0, &[(header(5, 841, &p), &c)]).unwrap();
    w.prepare().unwrap();
    assert!(publish_prepared(dir.path(), "r", 1, 46).unwrap());
    let meta = w.publish().unwrap();
    assert_eq!(meta.events, 1);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["r_bu1_000046.evb", "r_bu1_000046.evb.json"]);
    let events: Vec<_> = EventFile::open(&dir.path().join("r_bu1_000046.evb"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(events.len(), 1);

    // a file of that name from elsewhere, this writer's temporary still there: refused, and
    // the foreign file is left as it was
    let mut w = EventFileWriter::create(dir.path(), "r", 1, 47).unwrap();
    w.write_event(6, 7, 0, &[(header(6, 841, &p), &c)]).unwrap();
    let foreign = dir.path().join("r_bu1_000047.evb");
    std::fs::write(&foreign, b"not ours").unwrap();
    assert!(w.publish().is_err());
    assert_eq!(std::fs::read(&foreign).unwrap(), b"not ours");
}

/// Whether this process may mount a tmpfs (root with `mount` present); the full-disk tests
/// are skipped, saying so, where not.
fn may_mount() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|u| u.parse::<u32>().ok());
    euid == Some(0)
        && std::process::Command::new("mount")
            .arg("--version")
            .output()
            .is_ok()
}

/// A 512 KiB tmpfs mounted at `<tempdir>/small` for a full-disk test, unmounted on drop;
/// `None` (the test says it is skipped) where this process may not mount one — unless the
/// tools are required (`EVB_REQUIRE_TOOLS`, as scripts/test.sh runs as root): then it fails.
fn small_tmpfs(what: &str) -> Option<SmallTmpfs> {
    let skip = |why: &str| {
        assert!(
            std::env::var("EVB_REQUIRE_TOOLS").is_err(),
            "{what}: {why} (EVB_REQUIRE_TOOLS)"
        );
        evb_buffers::skips::skipped(what, why);
        None
    };
    if !may_mount() {
        return skip("needs root and mount");
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&mnt)
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        return skip("cannot mount a tmpfs here");
    }
    Some(SmallTmpfs { mnt, _dir: dir })
}

struct SmallTmpfs {
    mnt: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

/// A payload as a chain of several pieces, each in a block of its own (as an event's pages
/// from several RUs lie), cut at `cuts` and at the block size.
fn chain_in_pieces(pool: &Pool, bytes: &[u8], cuts: &[usize]) -> Chain {
    let mut c = Chain::new();
    let mut at = 0;
    for &end in cuts.iter().chain([&bytes.len()]) {
        let end = end.clamp(at, bytes.len());
        for piece in bytes[at..end].chunks(pool.block_size()) {
            c.push(pool.try_alloc().unwrap().append(piece).unwrap());
        }
        at = end;
    }
    c
}

/// Events small and large (staged, or written from their pages with one vectored write), in
/// batches and one by one: the file holds exactly the records `event_header` and the
/// fragments encode, read byte by byte, and its metadata's CRC32C (joined from the bodies'
/// CRCs for large bodies) is the CRC32C of the file's bytes.
#[test]
fn files_hold_exactly_the_encoded_events_and_their_crc() {
    for checked in [false, true] {
        files_hold_the_encoded_events(checked);
    }
}

/// With `checked`, the body CRCs are joined from the fragment headers' payload CRCs; one
/// event in five is flagged corrupt with a header CRC that lies, and has its body read.
fn files_hold_the_encoded_events(checked: bool) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 64 << 10, 64);
    let mut rng = 0x5eed_u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n.max(1) as u64) as usize
    };
    let mut w = EventFileWriter::create(dir.path(), "bytes", 0, 0).unwrap();
    w.payload_crcs_checked(checked);
    let mut records = Vec::new();
    for e in 0..60u64 {
        // bodies from empty to ~400 KiB, around the staging and joining thresholds
        let max = [64, 2100, 40 << 10, 150 << 10][next(4)];
        let frags: Vec<(FragmentHeader, Chain)> = (0..1 + next(3))
            .map(|k| {
                let p: Vec<u8> = (0..next(max)).map(|_| next(256) as u8).collect();
                let cuts: Vec<usize> = (0..next(4)).map(|_| next(p.len() + 1)).collect();
                let mut cuts = cuts;
                cuts.sort_unstable();
                (header(e, k as u16, &p), chain_in_pieces(&pool, &p, &cuts))
            })
            .collect();
        let mut frags = frags;
        let flags = if e % 5 == 4 {
            frags[0].0.payload_crc ^= 1;
            EVENT_CORRUPT
        } else {
            0
        };
        let refs: Vec<(FragmentHeader, &Chain)> = frags.iter().map(|(h, c)| (*h, c)).collect();
        let mut record = crate::events::event_header(e, e as u32, flags, &refs).to_vec();
        for (h, c) in &frags {
            record.extend_from_slice(&h.encode());
            record.extend_from_slice(&c.to_vec());
        }
        records.push(record);
        if next(3) == 0 {
            w.write_event(e, e as u32, flags, &refs).unwrap();
        } else {
            w.append_event(e, e as u32, flags, &refs).unwrap();
        }
        if next(5) == 0 {
            w.flush_events().unwrap();
        }
    }
    let meta = w.finish().unwrap();
    let data = std::fs::read(dir.path().join("bytes_bu0_000000.evb")).unwrap();
    let events_at = data.len() - records.iter().map(Vec::len).sum::<usize>();
    assert_eq!(&data[events_at..], records.concat().as_slice());
    assert_eq!((meta.bytes, meta.events), (data.len() as u64, 60));
    assert_eq!(meta.crc32c, crc32c::crc32c(&data));
    let f = EventFile::open(&dir.path().join("bytes_bu0_000000.evb")).unwrap();
    assert_eq!(f.map(Result::unwrap).count(), 60);
}

/// A batch of events appended and flushed at once is written whole or not at all: when the
/// disk fills under it, the file is cut back to where the batch began (counts, CRC and bytes
/// as before it), and the same batch written again once there is room lands exactly once.
#[test]
fn a_batch_that_does_not_fit_is_cut_back_whole_and_can_be_written_again() {
    let Some(disk) = small_tmpfs("batch cut-back test") else {
        return;
    };
    let mnt = disk.mnt.clone();

    // staged bodies (8 KiB) and bodies written from their pages (40 KiB)
    for size in [8 << 10, 40 << 10] {
        cut_back_whole(&mnt, size);
    }
}

fn cut_back_whole(mnt: &std::path::Path, size: usize) {
    let pool = Pool::new("t", 64 << 10, 16);
    let payloads: Vec<Vec<u8>> = (0..7u64).map(|e| vec![e as u8; size]).collect();
    let chains: Vec<Chain> = payloads.iter().map(|p| chain(&pool, p)).collect();
    let append = |w: &mut EventFileWriter, e: u64| {
        let p = &payloads[e as usize];
        w.append_event(
            e,
            e as u32 + 1,
            0,
            &[(header(e, 7, p), &chains[e as usize])],
        )
    };
    let mut w = EventFileWriter::create(mnt, "full", 0, size as u32).unwrap();
    for e in 0..3 {
        append(&mut w, e).unwrap();
    }
    w.flush_events().unwrap();
    let before = w.mark();
    assert_eq!(before.events(), 3);

    // take every byte that is left
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }
    let tmp = mnt.join(format!(".full_bu0_{size:06}.evb.tmp"));
    let len_before = std::fs::metadata(&tmp).unwrap().len();
    let failed = (3..7)
        .try_for_each(|e| append(&mut w, e))
        .and_then(|()| w.flush_events());
    assert!(failed.is_err(), "the batch fitted on a full disk");
    assert_eq!(
        w.mark(),
        before,
        "counts and CRC are back where the batch began"
    );
    assert_eq!(std::fs::metadata(&tmp).unwrap().len(), len_before);

    std::fs::remove_file(&filler).unwrap();
    for e in 3..7 {
        append(&mut w, e).unwrap();
    }
    w.flush_events().unwrap();
    let meta = w.finish().unwrap();
    assert_eq!(meta.events, 7);
    let data = std::fs::read(mnt.join(format!("full_bu0_{size:06}.evb"))).unwrap();
    assert_eq!(meta.crc32c, crc32c::crc32c(&data));
    let events: Vec<_> = EventFile::open(&mnt.join(format!("full_bu0_{size:06}.evb")))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(ids, (0..7).collect::<Vec<_>>());
    for (e, got) in events.iter().enumerate() {
        assert_eq!(got.fragments[0].1, payloads[e]);
    }
    std::fs::remove_file(mnt.join(format!("full_bu0_{size:06}.evb"))).unwrap();
}

/// `sink.compress = "zstd"`: compressible bodies are stored as zstd frames (flag
/// EVENT_ZSTD, a version-2 file), incompressible ones as they are; both read back exactly,
/// and a damaged or oversized frame is refused with its offset.
#[test]
fn compressed_event_files_read_back_exactly_and_refuse_damage() {
    use crate::events::{parse_file_header, CODEC_ZSTD, EVENT_ZSTD, FORMAT_VERSION_COMPRESSED};
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 8192, 16);
    let mut w = EventFileWriter::create_compressed(dir.path(), "z", 0, 0, 0o600, 3).unwrap();
    // event 0: runs of bytes (compresses); event 1: SplitMix noise (does not)
    let mut z = 7u64;
    let noise: Vec<u8> = (0..3000)
        .map(|_| {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (x ^ (x >> 31)) as u8
        })
        .collect();
    let bodies = [vec![0x55u8; 3000], noise];
    for (e, p) in bodies.iter().enumerate() {
        let c = chain(&pool, p);
        w.write_event(e as u64, e as u32 + 1, 0, &[(header(e as u64, 9, p), &c)])
            .unwrap();
    }
    let meta = w.finish().unwrap();
    let data = std::fs::read(dir.path().join("z_bu0_000000.evb")).unwrap();
    assert!(
        meta.bytes < 3000 + 3000,
        "nothing was compressed: {}",
        meta.bytes
    );
    let h = parse_file_header(&data, "z").unwrap();
    assert_eq!(h.codec, CODEC_ZSTD);
    assert_eq!(data[4..6], FORMAT_VERSION_COMPRESSED.to_le_bytes());
    // the first record is flagged compressed, the second not
    let first_flags = u16::from_le_bytes([data[h.len + 22], data[h.len + 23]]);
    assert_eq!(first_flags & EVENT_ZSTD, EVENT_ZSTD);
    let first_len = u32::from_le_bytes(data[h.len + 4..h.len + 8].try_into().unwrap()) as usize;
    let second = h.len + 32 + first_len;
    assert_eq!(
        u16::from_le_bytes([data[second + 22], data[second + 23]]) & EVENT_ZSTD,
        0
    );
    let got: Vec<_> = EventFile::parse(data.clone(), "z".into())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(got.len(), 2);
    for (ev, p) in got.iter().zip(&bodies) {
        assert_eq!(ev.flags, 0, "the unpacked event keeps its own flags only");
        assert_eq!(&ev.fragments[0].1, p);
    }
    // a flipped bit in the compressed body: refused by its CRC, with the offset
    let mut bad = data.clone();
    bad[h.len + 40] ^= 1;
    let e = EventFile::parse(bad, "z".into()).err().unwrap().to_string();
    assert!(e.contains(&format!("at byte {}", h.len)), "{e}");
    // a frame that claims a body larger than any event may be: refused, not allocated
    let mut bomb = data[..h.len].to_vec();
    // (a real frame of 2 GiB of zeros: its header says 2^31 bytes, past the limit)
    let frame = {
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
        enc.set_pledged_src_size(Some(1 << 31)).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..2048 {
            std::io::Write::write_all(&mut enc, &zeros).unwrap();
        }
        enc.finish().unwrap()
    };
    let rec = {
        let mut r = vec![0u8; 32];
        r[0..4].copy_from_slice(b"EVEV");
        r[4..8].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        r[22..24].copy_from_slice(&EVENT_ZSTD.to_le_bytes());
        r[24..28].copy_from_slice(&crc32c::crc32c(&frame).to_le_bytes());
        let hc = crc32c::crc32c(&r[..28]);
        r[28..32].copy_from_slice(&hc.to_le_bytes());
        r
    };
    bomb.extend_from_slice(&rec);
    bomb.extend_from_slice(&frame);
    assert!(EventFile::parse(bomb, "z".into()).is_err());
}

/// SplitMix64 bytes: incompressible.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut z = seed;
    (0..n)
        .map(|_| {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (x ^ (x >> 31)) as u8
        })
        .collect()
}

/// An event of the compression tests: compressible or not, small or large, one fragment or
/// two.
fn zstd_event(pool: &Pool, e: u64) -> Vec<(FragmentHeader, Chain)> {
    let size = [100usize, 3000, 70_000, 300_000][e as usize % 4];
    let p = if e.is_multiple_of(3) {
        noise(e, size)
    } else {
        vec![e as u8; size]
    };
    let frags = [(9u16, p.clone()), (11, p[..p.len() / 3].to_vec())];
    frags[..1 + (e as usize % 2)]
        .iter()
        .map(|(s, b)| {
            let mut h = header(e, *s, b);
            h.source_id = *s;
            (h, chain_in_pieces(pool, b, &[b.len() / 2]))
        })
        .collect()
}

/// Compressed on a thread of its own, a file is byte for byte the file compressed in the
/// writer's own time, whatever the runs (one event, many, appended and flushed in any
/// rhythm), and its metadata the same.
#[test]
fn compressing_on_a_thread_writes_exactly_the_inline_file() {
    let pool = Pool::new("t", 64 << 10, 256);
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let mut threaded = EventFileWriter::create_compressed_as(a.path(), "z", 0, 0, 3, true).unwrap();
    let mut inline = EventFileWriter::create_compressed_as(b.path(), "z", 0, 0, 3, false).unwrap();
    let mut e = 0u64;
    for run in [1usize, 5, 2, 9, 1, 1, 4] {
        for _ in 0..run {
            let frags = zstd_event(&pool, e);
            let refs: Vec<(FragmentHeader, &Chain)> = frags.iter().map(|(h, c)| (*h, c)).collect();
            for w in [&mut threaded, &mut inline] {
                w.append_event(e, e as u32 + 1, 0, &refs).unwrap();
            }
            e += 1;
        }
        for w in [&mut threaded, &mut inline] {
            w.flush_events().unwrap();
        }
        assert_eq!(threaded.events(), inline.events());
    }
    let (mt, mi) = (threaded.finish().unwrap(), inline.finish().unwrap());
    let (ft, fi) = (
        std::fs::read(a.path().join("z_bu0_000000.evb")).unwrap(),
        std::fs::read(b.path().join("z_bu0_000000.evb")).unwrap(),
    );
    assert!(
        ft == fi,
        "the files differ ({} and {} bytes)",
        ft.len(),
        fi.len()
    );
    assert_eq!(mt, mi);
    assert_eq!((mt.events, mt.crc32c), (e, crc32c::crc32c(&ft)));
    assert!(mt.bytes < mt.payload_bytes, "nothing was compressed");
}

/// Compressing on a thread, a disk that fills loses no event and doubles none: the run's
/// events stay taken, the file is cut back to its whole records, the next run is refused
/// (nothing taken) until there is room, and the prepare writes every record once.
#[test]
fn compressing_on_a_thread_survives_a_full_disk() {
    let Some(disk) = small_tmpfs("compressed full-disk test") else {
        return;
    };
    let mnt = disk.mnt.clone();
    let pool = Pool::new("t", 64 << 10, 64);
    // incompressible events of 40 KiB: stored as they are
    let payloads: Vec<Vec<u8>> = (0..8u64).map(|e| noise(e + 100, 40 << 10)).collect();
    let chains: Vec<Chain> = payloads.iter().map(|p| chain(&pool, p)).collect();
    let append = |w: &mut EventFileWriter, e: u64| {
        let p = &payloads[e as usize];
        w.append_event(e, e as u32, 0, &[(header(e, 7, p), &chains[e as usize])])
    };
    let mut w = EventFileWriter::create_compressed_as(&mnt, "zf", 0, 0, 3, true).unwrap();
    for e in 0..2 {
        append(&mut w, e).unwrap();
    }
    w.flush_events().unwrap();
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }
    // runs of two events go on being taken while their records are on their way (they
    // wait, taken); once records back from the thread cannot be written, a run's first
    // event is refused and nothing of it is taken
    let mut next = 2;
    'runs: while next < 8 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        for k in 0..2 {
            match append(&mut w, next) {
                Ok(()) => next += 1,
                Err(_) => {
                    assert_eq!(k, 0, "refused inside a run");
                    break 'runs;
                }
            }
            if next == 8 {
                break;
            }
        }
        w.flush_events().unwrap();
    }
    assert!(next < 8, "every run taken on a full disk");
    assert!(w.prepare().is_err(), "prepared on a full disk");
    assert_eq!(w.events(), next);
    std::fs::remove_file(&filler).unwrap();
    for e in next..8 {
        append(&mut w, e).unwrap();
    }
    w.flush_events().unwrap();
    let meta = w.finish().unwrap();
    assert_eq!(meta.events, 8);
    let path = mnt.join("zf_bu0_000000.evb");
    let data = std::fs::read(&path).unwrap();
    assert_eq!(
        (meta.bytes, meta.crc32c),
        (data.len() as u64, crc32c::crc32c(&data))
    );
    let events: Vec<_> = EventFile::open(&path)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    for (e, got) in events.iter().enumerate() {
        assert_eq!(got.fragments[0].1, payloads[e]);
    }
}

/// Issue 71 item 6: under `evb up` a run id is `<id>#<n>`; its files are named without the
/// `#` (and a `/` in a run id never leaves the folder).
#[test]
fn run_ids_name_files_safely() {
    assert_eq!(crate::run_stem("evb-local#3"), "evb-local_3");
    assert_eq!(crate::run_stem("../etc/x"), ".._etc_x");
    assert_eq!(
        crate::manifest::manifest_name("evb-local#3"),
        "evb-local_3.manifest.json"
    );
}

/// `event_ids` reads the ids from the event headers alone and finds what a full read finds:
/// small events through its buffer and a long one (past the buffer) skipped by a seek, a
/// compressed file as it is, and a file cut in an event's body ending the walk before it.
#[test]
fn event_ids_from_the_headers_match_a_full_read_plain_compressed_and_cut() {
    use crate::events::event_ids;
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new("t", 256 << 10, 64);
    let sizes = [10usize, 3000, 200_000, 5, 70_000, 1];
    for compressed in [false, true] {
        let mut w = if compressed {
            EventFileWriter::create_compressed(dir.path(), "ids", 0, 1, 0o600, 3).unwrap()
        } else {
            EventFileWriter::create(dir.path(), "ids", 0, 0).unwrap()
        };
        for (k, size) in sizes.iter().enumerate() {
            let e = 100 + 7 * k as u64;
            let p = vec![(k * 31) as u8; *size];
            let c = chain(&pool, &p);
            w.write_event(e, 1, 0, &[(header(e, 5, &p), &c)]).unwrap();
        }
        w.finish().unwrap();
    }
    let want: Vec<u64> = (0..sizes.len() as u64).map(|k| 100 + 7 * k).collect();
    for seq in [0, 1] {
        let path = dir.path().join(format!("ids_bu0_{seq:06}.evb"));
        let full: Vec<u64> = EventFile::open(&path)
            .unwrap()
            .map(|e| e.unwrap().event_id)
            .collect();
        assert_eq!(full, want, "file {seq}");
        assert_eq!(event_ids(&path).unwrap(), want, "file {seq}");
    }
    // cut inside the third event's body: the two before it, as a full read finds
    let data = std::fs::read(dir.path().join("ids_bu0_000000.evb")).unwrap();
    let cut = dir.path().join("cut.evb");
    let third = EventFile::open(&dir.path().join("ids_bu0_000000.evb"))
        .unwrap()
        .nth(2)
        .unwrap()
        .unwrap()
        .offset as usize;
    std::fs::write(&cut, &data[..third + 1000]).unwrap();
    let full: Vec<u64> = EventFile::open(&cut)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.event_id)
        .collect();
    assert_eq!(full, want[..2]);
    assert_eq!(event_ids(&cut).unwrap(), want[..2]);
    // not an event file at all: refused
    std::fs::write(&cut, b"junk").unwrap();
    assert!(event_ids(&cut).is_err());
}
