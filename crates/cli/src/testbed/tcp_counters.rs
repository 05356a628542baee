//! The hosts' TCP counters after a testbed run: how TCP recovered what the shaped ports
//! dropped. A port's drop count is in qdisc packets, and one packet there is a whole
//! segmentation-offload chunk (up to 64 KiB), so the drops alone do not say how many
//! segments TCP sent again, nor whether it found them by SACK in a round trip or waited
//! out a retransmission timeout (200 ms at least). These counters do.

use std::collections::HashMap;

/// The counters kept, as `/proc/net/snmp` and `/proc/net/netstat` name them ("Tcp:" or
/// "TcpExt:" and the field), with the JSON key each is reported under.
const KEPT: [(&str, &str); 8] = [
    ("Tcp:OutSegs", "segments_sent"),
    ("Tcp:RetransSegs", "segments_sent_again"),
    ("TcpExt:TCPFastRetrans", "fast_retransmits"),
    ("TcpExt:TCPSackRecovery", "sack_recoveries"),
    ("TcpExt:TCPTimeouts", "timeouts"),
    ("TcpExt:TCPLossProbes", "loss_probes"),
    ("TcpExt:TCPLostRetransmit", "retransmits_lost"),
    ("TcpExt:TCPRetransFail", "retransmits_refused_by_host"),
];

/// The counters of `/proc/net/snmp` or `/proc/net/netstat` text: pairs of lines, a
/// header ("Tcp: Name Name ...") and its values ("Tcp: 1 2 ..."), keyed "Tcp:Name".
/// Lines that do not pair up or do not parse are skipped.
pub fn parse(text: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (mut names, mut values) = (names.split_whitespace(), values.split_whitespace());
        let (Some(prefix), Some(prefix_again)) = (names.next(), values.next()) else {
            continue;
        };
        if prefix != prefix_again || !prefix.ends_with(':') {
            continue;
        }
        for (name, value) in names.zip(values) {
            if let Ok(v) = value.parse::<u64>() {
                out.insert(format!("{prefix}{name}"), v);
            }
        }
    }
    out
}

/// The kept counters summed over `hosts`' texts, in [`KEPT`]'s order.
pub fn sum(hosts: &[HashMap<String, u64>]) -> Vec<(&'static str, u64)> {
    KEPT.iter()
        .map(|&(counter, key)| (key, hosts.iter().filter_map(|h| h.get(counter)).sum()))
        .collect()
}

/// One host namespace's counters (empty where unreadable).
fn read(ns: &str) -> HashMap<String, u64> {
    parse(&super::fabric::stdout_in(
        ns,
        &["cat", "/proc/net/snmp", "/proc/net/netstat"],
    ))
}

/// The line printed under the run's drops, from [`sum`]'s figures.
pub fn line(figures: &[(&str, u64)]) -> String {
    let get = |k: &str| {
        figures
            .iter()
            .find(|(key, _)| *key == k)
            .map_or(0, |&(_, v)| v)
    };
    let sent = get("segments_sent");
    let again = get("segments_sent_again");
    format!(
        "TCP in the hosts: {sent} segments sent, {again} of them again ({:.2} %): {} by fast \
         retransmit in {} SACK recoveries, {} timeouts, {} loss probes, {} retransmits lost \
         again, {} refused by the host's own queue",
        100.0 * again as f64 / sent.max(1) as f64,
        get("fast_retransmits"),
        get("sack_recoveries"),
        get("timeouts"),
        get("loss_probes"),
        get("retransmits_lost"),
        get("retransmits_refused_by_host"),
    )
}

/// Every host's counters summed, printed in a line and returned as JSON. The counters
/// are each host's since its namespace was made, so they cover exactly this run (and its
/// few control connections).
pub fn report(name: &str, hosts: usize) -> serde_json::Value {
    let all: Vec<_> = (0..hosts).map(|k| read(&format!("{name}-h{k}"))).collect();
    let figures = sum(&all);
    println!("{}", line(&figures));
    figures
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    // the shape of a 6.x kernel's files, cut short
    const SNMP: &str = "Ip: Forwarding DefaultTTL\nIp: 2 64\n\
        Tcp: RtoAlgorithm RtoMin OutSegs RetransSegs InErrs\nTcp: 1 200 26305 4712 0\n";
    const NETSTAT: &str = "TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes TCPSackRecovery \
        TCPFastRetrans TCPLostRetransmit TCPRetransFail\nTcpExt: 0 2 12 142 4710 252 31\n\
        IpExt: InNoRoutes\nIpExt: 0\n";

    #[test]
    fn the_kept_counters_are_read_from_both_files_and_summed_over_hosts() {
        let one = parse(&format!("{SNMP}{NETSTAT}"));
        assert_eq!(one["Tcp:OutSegs"], 26305);
        assert_eq!(one["TcpExt:TCPRetransFail"], 31);
        assert_eq!(one["IpExt:InNoRoutes"], 0);
        let figures = sum(&[one.clone(), one]);
        assert_eq!(
            figures,
            vec![
                ("segments_sent", 52610),
                ("segments_sent_again", 9424),
                ("fast_retransmits", 9420),
                ("sack_recoveries", 284),
                ("timeouts", 4),
                ("loss_probes", 24),
                ("retransmits_lost", 504),
                ("retransmits_refused_by_host", 62),
            ]
        );
        let text = line(&figures);
        assert!(
            text.starts_with("TCP in the hosts: 52610 segments sent, 9424 of them again (17.91 %)"),
            "{text}"
        );
        assert!(text.contains("4 timeouts"), "{text}");
    }

    #[test]
    fn unpaired_or_garbled_lines_are_skipped_and_a_missing_counter_is_zero() {
        let text =
            "Tcp: OutSegs RetransSegs\nUdp: 1 2\nTcp: OutSegs\nTcp: x\nTcpExt: TCPTimeouts\n";
        let read = parse(text);
        assert!(read.is_empty(), "{read:?}");
        let figures = sum(&[read]);
        assert!(figures.iter().all(|&(_, v)| v == 0));
        assert!(line(&figures).contains("0 segments sent, 0 of them again (0.00 %)"));
    }
}
