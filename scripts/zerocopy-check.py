#!/usr/bin/env python3
"""MSG_ZEROCOPY against plain send for large messages on this host, beside iperf3 with
and without -Z, in the same run: CPU seconds per GB of the sender and the receiver, and
GB/s. Issue 33, item 4 asked whether evb's tcp transport should send messages of 64 KiB
and more with MSG_ZEROCOPY; this is the check, kept so the figures can be made again.

    scripts/zerocopy-check.py                    # loopback, 64 KiB sends, 4 GB, 3 rounds
    scripts/zerocopy-check.py --veth             # between two network namespaces (root)
    scripts/zerocopy-check.py --size 262144 --gb 8 --rounds 5

Each round runs the four senders one after the other; the table gives medians.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

MSG_ZEROCOPY = 0x4000000
SO_ZEROCOPY = 60
MSG_ERRQUEUE = 0x2000


def ns_prefix(ns):
    return ["ip", "netns", "exec", ns] if ns else []


def receiver(port, host):
    """Accepts one connection and reads until it closes."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    buf = bytearray(1 << 20)
    total = 0
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        total += n
    print(total, flush=True)


def sender(host, port, size, total, zerocopy):
    s = socket.socket()
    if zerocopy:
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    s.connect((host, port))
    buf = bytes(size)  # never written again: safe to share with the kernel until done
    sent, pending = 0, 0
    flags = MSG_ZEROCOPY if zerocopy else 0
    while sent < total:
        sent += s.send(buf, flags)
        if zerocopy:
            pending += 1
            # completions: drain the error queue so that notifications never pile up
            while pending > 0:
                try:
                    s.recvmsg(0, 1024, MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                    pending = 0
                except BlockingIOError:
                    break
    s.close()


def cpu_of(proc):
    """Waits for `proc`; its user + system CPU seconds."""
    _, _, ru = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return ru.ru_utime + ru.ru_stime


def one(args, mode, host, port):
    """One transfer; returns (GB/s, sender CPU s/GB, receiver CPU s/GB)."""
    me = [sys.executable, os.path.abspath(__file__)]
    total = int(args.gb * 1e9)
    if mode.startswith("iperf3"):
        rx = subprocess.Popen(
            ns_prefix(args.rx_ns) + ["iperf3", "-s", "-1", "-p", str(port), "-B", host],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        cmd = ["iperf3", "-c", host, "-p", str(port), "-n", str(total), "-l", str(args.size)]
        if mode == "iperf3 -Z":
            cmd.append("-Z")
        t0 = time.perf_counter()
        tx = subprocess.Popen(ns_prefix(args.tx_ns) + cmd, stdout=subprocess.DEVNULL)
    else:
        rx = subprocess.Popen(
            ns_prefix(args.rx_ns) + me + ["--receiver", str(port), "--host", host],
            stdout=subprocess.PIPE,
            text=True,
        )
        rx.stdout.readline()
        zc = "1" if mode == "MSG_ZEROCOPY" else "0"
        t0 = time.perf_counter()
        tx = subprocess.Popen(
            ns_prefix(args.tx_ns)
            + me
            + ["--sender", host, str(port), str(args.size), str(total), zc]
        )
    tx_cpu = cpu_of(tx)
    rx_cpu = cpu_of(rx)
    secs = time.perf_counter() - t0
    gb = total / 1e9
    return gb / secs, tx_cpu / gb, rx_cpu / gb


def veth():
    for ns in ("zctx", "zcrx"):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    subprocess.run(
        ["ip", "link", "add", "zca", "netns", "zctx", "type", "veth", "peer", "name", "zcb",
         "netns", "zcrx"],
        check=True,
    )
    for ns, dev, addr in (("zctx", "zca", "10.249.0.1/24"), ("zcrx", "zcb", "10.249.0.2/24")):
        subprocess.run(["ip", "-n", ns, "addr", "add", addr, "dev", dev], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--receiver":
        receiver(int(sys.argv[2]), sys.argv[4])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--sender":
        h, p, size, total, zc = sys.argv[2:7]
        sender(h, int(p), int(size), int(total), zc == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=65536, help="bytes per send")
    ap.add_argument("--gb", type=float, default=4.0, help="GB per transfer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--veth", action="store_true", help="between two namespaces (root)")
    args = ap.parse_args()
    args.tx_ns = args.rx_ns = None
    host = "127.0.0.1"
    if args.veth:
        veth()
        args.tx_ns, args.rx_ns, host = "zctx", "zcrx", "10.249.0.2"
    modes = ["send", "MSG_ZEROCOPY", "iperf3", "iperf3 -Z"]
    results = {m: [] for m in modes}
    port = 7400
    try:
        for r in range(args.rounds):
            for m in modes:
                port += 1
                results[m].append(one(args, m, host, port))
                g, t, x = results[m][-1]
                print(f"round {r + 1} {m:<13} {g:6.2f} GB/s  sender {t:.3f}  receiver {x:.3f} CPU s/GB",
                      flush=True)
    finally:
        if args.veth:
            for ns in ("zctx", "zcrx"):
                subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
    where = "veth between namespaces" if args.veth else "loopback"
    print(f"\n{where}, {args.size}-byte sends, {args.gb} GB, medians of {args.rounds}:")
    print(f"{'':<13} {'GB/s':>6} {'sender CPU s/GB':>16} {'receiver CPU s/GB':>18}")
    for m in modes:
        g, t, x = (statistics.median(v[i] for v in results[m]) for i in range(3))
        print(f"{m:<13} {g:6.2f} {t:16.3f} {x:18.3f}")


if __name__ == "__main__":
    main()
