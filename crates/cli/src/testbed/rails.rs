//! The testbed's extra rails: every host gets one more link per rail, into a switch of that
//! rail's own, and announces the rail's address as an MPTCP endpoint, so that each
//! connection (`transport.multipath`) is carried over every rail. Rail 0 is the testbed's
//! ordinary switch; rail r ≥ 1 is the namespace `<name>-r<r>`, its hosts at
//! 10.(250+r).0.(h+1).

use super::fabric::{host_link, tx_bytes, Queues};
use super::sh;

/// Host `h`'s address on rail `r`.
pub fn addr(r: usize, h: usize) -> String {
    format!("10.{}.0.{}", 250 + r, h + 1)
}

/// Adds rails 1 ..`rails` to hosts 0 ..`hosts`, every link shaped to `rate` with `q`.
pub fn build(name: &str, hosts: usize, rails: usize, rate: &str, q: Queues) -> Result<(), String> {
    for r in 1..rails {
        let sw = format!("{name}-r{r}");
        sh(&["ip", "netns", "add", &sw])?;
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
        for h in 0..hosts {
            let host = format!("{name}-h{h}");
            let (hd, port, dev) = (
                format!("{name}h{h}r{r}"),
                format!("{name}s{h}r{r}"),
                format!("eth{r}"),
            );
            let a = addr(r, h);
            host_link(&host, &hd, &dev, &format!("{a}/24"), &sw, &port, rate, q)?;
            // announced to every peer (signal), and a source of subflows of this host's own
            // connections (subflow): with signal alone the joins were never answered here
            sh(&[
                "ip", "-n", &host, "mptcp", "endpoint", "add", &a, "dev", &dev, "signal", "subflow",
            ])?;
        }
    }
    let n = rails.to_string();
    for h in 0..hosts {
        let host = format!("{name}-h{h}");
        sh(&[
            "ip",
            "-n",
            &host,
            "mptcp",
            "limits",
            "set",
            "subflows",
            &n,
            "add_addr_accepted",
            &n,
        ])?;
    }
    Ok(())
}

/// Cuts rail `r` at once, silently, as a switch that dies: its bridge stops forwarding.
pub fn cut(name: &str, r: usize) -> Result<(), String> {
    let sw = if r == 0 {
        format!("{name}-sw")
    } else {
        format!("{name}-r{r}")
    };
    sh(&["ip", "-n", &sw, "link", "set", "br0", "down"])
}

/// Bytes every host sent on each rail (its NIC's transmit counter), read before teardown.
pub fn bytes(name: &str, hosts: usize, rails: usize) -> Vec<u64> {
    (0..rails)
        .map(|r| {
            (0..hosts)
                .map(|h| tx_bytes(&format!("{name}-h{h}"), &format!("eth{r}")))
                .sum()
        })
        .collect()
}

/// `--cut-rail R@SECONDS`: the rail and when.
pub fn parse_cut(v: &str, rails: usize) -> Result<(usize, f64), String> {
    let bad =
        || format!("--cut-rail {v:?}: RAIL@SECONDS, as 1@2.5, with RAIL below --rails ({rails})");
    let (r, t) = v.split_once('@').ok_or_else(bad)?;
    let r: usize = r.parse().map_err(|_| bad())?;
    let t: f64 = t.parse().map_err(|_| bad())?;
    if r >= rails || rails < 2 || !(0.0..=3600.0).contains(&t) {
        return Err(bad());
    }
    Ok((r, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_names_an_existing_rail_and_a_time() {
        assert_eq!(parse_cut("1@2.5", 2), Ok((1, 2.5)));
        assert_eq!(parse_cut("0@1", 2), Ok((0, 1.0)));
        assert!(parse_cut("2@1", 2).is_err());
        assert!(parse_cut("1@1", 1).is_err());
        assert!(parse_cut("1", 2).is_err());
        assert!(parse_cut("1@-3", 2).is_err());
        assert_eq!(addr(1, 4), "10.251.0.5");
    }
}
