#!/usr/bin/env python3
"""Headers below /dev, /proc and /sys (suite 'nvrtc', tests nvrtc-pseudo*).

What decides whether a file a compile reads goes into the key is the
object, not its path: a header on a real filesystem is a dependency
wherever it lives, and a file kcache cannot key (a file of /proc or /sys,
a device, a FIFO) makes the compile pass through with its reason. Each
case is compiled by NVRTC alone and under the shim, in fresh processes,
and the shim must give NVRTC's own output every time:

  shm      a header in a directory under /dev/shm (tmpfs): cold a miss,
           then a hit; the header edited (HV 1 -> 2): a miss; a header of
           that name appearing earlier on the include path: a miss.
  proc-cwd -I/proc/self/cwd/inc, run in a directory holding inc/h.h: the
           same, and another directory with another inc/h.h misses (the
           lookup resolves /proc/self/cwd in its own process, as NVRTC
           reads it there).
  comm     #include "/proc/self/comm" (the process's name, set by the
           client): every compile passes through, the stats line naming
           the reason (unkeyable), and follows the name.
  bundled  (NVRTC 13.5) --use-bundled-headers=DIR, DIR under /dev/shm:
           after the fill, a bundled header edited in DIR gives NVRTC's
           output of the edited header (a miss), not the pristine one.

Usage: test_pseudo.py   (environment: KCACHE_SHIM, KCACHE_TEST_NVRTC_LIB:
the NVRTC to test, the toolkit's or a release's wheel in .venv-wheels)
"""
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "cwd_client.py")
SHIM = os.environ["KCACHE_SHIM"]
LIB = os.environ.get("KCACHE_TEST_NVRTC_LIB", "/usr/local/cuda/lib64/libnvrtc.so.13")

HSRC = '#include "h.h"\nextern "C" __global__ void k(int *x) { *x = HV; }\n'
COMM = '#include "/proc/self/comm"\nextern "C" __global__ void k(int *x) { *x = HV; }\n'
BUNDLED = ('#include <cuda_fp16.h>\n'
           'extern "C" __global__ void k(float *x) { x[0] = __half2float(__float2half(x[1])); }\n')
EDIT = b'\nextern "C" __global__ void kc_edited(int *x) { *x = 42; }\n'
C90 = "-arch=compute_90"

failures = []


