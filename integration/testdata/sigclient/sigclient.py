"""The Python half of sigclient (see main.go): the same cycles, with a
handler on an interval timer (ITIMER_REAL) that signals the process every
TIMER seconds, so that most of its slow system calls get FUSE_INTERRUPT.
Python installs handlers without SA_RESTART and retries EINTR itself
(PEP 475).

Usage: python3 sigclient.py M DURATION TIMER  (seconds, floats)

Prints calls=N, failed=N, fail.OP.ERRNO=N and the first failures."""
import errno
import fcntl
import os
import signal
import sys
import time

m, duration, timer = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
calls, failed, first = 0, {}, []


def call(op, fn, *args):
    """Runs one system call; returns (True, value) or (False, None)."""
    global calls
    calls += 1
    try:
        return True, fn(*args)
    except OSError as e:
        key = op + "." + errno.errorcode.get(e.errno, str(e.errno))
        failed[key] = failed.get(key, 0) + 1
        if len(first) < 20:
            first.append("%s: %s" % (op, e))
        return False, None


def token_cycle(p):
    ok, fd = call("create", os.open, p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    if not ok:
        return
    ok, tok = call("read-token", os.read, fd, 4096)
    call("close", os.close, fd)
    ok, w = call("open-renew", os.open, p, os.O_WRONLY)
    if ok:
        call("renew", os.write, w, tok or b"-")
        call("close", os.close, w)
    call("stat", os.stat, p)
    call("getxattr", os.getxattr, p, "user.lease.generation")
    ok, r = call("open-cat", os.open, p, os.O_RDONLY)
    if ok:
        while True:
            ok, b = call("cat", os.read, r, 4096)
            if not ok or not b:
                break
        call("close", os.close, r)
    call("unlink", os.unlink, p)


def handle_cycle(p):
    ok, fd = call("open-lock", os.open, p, os.O_CREAT | os.O_RDWR, 0o644)
    if not ok:
        return
    ok, _ = call("flock", fcntl.flock, fd, fcntl.LOCK_EX)
    if ok:
        call("unlock", fcntl.flock, fd, fcntl.LOCK_UN)
    call("close", os.close, fd)


signal.signal(signal.SIGALRM, lambda *_: None)
signal.setitimer(signal.ITIMER_REAL, timer, timer)
end = time.monotonic() + duration
k = 0
while time.monotonic() < end:
    token_cycle(os.path.join(m, "py"))
    handle_cycle(os.path.join(m, "py-h" if k % 2 == 0 else "go-shared"))
    k += 1
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print("calls=%d" % calls)
print("failed=%d" % sum(failed.values()))
for key in sorted(failed):
    print("fail.%s=%d" % (key, failed[key]))
for f in first:
    print("#", f)
