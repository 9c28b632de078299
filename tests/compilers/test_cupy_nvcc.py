#!/usr/bin/env python3
"""CuPy's nvcc backend under the shim (test compilers-cupy-nvcc).

cupy.cuda.compiler.compile_using_nvcc (what RawModule(backend='nvcc')
runs) compiles here without a device: it writes the source into a fresh
temporary directory and runs `nvcc -gencode=... --cubin kern.cu` there,
with no -o (nvcc names the output kern.cubin in the working directory).

The witness (what such a run may be served): two plain compiles of the same
source, each from its own directory, give cubins that differ, and only in
the 8 hex digits nvcc derives from the source's absolute path and puts in
the names of internal-linkage symbols (`_INTERNAL_<hash>_7_kern_cu_...`, a
static __device__ function, a static __device__ variable, an anonymous
namespace): putting one run's digits into the other's bytes makes them
equal. The rule this test holds kcache to (docs/clients.md): such a run is
keyed by its directory, never served another directory's bytes; today
CuPy's runs write a file no argument names, so they pass through with
reason `writes` and nothing is stored.

Phases, each a fresh Python process: plain twice, then cold and warm under
the preload with one store. Each run's cubin must be a plain run's up to
the path digits, the kcache runs must pass through (`writes`) and store
nothing, and the warm run must compile again (its digits are its own
directory's, not the cold run's).

Usage: test_cupy_nvcc.py PYTHON
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

SOURCE = r'''
namespace { __device__ __noinline__ int twice(int x) { return 2 * x; } }
static __device__ int counter;
static __device__ __noinline__ int thrice(int x) { return 3 * x + counter; }
extern "C" __global__ void k(int *p)
{
    p[threadIdx.x] = twice(p[threadIdx.x]) + thrice(1);
    counter++;
}
'''

CHILD = r'''
import io, json, sys
from cupy.cuda import compiler
log = io.StringIO()
b = compiler.compile_using_nvcc(sys.argv[1], options=(), arch="90", filename="kern.cu",
                                log_stream=log)
print(json.dumps({"cubin": b.hex(), "log": log.getvalue()}))
'''

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def digits(blob):
    return set(re.findall(rb"_INTERNAL_([0-9a-f]{8})_", blob))


def tool_stats(log):
    m = re.search(r"tool hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+)", log)
    t = dict(zip(["hits", "misses", "passthrough", "stores"], map(int, m.groups()))) if m else {}
    m = re.search(r"passthrough tool((?: \w+=\d+)+)", log)
    if m:
        t["reasons"] = m.group(1).strip()
    return t


def main():
    python = sys.argv[1]
    shim = os.environ["KCACHE_SHIM"]
    cuda = os.environ.get("CUDA_ROOT", "/usr/local/cuda")
    work = tempfile.mkdtemp(prefix="kcache-cupy-nvcc-")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}
    base.update(CUDA_PATH=cuda, PATH=cuda + "/bin:" + base.get("PATH", ""),
                TMPDIR=os.path.join(work, "tmp"), CUPY_CACHE_DIR=os.path.join(work, "cupy"))
    os.makedirs(base["TMPDIR"])
    probe = subprocess.run([python, "-c", "import cupy.cuda.compiler"], env=base,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("FAIL: CuPy is not importable from %s (run scripts/setup-venv): %s"
              % (python, probe.stderr.strip().splitlines()[-1:]))
        return 1
    store = os.path.join(work, "store")
    kc = dict(base, LD_PRELOAD=shim, KCACHE_DIR=store, KCACHE_STATS="1")
    runs = {}
    try:
        for phase, env in (("plain", base), ("plain2", base), ("cold", kc), ("warm", kc)):
            r = subprocess.run([python, "-c", CHILD, SOURCE], env=env, capture_output=True,
                               text=True, timeout=600)
            check(r.returncode == 0, "%s: CuPy compiled through nvcc%s"
                  % (phase, "" if r.returncode == 0 else ": " + r.stderr[-2000:]))
            if r.returncode != 0:
                return 1
            out = json.loads(r.stdout.splitlines()[-1])
            runs[phase] = (bytes.fromhex(out["cubin"]), out["log"])
        p, p2 = runs["plain"][0], runs["plain2"][0]
        dp, dp2 = digits(p), digits(p2)
        # The witness: two directories, two sets of digits, nothing else apart.
        check(len(dp) == 1 and len(dp2) == 1 and dp != dp2 and p != p2,
              "witness: two plain compiles from two directories differ (%s, %s)"
              % (dp, dp2))
        if len(dp) == 1 and len(dp2) == 1:
            check(p2.replace(dp2.pop(), next(iter(dp))) == p,
                  "witness: they differ only in the path digits of internal names")
        for phase in ("cold", "warm"):
            blob, log = runs[phase]
            d = digits(blob)
            check(len(d) == 1 and blob.replace(next(iter(d)), next(iter(digits(p)))) == p,
                  "%s: the cubin is a plain run's up to its own path digits" % phase)
            t = tool_stats(log)
            check(t.get("passthrough") == 1 and t.get("stores") == 0 and t.get("hits") == 0
                  and "writes=1" in t.get("reasons", ""),
                  "%s: nvcc passed through (an output no argument names), nothing stored (%s)"
                  % (phase, t))
        check(digits(runs["warm"][0]) != digits(runs["cold"][0]),
              "warm: compiled in its own directory, never the cold run's bytes")
    finally:
        rm_settled(work)
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
