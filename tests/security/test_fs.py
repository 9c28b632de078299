#!/usr/bin/env python3
"""Where the cache directory is, who controls the path to it, and the modes
of what kcache creates in it (suite 'faults'; issue 13, items 4, 5 and 7).

  home     HOME unset, empty or relative: the default directory is the
           passwd entry's home/.cache/kcache (`kcache config`); a user with
           no passwd entry and no usable HOME: no directory, caching off with
           exactly one warning, outputs unchanged, nothing created in /tmp
  path     the path to the cache directory must be controlled by the caller
           or root alone: root with HOME set to another user's home (no
           ~/.cache) creates nothing there; a symlink in that home to a
           root-owned directory (a foreign one, or root's own store) gets
           nothing written and nothing removed, by the shim and by every
           `kcache` command; a directory on the path writable by others
           (no sticky bit) is refused; an existing directory that is not
           empty and not a kcache store is refused; the same layouts owned
           by the caller (a plain user) work
  private  a cache directory the user made 0755, umask 022: after a cold
           run drained by the owner and a run that has a RocksDB secondary
           open, every directory below it is private (no group or other
           bits) and every file outside the secondaries' own (private)
           directories is too; a db/ left 0755 by an older kcache is made
           private by the next owner session

"Another user" is a uid with no passwd entry (BOB), chown'ed to; a process
runs as that user through setuid in the child. The client is tests/nvrtc's
nvrtc_client_dlopen (real NVRTC compiles). Exit 0 ok, 1 failure, 77 skip.
"""
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

SHIM = os.environ["KCACHE_SHIM"]
TOOL = os.environ["KCACHE_TOOL"]
CLIENT = os.path.join(os.environ["KCACHE_BUILD"], "tests", "nvrtc", "nvrtc_client_dlopen")
CASES = "ptx,name_expr"
STATS_RE = re.compile(r"nvrtc hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)")
failures = []
TMP = None


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def free_uid(start):
    uid = start
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


BOB = free_uid(12345)


def as_user(uid):
    def f():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return f


