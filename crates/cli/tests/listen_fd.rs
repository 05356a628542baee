//! `evb run` binds the ports it picks and its nodes inherit those sockets
//! (`evb node --listen-fd ADDR=FD`): the port is never free between the launcher's choice and
//! the node's use. Here the test plays the launcher and keeps its own copies open the whole
//! time, so a node that bound the address itself instead of adopting the socket would fail.

mod common;
use common::EVB;

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use evb_control::client::Api;

fn evm_config(dir: &std::path::Path, data: &str, control: &str) -> std::path::PathBuf {
    let base = common::free_base_port(4);
    let toml = format!(
        "[run]\nconnect_timeout_s = 10.0\n\
         [evm]\naddr = \"{data}\"\ncontrol = \"{control}\"\n\
         [[ru]]\nid = \"ru0\"\naddr = \"127.0.0.1:{}\"\ncontrol = \"127.0.0.1:{}\"\n\
         [[bu]]\nid = \"bu0\"\naddr = \"127.0.0.1:{}\"\ncontrol = \"127.0.0.1:{}\"\n",
        base,
        base + 1,
        base + 2,
        base + 3
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

#[test]
fn a_node_listens_on_the_sockets_its_launcher_bound_and_never_binds_them_itself() {
    let dir = common::out_dir();
    let data = TcpListener::bind("127.0.0.1:0").unwrap();
    let control = TcpListener::bind("127.0.0.1:0").unwrap();
    let (da, ca) = (data.local_addr().unwrap(), control.local_addr().unwrap());
    let cfg = evm_config(dir.path(), &da.to_string(), &ca.to_string());

    // Without the sockets handed over, the node cannot listen: the ports are taken (by this
    // test), which is what a port stolen between choice and use looks like.
    let out = Command::new(EVB)
        .args(["node", "--id", "evm", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&da.to_string()) || said.contains(&ca.to_string()),
        "{said}"
    );

    // With them, it serves on both while this test still holds its own copies.
    let fds = [data.as_raw_fd(), control.as_raw_fd()];
    let mut cmd = Command::new(EVB);
    cmd.args(["node", "--id", "evm", "--config"])
        .arg(&cfg)
        .arg(format!("--listen-fd={da}={}", fds[0]))
        .arg(format!("--listen-fd={ca}={}", fds[1]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: runs in the forked child before exec and only calls fcntl (async-signal-safe)
    // on descriptors this test owns, to let the child inherit them.
    unsafe {
        cmd.pre_exec(move || {
            for fd in fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let api = Api::new(&ca.to_string(), None).with_timeout(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(8);
    let pid = loop {
        if let Ok(r) = api.get("/api/v1/node") {
            if let Some(pid) = r.body["pid"].as_u64() {
                break pid;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the node exited ({status}) instead of serving: {err}");
        }
        assert!(Instant::now() < deadline, "no control API on {ca}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(pid, child.id() as u64, "someone else answered on {ca}");
    // the data socket is the node's too: a peer's connection gets its handshake answered
    // (a garbage hello is refused and the connection closed, not left hanging)
    let mut s = std::net::TcpStream::connect(da).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Write::write_all(&mut s, &[0x55; 64]).unwrap();
    let mut buf = [0u8; 64];
    let closed = match std::io::Read::read(&mut s, &mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(closed, "the node did not handle a connection to {da}");
    let _ = child.kill();
    let _ = child.wait();

    // A descriptor that is not the named listener is refused at once, naming both.
    let out = Command::new(EVB)
        .args(["node", "--id", "evm", "--config"])
        .arg(&cfg)
        .arg(format!("--listen-fd={da}=999"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--listen-fd") && said.contains("999"),
        "{said}"
    );
}
