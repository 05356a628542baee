//! A configuration sent with `configure`: what it changes, what needs the nodes restarted,
//! and the running system's nodes filled in where the file leaves them out.

use evb_config::Config;
use serde_json::Value;

/// The keys of `new` that the running nodes cannot take without a restart.
pub(super) fn restart_keys(cur: &Config, new: &Config) -> Vec<String> {
    cur.restart_needed(new)
}

/// The top-level sections that differ.
pub(super) fn changed_sections(a: &Config, b: &Config) -> Vec<String> {
    let (Ok(Value::Object(x)), Ok(Value::Object(y))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return Vec::new();
    };
    let mut keys: Vec<String> = x
        .keys()
        .chain(y.keys())
        .filter(|k| x.get(*k) != y.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The new configuration with the running system's nodes: a file that does not list
/// nodes (or lists them without addresses) means the nodes as they run now, with its own
/// per-node defaults (credits, sink).
pub(super) fn adopt(cur: &Config, new: Config) -> Config {
    let mut out = new;
    out.evm.addr = cur.evm.addr.clone();
    out.evm.control = cur.evm.control.clone();
    if out.evm.id != cur.evm.id {
        return out; // refused as a restart key
    }
    let n_ru = if out.ru.is_empty() {
        out.topology.rus as usize
    } else {
        out.ru.len()
    };
    let n_bu = if out.bu.is_empty() {
        out.topology.bus as usize
    } else {
        out.bu.len()
    };
    if n_ru != cur.ru.len() || n_bu != cur.bu.len() {
        return out; // refused: the number of nodes
    }
    if out.ru.is_empty() {
        out.ru = cur
            .ru
            .iter()
            .map(|r| evb_config::RuSection {
                files: Vec::new(),
                ..r.clone()
            })
            .collect();
    }
    for (x, y) in out.ru.iter_mut().zip(&cur.ru) {
        if x.addr.is_empty() {
            x.addr = y.addr.clone();
        }
        if x.control.is_empty() {
            x.control = y.control.clone();
        }
    }
    if out.bu.is_empty() {
        out.bu = cur
            .bu
            .iter()
            .map(|b| evb_config::BuSection {
                id: b.id.clone(),
                addr: b.addr.clone(),
                control: b.control.clone(),
                credits: None,
                sink: None,
                sink_delay_us: None,
                sink_delay_events: None,
                serve: b.serve.clone(),
                spare: b.spare,
            })
            .collect();
    }
    for (x, y) in out.bu.iter_mut().zip(&cur.bu) {
        if x.addr.is_empty() {
            x.addr = y.addr.clone();
        }
        if x.control.is_empty() {
            x.control = y.control.clone();
        }
    }
    out.topology = cur.topology.clone();
    out.control = cur.control.clone();
    // the CPUs the processes run on (given, or placed by evb up): as now unless listed
    if out.affinity.is_empty() {
        out.affinity = cur.affinity.clone();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_that_changed_are_named() {
        let a = Config::default();
        let mut b = a.clone();
        b.run.events = 5;
        b.fragments.size = 1000;
        assert_eq!(changed_sections(&a, &b), ["fragments", "run"]);
        assert!(changed_sections(&a, &a).is_empty());
    }
}
