//! DUNE's record headers byte by byte, and how evb's records map onto them: what the `hdf5`
//! sink writes with `sink.hdf5_layout = "dune"` (docs/formats.md §11), so that DUNE's
//! tools (hdf5libs' `HDF5RawDataFile`, `hdf5_dump.py`) read evb's records.
//!
//! Written from DUNE's public sources: daqdataformats at commit 3f617d5c (v3.8.0,
//! 2024-10-24; FragmentHeader version 5, TriggerRecordHeaderData version 4, ComponentRequest
//! version 2, TimeSliceHeader version 2, SourceID version 2) and hdf5libs at commit 1de7a465
//! (v2.8.0, 2024-03-28; file layout version 5). Every field is little-endian, as DUNE's
//! structs lie in memory on the x86-64 and ARM machines it runs on.
//!
//! No HDF5 here: the bytes, the names and the mapping, so that they are tested without the
//! library (the files themselves: `hdf5_dune`).

use evb_wire::super_fragment::{split, ENTRY_MISSING};
use evb_wire::window::{WindowHeader, WindowStatus};
use evb_wire::{FLAG_MISSING, FLAG_SUPER, FLAG_WINDOW};

/// `FragmentHeader::s_fragment_header_marker`.
pub const FRAGMENT_MAGIC: u32 = 0x1111_2222;
/// `FragmentHeader::s_fragment_header_version`.
pub const FRAGMENT_VERSION: u32 = 5;
/// `sizeof(FragmentHeader)`.
pub const FRAGMENT_HEADER_LEN: usize = 72;
/// `TriggerRecordHeaderData::s_trigger_record_header_magic`.
pub const TRIGGER_RECORD_MAGIC: u32 = 0x3333_4444;
/// `TriggerRecordHeaderData::s_trigger_record_header_version`.
pub const TRIGGER_RECORD_VERSION: u32 = 4;
/// `sizeof(TriggerRecordHeaderData)`, before the component requests.
pub const TRIGGER_RECORD_HEADER_LEN: usize = 64;
/// `ComponentRequest::s_component_request_version`.
pub const COMPONENT_REQUEST_VERSION: u32 = 2;
/// `sizeof(ComponentRequest)`.
pub const COMPONENT_REQUEST_LEN: usize = 32;
/// `TimeSliceHeader::s_timeslice_header_marker`.
pub const TIME_SLICE_MAGIC: u32 = 0x5555_6666;
/// `TimeSliceHeader::s_timeslice_header_version`.
pub const TIME_SLICE_VERSION: u32 = 2;
/// `sizeof(TimeSliceHeader)`.
pub const TIME_SLICE_HEADER_LEN: usize = 32;
/// `SourceID::s_source_id_version`.
pub const SOURCE_ID_VERSION: u16 = 2;
/// hdf5libs' `HDF5FileLayout` version (its `filelayout_version` attribute).
pub const FILE_LAYOUT_VERSION: u32 = 5;
/// The fields DUNE leaves unused hold all ones (`unused{ 0xFFFFFFFF }`).
const UNUSED: u32 = 0xFFFF_FFFF;

/// Fragment error bit `kDataNotFound`: none of the requested data (evb: a MISSING
/// placeholder, a left-out stream, a window whose first frames were evicted).
pub const FRAGMENT_DATA_NOT_FOUND: u32 = 1 << 0;
/// Fragment error bit `kIncomplete`: only part of the requested data (evb: a LATE window).
pub const FRAGMENT_INCOMPLETE: u32 = 1 << 1;
/// Trigger-record error bit `kIncomplete`: a fragment is incomplete or missing.
pub const RECORD_INCOMPLETE: u32 = 1 << 0;
/// `FragmentType::kUnknown`: evb does not know the detector's format of a payload.
pub const FRAGMENT_TYPE_UNKNOWN: u32 = 0;
/// `detdataformats::DetID::Subdetector::kUnknown`.
pub const DETECTOR_UNKNOWN: u16 = 0;

