#!/usr/bin/env python3
"""Driver-path tests of what the shim must keep invisible (suite 'driver').

Usage: test_driver_visible.py NAME   (one of the functions named test_NAME)

  pool_visible  every pointer query, address range and memory figure answers
                as without the allocation pool (issue 13, item 9)
  library_noctx cuLibraryLoadData of PTX with no current context is cached,
                and leaves the context state as it found it (item 10)
  flight        concurrent cold processes compile each JIT image once (item 11)
  bad_once      malformed PTX is compiled once per load, as without the shim,
                with the driver's return code and logs (item 12)

Every run gets a fresh temporary cache directory; the stand-in driver
(tests/standin) counts its JIT compiles. Outputs of drvclient never depend
on addresses or timing, so a run with the shim must print what a run
without it prints.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

STANDIN = os.environ["KCACHE_TEST_STANDIN_DIR"]
SHIM = os.environ["KCACHE_SHIM"]
CLIENT = os.environ["KCACHE_TEST_DRVCLIENT"]
CLIENT_LINKED = os.environ["KCACHE_TEST_DRVCLIENT_LINKED"]
DATA = os.environ["KCACHE_TEST_DRIVER_DATA"]

PTX = os.path.join(DATA, "k.ptx")
BAD = os.path.join(DATA, "bad.ptx")

TMP = tempfile.mkdtemp(prefix="kcache-driver-visible-")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    else:
        print("ok:", what)
    return cond


class Cache:
    """One cache directory, shared by the runs that are given it."""
    n = 0

    def __init__(self):
        Cache.n += 1
        self.dir = os.path.join(TMP, "cache-%d" % Cache.n)


def client_env(cache, shim, counts, extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_") or k == "KCACHE_SHIM"}
    e["LD_LIBRARY_PATH"] = STANDIN + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
    e["KCACHE_DIR"] = cache.dir
    e["KCACHE_TEST_STANDIN_COUNTS"] = counts
    e["KCACHE_STATS"] = "1"
    if shim:
        e["LD_PRELOAD"] = SHIM
    e.update(extra or {})
    return e


def read_counts(path):
    """The stand-in's counters, summed over the processes that wrote them."""
    c = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                for k, v in re.findall(r"(\w+)=(\d+)", line):
                    if k != "pid":
                        c[k] = c.get(k, 0) + int(v)
        os.unlink(path)
    return c


