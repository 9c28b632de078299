#!/usr/bin/env python3
"""Triton's make_cubin path under kcache (test compilers-triton).

triton.compile of a fp16 matmul for sm_90 runs Triton's bundled
ptxas-blackwell on a PTX file with a temporary name. Plain, cold and warm
(each with a fresh TRITON_CACHE_DIR, so Triton's own cache never answers):
the cubin is identical in all three; cold stores the ptxas run, warm is
served it (kcache stats of the store: tool hits), whatever the temporary
name.

Usage: test_triton.py PYTHON
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def main():
    python = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    shim, tool = os.environ["KCACHE_SHIM"], os.environ["KCACHE_TOOL"]
    work = tempfile.mkdtemp(prefix="kc-triton-")
    store = os.path.join(work, "store")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}
    base["TRITON_DEFAULT_FP_FUSION"] = "1"
    try:
        probe = subprocess.run([python, "-c", "import triton"], env=base, capture_output=True)
        if probe.returncode != 0:
            print("triton is not installed in %s (scripts/setup-venv)" % python)
            return 1
        digests = []
        hits = []
        for phase in ("plain", "cold", "warm"):
            cache = os.path.join(work, "triton-" + phase)
            env = dict(base, TRITON_CACHE_DIR=cache)
            if phase != "plain":
                env.update(LD_PRELOAD=shim, KCACHE_DIR=store)
            r = subprocess.run([python, os.path.join(here, "triton_compile.py")], env=env,
                               capture_output=True, text=True, timeout=600)
            m = re.search(r"^cubin (\d+) ([0-9a-f]+)$", r.stdout, re.M)
            check(r.returncode == 0 and m is not None,
                  "%s: triton.compile made a cubin%s" % (phase, "" if m else "\n" + r.stderr[-2000:]))
            digests.append(m.group(2) if m else None)
            if phase != "plain":
                s = subprocess.run([tool, "stats"], env=dict(base, KCACHE_DIR=store),
                                   capture_output=True, text=True).stdout
                t = re.search(r"^\s*tool\s+hits (\d+)\s+misses (\d+)", s, re.M)
                hits.append((int(t.group(1)), int(t.group(2))) if t else None)
        check(digests[0] is not None and digests[0] == digests[1] == digests[2],
              "the cubin is plain Triton's, cold and warm (%s)" % digests)
        check(hits[0] is not None and hits[0][1] >= 1 and hits[0][0] == 0,
              "cold: Triton's ptxas compiled and stored (tool hits, misses: %s)" % (hits[0],))
        check(hits[1] is not None and hits[1][0] >= 1 and hits[1][1] == hits[0][1],
              "warm: Triton's ptxas served, never run (tool hits, misses: %s)" % (hits[1],))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