/// `SourceID::Subsystem`: who made a piece of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subsystem {
    /// `kDetectorReadout`: a readout link (evb: a source id).
    DetectorReadout = 1,
    /// `kTRBuilder`: the record builder (evb: a BU, by its index).
    TrBuilder = 4,
}

impl Subsystem {
    /// `SourceID::subsystem_to_string`.
    pub fn name(self) -> &'static str {
        match self {
            Subsystem::DetectorReadout => "Detector_Readout",
            Subsystem::TrBuilder => "TR_Builder",
        }
    }
}

/// DUNE's `SourceID` (8 bytes: version u16, subsystem u16, id u32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SourceId {
    pub subsystem: Subsystem,
    pub id: u32,
}

impl SourceId {
    /// A readout link: evb source `id`.
    pub fn readout(id: u16) -> SourceId {
        SourceId {
            subsystem: Subsystem::DetectorReadout,
            id: id.into(),
        }
    }

    /// The builder of the records: BU `index`.
    pub fn builder(index: u16) -> SourceId {
        SourceId {
            subsystem: Subsystem::TrBuilder,
            id: index.into(),
        }
    }

    pub fn encode(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&SOURCE_ID_VERSION.to_le_bytes());
        b[2..4].copy_from_slice(&(self.subsystem as u16).to_le_bytes());
        b[4..8].copy_from_slice(&self.id.to_le_bytes());
        b
    }

    /// `SourceID::to_string`: the subsystem's name, `_0x`, the id in 8 hex digits
    /// (`Detector_Readout_0x00000349`).
    pub fn name(&self) -> String {
        format!("{}_0x{:08x}", self.subsystem.name(), self.id)
    }

    /// As hdf5libs' record attributes give it (`{"id":841,"subsys":1}`).
    fn json(&self) -> String {
        format!(
            "{{\"id\":{},\"subsys\":{}}}",
            self.id, self.subsystem as u16
        )
    }
}

/// DUNE's `FragmentHeader` version 5 (72 bytes), in front of every fragment's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentHeader {
    /// The whole fragment: this header and the payload.
    pub size: u64,
    pub trigger_number: u64,
    pub trigger_timestamp: u64,
    pub window_begin: u64,
    pub window_end: u64,
    pub run_number: u32,
    pub error_bits: u32,
    pub fragment_type: u32,
    pub sequence_number: u16,
    pub detector_id: u16,
    pub element_id: SourceId,
}

impl FragmentHeader {
    pub fn encode(&self) -> [u8; FRAGMENT_HEADER_LEN] {
        let mut b = [0u8; FRAGMENT_HEADER_LEN];
        b[0..4].copy_from_slice(&FRAGMENT_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&FRAGMENT_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.trigger_number.to_le_bytes());
        b[24..32].copy_from_slice(&self.trigger_timestamp.to_le_bytes());
        b[32..40].copy_from_slice(&self.window_begin.to_le_bytes());
        b[40..48].copy_from_slice(&self.window_end.to_le_bytes());
        b[48..52].copy_from_slice(&self.run_number.to_le_bytes());
        b[52..56].copy_from_slice(&self.error_bits.to_le_bytes());
        b[56..60].copy_from_slice(&self.fragment_type.to_le_bytes());
        b[60..62].copy_from_slice(&self.sequence_number.to_le_bytes());
        b[62..64].copy_from_slice(&self.detector_id.to_le_bytes());
        b[64..72].copy_from_slice(&self.element_id.encode());
        b
    }
}

/// DUNE's `ComponentRequest` version 2 (32 bytes): one component a trigger record asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComponentRequest {
    pub component: SourceId,
    pub window_begin: u64,
    pub window_end: u64,
}

impl ComponentRequest {
    pub fn encode(&self) -> [u8; COMPONENT_REQUEST_LEN] {
        let mut b = [0u8; COMPONENT_REQUEST_LEN];
        b[0..4].copy_from_slice(&COMPONENT_REQUEST_VERSION.to_le_bytes());
        b[4..8].copy_from_slice(&UNUSED.to_le_bytes());
        b[8..16].copy_from_slice(&self.component.encode());
        b[16..24].copy_from_slice(&self.window_begin.to_le_bytes());
        b[24..32].copy_from_slice(&self.window_end.to_le_bytes());
        b
    }
}

