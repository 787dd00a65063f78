"""Python load generator of the reliability suite (integration/reliability_test.go).

Loops over lease names taking token leases (create, read the token, renew by
writing it, complete or abandon) and handle leases (flock non-blocking,
flock blocking with an alarm, whole-file POSIX lockf), logging every operation
with CLOCK_MONOTONIC timestamps (time.monotonic_ns) for the checker.

Environment: M (lease directory), NAMES (space separated), LEASE_MS, LOG (log
file, appended), MODES (comma separated: token, flock, flockw, lockf), SEED.

Log lines (one write(2) each):
    B seq op name mode lease gen mono wall    before the operation
    E seq result lease gen mono extra         after it ("-" when unknown)
extra is the token read (acq of a token lease), the release action (rel:
complete, abandon, unlock or close) or "-".
"""

import errno
import fcntl
import os
import random
import re
import signal
import time

M = os.environ["M"]
NAMES = os.environ["NAMES"].split()
LEASE = int(os.environ["LEASE_MS"]) / 1000.0
MODES = os.environ["MODES"].split(",")
rng = random.Random(int(os.environ.get("SEED", "0")) ^ os.getpid())
log = os.open(os.environ["LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
seq = 0

LEASE_RE = re.compile(r'^lease_id = "([^"]+)"$', re.M)
GEN_RE = re.compile(r"^generation = (\d+)$", re.M)
STATUS_RE = re.compile(r'^status = "([^"]+)"$', re.M)
TOKEN_RE = re.compile(r"^hwl_[a-z2-7]{39}\n$")
GONE = ("ENOTCONN", "ECONNABORTED", "ENODEV")


def begin(op, name, mode, lease="-", gen=0):
    global seq
    seq += 1
    os.write(log, f"B {seq} {op} {name} {mode} {lease or '-'} {gen} {time.monotonic_ns()} {time.time_ns()}\n".encode())
    return seq


def end(s, result, lease="-", gen=0, token="-"):
    os.write(log, f"E {s} {result} {lease or '-'} {gen} {time.monotonic_ns()} {token or '-'}\n".encode())


def ename(e):
    if isinstance(e, OSError) and e.errno is not None:
        name = errno.errorcode.get(e.errno, f"E{e.errno}")
        return "EWOULDBLOCK" if name == "EAGAIN" else name
    return "ERR"


def nap(lo, hi):
    time.sleep(rng.uniform(lo, hi))


def status(fd):
    """Returns (lease, gen, result) from the status document read through fd."""
    try:
        doc = os.pread(fd, 8192, 0).decode()
    except OSError as e:
        return "-", 0, ename(e)
    l, g, s = LEASE_RE.search(doc), GEN_RE.search(doc), STATUS_RE.search(doc)
    if not (l and g and s):
        return "-", 0, "baddoc"
    if s.group(1) != "active":
        return l.group(1), 0, "notactive"
    return l.group(1), int(g.group(1)), "ok"


def reopen(path, lease, last_ok):
    """After the daemon restarted, find the token lease again by name."""
    while time.monotonic() - last_ok < LEASE:
        time.sleep(0.1)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            if ename(e) in GONE:
                continue
            return None
        got, _, res = status(fd)
        if res == "ok" and got == lease:
            return fd
        os.close(fd)
        if res not in GONE:
            return None
    return None


def token_cycle(name):
    path = os.path.join(M, name)
    s = begin("acq", name, "token")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR)
    except OSError as e:
        end(s, ename(e))
        nap(0.05, 0.2)
        return
    try:
        try:
            tok = os.read(fd, 4096).decode()
        except OSError as e:
            end(s, "lost-" + ename(e))
            return
        if not TOKEN_RE.match(tok):
            end(s, "notoken")
            return
        tok = tok.strip()
        lease, gen, res = status(fd)
        if res != "ok":
            end(s, "lost-" + res, lease, 0, tok)
            return
        end(s, "ok", lease, gen, tok)
        last_ok = time.monotonic()
        hold = time.monotonic() + rng.uniform(0.3, 1.5)
        while time.monotonic() < hold:
            nap(0.1, 0.6)
            s = begin("renew", name, "token", lease, gen)
            try:
                os.write(fd, (tok + "\n").encode())
                end(s, "ok", lease, gen)
                last_ok = time.monotonic()
                continue
            except OSError as e:
                res = ename(e)
                end(s, res, lease, gen)
            if res == "ESTALE":
                # A stalled holder's late renew: probe that the lease stays dead.
                s = begin("renew", name, "token", lease, gen)
                try:
                    os.write(fd, (tok + "\n").encode())
                    end(s, "ok", lease, gen)
                except OSError as e:
                    end(s, ename(e), lease, gen)
                return
            if res in GONE:
                nfd = reopen(path, lease, last_ok)
                if nfd is None:
                    return
                os.close(fd)
                fd = nfd
                continue
            return
        r = rng.randrange(10)
        if r == 0:
            return  # walk away: the lease expires
        action = "abandon" if r == 1 else "complete"
        s = begin("rel", name, "token", lease, gen)
        try:
            os.write(fd, f'token = "{tok}"\naction = "{action}"\n'.encode())
            end(s, "ok", lease, gen, action)
        except OSError as e:
            end(s, ename(e), lease, gen, action)
    finally:
        os.close(fd)


class Alarm(Exception):
    pass


def on_alarm(signum, frame):
    raise Alarm()


signal.signal(signal.SIGALRM, on_alarm)


# The opens of lock libraries, one picked per handle cycle: flock(1)'s
# O_CREAT; filelock's and portalocker's O_TRUNC; fasteners' open("a+"),
# whose fstat and lseek follow the open (docs/PROTOCOL.md §6, "Lock
# libraries").
OPEN_IDIOMS = (
    os.O_CREAT | os.O_RDWR,
    os.O_CREAT | os.O_RDWR | os.O_TRUNC,
    os.O_CREAT | os.O_RDWR | os.O_APPEND,
)


def handle_cycle(name, mode):
    path = os.path.join(M, name)
    s = begin("acq", name, mode)
    flags = rng.choice(OPEN_IDIOMS)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        end(s, ename(e))
        nap(0.05, 0.2)
        return
    try:
        os.fstat(fd)
        if flags & os.O_APPEND:
            os.lseek(fd, 0, os.SEEK_END)
    except OSError as e:
        os.close(fd)
        end(s, ename(e))
        return
    try:
        try:
            if mode == "flock":
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif mode == "lockf":
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:  # flockw: wait first come first served, at most ~2.5 s
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.5, 2.5))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except Alarm:
            end(s, "TIMEOUT")
            return
        except OSError as e:
            end(s, ename(e))
            return
        lease, gen, res = status(fd)
        if res != "ok":
            end(s, "lost-" + res, lease)
        else:
            end(s, "ok", lease, gen)
            hold = time.monotonic() + rng.uniform(0.2, 1.0)
            while time.monotonic() < hold:
                nap(0.1, 0.4)
                s = begin("check", name, mode, lease, gen)
                got, g, res = status(fd)
                if res == "ok" and (got != lease or g != gen):
                    res = "mismatch"
                end(s, res, got, g)
                if res != "ok":
                    break
        s = begin("rel", name, mode, lease, gen)
        result, action = "ok", "close"
        if rng.randrange(2) == 0:
            action = "unlock"
            try:
                if mode == "lockf":
                    fcntl.lockf(fd, fcntl.LOCK_UN)
                else:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError as e:
                result = ename(e)
        try:
            os.close(fd)
        except OSError as e:
            result = ename(e)
        fd = -1
        end(s, result, lease, gen, action)
    finally:
        if fd >= 0:
            os.close(fd)


while True:
    name = rng.choice(NAMES)
    mode = rng.choice(MODES)
    if mode == "token":
        token_cycle(name)
    else:
        handle_cycle(name, mode)
    nap(0.05, 0.25)
