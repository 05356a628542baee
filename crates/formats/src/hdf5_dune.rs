//! The `hdf5` sink's files in DUNE's layout (`sink.hdf5_layout = "dune"`, docs/formats.md
//! §11): hdf5libs' file layout version 5, its trigger records or time slices, each fragment
//! behind a DUNE FragmentHeader. The bytes and the names are [`crate::dune`]'s; this writes
//! them into an open file. The file's life (temporary name, durability, publication) is
//! [`crate::hdf5_events::Hdf5EventWriter`]'s, as for evb's own layout.

use evb_buffers::Chain;
use evb_wire::FragmentHeader as EvbHeader;
use hdf5::types::VarLenUnicode;
use hdf5_metno as hdf5;

use crate::dune::{
    components, fragment_dataset_name, header_dataset_name, record_maps, Component,
    ComponentRequest, FragmentHeader, RecordKind, SourceId, TimeSliceHeader, TriggerRecordHeader,
    DETECTOR_UNKNOWN, FILE_LAYOUT_VERSION, FRAGMENT_HEADER_LEN, FRAGMENT_TYPE_UNKNOWN, RAW_DATA,
    RECORD_INCOMPLETE,
};
use crate::events::EVENT_PARTIAL;

/// The `format` of these files' metadata (`.h5.json`) and the run manifest.
pub const DUNE_FORMAT: &str = "dune-hdf5";

/// One file in DUNE's layout, open: what it needs to write each record and close.
pub struct DuneFile {
    kind: RecordKind,
    run_number: u32,
    /// The builder's SourceID (`TR_Builder`, the BU's index).
    builder: SourceId,
    /// hdf5libs' `recorded_size`: the bytes of every header and fragment dataset.
    recorded_size: u64,
}

/// Milliseconds since 1970 in decimal, as hdf5libs writes its timestamps.
fn now_ms() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
        .to_string()
}

fn put_str(at: &hdf5::Location, name: &str, value: &str) -> hdf5::Result<()> {
    let v: VarLenUnicode = value
        .parse()
        .map_err(|e| hdf5::Error::from(format!("{name}: {e}")))?;
    at.new_attr::<VarLenUnicode>()
        .create(name)?
        .write_scalar(&v)
}

/// A dataset of `bytes` as hdf5libs writes one: signed chars, shape `[n, 1]`; chunked and
/// deflated at `deflate` when asked (one chunk of up to 1 MiB).
fn put_bytes(g: &hdf5::Group, name: &str, bytes: &[i8], deflate: Option<u8>) -> hdf5::Result<()> {
    let n = bytes.len();
    let mut b = g.new_dataset::<i8>().shape([n, 1]);
    if let (Some(level), true) = (deflate, n > 0) {
        b = b.chunk([n.min(1 << 20), 1]).deflate(level);
    }
    let ds = b.create(name)?;
    if n > 0 {
        ds.write_raw(bytes)?;
    }
    Ok(())
}

/// `bytes` as the signed chars hdf5libs stores (the same bits).
fn signed(bytes: &[u8], out: &mut Vec<i8>) {
    out.extend(bytes.iter().map(|&b| b as i8));
}

impl DuneFile {
    /// Writes the file attributes hdf5libs writes when it creates a file: `run_number`,
    /// `file_index`, `creation_timestamp`, `application_name`, `filelayout_params`,
    /// `filelayout_version`, `source_id_geo_id_map` (empty: evb knows no geometry) and
    /// `record_type`.
    pub fn start(
        f: &hdf5::File,
        record_type: &str,
        run_id: &str,
        bu: u16,
        file_index: u32,
    ) -> hdf5::Result<DuneFile> {
        let kind = RecordKind::of(record_type);
        let run_number = crate::dune::run_number(run_id);
        f.new_attr::<u32>()
            .create("run_number")?
            .write_scalar(&run_number)?;
        f.new_attr::<u64>()
            .create("file_index")?
            .write_scalar(&u64::from(file_index))?;
        put_str(f, "creation_timestamp", &now_ms())?;
        put_str(f, "application_name", &format!("evb-bu{bu}"))?;
        put_str(f, "filelayout_params", &kind.file_layout_params())?;
        f.new_attr::<u32>()
            .create("filelayout_version")?
            .write_scalar(&FILE_LAYOUT_VERSION)?;
        put_str(f, "source_id_geo_id_map", "{\"map_entries\":[]}")?;
        put_str(f, "record_type", kind.prefix())?;
        Ok(DuneFile {
            kind,
            run_number,
            builder: SourceId::builder(bu),
            recorded_size: 0,
        })
    }