/// DUNE's `TriggerRecordHeader`: the 64 bytes of `TriggerRecordHeaderData` version 4, then
/// one [`ComponentRequest`] per requested component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerRecordHeader {
    pub trigger_number: u64,
    pub trigger_timestamp: u64,
    pub run_number: u32,
    pub error_bits: u32,
    pub trigger_type: u64,
    pub sequence_number: u16,
    pub max_sequence_number: u16,
    pub element_id: SourceId,
    pub components: Vec<ComponentRequest>,
}

impl TriggerRecordHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; TRIGGER_RECORD_HEADER_LEN];
        b[0..4].copy_from_slice(&TRIGGER_RECORD_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&TRIGGER_RECORD_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.trigger_number.to_le_bytes());
        b[16..24].copy_from_slice(&self.trigger_timestamp.to_le_bytes());
        b[24..32].copy_from_slice(&(self.components.len() as u64).to_le_bytes());
        b[32..36].copy_from_slice(&self.run_number.to_le_bytes());
        b[36..40].copy_from_slice(&self.error_bits.to_le_bytes());
        b[40..48].copy_from_slice(&self.trigger_type.to_le_bytes());
        b[48..50].copy_from_slice(&self.sequence_number.to_le_bytes());
        b[50..52].copy_from_slice(&self.max_sequence_number.to_le_bytes());
        b[52..56].copy_from_slice(&UNUSED.to_le_bytes());
        b[56..64].copy_from_slice(&self.element_id.encode());
        for c in &self.components {
            b.extend_from_slice(&c.encode());
        }
        b
    }
}

/// DUNE's `TimeSliceHeader` version 2 (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSliceHeader {
    pub timeslice_number: u64,
    pub run_number: u32,
    pub element_id: SourceId,
}

impl TimeSliceHeader {
    pub fn encode(&self) -> [u8; TIME_SLICE_HEADER_LEN] {
        let mut b = [0u8; TIME_SLICE_HEADER_LEN];
        b[0..4].copy_from_slice(&TIME_SLICE_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&TIME_SLICE_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.timeslice_number.to_le_bytes());
        b[16..20].copy_from_slice(&self.run_number.to_le_bytes());
        b[20..24].copy_from_slice(&UNUSED.to_le_bytes());
        b[24..32].copy_from_slice(&self.element_id.encode());
        b
    }
}

/// What a file's records are (hdf5libs' `record_name_prefix`, its `record_type` attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Triggered events and decision windows.
    TriggerRecord,
    /// Time slices.
    TimeSlice,
}

impl RecordKind {
    /// The kind of evb's records of a run (its `record_type`: `"event"`, `"window"`,
    /// `"slice"`).
    pub fn of(record_type: &str) -> RecordKind {
        match record_type {
            "slice" => RecordKind::TimeSlice,
            _ => RecordKind::TriggerRecord,
        }
    }

    /// `record_name_prefix` and the `record_type` attribute.
    pub fn prefix(self) -> &'static str {
        match self {
            RecordKind::TriggerRecord => "TriggerRecord",
            RecordKind::TimeSlice => "TimeSlice",
        }
    }

    /// `digits_for_sequence_number`: 4 for trigger records, none for time slices.
    fn sequence_digits(self) -> usize {
        match self {
            RecordKind::TriggerRecord => 4,
            RecordKind::TimeSlice => 0,
        }
    }

    /// `record_header_dataset_name`.
    pub fn header_name(self) -> &'static str {
        match self {
            RecordKind::TriggerRecord => "TriggerRecordHeader",
            RecordKind::TimeSlice => "TimeSliceHeader",
        }
    }

    /// The record's group: the prefix, the number in 6 digits (more where it needs more,
    /// as hdf5libs does), and for trigger records `.` and the sequence number in 4 digits
    /// (`TriggerRecord000042.0000`, `TimeSlice000042`).
    pub fn group_name(self, number: u64, sequence: u16) -> String {
        let mut s = format!("{}{number:0RECORD_DIGITS$}", self.prefix());
        let digits = self.sequence_digits();
        if digits > 0 {
            s.push_str(&format!(".{sequence:0digits$}"));
        }
        s
    }

    /// hdf5libs' `FileLayoutParams` as its `filelayout_params` attribute holds them (JSON,
    /// keys in order, as nlohmann writes them).
    pub fn file_layout_params(self) -> String {
        format!(
            "{{\"digits_for_record_number\":{RECORD_DIGITS},\"digits_for_sequence_number\":{},\
             \"path_param_list\":[],\"raw_data_group_name\":\"{RAW_DATA}\",\
             \"record_header_dataset_name\":\"{}\",\"record_name_prefix\":\"{}\",\
             \"view_group_name\":\"Views\"}}",
            self.sequence_digits(),
            self.header_name(),
            self.prefix()
        )
    }
}

