#!/usr/bin/env python3
"""nvlink run as a process, served whole (test compilers-nvlink).

nvcc -rdc / -dlink runs nvlink on the relocatable objects, with
libcudadevrt found by a library search. Each case runs the real nvlink
plain (no kcache), under kcache cold and warm (a fresh store per case),
and compares the exit status, both outputs' bytes and modes (the cubin,
the registration file), standard output and standard error. Cases:

- ok: nvcc's own arguments (-L twice, -lcudadevrt, -cpu-arch,
  --host-ccbin, --register-link-binaries): warm is a hit;
- edited: the input object edited: a miss, plain's outputs;
- library: libcudadevrt found in a directory of the test's own: edited
  there (nvlink then fails), a copy put in an earlier -L directory, and
  $LIBRARY_PATH naming another: each a miss with plain's result, never
  the stored one;
- tempnames: the object under another temporary name, the outputs
  elsewhere, another working directory: a hit, plain's bytes (a witness:
  plain outputs do not differ by the names);
- existing: a registration file already there (nvlink keeps one, even of
  junk, in some runs and writes it in others): passed through (reason
  order), as plain;
- pass: an unknown option, -g, a comma list of libraries: passed through
  with their reason;
- flight: four identical runs at once link once;
- env: the variables nvlink reads are the ones tool.c's table lists;
- nvcc: nvcc -dlink twice: nvlink and fatbinary served warm, the device
  code (.nv_fatbin) plain nvcc's.

Usage: test_nvlink.py NVLINK NVCC
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toolrun import (Runner, check, compare, failures, getenv_names, read,  # noqa: E402
                     three, tool_counts)

KERNEL = ('extern __device__ float helper(float);\n'
          '__global__ void k(float *x) { x[threadIdx.x] = helper(x[threadIdx.x]) * MUL; }\n'
          '__device__ float helper(float v) { return v + 1.0f; }\n'
          '__global__ void parent(float *x) { k<<<1, 1>>>(x); }\n')


def obj(R, nvcc, name, mul="2.0f"):
    """A relocatable object (nvcc -rdc -c) under R.work/name."""
    d = os.path.join(R.work, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "k.cu"), "w") as f:
        f.write(KERNEL.replace("MUL", mul))
    subprocess.run([nvcc, "-rdc=true", "-c", "-arch=sm_90", "k.cu", "-o",
                    "tmpxft_00001234_00000000-11_k.o"], env=R.base, cwd=d, check=True)
    return d, os.path.join(d, "tmpxft_00001234_00000000-11_k.o")


def nl_args(R, d, o, libdirs=None, tag="tmpxft_00001234_00000000-"):
    outs = [os.path.join(d, tag + "12_k_dlink.sm_90.cubin"), os.path.join(d, tag + "7_k_dlink.reg.c")]
    lib = os.path.join(R.cuda, "targets", "x86_64-linux", "lib")
    dirs = libdirs if libdirs is not None else [os.path.join(lib, "stubs"), lib]
    args = (["-m64", "--arch=sm_90", "--register-link-binaries=" + outs[1]] +
            ["-L" + x for x in dirs] + ["-cpu-arch=X86_64", o, "-lcudadevrt", "-o", outs[0],
                                        "--host-ccbin", "gcc"])
    return args, outs


def case_ok(R, nvcc):
    d, o = obj(R, nvcc, "ok")
    args, outs = nl_args(R, d, o)
    res = three(R, "ok", args, outs)
    compare("ok", res)
    check(None not in res[0][3], "ok: plain wrote the cubin and the registration file")


def case_edited(R, nvcc):
    d, o = obj(R, nvcc, "edited")
    _, o2 = obj(R, nvcc, "edited2", mul="3.0f")
    store = os.path.join(R.work, "store-edited")
    args, outs = nl_args(R, d, o)
    R.run(args, env=R.env(store))
    first = [read(x) for x in outs]
    shutil.copy(o2, o)
    for x in outs:
        os.unlink(x)
    R.run(args)
    plain = [read(x) for x in outs]
    for x in outs:
        os.unlink(x)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(plain != first and [read(x) for x in outs] == plain and tool.get("misses") == 1,
          "edited: the edited object is a miss, the outputs plain's (%s)" % tool)


def case_library(R, nvcc):
    d, o = obj(R, nvcc, "library")
    store = os.path.join(R.work, "store-library")
    early, mine = os.path.join(d, "early"), os.path.join(d, "mine")
    os.makedirs(early)
    os.makedirs(mine)
    real = os.path.join(R.cuda, "targets", "x86_64-linux", "lib", "libcudadevrt.a")
    shutil.copy(real, mine)
    args, outs = nl_args(R, d, o, libdirs=[early, mine])

    def step(label, env_extra=None):
        for x in outs:
            if os.path.exists(x):
                os.unlink(x)
        plain = R.run(args, env=dict(R.base, **(env_extra or {})))[:3] + (
            tuple(read(x) for x in outs),)
        for x in outs:
            if os.path.exists(x):
                os.unlink(x)
        rc, so, se, tool, _ = R.run(args, env=R.env(store, **(env_extra or {})))
        got = (rc, so, se, tuple(read(x) for x in outs))
        check(got == plain and tool.get("misses") == 1,
              "library %s: a miss, plain's result (status %d, %s)" % (label, rc, tool))
        return got
    R.run(args, env=R.env(store))
    # Edited where it is found: nvlink then fails.
    with open(os.path.join(mine, "libcudadevrt.a"), "ab") as f:
        f.write(b"junk")
    got = step("edited")
    check(got[0] != 0, "library edited: plain nvlink fails on it (%d)" % got[0])
    # A copy in an earlier directory (the edited one stays later).
    shutil.copy(real, early)
    got = step("in an earlier -L directory")
    check(got[0] == 0, "library in an earlier directory: plain nvlink links (%d)" % got[0])
    # $LIBRARY_PATH naming another directory.
    other = os.path.join(d, "other")
    os.makedirs(other)
    step("LIBRARY_PATH", {"LIBRARY_PATH": other})


def case_tempnames(R, nvcc):
    d, o = obj(R, nvcc, "tempnames")
    store = os.path.join(R.work, "store-tempnames")
    args, outs = nl_args(R, d, o)
    R.run(args)
    plain1 = [read(x) for x in outs]
    for x in outs:
        os.unlink(x)
    R.run(args, env=R.env(store))
    d2 = os.path.join(d, "other", "dir")
    os.makedirs(d2)
    o2 = os.path.join(d2, "tmpxft_00bbbb_00000000-11_k.o")
    shutil.copy(o, o2)
    args2, outs2 = nl_args(R, d2, o2, tag="tmpxft_00bbbb_00000000-")
    R.run(args2, cwd=d2)
    plain2 = [read(x) for x in outs2]
    for x in outs2:
        os.unlink(x)
    rc, so, se, tool, _ = R.run(args2, env=R.env(store), cwd=d2)
    check(plain1 == plain2, "tempnames: witness: plain outputs do not differ by the names")
    check([read(x) for x in outs2] == plain2 and tool.get("hits") == 1,
          "tempnames: other names are a hit, the outputs plain's (%s)" % tool)


def case_existing(R, nvcc):
    """A registration file already there: nvlink sometimes keeps it (even
    junk) and sometimes writes it, by a rule kcache has not pinned down:
    such a run passes through, as plain."""
    d, o = obj(R, nvcc, "existing")
    args, outs = nl_args(R, d, o)
    store = os.path.join(R.work, "store-existing")
    R.run(args, env=R.env(store))
    res = []
    for env in (None, R.env(store)):
        os.unlink(outs[0])
        with open(outs[1], "w") as f:
            f.write("junk\n")
        rc, so, se, tool, _ = R.run(args, env=env)
        res.append((rc, so, se, read(outs[0]) is not None, read(outs[1]), tool))
    check(res[0][:5] == res[1][:5],
          "existing: as plain (%s)" % [r[:5] for r in res])
    check(res[1][5].get("passthrough") == 1 and res[1][5].get("reasons") == "order=1",
          "existing: passed through, reason order (%s)" % res[1][5])


def case_pass(R, nvcc):
    d, o = obj(R, nvcc, "pass")
    args, outs = nl_args(R, d, o)
    for name, a in (("unknown", ["--no-such-option"] + args),
                    ("debug", ["-g"] + args),
                    ("comma-libs", args + ["-lcudadevrt,cudadevrt"])):
        store = os.path.join(R.work, "store-pass-" + name)
        res = []
        for phase in ("plain", "kcache"):
            for x in outs:
                if os.path.exists(x):
                    os.unlink(x)
            rc, so, se, tool, _ = R.run(a, env=None if phase == "plain" else R.env(store))
            res.append((rc, so, se, [read(x) for x in outs], tool))
        check(res[0][:4] == res[1][:4], "pass %s: as plain (status %d)" % (name, res[0][0]))
        check(res[1][4].get("passthrough") == 1 and res[1][4].get("reasons") == "option=1",
              "pass %s: passed through, reason option (%s)" % (name, res[1][4]))


def case_flight(R, nvcc):
    d, o = obj(R, nvcc, "flight")
    store = os.path.join(R.work, "store-flight")
    procs, outsets = [], []
    for i in range(4):
        args, outs = nl_args(R, d, o, tag="tmpxft_%08x_00000000-" % (i + 1))
        outsets.append(outs)
        procs.append(subprocess.Popen([R.tool] + args, env=R.env(store), cwd=R.work,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    hits = misses = 0
    for p in procs:
        so, se = p.communicate(timeout=300)
        t = tool_counts(se) or {}
        hits += t.get("hits", 0)
        misses += t.get("misses", 0)
    got = {read(x[0]) for x in outsets}
    check(misses == 1 and hits == 3 and len(got) == 1 and None not in got,
          "flight: four runs at once, one links (%d misses, %d hits)" % (misses, hits))


def case_env(R, nvcc):
    d, o = obj(R, nvcc, "env")
    args, outs = nl_args(R, d, o)
    got = getenv_names(R, args)
    if got is not None:
        # tool.c's nvlink_env and nvlink_inert (LIBRARY_PATH: the search, keyed).
        check(got[0] == 0 and set(got[1]) <= {"CAN_FINALIZE_DEBUG", "LIBRARY_PATH"},
              "env: nvlink reads %s, all in kcache's lists" % got[1])


def case_nvcc(R, nvcc):
    d, o = obj(R, nvcc, "nvcc")
    store = os.path.join(R.work, "store-nvcc")
    args = [nvcc, "-dlink", "-arch=sm_90", o, "-o", "dl.o"]

    def fatbin():
        fb = os.path.join(d, "dl.fatbin")
        r = subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin",
                            os.path.join(d, "dl.o"), fb], capture_output=True)
        return read(fb) if r.returncode == 0 else None
    subprocess.run(args, cwd=d, check=True, env=R.base)
    plain = fatbin()
    seen = []
    for phase in ("cold", "warm"):
        # nvcc itself not served whole (KCACHE_NVCC=0): its tools are.
        r = subprocess.run(args, cwd=d, env=R.env(store, KCACHE_NVCC="0"), capture_output=True)
        t = tool_counts(r.stderr) or {}
        seen.append((t.get("hits"), t.get("misses"), t.get("passthrough")))
        check(r.returncode == 0 and plain and fatbin() == plain,
              "nvcc %s: the device code is plain nvcc's, byte for byte" % phase)
    check(seen == [(0, 2, 0), (2, 0, 0)],
          "nvcc -dlink: its nvlink and fatbinary runs link cold, are served warm (%s)" % seen)


def main():
    nvlink, nvcc = sys.argv[1], sys.argv[2]
    if not (os.access(nvlink, os.X_OK) and os.access(nvcc, os.X_OK)):
        print("FAIL: no nvlink at %s or nvcc at %s" % (nvlink, nvcc))
        return 1
    work = tempfile.mkdtemp(prefix="kc-nvlink-")
    R = Runner(nvlink, work)
    R.cuda = os.path.dirname(os.path.dirname(os.path.realpath(nvlink)))
    try:
        for case in (case_ok, case_edited, case_library, case_tempnames, case_existing,
                     case_pass, case_flight, case_env, case_nvcc):
            case(R, nvcc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f.splitlines()[0])
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