    /// Writes record `number` (evb's event id, slice or decision number) of evb `flags` and
    /// `fragments`: its group, `RawData` with the record's header and a dataset per
    /// component, and hdf5libs' record attributes. evb's trigger number and flags, which
    /// DUNE's headers have no room for, are the group's attributes `evb_trigger_number`
    /// and `evb_flags`.
    pub fn write_record(
        &mut self,
        f: &hdf5::File,
        number: u64,
        trigger: u32,
        flags: u16,
        fragments: &[(EvbHeader, &Chain)],
        deflate: Option<u8>,
    ) -> hdf5::Result<()> {
        let mut joined: Vec<Vec<u8>> = Vec::with_capacity(fragments.len());
        for (_, p) in fragments {
            let mut v = Vec::with_capacity(p.len());
            for c in p.chunks() {
                v.extend_from_slice(c);
            }
            joined.push(v);
        }
        let parts: Vec<_> = fragments
            .iter()
            .zip(&joined)
            .flat_map(|((h, _), bytes)| components(h.source_id, h.flags, bytes))
            .collect();
        // the record's window: its components'; a MISSING placeholder, which carries none,
        // asked for the same (a triggered event has none: 0, 0)
        let record_window = parts.iter().find_map(|c| c.window).unwrap_or((0, 0));
        let window_of = |c: &Component| c.window.unwrap_or(record_window);
        let timestamp = record_window.0;
        let group_name = self.kind.group_name(number, 0);
        let top = f.create_group(&group_name)?;
        let raw = top.create_group(RAW_DATA)?;
        let header_name = header_dataset_name(self.kind, self.builder);
        let mut buf: Vec<i8> = Vec::new();
        let header = match self.kind {
            RecordKind::TriggerRecord => {
                let incomplete =
                    flags & EVENT_PARTIAL != 0 || parts.iter().any(|c| c.error_bits != 0);
                TriggerRecordHeader {
                    trigger_number: number,
                    trigger_timestamp: timestamp,
                    run_number: self.run_number,
                    error_bits: if incomplete { RECORD_INCOMPLETE } else { 0 },
                    trigger_type: 0,
                    sequence_number: 0,
                    max_sequence_number: 0,
                    element_id: self.builder,
                    components: parts
                        .iter()
                        .map(|c| {
                            let (window_begin, window_end) = window_of(c);
                            ComponentRequest {
                                component: SourceId::readout(c.source),
                                window_begin,
                                window_end,
                            }
                        })
                        .collect(),
                }
                .encode()
            }
            RecordKind::TimeSlice => TimeSliceHeader {
                timeslice_number: number,
                run_number: self.run_number,
                element_id: self.builder,
            }
            .encode()
            .to_vec(),
        };
        signed(&header, &mut buf);
        put_bytes(&raw, &header_name, &buf, None)?;
        self.recorded_size += buf.len() as u64;
        let mut paths = Vec::with_capacity(parts.len());
        for c in &parts {
            let element = SourceId::readout(c.source);
            let window = window_of(c);
            let header = FragmentHeader {
                size: (FRAGMENT_HEADER_LEN + c.payload.len()) as u64,
                trigger_number: number,
                trigger_timestamp: timestamp,
                window_begin: window.0,
                window_end: window.1,
                run_number: self.run_number,
                error_bits: c.error_bits,
                fragment_type: FRAGMENT_TYPE_UNKNOWN,
                sequence_number: 0,
                detector_id: DETECTOR_UNKNOWN,
                element_id: element,
            };
            buf.clear();
            buf.reserve(FRAGMENT_HEADER_LEN + c.payload.len());
            signed(&header.encode(), &mut buf);
            signed(c.payload, &mut buf);
            let name = fragment_dataset_name(element, FRAGMENT_TYPE_UNKNOWN);
            put_bytes(&raw, &name, &buf, deflate)?;
            self.recorded_size += buf.len() as u64;
            paths.push((element, format!("/{group_name}/{RAW_DATA}/{name}")));
        }
        let maps = record_maps(
            self.builder,
            &format!("/{group_name}/{RAW_DATA}/{header_name}"),
            &paths,
        );
        put_str(&top, "record_header_source_id", &maps.header_source_id)?;
        put_str(&top, "source_id_path_map", &maps.source_id_paths)?;
        put_str(&top, "fragment_type_source_id_map", &maps.fragment_types)?;
        put_str(&top, "subdetector_source_id_map", &maps.subdetectors)?;
        top.new_attr::<u32>()
            .create("evb_trigger_number")?
            .write_scalar(&trigger)?;
        top.new_attr::<u16>()
            .create("evb_flags")?
            .write_scalar(&flags)?;
        Ok(())
    }

