#!/usr/bin/env python3
"""Real NVRTC clients from PyPI (cuda.core, cuda.bindings.nvrtc) under the shim.

Usage: test_client.py TEST
  core-cubin   cuda.core to CUBIN/LTOIR and raw cuda.bindings.nvrtc calls,
               with no libcuda at all: NVRTC compiles on the CPU, no GPU.
  core-ptx     the same plus cuda.core's "ptx" target, which asks the driver
               for its version first: run with the stand-in driver
               (build/tests/standin/libcuda.so.1) on LD_LIBRARY_PATH.

Each runs client_compile.py (in the project venv, scripts/setup-venv) without
the shim, then cold and warm under it: dumps, stdout and stderr identical;
KCACHE_STATS: the cold run misses every compile, the warm run hits every one.
Exit 77 (skip) when the venv is missing.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

STATS_RE = re.compile(
    rb"^kcache: stats: nvrtc hits=(\d+) misses=(\d+) passthrough=(\d+)"
    rb" stores=(\d+) errors=(\d+)", re.M)
STATS_LINE_RE = re.compile(rb"^kcache: stats: .*\n?", re.M)
HERE = os.path.dirname(os.path.abspath(__file__))


class Failure(Exception):
    pass


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

def check(cond, msg):
    if not cond:
        raise Failure(msg)


def first_diff(a, b):
    ra = re.split(rb"^(?=@)", a, flags=re.M)
    rb_ = re.split(rb"^(?=@)", b, flags=re.M)
    for x, y in zip(ra, rb_):
        if x != y:
            return f"{x[:160]!r} vs {y[:160]!r}"
    return f"{len(ra)} records vs {len(rb_)}"


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("core-cubin", "core-ptx"):
        print(__doc__, file=sys.stderr)
        return 2
    test = sys.argv[1]
    src = os.environ.get("KCACHE_SRC", os.path.dirname(os.path.dirname(HERE)))
    build = os.environ.get("KCACHE_BUILD", os.path.join(src, "build"))
    shim = os.environ.get("KCACHE_SHIM", "")
    python = os.environ.get("KCACHE_VENV_PYTHON",
                            os.path.join(src, ".venv", "bin", "python"))
    if not os.path.exists(python):
        print(f"SKIP: no venv python at {python} (run scripts/setup-venv)")
        return 77
    if not (shim and os.path.exists(shim)):
        print(f"FAIL: KCACHE_SHIM={shim!r} does not exist", file=sys.stderr)
        return 1

    base = {k: v for k, v in os.environ.items()
            if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD",
                                                         "LD_LIBRARY_PATH")}
    base["CUDA_HOME"] = "/usr/local/cuda"
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    args = [python, os.path.join(HERE, "client_compile.py")]
    if test == "core-ptx":
        standin = os.path.join(build, "tests", "standin")
        if not os.path.exists(os.path.join(standin, "libcuda.so.1")):
            print(f"FAIL: no stand-in driver in {standin}", file=sys.stderr)
            return 1
        base["LD_LIBRARY_PATH"] = standin
        extra = ["--ptx"]
    else:
        extra = []

    tmp = tempfile.mkdtemp(prefix="kcache-client-")
    base["HOME"] = os.path.join(tmp, "home")
    base.pop("XDG_CACHE_HOME", None)
    os.makedirs(base["HOME"])
    store = os.path.join(tmp, "store")
    n = [0]

    def run(label, preload, **kv):
        n[0] += 1
        dump = os.path.join(tmp, f"dump{n[0]}")
        env = dict(base, KCACHE_DIR=store)
        if preload:
            env["LD_PRELOAD"] = shim
        env.update({k: str(v) for k, v in kv.items()})
        p = subprocess.run(args + [dump] + extra, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=240)
        check(p.returncode == 0, f"{label}: exit {p.returncode}:\n"
              f"{p.stderr.decode(errors='replace')[-3000:]}")
        with open(dump, "rb") as f:
            data = f.read()
        m = re.search(rb"cacheable=(\d+)", p.stdout)
        check(m, f"{label}: no summary on stdout: {p.stdout!r}")
        print(f"  ran {label}", flush=True)
        return p, data, int(m.group(1))

    def stats(label, p):
        lines = STATS_LINE_RE.findall(p.stderr)
        check(len(lines) == 1, f"{label}: expected one 'kcache: stats:' line "
              f"on stderr, got {len(lines)}: {p.stderr[-1500:]!r}")
        m = STATS_RE.search(p.stderr)
        check(m, f"{label}: stats line not understood: {lines[0]!r}")
        return tuple(int(x) for x in m.groups())

    try:
        ref, ref_dump, cacheable = run("no shim", False)
        # No GPU, no driver: cuda.core and cuda.bindings compiled anyway.
        if test == "core-cubin":
            check(b"core.saxpy.cubin.code" in ref_dump,
                  "cuda.core did not compile to CUBIN without a driver")
        runs = [("cold", True, {}), ("warm", True, {}),
                ("cold, stats", True, {"KCACHE_STATS": 1}),
                ("warm, stats", True, {"KCACHE_STATS": 1})]
        for label, preload, kv in runs:
            if label == "cold, stats":
                store = os.path.join(tmp, "store2")   # a fresh store
            p, data, c = run(label, preload, **kv)
            check(data == ref_dump, f"{label}: dump differs from no shim: "
                  f"{first_diff(ref_dump, data)}")
            check(p.stdout == ref.stdout, f"{label}: stdout differs: "
                  f"{p.stdout!r} vs {ref.stdout!r}")
            err = STATS_LINE_RE.sub(b"", p.stderr) if kv else p.stderr
            check(err == ref.stderr, f"{label}: stderr differs:\n"
                  f"{err[-1500:]!r}\nvs\n{ref.stderr[-1500:]!r}")
            if label == "cold, stats":
                hits, misses, _, stores, errors = stats(label, p)
                check(hits == 0 and misses == cacheable,
                      f"{label}: hits={hits} misses={misses}, expected 0 and "
                      f"{cacheable}")
                check(errors == 0, f"{label}: errors={errors}")
            elif label == "warm, stats":
                hits, misses, _, stores, errors = stats(label, p)
                check(hits == cacheable and misses == 0,
                      f"{label}: hits={hits} misses={misses}, expected "
                      f"{cacheable} and 0")
                check(errors == 0 and stores == 0,
                      f"{label}: errors={errors} stores={stores}")
    except Failure as e:
        print(f"FAIL {test}: {e}", file=sys.stderr)
        return 1
    finally:
        rm_settled(tmp)
    print(f"PASS {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
