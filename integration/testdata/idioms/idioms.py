"""The open-and-lock idioms of Python's lock libraries, in a loop on a
leasefs mount, with an interval timer interrupting the calls.

Usage: idioms.py IDIOM PATH ITERATIONS

IDIOM is one of
  filelock    os.open(O_RDWR|O_CREAT|O_TRUNC) + flock(LOCK_EX|LOCK_NB) + flock(LOCK_UN) + close
              (filelock's UnixFileLock)
  portalocker open(path, "w") + flock(LOCK_EX|LOCK_NB) + write of a line of text + flock(LOCK_UN)
              + close (portalocker's Lock with mode "w" and a pid note)
  fasteners   open(path, "a+") (openat, fstat, lseek) + lockf(LOCK_EX|LOCK_NB) + lockf(LOCK_UN)
              + close (fasteners' InterProcessLock)
  blocking    os.open(O_RDWR|O_CREAT|O_TRUNC) + fstat + flock(LOCK_EX) + close (the release
              is the close)

It prints ok=N (acquired), busy=N (LOCK_NB refused as held), failed=N and
fail.OP.ERRNO=N for each kind of failure; every iteration is one of ok,
busy or a failure.
"""
import errno
import fcntl
import os
import signal
import sys

idiom, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
# A 1 ms interval timer: the kernel sends FUSE_INTERRUPT for calls in
# flight; Python retries EINTR (PEP 475).
signal.signal(signal.SIGALRM, lambda *_: None)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)

ok = busy = 0
fails = {}


def fail(op, e):
    key = "%s.%s" % (op, errno.errorcode.get(e.errno, str(e.errno)))
    fails[key] = fails.get(key, 0) + 1


for _ in range(n):
    op = "open"
    try:
        if idiom == "filelock":
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                op = "flock"
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    busy += 1
                    continue
                op = "unlock"
                fcntl.flock(fd, fcntl.LOCK_UN)
                ok += 1
            finally:
                os.close(fd)
        elif idiom == "portalocker":
            with open(path, "w") as f:
                op = "flock"
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    busy += 1
                    continue
                op = "note"
                f.write("locked by %d\n" % os.getpid())
                f.flush()
                op = "unlock"
                fcntl.flock(f, fcntl.LOCK_UN)
                ok += 1
        elif idiom == "fasteners":
            with open(path, "a+") as f:
                op = "lockf"
                try:
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except (BlockingIOError, PermissionError):
                    busy += 1
                    continue
                op = "unlock"
                fcntl.lockf(f, fcntl.LOCK_UN)
                ok += 1
        elif idiom == "blocking":
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                op = "fstat"
                os.fstat(fd)
                op = "flock"
                fcntl.flock(fd, fcntl.LOCK_EX)
                ok += 1
            finally:
                os.close(fd)
        else:
            sys.exit("unknown idiom " + idiom)
    except OSError as e:
        fail(op, e)

signal.setitimer(signal.ITIMER_REAL, 0, 0)
print("ok=%d\nbusy=%d\nfailed=%d" % (ok, busy, sum(fails.values())))
for k, v in sorted(fails.items()):
    print("fail.%s=%d" % (k, v))