    /// Writes what hdf5libs writes when it closes a file: `recorded_size` and
    /// `closing_timestamp`.
    pub fn finish(&self, f: &hdf5::File) -> hdf5::Result<()> {
        f.new_attr::<u64>()
            .create("recorded_size")?
            .write_scalar(&self.recorded_size)?;
        put_str(f, "closing_timestamp", &now_ms())
    }
}

#[cfg(test)]
mod tests {
    use evb_buffers::Pool;
    use evb_wire::window::{WindowHeader, WindowStatus};
    use evb_wire::{FLAG_MISSING, FLAG_WINDOW};

    use super::*;
    use crate::dune::{FRAGMENT_DATA_NOT_FOUND, FRAGMENT_INCOMPLETE};
    use crate::events::PartWriter;
    use crate::hdf5_events::{Hdf5EventWriter, Hdf5Layout};

    fn chain(pool: &Pool, bytes: &[u8]) -> Chain {
        let mut w = pool.try_alloc().unwrap();
        Chain::from_slice(w.append(bytes).unwrap())
    }

    fn header(event_id: u64, source_id: u16, flags: u16, payload: &[u8]) -> EvbHeader {
        EvbHeader {
            event_id,
            trigger_number: event_id as u32 + 100,
            source_id,
            flags,
            payload_size: payload.len() as u32,
            payload_crc: crc32c::crc32c(payload),
        }
    }

    /// A fragment: its source, flags and payload.
    type Fragment = (u16, u16, Vec<u8>);

    /// Writes `records` (event id, evb flags, fragments) through the sink's writer in DUNE's
    /// layout and opens the published file.
    fn write(
        dir: &std::path::Path,
        record_type: &str,
        records: &[(u64, u16, Vec<Fragment>)],
        deflate: Option<u8>,
    ) -> hdf5::File {
        let pool = Pool::new("t", 1 << 16, 16);
        let mut w = Hdf5EventWriter::create(
            dir,
            "cosmics#12",
            3,
            7,
            0o600,
            deflate,
            record_type,
            Hdf5Layout::Dune,
        )
        .unwrap();
        for (id, flags, frags) in records {
            let chains: Vec<(EvbHeader, Chain)> = frags
                .iter()
                .map(|(s, fl, p)| (header(*id, *s, *fl, p), chain(&pool, p)))
                .collect();
            let refs: Vec<(EvbHeader, &Chain)> = chains.iter().map(|(h, c)| (*h, c)).collect();
            w.append_event(*id, *id as u32 + 100, *flags, &refs)
                .unwrap();
        }
        let meta = w.publish().unwrap();
        assert_eq!(meta.format, DUNE_FORMAT);
        hdf5::File::open(dir.join("cosmics_12_bu3_000007.h5")).unwrap()
    }

    fn bytes(f: &hdf5::File, path: &str) -> Vec<u8> {
        let ds = f.dataset(path).unwrap();
        let n = ds.shape()[0];
        assert_eq!(ds.shape(), vec![n, 1], "{path}: hdf5libs' shape");
        ds.read_raw::<i8>()
            .unwrap()
            .into_iter()
            .map(|b| b as u8)
            .collect()
    }