/// `digits_for_record_number`.
const RECORD_DIGITS: usize = 6;
/// `raw_data_group_name`: the group of a record's header and fragments.
pub const RAW_DATA: &str = "RawData";

/// The record header's dataset in `RawData`: its builder's SourceID, `_`, the header's name
/// (`TR_Builder_0x00000000_TriggerRecordHeader`).
pub fn header_dataset_name(kind: RecordKind, builder: SourceId) -> String {
    format!("{}_{}", builder.name(), kind.header_name())
}

/// `FragmentType` names as hdf5libs puts them into a fragment's dataset name.
fn fragment_type_name(t: u32) -> &'static str {
    match t {
        1 => "ProtoWIB",
        2 => "WIB",
        3 => "DAPHNE",
        4 => "TDE_AMC",
        5 => "FW_Trigger_Primitive",
        6 => "Trigger_Primitive",
        7 => "Trigger_Activity",
        8 => "Trigger_Candidate",
        9 => "Hardware_Signal",
        10 => "PACMAN",
        11 => "MPD",
        12 => "WIBEth",
        13 => "DAPHNEStream",
        14 => "CRT",
        15 => "TDEEth",
        _ => "Unknown",
    }
}

/// A fragment's dataset in `RawData`: its SourceID, `_`, its fragment type's name
/// (`Detector_Readout_0x00000349_Unknown`).
pub fn fragment_dataset_name(element: SourceId, fragment_type: u32) -> String {
    format!("{}_{}", element.name(), fragment_type_name(fragment_type))
}

/// DUNE's run number from evb's run id: its trailing decimal digits (`"1234"`, `"cosmics#7"`
/// → 7, as under run control), 0 when it has none or they do not fit 32 bits.
pub fn run_number(run_id: &str) -> u32 {
    let digits = run_id.len() - run_id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    run_id[run_id.len() - digits..].parse().unwrap_or(0)
}

/// One component of an evb record as DUNE sees it: a readout link's fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component<'a> {
    pub source: u16,
    pub error_bits: u32,
    /// `[begin, end)` in ticks: the window fragment's (none for a triggered event, or a
    /// MISSING placeholder, which carry none).
    pub window: Option<(u64, u64)>,
    /// The fragment's payload as evb has it: the source's bytes, or its window fragment.
    pub payload: &'a [u8],
}