def check(cond, msg):
    print(("ok: " if cond else "FAIL: ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def run(tmp, cwd, label, case, store=None, comm=None):
    """Compiles one case in a fresh process (NVRTC alone, or under the shim
    with store): returns (the getters' answers, the verdict, stderr)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}
    env["PWD"] = cwd
    if comm is not None:
        env["KCACHE_TEST_COMM"] = comm
    if store is not None:
        env.update(LD_PRELOAD=SHIM, KCACHE_DIR=store, KCACHE_LOG="debug", KCACHE_STATS="1")
    name = re.sub(r"\W", "_", label)
    cases, out = os.path.join(tmp, name + ".in.json"), os.path.join(tmp, name + ".out.json")
    with open(cases, "w") as f:
        json.dump([case], f)
    p = subprocess.run([sys.executable, CLIENT, LIB, cases, out], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        check(False, "%s: client exited %d: %s" % (label, p.returncode, p.stderr[-3000:]))
        return None, None, p.stderr
    with open(out) as f:
        res = json.load(f)[0]
    v = re.findall(r"nvrtc (hit|miss|pass-through): [0-9.]+ ms in the hook", p.stderr)
    return res, (v[0] if len(v) == 1 else v), p.stderr


def compare(tmp, cwd, label, case, store, want, comm=None):
    """NVRTC alone, then the shim, in cwd: the same answers, and the verdict
    `want`. Returns the shim's stderr."""
    ref, _, _ = run(tmp, cwd, "nvrtc " + label, case, comm=comm)
    got, v, err = run(tmp, cwd, "shim " + label, case, store, comm=comm)
    if ref is None or got is None:
        return err
    check(ref.get("compile") == 0, "%s: NVRTC compiles it (%s)" % (label, ref.get("compile")))
    bad = [k for k in ref if ref[k] != got.get(k)]
    check(not bad, "%s: the shim's answers are NVRTC's own (differ: %s)" % (label, bad))
    check(v == want, "%s: a %s (%s)" % (label, want, v))
    return err


def t_headers(tmp, store, label, cwd, opts, inc, first):
    """cold miss, warm hit, edited miss, one earlier on the path a miss."""
    case = {"name": "k.cu", "src": HSRC, "opts": [C90] + opts, "headers": []}
    with open(os.path.join(inc, "h.h"), "w") as f:
        f.write("#define HV 1\n")
    compare(tmp, cwd, label + ", cold", case, store, "miss")
    compare(tmp, cwd, label + ", warm", case, store, "hit")
    with open(os.path.join(inc, "h.h"), "w") as f:
        f.write("#define HV 2\n")
    compare(tmp, cwd, label + ", header edited (HV 1 -> 2)", case, store, "miss")
    compare(tmp, cwd, label + ", edited, warm", case, store, "hit")
    with open(os.path.join(first, "h.h"), "w") as f:
        f.write("#define HV 3\n")
    compare(tmp, cwd, label + ", a header found earlier on the path", case, store, "miss")
    os.unlink(os.path.join(first, "h.h"))


def main():
    if not os.path.exists(LIB):
        print("FAIL: %s is missing (scripts/setup installs it)" % LIB)
        return 1
    tmp = tempfile.mkdtemp(prefix="kcache-pseudo-")
    shm = tempfile.mkdtemp(prefix="kcache-pseudo-", dir="/dev/shm")
    try:
        store = os.path.join(tmp, "store")
        # A header below /dev/shm, by its absolute path.
        for d in ("a", "inc"):
            os.makedirs(os.path.join(shm, d))
        t_headers(tmp, store, "/dev/shm", tmp,
                  ["-I" + os.path.join(shm, "a"), "-I" + os.path.join(shm, "inc")],
                  os.path.join(shm, "inc"), os.path.join(shm, "a"))

        # A header reached through /proc/self/cwd: resolved by each process.
        proj = {}
        for p in ("projA", "projB"):
            proj[p] = os.path.join(tmp, p)
            for d in ("a", "inc"):
                os.makedirs(os.path.join(proj[p], d))
        a = proj["projA"]
        t_headers(tmp, store, "-I/proc/self/cwd/inc", a,
                  ["-I/proc/self/cwd/a", "-I/proc/self/cwd/inc"],
                  os.path.join(a, "inc"), os.path.join(a, "a"))
        with open(os.path.join(proj["projB"], "inc", "h.h"), "w") as f:
            f.write("#define HV 5\n")
        case = {"name": "k.cu", "src": HSRC,
                "opts": [C90, "-I/proc/self/cwd/a", "-I/proc/self/cwd/inc"], "headers": []}
        compare(tmp, proj["projB"], "-I/proc/self/cwd/inc, another directory", case, store,
                "miss")
        compare(tmp, a, "-I/proc/self/cwd/inc, back in the first", case, store, "hit")

        # A pseudo-file: the process's name, read as a header.
        case = {"name": "k.cu", "src": COMM, "opts": [C90], "headers": []}
        for n in (3, 4):
            label = "#include \"/proc/self/comm\" (HV %d)" % n
            err = compare(tmp, tmp, label, case, store, "pass-through", comm="#define HV %d" % n)
            check(re.search(r"nvrtc hits=0 misses=0 passthrough=1 ", err) is not None and
                  re.search(r"; passthrough nvrtc unkeyable=1(;|$)", err, re.M) is not None,
                  "%s: the stats line says it passed through as a file kcache cannot key (%r)"
                  % (label, err[-400:]))

        # NVRTC 13.5's bundled headers in a directory below /dev/shm.
        if hasattr(ctypes.CDLL(LIB), "nvrtcInstallBundledHeaders"):
            bdir = tempfile.mkdtemp(prefix="kcache-pseudo-bundled-", dir="/dev/shm")
            try:
                case = {"name": "k.cu", "src": BUNDLED,
                        "opts": [C90, "--use-bundled-headers=" + bdir], "headers": []}
                got, v, _ = run(tmp, tmp, "shim bundled, cold", case, store)
                check(got is not None and got.get("compile") == 0 and v == "miss",
                      "bundled below /dev/shm, cold: a miss that fills DIR (%s)" % v)
                with open(os.path.join(bdir, "cuda_fp16.h"), "ab") as f:
                    f.write(EDIT)
                got, v, _ = run(tmp, tmp, "shim bundled, edited", case, store)
                ref, _, _ = run(tmp, tmp, "nvrtc bundled, edited", case)
                check(ref is not None and got is not None and ref == got and
                      "kc_edited" in bytes.fromhex(ref["PTX"][2] or "").decode(),
                      "bundled below /dev/shm, a header edited in DIR: NVRTC's own output "
                      "of the edited header")
                check(v == "miss", "bundled below /dev/shm, a header edited in DIR: a miss (%s)"
                      % v)
            finally:
                shutil.rmtree(bdir, ignore_errors=True)
        else:
            print("note: this NVRTC has no bundled headers; that case is 13.5's")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        rm_settled(tmp)
    if failures:
        print("FAIL: %d checks failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