def run(args, cache, shim=True, env=None, client=CLIENT):
    """Runs drvclient; returns (stdout, stderr, stand-in counters)."""
    run.n += 1
    counts = os.path.join(TMP, "counts-%d" % run.n)
    p = subprocess.run([client] + args, env=client_env(cache, shim, counts, env), capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        print(p.stdout)
        print(p.stderr)
        raise SystemExit("drvclient %s exited %d" % (" ".join(args), p.returncode))
    return p.stdout, p.stderr, read_counts(counts)


run.n = 0


def stats(stderr, backend):
    m = re.search(backend + r" hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)", stderr)
    if not m:
        return None
    return dict(zip(("hits", "misses", "passthrough", "stores", "errors"), map(int, m.groups())))


def normalize(out):
    """Drops what legitimately differs between two compiles: ptxas timing."""
    out = re.sub(r"Compile time = [0-9.]+ ms", "Compile time = T ms", out)
    return re.sub(r"info log \((\d+)\)", "info log (N)", out)


def show_diff(ref, out):
    import difflib
    print("".join(list(difflib.unified_diff(ref.splitlines(True), out.splitlines(True), "without", "with"))[:60]))


def test_pool_visible():
    """Item 9: the pool answers every query as the driver does without it."""
    env = {"KCACHE_TEST_STANDIN_MEM": "1G"}
    for client, route in ((CLIENT, []), (CLIENT_LINKED, []), (CLIENT, ["--route=proc:12050:0"])):
        name = os.path.basename(client) + " " + " ".join(route)
        cache = Cache()
        ref, _, c0 = run(route + ["pool"], cache, shim=False, env=env)
        out, err, c = run(route + ["pool"], cache, env=env)
        check("alloc 3670016 after 4194304 range: CUDA_SUCCESS base=base size=3670016" in ref,
              name + ": the stand-in reports the size asked for")
        check("freed 3670016 range: CUDA_ERROR_NOT_FOUND" in ref and
              "inside freed 3670016 attr 7: CUDA_ERROR_INVALID_VALUE" in ref,
              name + ": the stand-in knows nothing of a freed pointer")
        check("REUSED" not in ref and "all freed, free memory as at start: 1" in ref,
              name + ": the stand-in never reuses a buffer id and frees what is freed")
        if not check(out == ref, name + ": every pointer query, range and memory figure as without the shim"):
            show_diff(ref, out)
        m = stats(err, "memo")
        check(m and m["hits"] >= 4 and c.get("cuMemAlloc_v2", 0) < c0.get("cuMemAlloc_v2", 0),
              name + ": the pool served allocations (%s; %d vs %d real)" %
              (m, c.get("cuMemAlloc_v2", 0), c0.get("cuMemAlloc_v2", 0)))
        check(c.get("live_at_destroy", 0) == 0, name + ": no pooled block left for a context destroy")


def test_library_noctx():
    """Item 10: cuLibraryLoadData with no current context is cached."""
    two = {"KCACHE_TEST_STANDIN_DEVICES": "2"}
    for variant, env in (([], None), (["primary"], None), (["primary1"], two)):
        what = "no context current" + (", %s context retained" % variant[0] if variant else "")
        if env:
            what += ", 2 devices"
        cache = Cache()
        ref, _, c0 = run(["libnoctx", PTX] + variant, cache, shim=False, env=env)
        check("library load: CUDA_SUCCESS" in ref and c0.get("jit") == 1, what + ": the stand-in loads it (1 JIT)")
        before = re.findall(r"^before: (.*)$", ref, re.M)
        after = re.findall(r"^after: (.*)$", ref, re.M)
        check(before == after and "none" in before[0], what + ": the stand-in leaves the context state as it was")
        jits = []
        for i in range(3):
            out, err, c = run(["libnoctx", PTX] + variant, cache, env=env)
            jits.append(c.get("jit", 0))
            if not check(normalize(out) == normalize(ref), "%s: run %d prints what it prints without the shim"
                         % (what, i + 1)):
                show_diff(ref, out)
            if i == 0:
                s = stats(err, "jit")
                check(s and s["misses"] == 1 and s["stores"] == 1, what + ": the first run stores (%s)" % s)
                # How the compile got its context: the active primary,
                # retained once more and released (the host retains it
                # once), or one created for it and destroyed.
                retains, created = c.get("cuDevicePrimaryCtxRetain", 0), c.get("cuCtxCreate_v2", 0)
                check((retains, created) == ((2, 0) if variant else (0, 1)),
                      what + ": the compile's context (primary retains %d, contexts created %d)" % (retains, created))
        check(jits == [1, 0, 0], what + ": JIT compiles in three runs on one store: %s (want [1, 0, 0])" % jits)
    # A library loaded with no context is served to a run that has one, and
    # the other way round: one key.
    cache = Cache()
    run(["libnoctx", PTX], cache)
    _, _, c = run(["load", PTX, "library", "4096", "add1"], cache)
    check(c.get("jit", 0) == 0, "an entry stored with no context serves a load in a context")


def ptx_variants(n):
    """n distinct PTX images (k.ptx with a comment line naming each)."""
    with open(PTX) as f:
        text = f.read()
    paths = []
    for i in range(n):
        p = os.path.join(TMP, "v%d.ptx" % i)
        with open(p, "w") as f:
            f.write("// kcache flight test variant %d\n" % i + text)
        paths.append(p)
    return paths


def concurrent(args, cache, n):
    """Starts n drvclient processes with the shim, lets them begin their
    loads together, and returns their outputs and summed counters."""
    go = os.path.join(TMP, "go-%d" % Cache.n)
    counts = os.path.join(TMP, "counts-concurrent-%d" % Cache.n)
    procs = [subprocess.Popen([CLIENT] + args, env=client_env(cache, True, counts, {"KCACHE_TEST_GO": go}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            ready = [f for f in os.listdir(TMP) if f.startswith(os.path.basename(go) + ".")]
            if len(ready) >= n:
                break
            time.sleep(0.005)
        open(go, "w").close()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            if p.returncode != 0:
                print(out, err)
                raise SystemExit("drvclient %s exited %d" % (" ".join(args), p.returncode))
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs, read_counts(counts)


def test_flight():
    """Item 11: 4 cold processes loading the same 6 PTX images compile 6."""
    images = ptx_variants(6)
    for api in ("data", "library"):
        cache = Cache()
        ref, _, c0 = run(["loadmany", api] + images, Cache(), shim=False)
        check(c0.get("jit") == 6 and ref.count(": CUDA_SUCCESS") == 6, api + ": without the shim, 6 JITs")
        outs, c = concurrent(["loadmany", api] + images, cache, 4)
        check(c.get("jit") == 6, api + ": 4 concurrent cold processes made %d JIT compiles for 6 images (want 6)"
              % c.get("jit", 0))
        for i, out in enumerate(outs):
            if not check(out == ref, api + ": process %d loaded what it loads without the shim" % i):
                show_diff(ref, out)


def test_bad_once():
    """Item 12: malformed PTX is compiled once per load, as without the shim."""
    cases = [(["load", BAD, "ex", "4096"], "cuModuleLoadDataEx"),
             (["load", BAD, "ex", "40"], "cuModuleLoadDataEx, 40-byte logs"),
             (["load", BAD, "data"], "cuModuleLoadData"),
             (["load", BAD, "library", "4096"], "cuLibraryLoadData"),
             (["libnoctx", BAD], "cuLibraryLoadData with no context")]
    for args, what in cases:
        cache = Cache()
        ref, _, c0 = run(args, cache, shim=False)
        check(c0.get("jit") == 1 and "CUDA_ERROR_INVALID_PTX" in ref, what + ": without the shim, 1 failed JIT")
        for i in range(2):
            out, err, c = run(args, cache)
            check(c.get("jit") == 1, what + ": run %d with the shim made %d JIT attempts (want 1)"
                  % (i + 1, c.get("jit", 0)))
            if not check(out == ref, what + ": run %d returns the driver's code and logs" % (i + 1)):
                show_diff(ref, out)
            s = stats(err, "jit")
            check(s is None or s["stores"] == 0, what + ": nothing stored for a failure")
    # A good image in the same process still loads and is cached.
    cache = Cache()
    run(["load", PTX, "ex", "4096", "add1"], cache)
    _, _, c = run(["load", PTX, "ex", "4096", "add1"], cache)
    check(c.get("jit", 0) == 0, "good PTX is still cached")


def owner_pids(store):
    """The processes holding store's owner.lock (owners the test's clients
    started), from /proc/locks."""
    try:
        ino = os.stat(os.path.join(store, "owner.lock")).st_ino
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    pids = set()
    for line in lines:
        parts = line.split()
        if "->" in parts or len(parts) < 6:
            continue
        try:
            if int(parts[5].split(":")[2]) == ino:
                pids.add(int(parts[4]))
        except ValueError:
            pass
    return pids


def cleanup():
    """Stops the store owners this test's clients started (they would write
    into a removed cache directory), then removes everything."""
    for _ in range(200):
        pids = set()
        for d in os.listdir(TMP) if os.path.isdir(TMP) else []:
            pids |= owner_pids(os.path.join(TMP, d))
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    rm_settled(TMP)


def main():
    name = sys.argv[1]
    fn = globals().get("test_" + name)
    if fn is None:
        raise SystemExit("no test " + name)
    try:
        fn()
    finally:
        cleanup()
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