/// The components of one evb fragment from `source` with `flags` and `payload`: one, or
/// one per stream of a super-fragment (an RU of several streams), each under its stream's
/// source id. A window component the record's decision did not name (EMPTY) was not
/// requested: it is left out, as DUNE leaves out what a trigger did not ask for.
pub fn components(source: u16, flags: u16, payload: &[u8]) -> Vec<Component<'_>> {
    let missing = if flags & FLAG_MISSING != 0 {
        FRAGMENT_DATA_NOT_FOUND
    } else {
        0
    };
    let parts: Vec<(u16, u32, &[u8])> = match (flags & FLAG_SUPER != 0)
        .then(|| split(payload).ok())
        .flatten()
    {
        Some(entries) => entries
            .into_iter()
            .map(|(e, p)| {
                let left_out = if e.flags & ENTRY_MISSING != 0 {
                    FRAGMENT_DATA_NOT_FOUND
                } else {
                    0
                };
                (e.source_id, missing | left_out, p)
            })
            .collect(),
        // one fragment (or a directory the BU would have refused: kept whole)
        None => vec![(source, missing, payload)],
    };
    parts
        .into_iter()
        .filter_map(|(source, error_bits, payload)| {
            let mut c = Component {
                source,
                error_bits,
                window: None,
                payload,
            };
            if flags & FLAG_WINDOW != 0 {
                if let Ok(h) = WindowHeader::decode(payload) {
                    c.window = Some((h.begin, h.end));
                    c.error_bits |= match h.status {
                        WindowStatus::Complete => 0,
                        WindowStatus::Late => FRAGMENT_INCOMPLETE,
                        WindowStatus::Missing => FRAGMENT_DATA_NOT_FOUND,
                        WindowStatus::Empty => return None,
                    };
                }
            }
            Some(c)
        })
        .collect()
}

/// hdf5libs' record attributes (`record_header_source_id`, `source_id_path_map`,
/// `fragment_type_source_id_map`, `subdetector_source_id_map`): JSON, SourceIDs in their
/// order (subsystem, id), as its reader finds a record's fragments by them.
pub struct RecordMaps {
    pub header_source_id: String,
    pub source_id_paths: String,
    pub fragment_types: String,
    pub subdetectors: String,
}