def base_env(home=None, extra=None):
    """The environment of a run: no KCACHE_*, no XDG_CACHE_HOME; HOME as
    given (None: unset)."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("KCACHE_") and k not in ("HOME", "XDG_CACHE_HOME")}
    if home is not None:
        e["HOME"] = home
    e.update(extra or {})
    return e


n_runs = [0]


def run(env, shim=True, uid=None, dump_dir=None, rounds=1, between=None):
    """Runs the client; returns (dump bytes, stderr without the stats line,
    stats tuple). With rounds=2, between() is called while the client
    waits after its first round."""
    n_runs[0] += 1
    dump = os.path.join(dump_dir or TMP, "dump-%d" % n_runs[0])
    e = dict(env)
    e["KCACHE_STATS"] = "1"
    e.setdefault("KCACHE_TOOL", TOOL)
    if shim:
        e["LD_PRELOAD"] = SHIM
    args = [CLIENT, "--dump", dump, "--cases", CASES]
    if rounds > 1:
        args += ["--rounds", str(rounds)]
    p = subprocess.Popen(args, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=as_user(uid) if uid is not None else None)
    try:
        if rounds > 1:
            for r in range(rounds - 1):
                line = p.stdout.readline()
                if "round %d done" % r not in line:
                    raise SystemExit("client: expected round %d, got %r" % (r, line))
                between()
                p.stdin.write("go\n")
                p.stdin.flush()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if p.returncode != 0:
        print(out[-2000:], err[-2000:])
        raise SystemExit("client exited %d" % p.returncode)
    with open(dump, "rb") as f:
        d = f.read()
    os.unlink(dump)
    m = STATS_RE.search(err)
    st = tuple(int(x) for x in m.groups()) if m else None
    err = "\n".join(l for l in err.splitlines() if not l.startswith("kcache: stats:"))
    return d, err, st


REF = {}


def reference(rounds=1):
    if rounds not in REF:
        REF[rounds], _, _ = run(base_env("/nonexistent"), shim=False, rounds=rounds,
                                between=lambda: None)
    return REF[rounds]


def warnings_of(err):
    return [l for l in err.splitlines() if "kcache" in l]


def refused(label, d, err, st, rounds=1):
    warns = warnings_of(err)
    check(d == reference(rounds), "%s: outputs unchanged" % label)
    check(len(warns) == 1, "%s: exactly one warning (got %d: %r)" % (label, len(warns), warns))
    check(st is not None and st[0] == 0 and st[3] == 0,
          "%s: cache off: no hit, nothing stored (stats %s)" % (label, st))


def tool(args, env, uid=None):
    return subprocess.run([TOOL] + args, env=env, capture_output=True, text=True, timeout=120,
                          errors="replace",
                          preexec_fn=as_user(uid) if uid is not None else None)


def snapshot(top):
    """Every path below top with its type, size, mode, owner and mtime."""
    out = {}
    for dp, dns, fns in os.walk(top):
        for n in dns + fns:
            p = os.path.join(dp, n)
            s = os.lstat(p)
            out[os.path.relpath(p, top)] = (stat.S_IFMT(s.st_mode), s.st_size,
                                            stat.S_IMODE(s.st_mode), s.st_uid, s.st_mtime_ns)
    return out


def mkdir(path, mode, uid=0):
    os.mkdir(path)
    os.chmod(path, mode)
    os.chown(path, uid, uid)
    return path


# ---- home ------------------------------------------------------------------


def config_dir(env, uid=None):
    p = tool(["config"], env, uid)
    m = re.search(r"^KCACHE_DIR +\S+ *(.*)$", p.stdout, re.M)
    return p, (m.group(1).strip() if m else None)


def test_home():
    me = pwd.getpwuid(os.getuid())
    want = os.path.join(me.pw_dir, ".cache", "kcache")
    for label, home in (("HOME unset", None), ("HOME empty", ""), ("HOME relative", "relative"),
                        ("HOME relative ./", "./x")):
        p, got = config_dir(base_env(home))
        check(p.returncode == 0 and got == want,
              "home: %s: KCACHE_DIR is the passwd home's %s (got %r)" % (label, want, got))
    p, got = config_dir(base_env("/some/where"))
    check(got == "/some/where/.cache/kcache", "home: an absolute HOME is used (got %r)" % got)
    p, got = config_dir(base_env(None, {"XDG_CACHE_HOME": "/xdg"}))
    check(got == "/xdg/kcache", "home: XDG_CACHE_HOME wins (got %r)" % got)

    if os.geteuid() != 0:
        print("note: not root; the no-passwd-entry case was skipped")
        return
    # A user with no passwd entry and no usable HOME: no directory at all,
    # never a shared one such as /tmp/.cache/kcache.
    bobdir = mkdir(os.path.join(TMP, "nopw"), 0o700, BOB)
    shared = "/tmp/.cache/kcache"
    had_shared = os.path.lexists(shared)
    had_parent = os.path.lexists("/tmp/.cache")
    for label, home in (("unset", None), ("empty", ""), ("relative", "rel")):
        p, got = config_dir(base_env(home), uid=BOB)
        check(p.returncode == 0 and got in ("", "(none)"),
              "home: no passwd entry, HOME %s: no KCACHE_DIR (got %r)" % (label, got))
        check("warning:" in p.stdout and "KCACHE_DIR" in p.stdout,
              "home: no passwd entry, HOME %s: `kcache config` says why (%r)"
              % (label, p.stdout.splitlines()[-1:]))
        d, err, st = run(base_env(home), uid=BOB, dump_dir=bobdir)
        refused("home: no passwd entry, HOME %s, under the shim" % label, d, err, st)
        p = tool(["stats"], base_env(home), uid=BOB)
        check(p.returncode != 0, "home: no passwd entry, HOME %s: `kcache stats` fails (%d: %s)"
              % (label, p.returncode, p.stderr.strip()[-200:]))
    if not had_shared:
        created = os.path.lexists(shared)
        check(not created, "home: nothing created at %s" % shared)
        if created and os.lstat(shared).st_uid == BOB:
            shutil.rmtree(shared, ignore_errors=True)
            if not had_parent and os.lstat("/tmp/.cache").st_uid == BOB:
                shutil.rmtree("/tmp/.cache", ignore_errors=True)


# ---- path ------------------------------------------------------------------


def warm_store(path):
    """A root-owned store at path with entries in it (drained by the owner)."""
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": path}))
    check(d == reference() and st is not None and st[3] >= 1,
          "path: root's store %s filled (stats %s)" % (path, st))
    tool(["owner", "--idle-ms", "0"], base_env("/nonexistent", {"KCACHE_DIR": path}))


def tool_refuses(label, env, victim, uid=None):
    """Every command that opens the store refuses; victim is unchanged."""
    before = snapshot(victim)
    for cmd in (["stats"], ["ls"], ["verify"], ["gc"], ["clear"]):
        p = tool(cmd, env, uid)
        check(p.returncode != 0, "%s: `kcache %s` refuses (rc %d, %s)"
              % (label, " ".join(cmd), p.returncode, (p.stderr.strip() or p.stdout.strip())[-160:]))
    after = snapshot(victim)
    check(before == after, "%s: the kcache commands changed nothing in %s (%s)"
          % (label, victim, sorted(set(before.items()) ^ set(after.items()))[:6]))


def test_path():
    if os.geteuid() != 0:
        print("skip: path needs root (other users' directories)")
        return
    home = mkdir(os.path.join(TMP, "home"), 0o755)

    # (a) root with HOME set to bob's home, which has no ~/.cache.
    bob = mkdir(os.path.join(home, "bob"), 0o755, BOB)
    d, err, st = run(base_env(bob))
    refused("path: root with HOME=bob's home (no .cache)", d, err, st)
    check(not os.path.lexists(os.path.join(bob, ".cache")),
          "path: nothing created in bob's home (%s)" % os.listdir(bob))
    tool_refuses("path: root with HOME=bob's home", base_env(bob), bob)
    check(not os.path.lexists(os.path.join(bob, ".cache")),
          "path: the kcache commands created nothing in bob's home")

    # (b) bob's ~/.cache/kcache is bob's symlink to a root-owned 0755
    # directory: a foreign one, then root's own store.
    shutil.rmtree(os.path.join(bob, ".cache"), ignore_errors=True)  # left by (a) if it failed
    cache = mkdir(os.path.join(bob, ".cache"), 0o755, BOB)
    foreign = mkdir(os.path.join(TMP, "rootdir"), 0o755)
    with open(os.path.join(foreign, "keep"), "w") as f:
        f.write("root's file\n")
    link = os.path.join(cache, "kcache")
    os.symlink(foreign, link)
    os.lchown(link, BOB, BOB)
    before = snapshot(foreign)
    d, err, st = run(base_env(bob))
    refused("path: root through bob's link to a root-owned directory", d, err, st)
    check(snapshot(foreign) == before,
          "path: nothing written into the linked directory (%s)" % sorted(os.listdir(foreign)))
    tool_refuses("path: root through bob's link", base_env(bob), foreign)

    store = os.path.join(TMP, "rootstore")
    warm_store(store)
    os.unlink(link)
    os.symlink(store, link)
    os.lchown(link, BOB, BOB)
    before = snapshot(store)
    d, err, st = run(base_env(bob))
    refused("path: root through bob's link to root's own store", d, err, st)
    tool_refuses("path: root through bob's link to root's store", base_env(bob), store)
    check(snapshot(store) == before, "path: root's store unchanged")
    # The same store, named directly, still works.
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": store, "KCACHE_TOOL": "/bin/true"}))
    check(d == reference() and st is not None and st[0] >= 1 and not warnings_of(err),
          "path: root's store named directly still hits (stats %s, %r)" % (st, warnings_of(err)))

    # (c) a directory on the path that others can write (no sticky bit).
    opendir = mkdir(os.path.join(TMP, "open"), 0o777)
    target = os.path.join(opendir, "cache")
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": target}))
    refused("path: a parent writable by others", d, err, st)
    check(not os.path.lexists(target), "path: nothing created under a parent others can write")
    target = mkdir(os.path.join(opendir, "made"), 0o700)
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": target}))
    refused("path: an existing cache under a parent writable by others", d, err, st)
    check(os.listdir(target) == [], "path: nothing written under a parent others can write")
    # With the sticky bit (as /tmp), the directory is fine.
    sticky = mkdir(os.path.join(TMP, "sticky"), 0o1777)
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": os.path.join(sticky, "cache"),
                                               "KCACHE_TOOL": "/bin/true"}))
    check(d == reference() and st is not None and st[3] >= 1 and not warnings_of(err),
          "path: under a sticky directory others can write, the cache works (stats %s, %r)"
          % (st, warnings_of(err)))

    # (d) an existing directory, not empty and not a kcache store.
    other = mkdir(os.path.join(TMP, "notastore"), 0o700)
    with open(os.path.join(other, "notes.txt"), "w") as f:
        f.write("mine\n")
    os.mkdir(os.path.join(other, "db"))
    before = snapshot(other)
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": other}))
    refused("path: a directory that is not a kcache store", d, err, st)
    check(snapshot(other) == before, "path: nothing written into a directory that is not a store (%s)"
          % sorted(os.listdir(other)))
    tool_refuses("path: a directory that is not a kcache store",
                 base_env("/nonexistent", {"KCACHE_DIR": other}), other)
    # An empty one is fine (made with mkdir by the user).
    empty = mkdir(os.path.join(TMP, "emptydir"), 0o700)
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": empty, "KCACHE_TOOL": "/bin/true"}))
    check(d == reference() and st is not None and st[3] >= 1 and not warnings_of(err),
          "path: an empty directory becomes a store (stats %s, %r)" % (st, warnings_of(err)))
    # So is one holding only names kcache makes (what a store whose spool/
    # and db/ were removed by hand keeps: its locks/).
    left = mkdir(os.path.join(TMP, "onlylocks"), 0o700)
    os.mkdir(os.path.join(left, "locks"), 0o700)
    d, err, st = run(base_env("/nonexistent", {"KCACHE_DIR": left, "KCACHE_TOOL": "/bin/true"}))
    check(d == reference() and st is not None and st[3] >= 1 and not warnings_of(err),
          "path: a directory with only kcache's names is used (stats %s, %r)" % (st, warnings_of(err)))

    # (e) the same layout, used by its owner: bob's own ~/.cache (created)
    # and bob's link to a directory of his own, under root-owned parents.
    bob2 = mkdir(os.path.join(home, "bob2"), 0o755, BOB)
    for i in range(2):
        d, err, st = run(base_env(bob2), uid=BOB, dump_dir=bob2)
        check(d == reference() and not warnings_of(err) and st is not None and
              (st[3] >= 1 if i == 0 else st[0] >= 1),
              "path: bob's own default store, run %d (stats %s, %r)" % (i, st, warnings_of(err)))
    made = os.path.join(bob2, ".cache", "kcache")
    s = os.lstat(made) if os.path.lexists(made) else None
    check(s is not None and s.st_uid == BOB and stat.S_IMODE(s.st_mode) == 0o700,
          "path: bob's store created as bob, 0700")
    bob3 = mkdir(os.path.join(home, "bob3"), 0o755, BOB)
    mine = mkdir(os.path.join(bob3, "elsewhere"), 0o700, BOB)
    mkdir(os.path.join(bob3, ".cache"), 0o700, BOB)
    made = os.path.join(bob3, ".cache", "kcache")
    os.symlink(mine, made)
    os.lchown(made, BOB, BOB)
    d, err, st = run(base_env(bob3), uid=BOB, dump_dir=bob3)
    check(d == reference() and not warnings_of(err) and st is not None and st[3] >= 1,
          "path: bob's link to his own directory is used (stats %s, %r)" % (st, warnings_of(err)))
    check(os.path.isdir(os.path.join(mine, "spool")), "path: bob's store is where his link points")
    p = tool(["stats"], base_env(bob3), uid=BOB)
    check(p.returncode == 0, "path: bob's `kcache stats` works (%s)" % p.stderr.strip()[-200:])


# ---- private ---------------------------------------------------------------


def exposed(top):
    """Paths below top that group or others can reach into or read: every
    directory must be private, and every file outside a secondary's own
    directory (DIR/sec/<reader>/, private, its files made by RocksDB in the
    host process with the host's umask)."""
    bad = []
    for dp, dns, fns in os.walk(top):
        rel = os.path.relpath(dp, top)
        in_reader = rel.startswith("sec" + os.sep)
        for n in dns + fns:
            p = os.path.join(dp, n)
            s = os.lstat(p)
            m = stat.S_IMODE(s.st_mode)
            if stat.S_ISDIR(s.st_mode) or not in_reader:
                if m & 0o077:
                    bad.append("%s %o" % (os.path.relpath(p, top), m))
    return bad


def test_private():
    old = os.umask(0o022)
    try:
        cache = os.path.join(TMP, "priv", "cache")
        os.makedirs(cache)
        os.chmod(cache, 0o755)  # the user made it so
        env = base_env("/nonexistent", {"KCACHE_DIR": cache, "KCACHE_TOOL": "/bin/true"})
        d, err, st = run(env)
        check(d == reference() and st is not None and st[3] >= 1, "private: cold run stored (%s)" % (st,))
        p = tool(["owner", "--idle-ms", "0"], env)
        check(p.returncode == 0 and os.path.exists(os.path.join(cache, "db", "CURRENT")),
              "private: the owner drained the spool (%s)" % p.stderr.strip()[-200:])
        bad = exposed(cache)
        check(not bad, "private: after the owner, nothing below DIR is open to others (%s)" % bad[:8])

        # A run whose lookups go to a RocksDB secondary: no filter, no hot
        # files. It waits after its first round, secondary open.
        os.unlink(os.path.join(cache, "filter"))
        hot = os.path.join(cache, "hot")
        for n in os.listdir(hot):
            os.unlink(os.path.join(hot, n))
        seen = {}

        def look():
            sec = os.path.join(cache, "sec")
            seen["readers"] = [n for n in os.listdir(sec) if os.path.isdir(os.path.join(sec, n))]
            seen["bad"] = exposed(cache)
        d, err, st = run(env, rounds=2, between=look)
        check(d == reference(2) and st is not None and st[0] >= 1,
              "private: the secondary run hits (%s)" % (st,))
        check(len(seen.get("readers", [])) >= 1,
              "private: a secondary was open in DIR/sec (%s)" % seen.get("readers"))
        check(not seen.get("bad"),
              "private: with a secondary open, nothing below DIR is open to others (%s)"
              % seen.get("bad", [])[:8])

        # A db/ an older kcache left 0755 (files 0644) is made private.
        db = os.path.join(cache, "db")
        os.chmod(db, 0o755)
        for n in os.listdir(db):
            if os.path.isfile(os.path.join(db, n)):
                os.chmod(os.path.join(db, n), 0o644)
        p = tool(["owner", "--idle-ms", "0"], env)
        m = stat.S_IMODE(os.lstat(db).st_mode)
        check(m & 0o077 == 0, "private: an old 0755 db/ is made private by the owner (%o)" % m)
    finally:
        os.umask(old)


def main():
    global TMP
    if not os.path.exists(CLIENT):
        print("skip: no", CLIENT)
        return 77
    TMP = tempfile.mkdtemp(prefix="kcache-fs-")
    os.chmod(TMP, 0o755)  # others (BOB) traverse it to their directories
    try:
        only = sys.argv[1:] or ["home", "path", "private"]
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
