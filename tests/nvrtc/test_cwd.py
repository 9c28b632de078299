#!/usr/bin/env python3
"""Outputs that name the working directory (suite 'nvrtc', test nvrtc-cwd).

With -lineinfo, -G, -dlto or -optix-ir NVRTC records the directory it
runs in (joined with a relative program name, in-memory header names and
headers found through relative paths; -G's compile unit and the LTO and
OptiX IR even with an absolute name): the PTX's .file lines, the cubin's
debug sections, the IR. The directory is LLVM's: $PWD when it names the
same directory as ".", else getcwd().

The cases below are compiled with NVRTC itself in two directories (A and
B), through a symlink to A with PWD naming the link, and in A with a PWD
that names B: what differs between them is established here, every run,
not assumed. Under the shim, a store filled in A must give B, the link
and the bogus PWD exactly what NVRTC gives there, byte for byte; the
compiles whose options record no path must still hit in every directory,
and those whose options can record one must miss where the directory
differs (and only there).

Usage: test_cwd.py   (environment: KCACHE_SHIM, KCACHE_TEST_NVRTC_LIB: the
NVRTC to test, the toolkit's or a release's wheel in .venv-wheels)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "cwd_client.py")
SHIM = os.environ["KCACHE_SHIM"]
LIB = os.environ.get("KCACHE_TEST_NVRTC_LIB", "/usr/local/cuda/lib64/libnvrtc.so.13")

PLAIN = 'extern "C" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n'
RELHDR = ('#include "kc_cwd.h"\n'
          'extern "C" __global__ void k(float *x) { x[threadIdx.x] = hf(x[threadIdx.x]); }\n')
MEMHDR = ('#include "kc_mem.h"\n'
          'extern "C" __global__ void k(float *x) { x[threadIdx.x] = mf(x[threadIdx.x]); }\n')
FILEMAC = ('extern "C" __global__ void k(const char **s, float *x)'
           ' { *s = __FILE__; x[threadIdx.x] += 1.0f; }\n')
ERROR = 'extern "C" __global__ void k(float *x) { x[0] = nope(x[1]); }\n'
HDR = "__device__ float hf(float v) { return v * 2.0f; }\n"
MEM = [["kc_mem.h", "__device__ float mf(float v) { return v * 5.0f; }\n"]]
C90 = "-arch=compute_90"

# (label, program name, source, options, in-memory headers, keyed):
# keyed = the options can make NVRTC record a path, so kcache keys the
# directory. Every case that is not keyed must be independent of it.
CASES = [
    ("plain", "k.cu", PLAIN, [C90], [], False),
    ("plain-noname", None, PLAIN, [C90], [], False),
    ("plain-sm90", "k.cu", PLAIN, ["-arch=sm_90"], [], False),
    ("rdc", "k.cu", PLAIN, [C90, "-rdc=true"], [], False),
    ("relhdr", "k.cu", RELHDR, [C90, "-Iinc"], [], False),
    ("memhdr", "k.cu", MEMHDR, [C90], MEM, False),
    ("file-macro", "sub/k.cu", FILEMAC, [C90], [], False),
    ("error", "k.cu", ERROR, [C90, "-Iinc"], [], False),
    ("dopt", "k.cu", PLAIN, [C90, "-dopt=on"], [], False),
    ("xptxas", "k.cu", PLAIN, ["-arch=sm_90", "-Xptxas", "-O2"], [], False),
    # An absolute -I under the directory the store is filled in (A): the
    # request names A, so a header path under it may be absolute as given;
    # the entry made in A holds only in A (BOUND_TO_A: a miss in B), the one
    # made in B (nothing under B) everywhere.
    ("abs-I", "k.cu", RELHDR, [C90, "-I@A@/inc"], [], False),
    ("lineinfo", "k.cu", PLAIN, [C90, "-lineinfo"], [], True),
    ("lineinfo-noname", None, PLAIN, [C90, "-lineinfo"], [], True),
    ("lineinfo-long", "./k.cu", PLAIN, [C90, "--generate-line-info"], [], True),
    ("lineinfo-sm90", "k.cu", PLAIN, ["-arch=sm_90", "-lineinfo"], [], True),
    ("lineinfo-abs-relhdr", "/kc/abs/k.cu", RELHDR, [C90, "-lineinfo", "-Iinc"], [], True),
    ("lineinfo-abs-memhdr", "/kc/abs/k.cu", MEMHDR, [C90, "-lineinfo"], MEM, True),
    # No relative name anywhere: NVRTC records no directory, but the key
    # cannot know that before the compile (a header or a #line may bring
    # one): keyed, a miss in another directory.
    ("lineinfo-abs-plain", "/kc/abs/k.cu", PLAIN, [C90, "-lineinfo"], [], True),
    ("G", "k.cu", PLAIN, [C90, "-G"], [], True),
    ("G-abs", "/kc/abs/k.cu", PLAIN, [C90, "--device-debug"], [], True),
    ("G-sm90", "k.cu", PLAIN, ["-arch=sm_90", "-G", "-dopt=on"], [], True),
    ("dlto", "k.cu", PLAIN, ["-arch=sm_90", "-dlto"], [], True),
    ("dlto-abs", "/kc/abs/k.cu", PLAIN, [C90, "--dlink-time-opt"], [], True),
    ("optix", "/kc/abs/k.cu", PLAIN, [C90, "-optix-ir"], [], True),
]
# Independent of the directory although keyed (checked; NVRTC 13.0 and
# 12.9 record it for every other keyed case, 13.5 no longer for -optix-ir).
KEYED_INDEPENDENT = {"lineinfo-abs-plain"}
BOUND_TO_A = {"abs-I"}


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)
    print("ok: " + msg, flush=True)


def run(tmp, cwd, label, store=None, pwd=None, gone=False):
    """Runs the client in cwd (with PWD=pwd, default cwd); returns (outputs,
    ["hit"|"miss"|..., one per compile]) -- the second only under the shim."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}
    env["PWD"] = pwd or cwd
    if gone:
        env["KCACHE_TEST_RMDIR_CWD"] = "1"
    if store is not None:
        env["LD_PRELOAD"] = SHIM
        env["KCACHE_DIR"] = store
        env["KCACHE_LOG"] = "debug"
    out = os.path.join(tmp, "out-%s.json" % re.sub(r"\W", "_", label))
    p = subprocess.run([sys.executable, CLIENT, LIB, os.path.join(tmp, "cases.json"), out],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        raise Failure("%s: client exited %d: %s" % (label, p.returncode, p.stderr[-3000:]))
    with open(out) as f:
        res = json.load(f)
    verdicts = re.findall(r"nvrtc (hit|miss|pass-through): [0-9.]+ ms in the hook", p.stderr)
    if store is not None and len(verdicts) != len(CASES):
        raise Failure("%s: %d compile verdicts in the debug log for %d cases:\n%s"
                      % (label, len(verdicts), len(CASES), p.stderr[-3000:]))
    return res, verdicts


def same(label, ref, got):
    for (name, *_), a, b in zip(CASES, ref, got):
        if a != b:
            what = [k for k in a if a.get(k) != b.get(k)]
            raise Failure("%s: case %s differs from NVRTC's own there (%s)" % (label, name, what))
    check(len(ref) == len(got), "%s: every output byte-identical to NVRTC's own there" % label)


def expect(label, verdicts, want):
    got = {CASES[i][0]: v for i, v in enumerate(verdicts)}
    bad = {n: (got[n], w) for n, w in want.items() if got[n] != w}
    check(not bad, "%s: hits and misses as keyed (%s)" % (label, bad or "all as expected"))


def main():
    if not os.path.exists(LIB):
        print("FAIL: %s is missing (scripts/setup installs it)" % LIB)
        return 1
    tmp = tempfile.mkdtemp(prefix="kcache-cwd-")
    try:
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump([{"name": n, "src": s, "opts": [x.replace("@A@", os.path.join(tmp, "projA"))
                                                      for x in o], "headers": h}
                       for (_, n, s, o, h, _) in CASES], f)
        dirs = {}
        for d in ("projA", "projB"):
            dirs[d] = os.path.join(tmp, d)
            os.makedirs(os.path.join(dirs[d], "inc"))
            with open(os.path.join(dirs[d], "inc", "kc_cwd.h"), "w") as f:
                f.write(HDR)
        a, b = dirs["projA"], dirs["projB"]
        link = os.path.join(tmp, "linkA")
        os.symlink(a, link)
        store = os.path.join(tmp, "store")

        ref_a, _ = run(tmp, a, "NVRTC in A")
        ref_b, _ = run(tmp, b, "NVRTC in B")
        ref_l, _ = run(tmp, a, "NVRTC in A, PWD through a link", pwd=link)
        ref_p, _ = run(tmp, a, "NVRTC in A, PWD naming B", pwd=b)
        # Compiles NVRTC refuses for other reasons than the source (an option
        # this release lacks) are never cached: a miss every time.
        uncached = {c[0] for c, x in zip(CASES, ref_a) if x.get("compile") not in (0, 6)}
        dep = {c[0] for c, x, y in zip(CASES, ref_a, ref_b) if x != y}
        dep_l = {c[0] for c, x, y in zip(CASES, ref_a, ref_l) if x != y}
        print("note: outputs that differ between A and B: %s" % sorted(dep))
        keyed = {c[0] for c in CASES if c[5]}
        check(dep <= keyed, "every directory-dependent output is keyed (not keyed: %s)"
              % sorted(dep - keyed))
        check(KEYED_INDEPENDENT <= keyed - dep, "keyed but independent of the directory: "
              "%s (%s)" % (sorted(KEYED_INDEPENDENT), sorted(keyed - dep)))
        if keyed - dep != KEYED_INDEPENDENT:
            print("note: this NVRTC records no directory for %s either (keyed all the same)"
                  % sorted(keyed - dep - KEYED_INDEPENDENT))
        check(dep_l == dep, "through a link NVRTC names the link ($PWD): the same outputs "
              "differ (%s)" % sorted(dep_l ^ dep))
        check(ref_p == ref_a, "a PWD naming another directory is not used: outputs as in A")

        cold, v = run(tmp, a, "shim cold in A", store)
        same("shim cold in A", ref_a, cold)
        expect("shim cold in A", v, {c[0]: "miss" for c in CASES})
        got, v = run(tmp, b, "shim in B", store)
        same("shim in B, store filled in A", ref_b, got)
        expect("shim in B", v, {c[0]: "miss" if c[5] or c[0] in uncached | BOUND_TO_A
                                 else "hit" for c in CASES})
        got, v = run(tmp, a, "shim warm in A", store)
        same("shim warm in A", ref_a, got)
        expect("shim warm in A", v, {c[0]: "miss" if c[0] in uncached else "hit"
                                      for c in CASES})
        got, v = run(tmp, a, "shim in A, PWD through a link", store, pwd=link)
        same("shim in A, PWD through a link", ref_l, got)
        expect("shim, PWD through a link", v,
               {c[0]: "miss" if c[5] or c[0] in uncached else "hit" for c in CASES})
        got, v = run(tmp, a, "shim in A, PWD naming B", store, pwd=b)
        same("shim in A, PWD naming B", ref_a, got)
        expect("shim, PWD naming B", v, {c[0]: "miss" if c[0] in uncached else "hit"
                                          for c in CASES})
        # Another directory whose header differs: the compile that reads it
        # misses there (NVRTC 13.5 opens it by an absolute path made from
        # the directory, so the manifest must hold only where it was made).
        c_dir = os.path.join(tmp, "projC")
        os.makedirs(os.path.join(c_dir, "inc"))
        with open(os.path.join(c_dir, "inc", "kc_cwd.h"), "w") as f:
            f.write(HDR.replace("2.0f", "3.0f"))
        ref_c, _ = run(tmp, c_dir, "NVRTC in C")
        got, v = run(tmp, c_dir, "shim in C", store)
        same("shim in C, another header", ref_c, got)
        hdr = {c[0] for c in CASES if "-Iinc" in c[3] and c[2] is RELHDR}
        expect("shim in C", v, {c[0]: "miss" if c[5] or c[0] in hdr | uncached else "hit"
                                 for c in CASES})
        # A directory removed under the program: NVRTC records none (the
        # names stay relative); kcache cannot name it and passes the keyed
        # compiles through.
        for d in ("goneR", "goneS"):
            os.makedirs(os.path.join(tmp, d))
        ref_g, _ = run(tmp, os.path.join(tmp, "goneR"), "NVRTC in a removed directory", gone=True)
        got, v = run(tmp, os.path.join(tmp, "goneS"), "shim in a removed directory", store,
                     gone=True)
        same("shim in a removed directory", ref_g, got)
        got_v = {CASES[i][0]: x for i, x in enumerate(v)}
        bad = {c[0]: got_v[c[0]] for c in CASES
               if c[5] and c[0] not in uncached and got_v[c[0]] != "pass-through"}
        check(not bad, "shim in a removed directory: the keyed compiles pass through (%s)"
              % (bad or "all"))
        return 0
    except Failure as e:
        print("FAIL: %s" % e, flush=True)
        return 1
    finally:
        rm_settled(tmp)


if __name__ == "__main__":
    sys.exit(main())
