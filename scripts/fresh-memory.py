#!/usr/bin/env python3
"""What writing into memory costs by how much is already held: a plain writer keeps its files
in DIR (default /dev/shm), 16 MiB each in 1 MiB writes from a 64 MiB buffer, and prints its
CPU seconds for each GiB in turn, GIB of them, ROUNDS times (the files removed after each).
On a VM whose host takes back memory the guest freed, the GiBs past what the guest used
lately cost several times the first ones.  Usage: fresh-memory.py [GIB] [ROUNDS] [DIR]
"""
import os, time, shutil, sys
MB=1<<20
raw=bytearray(os.urandom(64*MB)); mv=memoryview(raw)
def run(total_gb):
    d=os.path.join(sys.argv[3] if len(sys.argv) > 3 else '/dev/shm', 'evb-fresh-memory'); shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    off=0; k=0; out=[]
    for g in range(total_gb):
        t0=time.time(); c0=time.process_time()
        for f in range(64):  # 64 x 16 MiB = 1 GiB
            fd=os.open(f'{d}/f{k}',os.O_CREAT|os.O_WRONLY|os.O_TRUNC)
            for j in range(16):
                os.write(fd, mv[off:off+MB]); off=(off+MB)%(64*MB)
            os.close(fd); k+=1
        out.append(f"{time.process_time()-c0:.2f}")
    shutil.rmtree(d, ignore_errors=True)
    return out
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    print("cpu s per GiB, GiB by GiB:", run(int(sys.argv[1]) if len(sys.argv) > 1 else 8), flush=True)
