#!/usr/bin/env python3
"""A receiver that writes what it receives into /dev/shm, against one that only receives.

A feeder process sends 1 GiB over loopback TCP; the receiver reads 1 MiB at a time into a
ring of RING MiB (environment, default 1: always hot in the cache) and writes the slot
received RING-1 reads earlier into 32 MiB files (fdatasync'd and removed). Prints GB/s
and the receiver's CPU seconds per GB, two rounds.  Usage: RING=64 recv-then-write.py
"""
import os, time, socket, multiprocessing as mp
MB=1<<20
def feeder(port, total):
    s=socket.create_connection(('127.0.0.1',port)); blk=os.urandom(MB); sent=0
    while sent<total: s.sendall(blk); sent+=MB
    s.close()
def run(write, total_mb=1024):
    ls=socket.socket(); ls.bind(('127.0.0.1',0)); ls.listen(1); port=ls.getsockname()[1]
    p=mp.Process(target=feeder,args=(port,total_mb*MB)); p.start()
    c,_=ls.accept(); RING=int(os.environ.get('RING','1')); buf=bytearray(RING*MB); ring=memoryview(buf); slot=0
    d='/dev/shm/evb-recv-then-write'; os.makedirs(d,exist_ok=True)
    t0=time.time(); c0=time.process_time(); got=0; k=0; fd=None; infile=0
    while got<total_mb*MB:
        n=0
        while n<MB:
            mv=ring[slot*MB:(slot+1)*MB]; r=c.recv_into(mv[n:]); 
            if r==0: break
            n+=r
        if n==0: break
        got+=n
        old=(slot+1)%RING; wmv=ring[old*MB:old*MB+MB] if RING>1 else mv[:n]; slot=(slot+1)%RING
        if write:
            if fd is None: fd=os.open(f'{d}/f{k}',os.O_CREAT|os.O_WRONLY|os.O_TRUNC)
            os.write(fd, wmv); infile+=n
            if infile>=32*MB: os.fdatasync(fd); os.close(fd); os.unlink(f'{d}/f{k}'); fd=None; k+=1; infile=0
    dt=time.time()-t0; c1=time.process_time()-c0; p.join()
    return got/dt/1e9, c1/(got/1e9)
for r in range(2):
    for w in (False, True):
        g,c=run(w); print(f"recv{' + write' if w else '        '}: {g:.2f} GB/s, receiver {c:.3f} cpu s/GB", flush=True)

import shutil
shutil.rmtree("/dev/shm/evb-recv-then-write", ignore_errors=True)