/// The maps of a record whose header is `header` at `header_path` and whose fragments are
/// `fragments` (SourceID and dataset path each), all of unknown type and subdetector.
pub fn record_maps(
    header: SourceId,
    header_path: &str,
    fragments: &[(SourceId, String)],
) -> RecordMaps {
    let mut all: Vec<(SourceId, &str)> = fragments.iter().map(|(s, p)| (*s, p.as_str())).collect();
    all.push((header, header_path));
    all.sort();
    let paths: Vec<String> = all
        .iter()
        .map(|(s, p)| {
            format!(
                "{{\"id\":{},\"path\":{},\"subsys\":{}}}",
                s.id,
                serde_json::Value::from(*p),
                s.subsystem as u16
            )
        })
        .collect();
    let mut sids: Vec<SourceId> = fragments.iter().map(|(s, _)| *s).collect();
    sids.sort();
    sids.dedup();
    let list = sids
        .iter()
        .map(SourceId::json)
        .collect::<Vec<_>>()
        .join(",");
    let (types, subdetectors) = if sids.is_empty() {
        (
            "{\"map_entries\":[]}".to_string(),
            "{\"map_entries\":[]}".to_string(),
        )
    } else {
        (
            format!(
                "{{\"map_entries\":[{{\"fragment_type\":{FRAGMENT_TYPE_UNKNOWN},\"sourceids\":[{list}]}}]}}"
            ),
            format!(
                "{{\"map_entries\":[{{\"sourceids\":[{list}],\"subdetector\":{DETECTOR_UNKNOWN}}}]}}"
            ),
        )
    };
    RecordMaps {
        header_source_id: header.json(),
        source_id_paths: format!("{{\"map_entries\":[{}]}}", paths.join(",")),
        fragment_types: types,
        subdetectors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evb_wire::super_fragment::{encode_directory, SuperEntry};

    /// The offsets of DUNE's static_asserts, field by field.
    #[test]
    fn fragment_header_fields_lie_where_dune_asserts_them() {
        let h = FragmentHeader {
            size: 72 + 5,
            trigger_number: 0x0102_0304_0506_0708,
            trigger_timestamp: 11,
            window_begin: 12,
            window_end: 13,
            run_number: 14,
            error_bits: FRAGMENT_INCOMPLETE,
            fragment_type: 0,
            sequence_number: 15,
            detector_id: 16,
            element_id: SourceId::readout(841),
        };
        let b = h.encode();
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        assert_eq!((u32_at(0), u32_at(4)), (0x1111_2222, 5));
        assert_eq!(u64_at(8), 77);
        assert_eq!(u64_at(16), 0x0102_0304_0506_0708);
        assert_eq!((u64_at(24), u64_at(32), u64_at(40)), (11, 12, 13));
        assert_eq!((u32_at(48), u32_at(52), u32_at(56)), (14, 2, 0));
        assert_eq!((u16_at(60), u16_at(62)), (15, 16));
        assert_eq!((u16_at(64), u16_at(66), u32_at(68)), (2, 1, 841));
    }

    #[test]
    fn trigger_record_header_is_64_bytes_then_32_per_component() {
        let h = TriggerRecordHeader {
            trigger_number: 42,
            trigger_timestamp: 7,
            run_number: 3,
            error_bits: RECORD_INCOMPLETE,
            trigger_type: 0,
            sequence_number: 0,
            max_sequence_number: 0,
            element_id: SourceId::builder(1),
            components: vec![
                ComponentRequest {
                    component: SourceId::readout(0),
                    window_begin: 100,
                    window_end: 300,
                },
                ComponentRequest {
                    component: SourceId::readout(9),
                    window_begin: 100,
                    window_end: 300,
                },
            ],
        };
        let b = h.encode();
        assert_eq!(b.len(), 64 + 2 * 32);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!((u32_at(0), u32_at(4)), (0x3333_4444, 4));
        assert_eq!((u64_at(8), u64_at(16), u64_at(24)), (42, 7, 2));
        assert_eq!((u32_at(32), u32_at(36), u64_at(40)), (3, 1, 0));
        assert_eq!(&b[48..56], &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[56..64], &[2, 0, 4, 0, 1, 0, 0, 0]);
        // the second request
        assert_eq!((u32_at(96), u32_at(100)), (2, 0xFFFF_FFFF));
        assert_eq!(&b[104..112], &[2, 0, 1, 0, 9, 0, 0, 0]);
        assert_eq!((u64_at(112), u64_at(120)), (100, 300));
    }

    #[test]
    fn time_slice_header_is_32_bytes() {
        let b = TimeSliceHeader {
            timeslice_number: 5,
            run_number: 6,
            element_id: SourceId::builder(0),
        }
        .encode();
        assert_eq!(&b[0..8], &[0x66, 0x66, 0x55, 0x55, 2, 0, 0, 0]);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 5);
        assert_eq!(&b[16..24], &[6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[24..32], &[2, 0, 4, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn names_follow_hdf5libs_digits_and_source_ids() {
        let tr = RecordKind::TriggerRecord;
        assert_eq!(tr.group_name(42, 0), "TriggerRecord000042.0000");
        assert_eq!(tr.group_name(1_234_567, 3), "TriggerRecord1234567.0003");
        assert_eq!(RecordKind::TimeSlice.group_name(0, 0), "TimeSlice000000");
        assert_eq!(RecordKind::of("window"), tr);
        assert_eq!(RecordKind::of("event"), tr);
        assert_eq!(
            header_dataset_name(tr, SourceId::builder(0)),
            "TR_Builder_0x00000000_TriggerRecordHeader"
        );
        assert_eq!(
            header_dataset_name(RecordKind::TimeSlice, SourceId::builder(10)),
            "TR_Builder_0x0000000a_TimeSliceHeader"
        );
        assert_eq!(
            fragment_dataset_name(SourceId::readout(841), FRAGMENT_TYPE_UNKNOWN),
            "Detector_Readout_0x00000349_Unknown"
        );
        let p: serde_json::Value = serde_json::from_str(&tr.file_layout_params()).unwrap();
        assert_eq!(p["record_name_prefix"], "TriggerRecord");
        assert_eq!(p["digits_for_sequence_number"], 4);
        let p: serde_json::Value =
            serde_json::from_str(&RecordKind::TimeSlice.file_layout_params()).unwrap();
        assert_eq!(p["record_header_dataset_name"], "TimeSliceHeader");
        assert_eq!(p["digits_for_sequence_number"], 0);
    }

    #[test]
    fn run_numbers_come_from_the_run_ids_last_digits() {
        assert_eq!(run_number("1234"), 1234);
        assert_eq!(run_number("cosmics#7"), 7);
        assert_eq!(run_number("h5"), 5);
        assert_eq!(run_number("cms"), 0);
        assert_eq!(run_number(""), 0);
        assert_eq!(run_number("99999999999"), 0, "beyond 32 bits");
        assert_eq!(run_number("é12"), 12);
    }

    fn window(status: WindowStatus) -> Vec<u8> {
        WindowHeader {
            begin: 100,
            end: 300,
            core_end: 300,
            status,
            frames: 0,
        }
        .encode()
        .to_vec()
    }

    /// MISSING and LATE become DUNE's error bits, an EMPTY component is not requested, a
    /// super-fragment is one component per stream.
    #[test]
    fn evb_status_maps_to_dune_error_bits() {
        let c = components(3, FLAG_MISSING, &[]);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].source, c[0].error_bits), (3, FRAGMENT_DATA_NOT_FOUND));
        let c = components(3, 0, b"abc");
        assert_eq!(
            (c[0].error_bits, c[0].window, c[0].payload),
            (0, None, &b"abc"[..])
        );
        let late = window(WindowStatus::Late);
        let c = components(3, FLAG_WINDOW, &late);
        assert_eq!(
            (c[0].error_bits, c[0].window),
            (FRAGMENT_INCOMPLETE, Some((100, 300)))
        );
        let gone = window(WindowStatus::Missing);
        assert_eq!(
            components(3, FLAG_WINDOW, &gone)[0].error_bits,
            FRAGMENT_DATA_NOT_FOUND
        );
        assert!(components(3, FLAG_WINDOW, &window(WindowStatus::Empty)).is_empty());
        // an RU of three streams: complete, EMPTY (left out), LATE
        let parts = [
            (7u16, window(WindowStatus::Complete)),
            (8, window(WindowStatus::Empty)),
            (9, late.clone()),
        ];
        let entries: Vec<SuperEntry> = parts
            .iter()
            .map(|(s, w)| SuperEntry {
                source_id: *s,
                flags: 0,
                trigger_number: 100,
                length: w.len() as u32,
            })
            .collect();
        let mut bytes = Vec::new();
        encode_directory(&entries, &mut bytes);
        for (_, w) in &parts {
            bytes.extend_from_slice(w);
        }
        let c = components(3, FLAG_SUPER | FLAG_WINDOW, &bytes);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].source, c[0].error_bits), (7, 0));
        assert_eq!((c[1].source, c[1].error_bits), (9, FRAGMENT_INCOMPLETE));
        assert_eq!(c[1].payload, &late[..]);
        // a broken directory is kept whole, never a panic
        let c = components(3, FLAG_SUPER, b"EVSF");
        assert_eq!((c.len(), c[0].payload), (1, &b"EVSF"[..]));
    }

    #[test]
    fn record_maps_list_every_dataset_by_source_id() {
        let m = record_maps(
            SourceId::builder(0),
            "/TriggerRecord000001.0000/RawData/TR_Builder_0x00000000_TriggerRecordHeader",
            &[
                (SourceId::readout(9), "/b".into()),
                (SourceId::readout(2), "/a".into()),
            ],
        );
        assert_eq!(m.header_source_id, "{\"id\":0,\"subsys\":4}");
        let v: serde_json::Value = serde_json::from_str(&m.source_id_paths).unwrap();
        let e = v["map_entries"].as_array().unwrap();
        assert_eq!(
            (e[0]["id"].as_u64(), e[0]["path"].as_str()),
            (Some(2), Some("/a"))
        );
        assert_eq!(
            (e[2]["subsys"].as_u64(), e[2]["id"].as_u64()),
            (Some(4), Some(0))
        );
        let v: serde_json::Value = serde_json::from_str(&m.fragment_types).unwrap();
        assert_eq!(v["map_entries"][0]["sourceids"][1]["id"], 9);
        let v: serde_json::Value = serde_json::from_str(&m.subdetectors).unwrap();
        assert_eq!(v["map_entries"][0]["subdetector"], 0);
    }
}
