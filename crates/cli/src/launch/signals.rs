//! Ctrl-C and the launcher's pipe: how a node process and `evb run` hear that they should
//! stop or go.

use std::io::{BufRead, BufReader};

use evb_config::{Config, Role};

/// Used by supervised nodes: when the launcher goes away, so do they (no orphans). A line
/// `stop` asks the node's EVM to end the run cleanly. Ctrl-C at the terminal reaches every
/// process of the group: supervised nodes leave it to the launcher, which decides.
pub fn exit_when_stdin_closes(control: evb_node::RunControl) {
    let ignored = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, ignored);
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut stdin = BufReader::new(std::io::stdin());
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    // not eprintln!, which panics (and the node stays) when stderr is a pipe
                    // to the launcher that is gone with it (`evb run` passes it on)
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "evb node: launcher gone (stdin closed), exiting"
                    );
                    std::process::exit(3);
                }
                Ok(_) if line.trim() == "stop" => control.stop(),
                Ok(_) => {}
            }
        }
    });
}

/// A standalone `evb node`: Ctrl-C (or SIGTERM) at the EVM ends the run cleanly, a second
/// one exits at once; any other node exits at once (the EVM handles it as a lost node).
pub fn stop_on_interrupt(cfg: &Config, id: &str, control: evb_node::RunControl) {
    let is_evm = cfg
        .nodes()
        .iter()
        .any(|n| n.id == id && n.role == Role::Evm);
    on_interrupt(move |n| {
        if n >= 2 || !is_evm {
            eprintln!("evb node: interrupted, exiting");
            std::process::exit(130);
        }
        control.stop();
    });
}

/// A serving node (`evb node --serve`): Ctrl-C or SIGTERM exits at once (`evb ctl halt`
/// is the orderly way down); its EVM, if it runs one, handles it as a lost node.
pub fn exit_on_interrupt() {
    on_interrupt(|_| {
        eprintln!("evb node: interrupted, exiting");
        std::process::exit(130);
    });
}

/// Calls `act` with the running count of SIGINT and SIGTERM received, on a thread of its own.
pub(crate) fn on_interrupt(mut act: impl FnMut(usize) + Send + 'static) {
    match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                for (n, _) in signals.forever().enumerate() {
                    act(n + 1);
                }
            });
        }
        Err(e) => eprintln!("evb: cannot watch for Ctrl-C ({e}): it will end the run at once"),
    }
}

/// Counts SIGINT and SIGTERM: the first asks for a clean stop, the second aborts.
pub(super) fn count_interrupts() -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = n.clone();
    on_interrupt(move |k| seen.store(k, std::sync::atomic::Ordering::SeqCst));
    n
}
