#!/usr/bin/env python3
"""Security of the cache directory (suite 'faults').

  mode       a cache directory kcache creates is 0700 (and so are spool/,
             sec/ and locks/ inside it)
  refuse     DIR, DIR/spool or DIR/locks writable by group or others, or
             (as root) owned by another user (chown nobody): the cache is
             off (nothing stored, nothing served), exactly one warning,
             outputs identical to NVRTC's own
  symlinks   symlinks planted in DIR/spool (under the names the next writes
             and reads use), DIR/locks and DIR/sec, pointing at a victim file
             or directory outside the cache: the victim is never written,
             read into a result or deleted, and outputs stay right, through
             compiles, hits and a run of the owner (kcache owner)

The client is tests/nvrtc's nvrtc_client_dlopen (real NVRTC compiles).
KCACHE_TOOL=/bin/true keeps the owner from draining the spool where a test
needs the spool's files to stay put. Exit 0 ok, 1 failure, 77 skip.
"""
import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

SHIM = os.environ["KCACHE_SHIM"]
TOOL = os.environ["KCACHE_TOOL"]
CLIENT = os.path.join(os.environ["KCACHE_BUILD"], "tests", "nvrtc", "nvrtc_client_dlopen")
CASES = "ptx,name_expr"
STATS_RE = re.compile(r"nvrtc hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)")
TMP = tempfile.mkdtemp(prefix="kcache-security-")
os.chmod(TMP, 0o755)  # so that nobody can traverse to a chown'ed directory
failures = []
n_runs = [0]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def run(cache, shim=True, env=None):
    """Runs the client; returns (dump bytes, stderr without the stats line, stats tuple)."""
    n_runs[0] += 1
    dump = os.path.join(TMP, "dump-%d" % n_runs[0])
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    e["KCACHE_DIR"] = cache
    e["KCACHE_STATS"] = "1"
    e["KCACHE_TOOL"] = TOOL
    if shim:
        e["LD_PRELOAD"] = SHIM
    e.update(env or {})
    p = subprocess.run([CLIENT, "--dump", dump, "--cases", CASES], env=e, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit("client exited %d" % p.returncode)
    with open(dump, "rb") as f:
        d = f.read()
    m = STATS_RE.search(p.stderr)
    st = tuple(int(x) for x in m.groups()) if m else None
    err = "\n".join(l for l in p.stderr.splitlines() if not l.startswith("kcache: stats:"))
    return d, err, st


REF = None


def reference():
    global REF
    if REF is None:
        REF, _, _ = run(os.path.join(TMP, "unused"), shim=False)
    return REF


def warm_cache(name, env=None):
    cache = os.path.join(TMP, name, "cache")
    os.makedirs(os.path.dirname(cache))
    d, err, st = run(cache, env=env)
    check(d == reference(), "%s: cold run outputs right" % name)
    return cache


def test_mode():
    cache = os.path.join(TMP, "mode", "a", "cache")
    os.makedirs(os.path.dirname(os.path.dirname(cache)))
    old = os.umask(0)
    try:
        d, err, st = run(cache)
    finally:
        os.umask(old)
    check(d == reference(), "mode: outputs right")
    for sub in ("", "spool", "sec", "locks"):
        p = os.path.join(cache, sub)
        if os.path.exists(p):
            m = stat.S_IMODE(os.lstat(p).st_mode)
            check(m == 0o700, "mode: %s created 0700 under umask 0 (got %o)" % (p[len(TMP):], m))
    check(os.path.isdir(os.path.join(cache, "spool")), "mode: spool created")


def refused(label, cache):
    d, err, st = run(cache)
    warns = [l for l in err.splitlines() if "kcache" in l]
    check(d == reference(), "%s: outputs unchanged" % label)
    check(len(warns) == 1, "%s: exactly one warning (got %d: %r)" % (label, len(warns), warns))
    check(st is not None and st[0] == 0 and st[3] == 0,
          "%s: cache off: no hit, nothing stored (stats %s)" % (label, st))


def test_refuse():
    root = os.geteuid() == 0
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        nobody = None
    for sub in ("", "spool", "locks"):
        where = sub or "dir"
        for mode in (0o770, 0o707, 0o720, 0o702):
            cache = warm_cache("refuse-%s-%o" % (where, mode))
            target = os.path.join(cache, sub) if sub else cache
            if not os.path.isdir(target):
                os.mkdir(target, 0o700)
            os.chmod(target, mode)
            refused("refuse: %s mode %o" % (where, mode), cache)
        if root and nobody is not None:
            cache = warm_cache("refuse-%s-nobody" % where)
            target = os.path.join(cache, sub) if sub else cache
            if not os.path.isdir(target):
                os.mkdir(target, 0o700)
            os.chown(target, nobody, -1)
            refused("refuse: %s owned by nobody" % where, cache)
            # A symlink in place of the subdirectory, to a private directory
            # of another user.
            if sub:
                cache = warm_cache("refuse-%s-link-nobody" % where)
                other = os.path.join(TMP, "other-%s" % where)
                os.mkdir(other, 0o700)
                os.chown(other, nobody, -1)
                shutil.rmtree(os.path.join(cache, sub))
                os.symlink(other, os.path.join(cache, sub))
                refused("refuse: %s a symlink to nobody's directory" % where, cache)
    if not root:
        print("note: not root; the other-user cases were skipped")


def victim_file():
    v = os.path.join(TMP, "victim-%d" % n_runs[0])
    with open(v, "wb") as f:
        f.write(b"victim: must never change\n")
    os.chmod(v, 0o644)
    return v, os.stat(v)


def victim_ok(label, v, st0):
    st = os.stat(v)
    with open(v, "rb") as f:
        body = f.read()
    check(body == b"victim: must never change\n" and st.st_size == st0.st_size and
          st.st_mtime_ns == st0.st_mtime_ns and stat.S_IMODE(st.st_mode) == 0o644,
          "%s: victim untouched" % label)


def test_symlinks():
    noowner = {"KCACHE_TOOL": "/bin/true"}
    # 1. The spool: run once with the owner held off, so the spool keeps the
    # put files under the names every later read and write of the same
    # requests use; replace each with a symlink to the victim.
    cache = warm_cache("symlink-spool", env=noowner)
    spool = os.path.join(cache, "spool")
    names = [n for n in os.listdir(spool) if n.startswith("p-")]
    check(len(names) >= 2, "symlinks: the cold run left its puts in the spool (%d)" % len(names))
    v, st0 = victim_file()
    for n in names:
        os.unlink(os.path.join(spool, n))
        os.symlink(v, os.path.join(spool, n))
        os.symlink(v, os.path.join(spool, "d" + n[1:]))  # the drain name
    d, err, st = run(cache, env=noowner)
    check(d == reference(), "symlinks: spool, outputs right")
    check(st is not None and st[0] == 0, "symlinks: spool, nothing served through a symlink (%s)" % (st,))
    victim_ok("symlinks: spool, compiles that read and rewrote the planted names", v, st0)
    check(all(os.path.isfile(os.path.join(spool, n)) and not os.path.islink(os.path.join(spool, n))
              for n in names), "symlinks: the new puts replaced the links (rename), not their target")
    d, err, st = run(cache, env=noowner)
    check(d == reference() and st is not None and st[0] >= 1, "symlinks: spool, the next run hits (%s)" % (st,))
    victim_ok("symlinks: spool, hits", v, st0)
    left = [n for n in os.listdir(spool) if os.path.islink(os.path.join(spool, n))]
    check(not left or all(os.readlink(os.path.join(spool, n)) == v for n in left),
          "symlinks: no new symlink appeared in the spool")
    # The owner drains that spool: it must not follow the links either.
    subprocess.run([TOOL, "owner", "--idle-ms", "0"], env=dict(os.environ, KCACHE_DIR=cache),
                   capture_output=True, timeout=120)
    victim_ok("symlinks: after the owner drained", v, st0)
    d, err, st = run(cache)
    check(d == reference(), "symlinks: after the owner, outputs right")
    check(st is not None and st[0] >= 1, "symlinks: after the owner, real entries hit (%s)" % (st,))

    # 2. The locks: every request's lock file replaced by a symlink.
    cache = warm_cache("symlink-locks")
    locks = os.path.join(cache, "locks")
    if os.path.isdir(locks):
        lnames = os.listdir(locks)
        check(len(lnames) >= 1, "symlinks: lock files exist (%d)" % len(lnames))
        v, st0 = victim_file()
        for n in lnames:
            os.unlink(os.path.join(locks, n))
            os.symlink(v, os.path.join(locks, n))
        d, err, st = run(cache, env={"KCACHE_RECACHE": "1"})
        check(d == reference(), "symlinks: locks outputs right (recache)")
        shutil.rmtree(os.path.join(cache, "db"), ignore_errors=True)
        d, err, st = run(cache)
        check(d == reference(), "symlinks: locks outputs right (miss)")
        victim_ok("symlinks: locks", v, st0)
    else:
        print("note: no DIR/locks (single flight off?)")

    # 3. DIR/sec: symlinks named like secondaries of dead processes, to a
    # victim directory with a file in it; runs and the owner's cleanup must
    # not write into it or delete it.
    cache = warm_cache("symlink-sec")
    sec = os.path.join(cache, "sec")
    vdir = os.path.join(TMP, "victim-dir")
    os.mkdir(vdir, 0o755)
    v, st0 = victim_file()
    shutil.copy2(v, os.path.join(vdir, "keep"))
    for name in ("999999-0000000000000000", "1-0123456789abcdef", "LOG", "CURRENT"):
        os.symlink(vdir, os.path.join(sec, name))
    for i in range(2):
        d, err, st = run(cache)
        check(d == reference(), "symlinks: sec run %d outputs right" % i)
    subprocess.run([TOOL, "owner", "--idle-ms", "0"], env=dict(os.environ, KCACHE_DIR=cache),
                   capture_output=True, timeout=120)
    subprocess.run([TOOL, "gc"], env=dict(os.environ, KCACHE_DIR=cache), capture_output=True, timeout=120)
    check(sorted(os.listdir(vdir)) == ["keep"], "symlinks: victim directory unchanged (%s)" % os.listdir(vdir))
    victim_ok("symlinks: sec", os.path.join(vdir, "keep"), os.stat(os.path.join(vdir, "keep")))
    with open(os.path.join(vdir, "keep"), "rb") as f:
        check(f.read() == b"victim: must never change\n", "symlinks: sec victim file content")


def main():
    if not os.path.exists(CLIENT):
        rm_settled(TMP)
        print("skip: no", CLIENT)
        return 77
    only = sys.argv[1:] or ["mode", "refuse", "symlinks"]
    try:
        for t in only:
            globals()["test_" + t]()
    finally:
        rm_settled(TMP)
    if failures:
        print("%d failure(s):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
