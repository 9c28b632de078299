#!/usr/bin/env python3
"""Driver-path tests against the stand-in driver (suite 'driver').

Usage: test_driver.py NAME   (one of the functions named test_NAME below)

Every run gets its own temporary cache directory. The stand-in's directory
goes first on LD_LIBRARY_PATH; the shim is preloaded only where a test says
so. Outputs of drvclient never depend on addresses or timing, so a run with
the shim must print exactly what a run without it prints.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

STANDIN = os.environ["KCACHE_TEST_STANDIN_DIR"]
SHIM = os.environ["KCACHE_SHIM"]
CLIENT = os.environ["KCACHE_TEST_DRVCLIENT"]
CLIENT_LINKED = os.environ["KCACHE_TEST_DRVCLIENT_LINKED"]
DATA = os.environ["KCACHE_TEST_DRIVER_DATA"]
FIX = os.environ["KCACHE_TEST_DRIVER_FIXTURES"]

PTX = os.path.join(DATA, "k.ptx")
PTX2 = os.path.join(DATA, "k2.ptx")
BAD = os.path.join(DATA, "bad.ptx")
CUBIN90 = os.path.join(FIX, "k90.cubin")
CUBIN80 = os.path.join(FIX, "k80.cubin")
FAT_PTX = os.path.join(FIX, "kptx.fatbin")
FAT_SASS = os.path.join(FIX, "ksass.fatbin")

TMP = tempfile.mkdtemp(prefix="kcache-driver-")
failures = []


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    else:
        print("ok:", what)


def run(args, shim=True, env=None, client=CLIENT, expect_rc=0):
    """Runs drvclient; returns (stdout, stderr, counters dict of the stand-in)."""
    counts = os.path.join(TMP, "counts-%d" % run.n)
    run.n += 1
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_") or k in ("KCACHE_SHIM",)}
    e["LD_LIBRARY_PATH"] = STANDIN + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
    e["KCACHE_DIR"] = os.path.join(TMP, "cache-%d" % fresh_cache.n)
    e["KCACHE_TEST_STANDIN_COUNTS"] = counts
    e["KCACHE_STATS"] = "1"
    if shim:
        e["LD_PRELOAD"] = SHIM
    e.update(env or {})
    p = subprocess.run([client] + args, env=e, capture_output=True, text=True, timeout=60)
    if p.returncode != expect_rc:
        print(p.stdout)
        print(p.stderr)
        raise SystemExit("drvclient %s exited %d" % (" ".join(args), p.returncode))
    c = {}
    if os.path.exists(counts):
        with open(counts) as f:
            for line in f:
                for k, v in re.findall(r"(\w+)=(\d+)", line):
                    c[k] = c.get(k, 0) + int(v)
        os.unlink(counts)
    return p.stdout, p.stderr, c


run.n = 0


def stats(stderr, backend):
    m = re.search(backend + r" hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)", stderr)
    if not m:
        return None
    return dict(zip(("hits", "misses", "passthrough", "stores", "errors"), map(int, m.groups())))


def normalize(out):
    """Drops what legitimately differs between two compiles: ptxas timing."""
    out = re.sub(r"Compile time = [0-9.]+ ms", "Compile time = T ms", out)
    # The sizes written back include the timing digits.
    return re.sub(r"info log \((\d+)\)", "info log (N)", out)


def fresh_cache():
    """A new cache directory (never one deleted under a running store owner)."""
    fresh_cache.n += 1


fresh_cache.n = 0


def test_standin():
    """The stand-in alone: a JIT per PTX load, none for cubins, counters."""
    out, _, c = run(["load", PTX, "ex", "4096", "add1", "nope"], shim=False)
    check("load ex: CUDA_SUCCESS" in out, "stand-in JIT-compiles PTX")
    check("function nope: CUDA_ERROR_NOT_FOUND" in out, "unknown kernel is CUDA_ERROR_NOT_FOUND")
    check("Compiling entry function 'add1' for 'sm_90'" in out, "JIT for the device's arch (sm_90)")
    check(c.get("jit") == 1, "one JIT counted")
    out, _, c = run(["load", CUBIN90, "data", "0", "add1"], shim=False)
    check("load data: CUDA_SUCCESS" in out and c.get("jit", 0) == 0, "cubin loads without a JIT")
    out, _, c = run(["load", CUBIN80, "data"], shim=False)
    check("load data: CUDA_ERROR_NO_BINARY_FOR_GPU" in out, "sm_80 cubin refused on a 9.0 device")
    out, _, c = run(["load", CUBIN80, "data"], shim=False, env={"KCACHE_TEST_STANDIN_CC": "8.6"})
    check("load data: CUDA_SUCCESS" in out, "sm_80 cubin runs on an 8.6 device")
    out, _, c = run(["load", FAT_SASS, "fatbin", "0", "add1"], shim=False)
    check("load fatbin: CUDA_SUCCESS" in out and c.get("jit", 0) == 0, "fatbinary with SASS: no JIT")
    out, _, c = run(["load", FAT_SASS, "fatbin", "0", "add1"], shim=False, env={"KCACHE_TEST_STANDIN_CC": "8.0"})
    check("load fatbin: CUDA_SUCCESS" in out and c.get("jit") == 1, "same fatbinary on 8.0: PTX JIT")
    out, _, c = run(["load", FAT_PTX, "fatbin", "0", "add1"], shim=False)
    check("load fatbin: CUDA_SUCCESS" in out and c.get("jit") == 1, "PTX-only fatbinary: JIT")
    out, _, _ = run(["procaddr"], shim=False)
    check("v2 cuMemAlloc@2000/0: CUDA_SUCCESS -> cuMemAlloc status=0" in out, "procaddr: v1 below 3020")
    check("v2 cuMemAlloc@3020/0: CUDA_SUCCESS -> cuMemAlloc_v2 status=0" in out, "procaddr: _v2 from 3020")
    check("v2 cuMemcpyHtoD@12000/2: CUDA_SUCCESS -> cuMemcpyHtoD_v2_ptds" in out, "procaddr: per-thread variant")
    check("v2 cuMemcpyHtoD@12000/1: CUDA_SUCCESS -> cuMemcpyHtoD_v2 status" in out, "procaddr: legacy stream")
    check("v2 cuCtxCreate@12050/0: CUDA_SUCCESS -> cuCtxCreate_v4" in out, "procaddr: cuCtxCreate_v4")
    check("v2 cuLibraryLoadData@12000/0: CUDA_SUCCESS -> cuLibraryLoadData" in out, "procaddr: library API")
    out, _, _ = run(["oom"], shim=False, env={"KCACHE_TEST_STANDIN_MEM": "1M"})
    check("alloc 700K more: CUDA_ERROR_OUT_OF_MEMORY" in out, "stand-in enforces its memory limit")


def test_cold_warm():
    """Cold then warm in separate processes: the warm run reaches no JIT."""
    cases = [
        (["load", PTX, "data", "0", "add1", "scale"], "PTX via cuModuleLoadData"),
        (["load", PTX, "ex", "4096", "add1"], "PTX via cuModuleLoadDataEx"),
        (["load", FAT_PTX, "fatbin", "0", "add1"], "PTX-only fatbinary via cuModuleLoadFatBinary"),
        (["load", FAT_PTX, "data", "0", "add1"], "PTX-only fatbinary via cuModuleLoadData"),
        (["load", PTX, "library", "4096", "add1"], "PTX via cuLibraryLoadData"),
    ]
    for args, what in cases:
        fresh_cache()
        out1, err1, c1 = run(args)
        out2, err2, c2 = run(args)
        s1, s2 = stats(err1, "jit"), stats(err2, "jit")
        check(c1.get("jit") == 1 and s1 and s1["misses"] == 1 and s1["stores"] == 1, what + ": cold run compiles and stores")
        check(c2.get("jit", 0) == 0 and s2 and s2["hits"] == 1, what + ": warm run loads the stored cubin, no JIT")
        check(normalize(out1) == normalize(out2), what + ": same output cold and warm")
    # A fatbinary with SASS for the device passes straight through.
    fresh_cache()
    out, err, c = run(["load", FAT_SASS, "fatbin", "0", "add1"])
    s = stats(err, "jit")
    check(s and s["passthrough"] == 1 and s["stores"] == 0, "fatbinary with matching SASS passes through")
    out, err, c = run(["load", CUBIN90, "data", "0", "add1"])
    s = stats(err, "jit")
    check(s and s["passthrough"] == 1 and s["stores"] == 0, "cubin passes through")
    # The same fatbinary on an 8.0 device needs its PTX: cached, per device.
    env80 = {"KCACHE_TEST_STANDIN_CC": "8.0"}
    _, err, c = run(["load", FAT_SASS, "fatbin", "0", "add1"], env=env80)
    _, err2, c2 = run(["load", FAT_SASS, "fatbin", "0", "add1"], env=env80)
    check(c.get("jit") == 1 and c2.get("jit", 0) == 0, "fatbinary without SASS for 8.0: cold JIT, warm hit")
    # Another device never gets the 8.0 cubin.
    _, err3, c3 = run(["load", FAT_PTX, "fatbin", "0", "add1"], env={"KCACHE_TEST_STANDIN_CC": "8.6"})
    check(c3.get("jit") == 1, "a different compute capability misses")
    # Options that affect code are part of the key.
    fresh_cache()
    run(["load", PTX, "ex", "4096", "add1"])
    _, _, c = run(["load", PTX, "data", "0", "add1"])
    check(c.get("jit") == 1, "different JIT options (ex passes -O3, verbose) miss")


def test_identical():
    """Module contents and function behaviour with and without the shim."""
    for args in (["load", PTX, "ex", "4096", "add1", "scale", "nope"],
                 ["load", PTX, "data", "0", "add1", "scale"],
                 ["load", FAT_PTX, "fatbin", "0", "add1", "nope"],
                 ["load", FAT_SASS, "data", "0", "add1"],
                 ["load", PTX, "library", "4096", "add1", "scale", "nope"],
                 ["load", BAD, "ex", "4096"],
                 ["load", BAD, "library", "64"]):
        fresh_cache()
        ref, _, _ = run(args, shim=False)
        cold, _, _ = run(args)
        warm, _, _ = run(args)
        name = " ".join(os.path.basename(a) for a in args[1:3])
        check(normalize(cold) == normalize(ref), name + ": cold run with the shim == without")
        check(normalize(warm) == normalize(ref), name + ": warm run with the shim == without")
        if normalize(warm) != normalize(ref):
            print("--- without\n" + ref + "--- warm\n" + warm)


def test_routes():
    """Linked, dlsym, and cuGetProcAddress at several versions and flags."""
    routes = [(CLIENT_LINKED, []), (CLIENT, []), (CLIENT, ["--route=dlsym"]),
              (CLIENT, ["--route=proc:12050:0"]), (CLIENT, ["--route=proc:13000:1"]),
              (CLIENT, ["--route=proc:12080:2"])]
    for client, route in routes:
        fresh_cache()
        name = os.path.basename(client) + " " + " ".join(route)
        args = route + ["load", PTX, "data", "0", "add1"]
        ref, _, _ = run(args, shim=False, client=client)
        out1, err1, c1 = run(args, client=client)
        out2, err2, c2 = run(args, client=client)
        s1, s2, m2 = stats(err1, "jit"), stats(err2, "jit"), stats(err2, "memo")
        check(s1 and s1["misses"] == 1 and s2 and s2["hits"] == 1 and c2.get("jit", 0) == 0,
              name + ": JIT cache reached (miss then hit)")
        check(m2 and m2["hits"] >= 1, name + ": memo reached")
        check(normalize(out2) == normalize(ref), name + ": same output as without the shim")
    # What cuGetProcAddress hands out: the same variant names as the driver's,
    # and our wrapper exactly for the hooked variants.
    ref, _, _ = run(["procaddr"], shim=False)
    out, _, _ = run(["procaddr"])
    check(ref == out, "cuGetProcAddress returns the same variants with the shim")
    out, _, _ = run(["procaddr", "--show-lib"])
    wrapped = {l.split(":")[0] for l in out.splitlines() if l.endswith("in kcache")}
    for want in ("v2 cuMemAlloc@3020/0", "v2 cuModuleLoadDataEx@12000/2", "v2 cuLibraryLoadData@12000/0",
                 "v1 cuMemFree@3020/0", "v2 cuCtxDestroy@4000/0", "v2 cuDevicePrimaryCtxRelease@11000/0",
                 "v2 cuDevicePrimaryCtxRelease@10000/0", "v2 cuGetProcAddress@12000/0",
                 "v2 cuGetProcAddress@11030/0", "v2 cuKernelGetFunction@12000/0",
                 "v2 cuLinkCreate@12000/0"):  # the link cache's (issue 17)
        check(want in wrapped, "wrapped: " + want)
    for unwanted in ("v2 cuMemAlloc@2000/0", "v2 cuMemcpyHtoD@12000/2", "v2 cuLaunchKernel@12000/2",
                     "v2 cuCtxCreate@12050/0"):
        check(unwanted not in wrapped, "not wrapped: " + unwanted)


def test_memo():
    """Invalidation on unload, destroy, primary reset and release."""
    env = {"KCACHE_TEST_STANDIN_REUSE": "1"}
    for route in ([], ["--route=proc:12050:0"]):
        fresh_cache()
        ref, _, _ = run(route + ["memo", PTX, PTX2], shim=False, env=env)
        out, err, _ = run(route + ["memo", PTX, PTX2], env=env)
        check("unload/handle reused: 1" in ref and "library/handle reused: 1" in ref,
              "stand-in reuses module and library handles")
        check("destroy/context handle reused: 1, new id: 1" in ref, "stand-in reuses context handles, new ids")
        check("reset/primary handle same: 1" in ref, "primary handle survives reset")
        check(out == ref, "memo scenario identical with the shim " + " ".join(route))
        if out != ref:
            print("--- without\n" + ref + "--- with\n" + out)
        m = stats(err, "memo")
        check(m and m["misses"] > 0, "memo was consulted")
    # Hits within a context.
    out, err, c = run(["load", PTX, "data", "0", "add1", "scale"])
    m = stats(err, "memo")
    check(m and m["hits"] == 2 and c.get("cuModuleGetFunction") == 2, "repeated lookups served by the memo")


def test_alloc():
    """The pool: per context, released before destroy, OOM retry, fallback."""
    ref, _, _ = run(["alloc"], shim=False)
    out, err, c = run(["alloc"])
    check(out == ref, "alloc scenario identical with the shim")
    if out != ref:
        print("--- without\n" + ref + "--- with\n" + out)
    check(c.get("live_at_destroy", 0) == 0, "no pooled block left for a context destroy to free")
    m = stats(err, "memo")
    check(m and m["hits"] >= 1, "pooled blocks served allocations")
    check(c.get("cuMemAlloc_v2", 0) < 12, "fewer allocations reached the stand-in (%d)" % c.get("cuMemAlloc_v2", 0))
    env = {"KCACHE_TEST_STANDIN_MEM": "1M"}
    ref, _, _ = run(["oom"], shim=False, env=env)
    out, _, c = run(["oom"], env=env)
    check("alloc 700K after free: CUDA_SUCCESS" in out, "OOM with a pooled block: released and retried")
    check(out == ref, "oom scenario identical with the shim")
    # Pool bound.
    out, _, c = run(["oom"], env=dict(env, KCACHE_ALLOC_POOL="0"))
    check(out == ref and c.get("cuMemFree_v2", 0) >= 1, "KCACHE_ALLOC_POOL=0 keeps nothing")
    # Managed fallback, opt-in.
    ref, _, _ = run(["fallback"], shim=False, env=env)
    check("alloc 2097152: CUDA_ERROR_OUT_OF_MEMORY" in ref, "without the shim the big allocation fails")
    out, _, _ = run(["fallback"], env=env)
    check(out == ref, "fallback off by default: same as without the shim")
    out, err, c = run(["fallback"], env=dict(env, KCACHE_ALLOC_FALLBACK="managed"))
    check("alloc 2097152: CUDA_SUCCESS managed" in out, "KCACHE_ALLOC_FALLBACK=managed serves the failed allocation")
    check("alloc 4096: CUDA_SUCCESS managed" in out, "the latch holds for the context")
    check("new context alloc: device" in out, "a new context tries device memory again")
    check(c.get("cuMemAllocManaged") == 3, "managed allocations reached the stand-in")


def test_hostile():
    """Bad input to every hook: the same errors as without the shim."""
    args = ["hostile", PTX, BAD, CUBIN90]
    for route in ([], ["--route=dlsym"], ["--route=proc:12050:0"]):
        fresh_cache()
        ref, _, _ = run(route + args, shim=False)
        cold, _, _ = run(route + args)
        warm, _, _ = run(route + args)
        check(len(ref.splitlines()) > 60, "hostile scenario ran to the end")
        check(cold == ref, "hostile input, cold cache, same results " + " ".join(route))
        check(warm == ref, "hostile input, warm cache, same results " + " ".join(route))
        if cold != ref or warm != ref:
            import difflib
            print("".join(difflib.unified_diff(ref.splitlines(True), warm.splitlines(True))))


def test_logs():
    """JIT log buffers on a miss and a hit, including truncation."""
    for size in ("4096", "40", "1", "0"):
        for api in ("ex", "library"):
            fresh_cache()
            args = ["load", PTX, api, size, "add1"]
            ref, _, _ = run(args, shim=False)
            cold, _, _ = run(args)
            warm, _, c = run(args)
            check(c.get("jit", 0) == 0, "warm run had no JIT (%s, %s)" % (api, size))
            check(normalize(cold) == normalize(ref) and normalize(warm) == normalize(ref),
                  "log buffers of %s bytes filled as the driver fills them (%s)" % (size, api))
    args = ["load", BAD, "ex", "4096"]
    ref, _, _ = run(args, shim=False)
    out, _, _ = run(args)
    check("error log (0): []" not in ref and out == ref, "bad PTX: the driver's own error log")


def test_switches():
    """KCACHE_JIT=0, KCACHE_MEMO=0, KCACHE_ALLOC=0, KCACHE_DISABLE=1."""
    args = ["load", PTX, "data", "0", "add1", "scale"]
    for env, what in (({"KCACHE_JIT": "0"}, "KCACHE_JIT=0"), ({"KCACHE_DISABLE": "1"}, "KCACHE_DISABLE=1")):
        fresh_cache()
        run(args, env=env)
        _, err, c = run(args, env=env)
        check(c.get("jit") == 1, what + ": every load JIT-compiles")
    _, err, c = run(args, env={"KCACHE_MEMO": "0"})
    check(c.get("cuModuleGetFunction") == 4, "KCACHE_MEMO=0: every lookup reaches the driver")
    ref, _, c0 = run(["alloc"], shim=False)
    out, _, c = run(["alloc"], env={"KCACHE_ALLOC": "0"})
    check(out == ref and c.get("cuMemAlloc_v2") == c0.get("cuMemAlloc_v2"), "KCACHE_ALLOC=0: no pool")
    # RECACHE compiles again, READONLY stores nothing.
    fresh_cache()
    run(args)
    _, err, c = run(args, env={"KCACHE_RECACHE": "1"})
    check(c.get("jit") == 1, "KCACHE_RECACHE=1 compiles again")
    fresh_cache()
    _, err, c = run(args, env={"KCACHE_READONLY": "1"})
    _, err, c = run(args)
    check(c.get("jit") == 1, "KCACHE_READONLY=1 stored nothing")


def test_file_loads():
    """cuModuleLoad and cuLibraryLoadFromFile (issue 23): cached like data
    loads, the file's content the key; a missing, unreadable or directory
    path, and a file whose content changes, answer as without the shim."""
    work = os.path.join(TMP, "files")
    os.makedirs(work, exist_ok=True)
    f = os.path.join(work, "k.ptx")
    shutil.copy(PTX, f)
    for api, what in (("file", "cuModuleLoad"), ("libfile", "cuLibraryLoadFromFile")):
        args = ["load", f, api, "4096", "add1", "scale"]
        fresh_cache()
        ref, _, _ = run(args, shim=False)
        out1, err1, c1 = run(args)
        out2, err2, c2 = run(args)
        s1, s2 = stats(err1, "jit"), stats(err2, "jit")
        check(normalize(out1) == normalize(ref) and normalize(out2) == normalize(ref),
              what + ": same output as the driver's, cold and warm")
        check(c1.get("jit") == 1 and s1 and s1["misses"] == 1 and s1["stores"] == 1,
              what + ": cold run compiles and stores")
        check(c2.get("jit", 0) == 0 and s2 and s2["hits"] == 1,
              what + ": warm run loads the stored cubin, no JIT")
        # The same content as a data load: one entry serves both.
        if api == "file":
            _, _, c3 = run(["load", PTX, "data", "0", "add1"])
            check(c3.get("jit", 0) == 0, what + ": a data load of the same PTX is served")
        # Another content under the same name: a miss, the new module.
        g = os.path.join(work, "k2.ptx")
        shutil.copy(PTX2, g)
        os.replace(g, f)
        ref2, _, _ = run(args, shim=False)
        out3, _, c3 = run(args)
        check(normalize(out3) == normalize(ref2) and c3.get("jit") == 1,
              what + ": the file's new content is compiled, not the old served")
        shutil.copy(PTX, f)
        bad = [os.path.join(work, "missing.ptx"), work]
        unreadable = os.path.join(work, "noread.ptx")
        shutil.copy(PTX, unreadable)
        os.chmod(unreadable, 0)
        if os.geteuid() != 0:
            bad.append(unreadable)
        for b in bad:
            ref, _, _ = run(["load", b, api, "4096", "add1"], shim=False)
            out, err, _ = run(["load", b, api, "4096", "add1"])
            s = stats(err, "jit")
            check(out == ref and "CUDA_SUCCESS" not in out.splitlines()[0],
                  "%s of %s: the driver's answer (%s)" % (what, os.path.basename(b),
                                                        out.splitlines()[0]))
            check(s is None or s["stores"] == 0, "%s of %s: nothing stored" % (what, b))
        os.chmod(unreadable, 0o600)


def main():
    name = sys.argv[1]
    fn = globals().get("test_" + name)
    if fn is None:
        raise SystemExit("no test " + name)
    try:
        fn()
    finally:
        rm_settled(TMP)
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
