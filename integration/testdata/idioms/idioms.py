"""A blocking open-and-lock idiom of lock libraries, in a loop on a
leasefs mount, with an interval timer interrupting the calls.

Usage: idioms.py blocking PATH ITERATIONS

  blocking    os.open(O_RDWR|O_CREAT|O_TRUNC) + fstat + flock(LOCK_EX) + close (the release
              is the close)

(libraries.py runs Python's lock libraries themselves.) It prints ok=N
(acquired), busy=N (always 0 here), failed=N and fail.OP.ERRNO=N for each
kind of failure; every iteration is one of ok or a failure.
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
        if idiom == "blocking":
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
