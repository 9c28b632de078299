#!/usr/bin/env python3
"""test_front.py: the shim's store front (shim/front.c), suite `store`.

Real NVRTC compiles (tests/bench/nvrtc_bench) under the shim, on a store of
their own. Whether a process loaded RocksDB is read from the debug line the
front prints when it loads the store ("store loaded"). Checked:
  - a miss on an empty store, a hit after the owner drained (hot files), a
    miss on a store with a filter: none loads RocksDB;
  - a process that only hit writes one spool log (counters and hits) and
    starts no owner; `kcache stats` counts it, the next owner applies its
    hit;
  - hot files gone: the hit comes from RocksDB, with the same output, and
    the owner writes the hot files again from the hit log;
  - corrupted hot files: still a hit with the same output (from RocksDB);
    the owner replaces or removes them (verify finds nothing bad);
  - a filter writable by others is not trusted (RocksDB is asked);
  - `kcache clear` rebuilds the filter: a miss, stored again;
  - DIR/hot a symlink: the cache is refused, outputs unchanged;
  - read-only: a hit, nothing written.
Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("KCACHE_BUILD", "")
SHIM = os.environ.get("KCACHE_SHIM", "")
TOOL = os.environ.get("KCACHE_TOOL", "")
BENCH = os.path.join(BUILD, "tests", "bench", "nvrtc_bench")

failures = []


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def run(d, kernel, tag, readonly=False, extra=None):
    """One process compiling `kernel` once; returns (stats, loaded, ptx)."""
    out = os.path.join(d, "ptx-" + tag)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env.update({"LD_PRELOAD": SHIM, "KCACHE_DIR": os.path.join(d, "c"),
                "KCACHE_STATS": "1", "KCACHE_LOG": "debug", "KCACHE_TOOL": TOOL})
    if readonly:
        env["KCACHE_READONLY"] = "1"
    env.update(extra or {})
    src = os.path.join(d, kernel + ".cu")
    p = subprocess.run([BENCH, "--save", out, "--file", src, "1"], env=env,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit("nvrtc_bench failed: " + p.stderr[-2000:])
    m = re.search(r"nvrtc hits=(\d+) misses=(\d+) passthrough=\d+ stores=(\d+) errors=(\d+)",
                  p.stderr)
    stats = tuple(int(x) for x in m.groups()) if m else None
    loaded = "store loaded" in p.stderr
    warns = [l for l in p.stderr.splitlines() if "warning" in l]
    ptx = b"".join(open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out)))
    return stats, loaded, ptx, warns


def drain(d):
    """Runs the owner until the spool holds no put or log."""
    c = os.path.join(d, "c")
    for _ in range(200):
        subprocess.run([TOOL, "--dir", c, "owner", "--idle-ms", "0"],
                       capture_output=True, timeout=60)
        sp = os.path.join(c, "spool")
        if not any(n[:2] in ("p-", "d-", "h-", "x-", "c-") for n in os.listdir(sp)):
            return
        time.sleep(0.05)
    raise SystemExit("the spool did not drain")


def owner_gone(d, timeout=60):
    """Waits until no owner holds DIR/owner.lock (one a miss started)."""
    import fcntl
    path = os.path.join(d, "c", "owner.lock")
    end = time.time() + timeout
    while time.time() < end:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            time.sleep(0.1)
        finally:
            os.close(fd)
    raise SystemExit("an owner still runs")


def hot_files(d):
    h = os.path.join(d, "c", "hot")
    return sorted(os.listdir(h)) if os.path.isdir(h) else []


def main():
    if not (os.path.exists(BENCH) and os.path.exists(SHIM) and os.path.exists(TOOL)):
        print("skip: needs nvrtc_bench, the shim and the tool (KCACHE_BUILD)")
        return 77
    d = tempfile.mkdtemp(prefix="kc-front-")
    os.chmod(d, 0o700)
    v = os.statvfs(d)
    if v.f_bavail * v.f_frsize < (64 << 20) or v.f_bavail * 20 < v.f_blocks:
        shutil.rmtree(d)
        print("skip: the owner keeps no hot files on a file system this full")
        return 77
    try:
        for name, n in (("x", 2.0), ("y", 3.0), ("z", 4.0)):
            with open(os.path.join(d, name + ".cu"), "w") as f:
                f.write('extern "C" __global__ void k_%s(float *p) '
                        '{ p[threadIdx.x] *= %.1ff; }\n' % (name, n))

        s, loaded, ptx_x, _ = run(d, "x", "x0")
        check(s is not None and s[1] == 1 and s[2] == 1, "empty store: a miss, stored (%s)" % (s,))
        check(not loaded, "empty store: the miss loads no RocksDB")
        drain(d)
        check(len(hot_files(d)) >= 1, "drained puts became hot files (%d)" % len(hot_files(d)))
        check(os.path.exists(os.path.join(d, "c", "filter")), "the owner wrote DIR/filter")

        owner_gone(d)
        before = set(os.listdir(os.path.join(d, "c", "spool")))
        s, loaded, ptx, _ = run(d, "x", "x1")
        check(s is not None and s[0] == 1 and s[1] == 0, "fresh process: a hit (%s)" % (s,))
        check(not loaded, "fresh process: the hit loads no RocksDB")
        check(ptx == ptx_x, "the hit's PTX is the compile's")
        # A process that only hit leaves one spool log (its counters and
        # its hit together) and starts no owner: the log waits.
        new = sorted(set(os.listdir(os.path.join(d, "c", "spool"))) - before)
        check(len(new) == 1 and new[0].startswith("c-"),
              "a process that only hit wrote one log (%s)" % new)
        time.sleep(1.0)
        check(set(new) <= set(os.listdir(os.path.join(d, "c", "spool"))),
              "a process that only hit started no owner (its log is still there)")
        st = subprocess.run([TOOL, "--dir", os.path.join(d, "c"), "stats"],
                            capture_output=True, text=True).stdout
        m = re.search(r"nvrtc\s+hits (\d+)\s+misses (\d+)", st)
        check(m is not None and m.groups() == ("1", "1"),
              "kcache stats counts the waiting log: %s" % (m.group(0) if m else st))
        drain(d)
        ls = subprocess.run([TOOL, "--dir", os.path.join(d, "c"), "ls"],
                            capture_output=True, text=True).stdout.split("\n")
        hits = [l.split()[5] for l in ls if len(l.split()) > 5 and l.split()[2] == "nvrtc"]
        check(hits == ["1"], "the owner took the hit from the log for recency (%s)" % hits)

        s, loaded, _, _ = run(d, "y", "y0")
        check(s is not None and s[1] == 1, "a new kernel: a miss (%s)" % (s,))
        check(not loaded, "a miss the filter rules out loads no RocksDB")
        drain(d)

        # Hot files gone: RocksDB serves; the hit log brings them back.
        for f in hot_files(d):
            os.unlink(os.path.join(d, "c", "hot", f))
        s, loaded, ptx, _ = run(d, "x", "x2")
        check(s is not None and s[0] == 1, "no hot files: still a hit (%s)" % (s,))
        check(loaded, "no hot files: the hit came through RocksDB")
        check(ptx == ptx_x, "RocksDB's hit has the same PTX")
        drain(d)
        check(len(hot_files(d)) >= 1, "hits wrote the hot files again (%d)" % len(hot_files(d)))

        # Corrupted hot files: a miss there, a hit from RocksDB.
        for f in hot_files(d):
            p = os.path.join(d, "c", "hot", f)
            b = bytearray(open(p, "rb").read())
            b[len(b) // 2] ^= 0x5A
            open(p, "wb").write(bytes(b))
        s, loaded, ptx, _ = run(d, "x", "x3")
        check(s is not None and s[0] == 1 and ptx == ptx_x,
              "corrupt hot files: a hit with the right PTX (%s)" % (s,))
        check(loaded, "corrupt hot files: served from RocksDB")
        drain(d)
        v = subprocess.run([TOOL, "--dir", os.path.join(d, "c"), "verify"],
                           capture_output=True, text=True)
        check(v.returncode == 0 and re.search(r" 0 bad, .* 0 bad spool", v.stdout) is not None,
              "after the owner ran, nothing bad is left: " + v.stdout.strip())

        # A filter others could write is not trusted.
        fp = os.path.join(d, "c", "filter")
        os.chmod(fp, 0o666)
        s, loaded, _, _ = run(d, "z", "z0")
        check(s is not None and s[1] == 1, "z: a miss (%s)" % (s,))
        check(loaded, "a filter writable by others is ignored (RocksDB asked)")
        os.chmod(fp, 0o600)
        drain(d)

        # Read-only: a hit, nothing written.
        before = sorted(os.listdir(os.path.join(d, "c", "spool")))
        s, _, ptx, _ = run(d, "x", "x4", readonly=True)
        check(s is not None and s[0] == 1 and ptx == ptx_x, "read-only: a hit (%s)" % (s,))
        check(sorted(os.listdir(os.path.join(d, "c", "spool"))) == before,
              "read-only: nothing written to the spool")

        # clear rebuilds the filter (a reader notices the new file).
        subprocess.run([TOOL, "--dir", os.path.join(d, "c"), "clear"], check=True,
                       capture_output=True)
        check(hot_files(d) == [], "clear removed the hot files")
        s, loaded, ptx, _ = run(d, "x", "x5")
        check(s is not None and s[1] == 1 and s[2] == 1 and ptx == ptx_x,
              "after clear: a miss, stored again (%s)" % (s,))
        check(not loaded, "after clear: the rebuilt filter rules the miss out")
        drain(d)

        # DIR/hot a symlink: refused like a planted spool.
        h = os.path.join(d, "c", "hot")
        shutil.rmtree(h)
        other = os.path.join(d, "elsewhere")
        os.mkdir(other, 0o700)
        os.symlink(other, h)
        s, _, ptx, warns = run(d, "x", "x6")
        check(ptx == ptx_x, "DIR/hot a symlink: outputs unchanged")
        check(s is not None and s[0] == 0 and len(warns) == 1 and "cache" in warns[0],
              "DIR/hot a symlink: the cache is refused with one warning (%s, %s)" % (s, warns))
    finally:
        rm_settled(d)
    if failures:
        print("%d failure(s):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