    fn text(at: &hdf5::Location, name: &str) -> String {
        at.attr(name)
            .unwrap()
            .read_scalar::<VarLenUnicode>()
            .unwrap()
            .to_string()
    }

    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }

    /// Triggered events as one-window trigger records: the file's attributes, the record's
    /// group and datasets by hdf5libs' names, every header byte that matters and the
    /// payload, a MISSING placeholder as a header alone with kDataNotFound.
    #[test]
    fn events_are_trigger_records_read_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "event",
            &[
                (
                    1,
                    0,
                    vec![(3, 0, b"three".to_vec()), (841, 0, vec![0xff; 300])],
                ),
                (
                    2,
                    crate::events::EVENT_PARTIAL,
                    vec![(3, 0, b"again".to_vec()), (841, FLAG_MISSING, vec![])],
                ),
            ],
            None,
        );
        assert_eq!(
            f.attr("run_number").unwrap().read_scalar::<u32>().unwrap(),
            12
        );
        assert_eq!(
            f.attr("file_index").unwrap().read_scalar::<u64>().unwrap(),
            7
        );
        assert_eq!(
            f.attr("filelayout_version")
                .unwrap()
                .read_scalar::<u32>()
                .unwrap(),
            5
        );
        assert_eq!(text(&f, "record_type"), "TriggerRecord");
        assert_eq!(text(&f, "application_name"), "evb-bu3");
        let params: serde_json::Value =
            serde_json::from_str(&text(&f, "filelayout_params")).unwrap();
        assert_eq!(params["record_name_prefix"], "TriggerRecord");
        for t in ["creation_timestamp", "closing_timestamp"] {
            assert!(
                text(&f, t).parse::<u64>().unwrap() > 1_700_000_000_000,
                "{t}"
            );
        }
        // 2 headers of 64 + 2 × 32, 4 fragments of 72 + payload
        let recorded = f
            .attr("recorded_size")
            .unwrap()
            .read_scalar::<u64>()
            .unwrap();
        assert_eq!(recorded, 2 * 128 + 4 * 72 + 5 + 300 + 5);
        let names = f.member_names().unwrap();
        assert_eq!(
            names,
            ["TriggerRecord000001.0000", "TriggerRecord000002.0000"]
        );

        let g = f.group("TriggerRecord000001.0000").unwrap();
        assert_eq!(
            g.group("RawData").unwrap().member_names().unwrap(),
            [
                "Detector_Readout_0x00000003_Unknown",
                "Detector_Readout_0x00000349_Unknown",
                "TR_Builder_0x00000003_TriggerRecordHeader",
            ]
        );
        let h = bytes(
            &f,
            "TriggerRecord000001.0000/RawData/TR_Builder_0x00000003_TriggerRecordHeader",
        );
        assert_eq!(h.len(), 64 + 2 * 32);
        assert_eq!((u32_at(&h, 0), u32_at(&h, 4)), (0x3333_4444, 4));
        assert_eq!(
            (u64_at(&h, 8), u64_at(&h, 24)),
            (1, 2),
            "trigger number, components"
        );
        assert_eq!((u32_at(&h, 32), u32_at(&h, 36)), (12, 0), "run, no error");
        assert_eq!(&h[56..64], &[2, 0, 4, 0, 3, 0, 0, 0], "TR_Builder 3");
        assert_eq!(
            &h[72..80],
            &[2, 0, 1, 0, 3, 0, 0, 0],
            "component 0: source 3"
        );
        assert_eq!(
            &h[104..112],
            &[2, 0, 1, 0, 0x49, 3, 0, 0],
            "component 1: source 841"
        );
        let d = bytes(
            &f,
            "TriggerRecord000001.0000/RawData/Detector_Readout_0x00000349_Unknown",
        );
        assert_eq!(d.len(), 72 + 300);
        assert_eq!(
            (u32_at(&d, 0), u32_at(&d, 4), u64_at(&d, 8)),
            (0x1111_2222, 5, 372)
        );
        assert_eq!((u64_at(&d, 16), u32_at(&d, 48), u32_at(&d, 52)), (1, 12, 0));
        assert_eq!(&d[64..72], &[2, 0, 1, 0, 0x49, 3, 0, 0]);
        assert_eq!(&d[72..], &[0xff; 300][..]);
        assert_eq!(
            g.attr("evb_trigger_number")
                .unwrap()
                .read_scalar::<u32>()
                .unwrap(),
            101
        );
        let paths: serde_json::Value =
            serde_json::from_str(&text(&g, "source_id_path_map")).unwrap();
        assert_eq!(
            paths["map_entries"][1]["path"],
            "/TriggerRecord000001.0000/RawData/Detector_Readout_0x00000349_Unknown"
        );

        // the partial event: its header says incomplete, the MISSING fragment is a header alone
        let h = bytes(
            &f,
            "TriggerRecord000002.0000/RawData/TR_Builder_0x00000003_TriggerRecordHeader",
        );
        assert_eq!((u32_at(&h, 36), u64_at(&h, 24)), (RECORD_INCOMPLETE, 2));
        let d = bytes(
            &f,
            "TriggerRecord000002.0000/RawData/Detector_Readout_0x00000349_Unknown",
        );
        assert_eq!((d.len(), u64_at(&d, 8)), (72, 72));
        assert_eq!(u32_at(&d, 52), FRAGMENT_DATA_NOT_FOUND);
        let d = bytes(
            &f,
            "TriggerRecord000002.0000/RawData/Detector_Readout_0x00000003_Unknown",
        );
        assert_eq!((u32_at(&d, 52), &d[72..]), (0, &b"again"[..]));
    }

    fn window(begin: u64, end: u64, status: WindowStatus) -> Vec<u8> {
        WindowHeader {
            begin,
            end,
            core_end: end,
            status,
            frames: 0,
        }
        .encode()
        .to_vec()
    }

    /// A decision window of five components: complete, LATE (kIncomplete), MISSING
    /// (kDataNotFound), EMPTY, which its decision did not name (not requested, no dataset),
    /// and a MISSING placeholder with no window fragment (kDataNotFound, the record's
    /// window). The windows are in the headers.
    #[test]
    fn a_window_maps_late_and_missing_to_error_bits_and_leaves_empty_out() {
        let dir = tempfile::tempdir().unwrap();
        let w = FLAG_WINDOW;
        let f = write(
            dir.path(),
            "window",
            &[(
                9,
                crate::events::EVENT_PARTIAL,
                vec![
                    (0, w, window(500, 900, WindowStatus::Complete)),
                    (1, w, window(500, 900, WindowStatus::Late)),
                    (2, w, window(500, 900, WindowStatus::Missing)),
                    (3, w, window(500, 900, WindowStatus::Empty)),
                    (4, FLAG_MISSING, vec![]),
                ],
            )],
            None,
        );
        assert_eq!(text(&f, "record_type"), "TriggerRecord");
        let raw = "TriggerRecord000009.0000/RawData/";
        let names = f.group(raw).unwrap().member_names().unwrap();
        assert_eq!(names.len(), 5, "{names:?}: four fragments and the header");
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("Detector_Readout_0x00000003")),
            "{names:?}"
        );
        let h = bytes(
            &f,
            &format!("{raw}TR_Builder_0x00000003_TriggerRecordHeader"),
        );
        assert_eq!(u64_at(&h, 24), 4, "four requested");
        assert_eq!((u64_at(&h, 16), u32_at(&h, 36)), (500, RECORD_INCOMPLETE));
        for (i, sid) in [0, 1, 2, 4].into_iter().enumerate() {
            let c = 64 + 32 * i;
            assert_eq!(u32_at(&h, c + 12), sid);
            assert_eq!((u64_at(&h, c + 16), u64_at(&h, c + 24)), (500, 900));
        }
        for (sid, bits) in [
            (0, 0),
            (1, FRAGMENT_INCOMPLETE),
            (2, FRAGMENT_DATA_NOT_FOUND),
        ] {
            let d = bytes(&f, &format!("{raw}Detector_Readout_0x0000000{sid}_Unknown"));
            assert_eq!(u32_at(&d, 52), bits, "source {sid}");
            assert_eq!(
                (u64_at(&d, 24), u64_at(&d, 32), u64_at(&d, 40)),
                (500, 500, 900)
            );
            assert_eq!(u64_at(&d, 72), 500, "the window fragment as evb has it");
        }
        // the MISSING placeholder: a header alone, the record's window
        let d = bytes(&f, &format!("{raw}Detector_Readout_0x00000004_Unknown"));
        assert_eq!((d.len(), u32_at(&d, 52)), (72, FRAGMENT_DATA_NOT_FOUND));
        assert_eq!((u64_at(&d, 32), u64_at(&d, 40)), (500, 900));
    }

    /// Time slices: `TimeSliceNNNNNN` with its TimeSliceHeader, record_type "TimeSlice"; the
    /// fragment deflated (`sink.hdf5_deflate`), the header stored.
    #[test]
    fn slices_are_time_slices() {
        let dir = tempfile::tempdir().unwrap();
        // deflated as asked: the bytes read back all the same
        let f = write(
            dir.path(),
            "slice",
            &[(
                0,
                0,
                vec![(5, FLAG_WINDOW, window(0, 1100, WindowStatus::Complete))],
            )],
            Some(6),
        );
        assert_eq!(text(&f, "record_type"), "TimeSlice");
        let params: serde_json::Value =
            serde_json::from_str(&text(&f, "filelayout_params")).unwrap();
        assert_eq!(params["record_header_dataset_name"], "TimeSliceHeader");
        let h = bytes(
            &f,
            "TimeSlice000000/RawData/TR_Builder_0x00000003_TimeSliceHeader",
        );
        assert_eq!(h.len(), 32);
        assert_eq!(
            (u32_at(&h, 0), u32_at(&h, 4), u64_at(&h, 8)),
            (0x5555_6666, 2, 0)
        );
        assert_eq!(u32_at(&h, 16), 12);
        let path = "TimeSlice000000/RawData/Detector_Readout_0x00000005_Unknown";
        assert_eq!(f.dataset(path).unwrap().filters().len(), 1, "deflated");
        let d = bytes(&f, path);
        assert_eq!((u64_at(&d, 32), u64_at(&d, 40)), (0, 1100));
        assert_eq!(&d[72..], &window(0, 1100, WindowStatus::Complete)[..]);
    }
}
