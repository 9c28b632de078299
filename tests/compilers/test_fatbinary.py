#!/usr/bin/env python3
"""fatbinary run as a process, served whole (test compilers-fatbinary).

nvcc runs fatbinary on the cubins and PTX of a source: it writes the
fatbinary (--create) and the C file that embeds it (--embedded-fatbin).
Each case runs the real fatbinary plain (no kcache), under kcache cold and
warm (a fresh store per case), and compares the exit status, both
outputs' bytes and modes, standard output and standard error. Cases:

- ok: nvcc's own arguments (--image3=kind=...,file=PATH, -64,
  --cicc-cmdline): warm is a hit;
- error: an image that is no ELF: status, diagnostics, no output; replayed;
- edited: the cubin edited: a miss, plain's outputs;
- tempnames: the images under other temporary names and directories: a
  hit, every output plain's for those names (a witness: plain outputs do
  not differ by the names);
- pass: an unknown option, an options file, an image spec whose file is
  not last, a missing image: passed through with their reason;
- outputs: a missing output directory: as plain, cold and warm;
- flight: four identical runs at once compile once;
- version: a copy of fatbinary with bytes appended is keyed by its own
  content (a miss, then a hit);
- env: fatbinary reads no variable (a getenv trace).

fatbinary takes milliseconds: a run killed mid-way is tested with cicc
and ptxas, whose runs the same supervision watches.

Usage: test_fatbinary.py FATBINARY NVCC
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toolrun import (Runner, check, compare, failures, getenv_names, read,  # noqa: E402
                     three, tool_counts)

KERNEL = '__global__ void k(float *x) { x[threadIdx.x] = sqrtf(x[threadIdx.x]) * MUL; }\n'


def images(R, nvcc, name, mul="2.0f"):
    """A cubin and a PTX of a kernel (nvcc --keep) under R.work/name."""
    d = os.path.join(R.work, name)
    keep = os.path.join(d, "keep")
    os.makedirs(keep)
    with open(os.path.join(d, "k.cu"), "w") as f:
        f.write(KERNEL.replace("MUL", mul))
    subprocess.run([nvcc, "-c", "-arch=sm_90", "--keep", "--keep-dir", keep, "k.cu", "-o",
                    os.path.join(keep, "k.o")], env=R.base, cwd=d, check=True)
    cubin, = glob.glob(os.path.join(keep, "*.cubin"))
    ptx, = glob.glob(os.path.join(keep, "*.ptx"))
    return d, cubin, ptx


def fb_args(d, cubin, ptx, tag="tmpxft_00001234_00000000-"):
    outs = [os.path.join(d, tag + "3_k.fatbin"), os.path.join(d, tag + "3_k.fatbin.c")]
    args = ["--create=" + outs[0], "-64",
            "--cicc-cmdline=-ftz=0 -prec_div=1 -prec_sqrt=1 -fmad=1 ",
            "--image3=kind=elf,sm=90,file=" + cubin, "--image3=kind=ptx,sm=90,file=" + ptx,
            "--embedded-fatbin=" + outs[1]]
    return args, outs


def case_ok(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "ok")
    args, outs = fb_args(d, cubin, ptx)
    res = three(R, "ok", args, outs)
    compare("ok", res)
    check(None not in res[0][3], "ok: plain wrote both outputs")


def case_error(R, nvcc):
    d = os.path.join(R.work, "error")
    os.makedirs(d)
    junk = os.path.join(d, "junk.cubin")
    with open(junk, "wb") as f:
        f.write(bytes(range(256)) * 4)
    outs = [os.path.join(d, "j.fatbin")]
    res = three(R, "error", ["--create=" + outs[0], "-64", "--image3=kind=elf,sm=90,file=" + junk],
                outs)
    check(res[0][0] != 0 and res[0][2] != b"" and res[0][3] == (None,),
          "error: plain fails with diagnostics, no output (%d)" % res[0][0])
    compare("error", res)


def case_edited(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "edited")
    _, cubin2, _ = images(R, nvcc, "edited2", mul="3.0f")
    store = os.path.join(R.work, "store-edited")
    args, outs = fb_args(d, cubin, ptx)
    R.run(args, env=R.env(store))
    first = [read(o) for o in outs]
    shutil.copy(cubin2, cubin)
    R.run(args)
    plain = [read(o) for o in outs]
    for o in outs:
        os.unlink(o)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(plain != first and [read(o) for o in outs] == plain and tool.get("misses") == 1,
          "edited: the edited cubin is a miss, the outputs plain's (%s)" % tool)


def case_tempnames(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "tempnames")
    store = os.path.join(R.work, "store-tempnames")
    args, outs = fb_args(d, cubin, ptx)
    R.run(args)
    plain1 = [read(o) for o in outs]
    R.run(args, env=R.env(store))
    d2 = os.path.join(d, "other", "dir")
    os.makedirs(d2)
    c2, p2 = os.path.join(d2, "tmpxft_00bb_00000000-8_k.cubin"), \
        os.path.join(d2, "tmpxft_00bb_00000000-6_k.ptx")
    shutil.copy(cubin, c2)
    shutil.copy(ptx, p2)
    args2, outs2 = fb_args(d2, c2, p2, tag="tmpxft_00bb_00000000-")
    R.run(args2)
    plain2 = [read(o) for o in outs2]
    for o in outs2:
        os.unlink(o)
    rc, so, se, tool, _ = R.run(args2, env=R.env(store))
    check(plain1 == plain2, "tempnames: witness: plain outputs do not differ by the names")
    check([read(o) for o in outs2] == plain2 and tool.get("hits") == 1,
          "tempnames: other names are a hit, the outputs plain's (%s)" % tool)


def case_pass(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "pass")
    args, outs = fb_args(d, cubin, ptx)
    optf = os.path.join(d, "opts")
    with open(optf, "w") as f:
        f.write("-64\n")
    for name, a, reason in (
            ("unknown", ["--no-such-option"] + args, "option"),
            ("optfile", ["--options-file", optf] + args, "option"),
            ("spec-order", ["--create=" + outs[0], "--image3=file=%s,kind=elf,sm=90" % cubin],
             "option"),
            ("missing-image", ["--create=" + outs[0],
                               "--image3=kind=elf,sm=90,file=" + cubin + ".absent"], "input")):
        store = os.path.join(R.work, "store-pass-" + name)
        res = []
        for phase in ("plain", "kcache"):
            for o in outs:
                if os.path.exists(o):
                    os.unlink(o)
            rc, so, se, tool, _ = R.run(a, env=None if phase == "plain" else R.env(store))
            res.append((rc, so, se, [read(o) for o in outs], tool))
        check(res[0][:4] == res[1][:4], "pass %s: as plain (status %d)" % (name, res[0][0]))
        check(res[1][4].get("passthrough") == 1 and res[1][4].get("reasons") == reason + "=1",
              "pass %s: passed through, reason %s (%s)" % (name, reason, res[1][4]))


def case_outputs(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "outputs")
    args, outs = fb_args(os.path.join(d, "nodir"), cubin, ptx)
    store = os.path.join(R.work, "store-outputs")
    res = []
    for phase in ("plain", "cold", "warm"):
        rc, so, se, tool, _ = R.run(args, env=None if phase == "plain" else R.env(store))
        res.append((rc, so, se))
    check(res[0][0] != 0 and res[0] == res[1] == res[2],
          "outputs missing-dir: as plain (status %d)" % res[0][0])


def case_flight(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "flight")
    store = os.path.join(R.work, "store-flight")
    procs, outsets = [], []
    for i in range(4):
        args, outs = fb_args(d, cubin, ptx, tag="tmpxft_%08x_00000000-" % (i + 1))
        outsets.append(outs)
        procs.append(subprocess.Popen([R.tool] + args, env=R.env(store), cwd=R.work,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    hits = misses = 0
    for p in procs:
        so, se = p.communicate(timeout=300)
        t = tool_counts(se) or {}
        hits += t.get("hits", 0)
        misses += t.get("misses", 0)
    got = {read(o[0]) for o in outsets}
    check(misses == 1 and hits == 3 and len(got) == 1 and None not in got,
          "flight: four runs at once, one compiles (%d misses, %d hits)" % (misses, hits))


def case_version(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "version")
    store = os.path.join(R.work, "store-version")
    args, outs = fb_args(d, cubin, ptx)
    R.run(args, env=R.env(store))
    ref = [read(o) for o in outs]
    copy = os.path.join(R.work, "otherbin", "fatbinary")
    os.makedirs(os.path.dirname(copy))
    shutil.copy(R.tool, copy)
    with open(copy, "ab") as f:
        f.write(b"\0kcache-test")
    os.chmod(copy, 0o755)
    seen = []
    for _ in range(2):
        for o in outs:
            os.unlink(o)
        r = subprocess.run([copy] + args, env=R.env(store), cwd=R.work, capture_output=True)
        t = tool_counts(r.stderr) or {}
        seen.append((r.returncode, t.get("hits"), t.get("misses"), [read(o) for o in outs] == ref))
    check(seen == [(0, 0, 1, True), (0, 1, 0, True)],
          "version: a changed fatbinary is keyed by its own content: a miss, then a hit (%s)"
          % seen)


def case_env(R, nvcc):
    d, cubin, ptx = images(R, nvcc, "env")
    args, outs = fb_args(d, cubin, ptx)
    got = getenv_names(R, args)
    if got is not None:
        check(got[0] == 0 and got[1] == [], "env: fatbinary reads no variable (%s)" % got[1])


def main():
    fatbinary, nvcc = sys.argv[1], sys.argv[2]
    if not (os.access(fatbinary, os.X_OK) and os.access(nvcc, os.X_OK)):
        print("FAIL: no fatbinary at %s or nvcc at %s" % (fatbinary, nvcc))
        return 1
    work = tempfile.mkdtemp(prefix="kc-fatbinary-")
    R = Runner(fatbinary, work)
    try:
        for case in (case_ok, case_error, case_edited, case_tempnames, case_pass, case_outputs,
                     case_flight, case_version, case_env):
            case(R, nvcc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f.splitlines()[0])
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
