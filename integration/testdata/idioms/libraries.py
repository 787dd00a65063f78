"""Python's lock libraries themselves (Debian's python3-filelock,
python3-fasteners, python3-portalocker), in a loop on a leasefs mount,
with a 1 ms interval timer interrupting their calls.

Usage: libraries.py LIBRARY PATH ITERATIONS

LIBRARY is filelock (FileLock with timeout 0), fasteners
(InterProcessLock.acquire(blocking=False)) or portalocker (Lock in mode
"w" with timeout 0, writing the holder's pid while it holds the lock).

It prints ok=N (acquired and released), busy=N (refused as held),
failed=N and fail.EXCEPTION=N for each kind of failure.
"""
import signal
import sys

library, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGALRM, lambda *_: None)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)

ok = busy = 0
fails = {}


def fail(e):
    key = type(e).__name__ + "." + str(getattr(e, "errno", ""))
    fails[key] = fails.get(key, 0) + 1


if library == "filelock":
    import filelock

    for _ in range(n):
        lock = filelock.FileLock(path, timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            busy += 1
            continue
        except Exception as e:
            fail(e)
            continue
        try:
            lock.release()
            ok += 1
        except Exception as e:
            fail(e)
elif library == "fasteners":
    import fasteners

    for _ in range(n):
        lock = fasteners.InterProcessLock(path)
        try:
            got = lock.acquire(blocking=False)
        except Exception as e:
            fail(e)
            continue
        if not got:
            busy += 1
            continue
        try:
            lock.release()
            ok += 1
        except Exception as e:
            fail(e)
elif library == "portalocker":
    import os

    import portalocker

    for _ in range(n):
        lock = portalocker.Lock(path, mode="w", timeout=0, fail_when_locked=True)
        try:
            fh = lock.acquire()
        except portalocker.exceptions.AlreadyLocked:
            busy += 1
            continue
        except Exception as e:
            fail(e)
            continue
        try:
            fh.write("%d\n" % os.getpid())
            fh.flush()
            lock.release()
            ok += 1
        except Exception as e:
            fail(e)
else:
    sys.exit("unknown library " + library)

signal.setitimer(signal.ITIMER_REAL, 0, 0)
print("ok=%d\nbusy=%d\nfailed=%d" % (ok, busy, sum(fails.values())))
for k, v in sorted(fails.items()):
    print("fail.%s=%d" % (k, v))
