#!/usr/bin/env python3
"""Cost of a write into /dev/shm by the relative alignment of file offset and source address.

Writes 1 GiB in 32 MiB files (1 MiB writes from a 64 MiB buffer, each file fdatasync'd
and removed) with (file offset - source address) mod 4096 = each REL given; prints GB/s
and this process's CPU seconds per GB, two rounds.  Usage: write-alignment.py 0 1 9 41 ...
"""
import os, time, sys, ctypes
MB=1<<20
src_mb=64
raw=bytearray(os.urandom(src_mb*MB+8192))
base=ctypes.addressof((ctypes.c_char*len(raw)).from_buffer(raw))
def run(rel, total_mb=1024, part_mb=32):
    # src start s.t. (file_off - src) mod 4096 == rel, file_off = 0 (page aligned)
    start=(-base - rel) % 4096
    mv=memoryview(raw)[start:start+src_mb*MB]
    d='/dev/shm/evb-write-alignment'; os.makedirs(d,exist_ok=True)
    t0=time.time(); c0=time.process_time(); off=0; k=0; written=0
    while written<total_mb*MB:
        p=f'{d}/f{k}'; fd=os.open(p,os.O_CREAT|os.O_WRONLY|os.O_TRUNC)
        for i in range(part_mb):
            os.write(fd, mv[off:off+MB]); off=(off+MB)%(src_mb*MB)
        os.fdatasync(fd); os.close(fd); os.unlink(p); k+=1; written+=part_mb*MB
    dt=time.time()-t0; c=time.process_time()-c0
    return written/dt/1e9, c/(written/1e9)
rels=[int(x) for x in sys.argv[1:]]
for r in range(2):
    for s in rels:
        g,c=run(s); print(f"rel {s:5d}: {g:.2f} GB/s  {c:.3f} cpu s/GB", flush=True)

import shutil
shutil.rmtree("/dev/shm/evb-write-alignment", ignore_errors=True)
