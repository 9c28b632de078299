#!/usr/bin/env python3
"""Housekeeping of the cache directory and $TMPDIR (suite 'faults').

  locks      single-flight lock files (DIR/locks) nobody holds are removed
             by `kcache gc`, by `kcache clear` and at the end of an owner
             session; one that a process holds stays
  maxsize    KCACHE_MAXSIZE past 2^64 bytes, and KCACHE_MAXSIZE=0, warn and
             keep the default; `kcache config`, `gc` and `stats` agree
  spool      an owner that cannot start (a bad KCACHE_TOOL): the spool stays
             within KCACHE_MAXSIZE (plus one put), the puts past it are
             skipped with one warning and counted, outputs unchanged
  tmpsec     a read-only reader's secondary goes under $TMPDIR/kcache-<uid>
             (0700, ours); thousands of stale-looking kcache-sec-* entries
             of another user in $TMPDIR are never opened (inotify) nor
             removed; a dead reader's directory in ours is swept; a
             kcache-<uid> squatted by another user is not written into
  ownerstart a cold run of several kernels that starts the owner (kept
             live: KCACHE_OWNER_IDLE_MS) never loads RocksDB in the host:
             every miss is told apart by the spool and the key filter
  ownergone  an owner a store started finds its directory removed: it does
             not make it again (a test's, or a user's, removed store stays
             removed); `kcache owner` by hand still makes a missing one

Real NVRTC compiles through tests/bench's nvrtc_bench under the shim. The
other-user cases need root (chown); they are skipped otherwise.
Exit 0 ok, 1 failure, 77 skip.
"""
import ctypes
import ctypes.util
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

SHIM = os.environ["KCACHE_SHIM"]
TOOL = os.environ["KCACHE_TOOL"]
BENCH = os.path.join(os.environ["KCACHE_BUILD"], "tests", "bench", "nvrtc_bench")
STATS_RE = re.compile(r"nvrtc hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)")
OTHER_UID = 12345
failures = []


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def kernels(tmp, tag, n):
    """Writes n distinct kernel sources; returns their paths."""
    paths = []
    for i in range(n):
        p = os.path.join(tmp, "%s%d.cu" % (tag, i))
        with open(p, "w") as f:
            f.write('extern "C" __global__ void %s_%d(float *p) '
                    '{ p[threadIdx.x] *= %d.5f; }\n' % (tag, i, i))
        paths.append(p)
    return paths


def base_env(cache, extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    e.update({"KCACHE_DIR": cache, "KCACHE_STATS": "1", "KCACHE_TOOL": TOOL})
    e.update(extra or {})
    return e


def compile_all(cache, srcs, save, extra=None, shim=True):
    """One process compiling every source once; returns (stats, stderr, ptx by name)."""
    os.makedirs(save, exist_ok=True)
    e = base_env(cache, extra)
    if shim:
        e["LD_PRELOAD"] = SHIM
    args = [BENCH, "--save", save]
    for s in srcs:
        args += ["--file", s]
    p = subprocess.run(args + ["1"], env=e, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit("nvrtc_bench failed: " + p.stderr[-2000:])
    m = STATS_RE.search(p.stderr)
    st = tuple(int(x) for x in m.groups()) if m else None
    ptx = {}
    for n in sorted(os.listdir(save)):
        with open(os.path.join(save, n), "rb") as f:
            ptx[n] = f.read()
    return st, p.stderr, ptx


def tool(cache, *args, extra=None):
    e = base_env(cache, extra)
    e.pop("KCACHE_STATS")
    return subprocess.run([TOOL] + list(args), env=e, capture_output=True, text=True,
                          timeout=120)


def drain(cache):
    """Runs owner sessions until the spool holds no put or log."""
    for _ in range(200):
        tool(cache, "owner", "--idle-ms", "0")
        sp = os.path.join(cache, "spool")
        if not any(n[:2] in ("p-", "d-", "h-", "x-", "c-") for n in os.listdir(sp)):
            return
        time.sleep(0.05)
    raise SystemExit("the spool did not drain")


def stop_owner(cache):
    """Asks a live owner to stop (a tool operation does) and waits for it."""
    if os.path.isdir(cache):
        tool(cache, "gc")


def new_cache(tmp, name):
    c = os.path.join(tmp, name)
    os.mkdir(c, 0o700)
    return c


# ---- locks ---------------------------------------------------------------


def lock_files(cache):
    d = os.path.join(cache, "locks")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_locks(tmp):
    # gc: lock files of compiles that just ended are nobody's.
    c = new_cache(tmp, "locks-gc")
    srcs = kernels(tmp, "lg", 6)
    compile_all(c, srcs, os.path.join(tmp, "lg-ptx"), {"KCACHE_TOOL": "/bin/true"})
    n = len(lock_files(c))
    check(n >= 6, "locks: each miss made a lock file (%d)" % n)
    # One held by a live process stays.
    held = os.path.join(c, "locks", lock_files(c)[0])
    fd = os.open(held, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = tool(c, "gc")
        check(r.returncode == 0, "locks: gc ran (%s)" % r.stderr.strip())
        left = lock_files(c)
        check(left == [os.path.basename(held)],
              "locks: gc removed every lock file nobody holds and kept the held one "
              "(%d of %d left)" % (len(left), n))
    finally:
        os.close(fd)
    r = tool(c, "gc", "--max-size", "1")
    check(lock_files(c) == [], "locks: released, the next gc (evicting every entry) removes "
          "it (%s)" % lock_files(c))

    # clear.
    c = new_cache(tmp, "locks-clear")
    compile_all(c, kernels(tmp, "lc", 4), os.path.join(tmp, "lc-ptx"),
                {"KCACHE_TOOL": "/bin/true"})
    check(len(lock_files(c)) >= 4, "locks: clear's store has lock files")
    tool(c, "clear")
    check(lock_files(c) == [], "locks: clear removed them (%s)" % lock_files(c))

    # The end of an owner session (the one that drains).
    c = new_cache(tmp, "locks-owner")
    st, err, ptx = compile_all(c, kernels(tmp, "lo", 6), os.path.join(tmp, "lo-ptx"),
                               {"KCACHE_TOOL": "/bin/true"})
    check(len(lock_files(c)) >= 6, "locks: the owner's store has lock files")
    drain(c)
    check(lock_files(c) == [], "locks: the owner's session removed them (%d left)"
          % len(lock_files(c)))
    # And the cache still works: the same requests hit or compile again,
    # with the same outputs.
    st2, err2, ptx2 = compile_all(c, kernels(tmp, "lo", 6), os.path.join(tmp, "lo-ptx2"))
    check(ptx2 == ptx, "locks: outputs unchanged after the lock files went")
    stop_owner(c)


# ---- maxsize --------------------------------------------------------------

DEFAULT = 5 << 30


def config_value(out, var):
    m = re.search(r"^%s +\S+ +(\S+)" % var, out, re.M)
    return m.group(1) if m else None


def maxsize_warnings(r):
    """Warning lines about KCACHE_MAXSIZE (`config` prints them on stdout)."""
    return [l for l in (r.stdout + r.stderr).splitlines()
            if "warning" in l and "KCACHE_MAXSIZE" in l]


def test_maxsize(tmp):
    c = new_cache(tmp, "maxsize")
    for val in ("99999999999999999999999", "18446744073709551616", "20000000000T", "0", "0G"):
        env = {"KCACHE_MAXSIZE": val}
        r = tool(c, "config", extra=env)
        check(len(maxsize_warnings(r)) == 1, "maxsize %s: config warns once (%r)"
              % (val, maxsize_warnings(r)))
        check(config_value(r.stdout, "KCACHE_MAXSIZE") == str(DEFAULT),
              "maxsize %s: config shows the default (%s)"
              % (val, config_value(r.stdout, "KCACHE_MAXSIZE")))
        r = tool(c, "stats", "--json", extra=env)
        try:
            js = json.loads(r.stdout)
        except ValueError:
            js = {}
        check(js.get("max_size") == DEFAULT, "maxsize %s: stats says the default (%s)"
              % (val, js.get("max_size")))
        check(len(maxsize_warnings(r)) == 1, "maxsize %s: stats warns once" % val)
        r = tool(c, "gc", extra=env)
        check(len(maxsize_warnings(r)) == 1, "maxsize %s: gc warns once" % val)
        m = re.search(r"\(limit ([^)]*)\)", r.stdout)
        check(m is not None and m.group(1) == "5.0 GiB",
              "maxsize %s: gc's limit is the default (%s)" % (val, r.stdout.strip()))
    # A size that fits still works.
    r = tool(c, "config", extra={"KCACHE_MAXSIZE": "16E"})
    check(len(maxsize_warnings(r)) == 1, "maxsize 16E warns")
    r = tool(c, "config", extra={"KCACHE_MAXSIZE": "1023T"})
    check(maxsize_warnings(r) == [] and
          config_value(r.stdout, "KCACHE_MAXSIZE") == str(1023 << 40),
          "maxsize 1023T is taken as it is (%s)" % maxsize_warnings(r))


# ---- spool ---------------------------------------------------------------


def spool_bytes(cache, prefix=""):
    sp = os.path.join(cache, "spool")
    return sum(os.lstat(os.path.join(sp, n)).st_size for n in os.listdir(sp)
               if n.startswith(prefix))


def test_spool(tmp):
    limit = 16 << 10
    bad = {"KCACHE_TOOL": "/nonexistent/kcache", "KCACHE_MAXSIZE": "16K"}
    srcs = kernels(tmp, "sp", 40)
    _, _, ref = compile_all(os.path.join(tmp, "unused"), srcs, os.path.join(tmp, "sp-ref"),
                            shim=False)
    c = new_cache(tmp, "spool")
    st, err, ptx = compile_all(c, srcs, os.path.join(tmp, "sp-ptx"), bad)
    check(ptx == ref, "spool: outputs unchanged")
    sizes = [os.lstat(os.path.join(c, "spool", n)).st_size
             for n in os.listdir(os.path.join(c, "spool")) if n.startswith("p-")]
    biggest = max(sizes) if sizes else 0
    used = spool_bytes(c)
    check(used <= limit + 2 * biggest + 1024,
          "spool: bounded by KCACHE_MAXSIZE (16 KiB): %d bytes in %d puts" % (used, len(sizes)))
    warns = [l for l in err.splitlines() if "warning" in l]
    spool_w = [l for l in warns if "spool" in l]
    check(len(spool_w) == 1, "spool: one warning about the full spool (%r)" % warns)
    check(len(warns) <= 2, "spool: no other warning but the owner's (%r)" % warns)
    check(st is not None and st[1] == 40 and st[3] < 40 and st[3] + st[4] == 40,
          "spool: every skipped put counted as an error (stats %s)" % (st,))
    # A second process finds the spool full at once.
    puts = spool_bytes(c, "p-")
    st, err, ptx = compile_all(c, kernels(tmp, "sq", 4), os.path.join(tmp, "sq-ptx"), bad)
    check(st is not None and st[3] == 0 and spool_bytes(c, "p-") == puts,
          "spool: the next process stores nothing (stats %s, %d bytes of puts)"
          % (st, spool_bytes(c, "p-")))
    # Once an owner drains it, puts are stored again.
    drain(c)
    st, err, ptx = compile_all(c, kernels(tmp, "sr", 2), os.path.join(tmp, "sr-ptx"),
                               {"KCACHE_TOOL": "/nonexistent/kcache"})
    check(st is not None and st[3] == 2, "spool: drained, puts are stored again (%s)" % (st,))


# ---- tmpsec --------------------------------------------------------------

IN_ACCESS, IN_OPEN, IN_CREATE = 0x1, 0x20, 0x100


class Inotify:
    def __init__(self):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.wd = {}

    def watch(self, path, mask):
        wd = self.libc.inotify_add_watch(self.fd, path.encode(), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch " + path)
        self.wd[wd] = path

    def events(self):
        """[(path watched, mask, name)] read so far."""
        out = []
        while True:
            try:
                b = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            i = 0
            while i < len(b):
                wd, mask, _, ln = struct.unpack_from("iIII", b, i)
                name = b[i + 16:i + 16 + ln].rstrip(b"\0").decode()
                out.append((self.wd.get(wd), mask, name))
                i += 16 + ln

    def close(self):
        os.close(self.fd)


def dead_pid():
    for pid in range(4000000, 3000000, -7919):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
    raise SystemExit("no free pid")


def test_tmpsec(tmp):
    if os.geteuid() != 0:
        print("note: not root; tmpsec needs chown")
        return
    uid = os.geteuid()
    c = new_cache(tmp, "tmpsec")
    src = kernels(tmp, "ts", 1)
    _, _, ref = compile_all(c, src, os.path.join(tmp, "ts-0"))
    drain(c)
    t = os.path.join(tmp, "tmpdir")
    os.mkdir(t)
    os.chmod(t, 0o1777)
    # Another user's entries, named as the readers of dead processes once
    # named their directories, and private: nothing of ours.
    pid = dead_pid()
    planted = 3000
    for i in range(planted):
        p = os.path.join(t, "kcache-sec-%d-%06d" % (pid, i))
        os.mkdir(p, 0o700)
        os.chown(p, OTHER_UID, OTHER_UID)
    watched = [os.path.join(t, "kcache-sec-%d-%06d" % (pid, i)) for i in range(0, planted, 60)]

    def run_ro(tag):
        # No hot file: the hit goes through RocksDB, so a secondary is
        # opened, under $TMPDIR since the process is read-only.
        for h in os.listdir(os.path.join(c, "hot")):
            os.unlink(os.path.join(c, "hot", h))
        ino = Inotify()
        try:
            ino.watch(t, IN_CREATE)
            for w in watched:
                ino.watch(w, IN_OPEN | IN_ACCESS)
            st, err, ptx = compile_all(c, src, os.path.join(tmp, "ts-" + tag),
                                       {"KCACHE_READONLY": "1", "TMPDIR": t,
                                        "KCACHE_LOG": "debug"})
            ev = ino.events()
        finally:
            ino.close()
        check(ptx == ref and st is not None and st[0] == 1,
              "tmpsec %s: read-only hit, same output (%s)" % (tag, st))
        check("store loaded" in err, "tmpsec %s: the hit went through RocksDB" % tag)
        return ev

    ev = run_ro("a")
    looked = [e for e in ev if e[0] != t]
    check(looked == [], "tmpsec: another user's kcache-sec-* entries are never opened "
          "(%d events)" % len(looked))
    made = sorted(set(e[2] for e in ev if e[0] == t))
    mine = "kcache-%d" % uid
    check(made == [mine], "tmpsec: the reader made only %s in $TMPDIR (%s)" % (mine, made))
    left = [n for n in os.listdir(t) if not n.startswith("kcache-sec-%d-" % pid)]
    check(left == [] or (left == [mine] and os.listdir(os.path.join(t, mine)) == []),
          "tmpsec: the reader left nothing of its own (%s)" % left)
    n = len([n for n in os.listdir(t) if n.startswith("kcache-sec-")])
    check(n == planted, "tmpsec: every planted entry is still there (%d)" % n)

    # A dead reader's directory in our own parent is swept.
    pd = os.path.join(t, mine)
    if not os.path.isdir(pd):
        os.mkdir(pd, 0o700)
    stale = os.path.join(pd, "%d-0123456789abcdef" % pid)
    os.mkdir(stale, 0o700)
    with open(os.path.join(stale, "LOG"), "w") as f:
        f.write("x")
    run_ro("b")
    check(not os.path.exists(stale), "tmpsec: a dead reader's directory of ours is swept")

    # kcache-<uid> squatted by another user: not written into, still a hit.
    shutil.rmtree(pd, ignore_errors=True)
    os.mkdir(pd, 0o777)
    os.chmod(pd, 0o777)
    os.chown(pd, OTHER_UID, OTHER_UID)
    run_ro("c")
    check(os.listdir(pd) == [], "tmpsec: a squatted kcache-%d is not written into" % uid)
    stray = [n for n in os.listdir(t) if n != mine and not n.startswith("kcache-sec-%d-" % pid)]
    check(stray == [], "tmpsec: squatted, the reader left nothing behind (%s)" % stray)
    shutil.rmtree(t, ignore_errors=True)
    stop_owner(c)


# ---- ownerstart ----------------------------------------------------------


def test_ownerstart(tmp):
    for i in range(3):
        c = new_cache(tmp, "ownerstart-%d" % i)
        try:
            st, err, _ = compile_all(c, kernels(tmp, "os%d_" % i, 8),
                                     os.path.join(tmp, "os-ptx-%d" % i),
                                     {"KCACHE_LOG": "debug", "KCACHE_OWNER_IDLE_MS": "60000"})
            check(st is not None and st[1] == 8 and st[3] == 8,
                  "ownerstart %d: 8 misses, stored (%s)" % (i, st))
            lines = [l for l in err.splitlines() if "store loaded" in l]
            check(lines == [], "ownerstart %d: no miss loaded RocksDB (%r)" % (i, lines))
        finally:
            stop_owner(c)


def owners_of(cache):
    """Pids of processes whose command line names cache (an owner's --dir)."""
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if cache.encode() in args:
            pids.append(int(pid))
    return pids


def test_ownergone(tmp):
    # An owner a store started (detached, as spawn_owner starts it) finds
    # the directory gone (removed with its store before it ran): it does not
    # make it again.
    gone = os.path.join(tmp, "gone", "cache")
    e = base_env(gone, {"KCACHE_OWNER_DETACH": "1"})
    e.pop("KCACHE_STATS")
    subprocess.run([TOOL, "--dir", gone, "owner", "--idle-ms", "0"], env=e,
                   capture_output=True, timeout=60)
    for _ in range(600):
        if not owners_of(gone):
            break
        time.sleep(0.05)
    check(not owners_of(gone), "ownergone: the detached owner ended")
    check(not os.path.lexists(os.path.join(tmp, "gone")),
          "ownergone: a started owner did not make the removed directory again")
    # `kcache owner` by hand still makes a missing directory.
    r = tool(os.path.join(tmp, "new", "cache"), "owner", "--idle-ms", "0")
    check(r.returncode == 0 and os.path.isdir(os.path.join(tmp, "new", "cache", "spool")),
          "ownergone: kcache owner by hand makes a missing directory (%s)" % r.stderr.strip())


def main():
    if not (os.path.exists(BENCH) and os.path.exists(SHIM) and os.path.exists(TOOL)):
        print("skip: needs nvrtc_bench, the shim and the tool (KCACHE_BUILD)")
        return 77
    only = sys.argv[1:] or ["locks", "maxsize", "spool", "tmpsec", "ownerstart", "ownergone"]
    tmp = tempfile.mkdtemp(prefix="kcache-housekeeping-")
    try:
        os.chmod(tmp, 0o755)  # the other user's entries are reached through it
        for t in only:
            globals()["test_" + t](tmp)
    finally:
        rm_settled(tmp)
    if failures:
        print("%d failure(s):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
