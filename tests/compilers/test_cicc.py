#!/usr/bin/env python3
"""cicc run as a process, served whole (test compilers-cicc).

nvcc runs cicc on each preprocessed source: it writes the PTX (-o), the
host-side C file, the device file and the stub, from the .ii and the
module id file. Each case runs the real cicc plain (no kcache), under
kcache cold and warm (a fresh store per case), and compares what the
caller sees: the exit status, every output's bytes and mode, standard
output and standard error. Cases:

- ok: nvcc's own arguments (tmpxft names): warm is a hit, every output
  as plain's;
- error: a source that does not compile: status, diagnostics, no outputs
  as plain; never stored (a failing cicc leaves its scratch file in
  TMPDIR, which a replay would not), so warm runs cicc again;
- edited: the .ii edited, then the module id file edited: each a miss,
  the outputs plain's;
- tempnames: every input and output under other temporary names (and
  another --include_file_name): a hit, and the stub (which records its own
  path and the include name) is byte for byte what plain cicc writes under
  those names; a name with a character cicc might escape is keyed as
  written (a miss, plain's bytes);
- cwd: -g records the working directory (a witness: plain outputs differ
  by it): another working directory is a miss with plain's outputs;
  without -g it is a hit;
- pass: an unknown option, a variable of cicc's (EDG_BASE): passed
  through with their reason;
- genid: --gen_module_id_file (nvcc -cubin): the module id file is then an
  output, written on a hit as plain cicc writes it;
- killed: SIGTERM mid-run (cicc catches it and exits 4): the caller sees
  that, nothing is stored (neither the signal nor the failure it made);
- outputs: a missing output directory: as plain, cold and warm;
- flight: four identical runs at once compile once;
- version: a copy of cicc with bytes appended (a cicc kcache has not seen)
  is served keyed by its own content: a miss in a store holding the
  original's run, then a hit; a shell script named cicc is no tool (the
  process is the shell): passed by untouched;
- env: the variables cicc reads are the ones tool.c's table lists;
- nvcc: nvcc -fatbin twice: cicc, ptxas and fatbinary compile cold and
  are served warm, the fatbinary byte for byte plain nvcc's.

Usage: test_cicc.py CICC NVCC
"""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toolrun import (Runner, check, compare, failures, getenv_names, read,  # noqa: E402
                     three, tool_counts)

KERNEL = r'''
__global__ void k(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = erfinvf(x[i]) + powf(x[i], MUL);
}
'''

# What nvcc 13.0 passes cicc (nvcc --dryrun -c -arch=sm_90), less the files.
FLAGS = ["--c++17", "--static-host-stub", "--device-hidden-visibility", "--gnu_version=120200",
         "--display_error_number", "--orig_src_file_name", "k.cu", "--orig_src_path_name",
         "/src/k.cu", "--allow_managed", "-arch", "compute_90", "-m64", "--no-version-ident",
         "-ftz=0", "-prec_div=1", "-prec_sqrt=1", "-fmad=1", "-tused"]


def prepare(R, nvcc, name, mul="3.3f", extra=""):
    """nvcc -E of a kernel: its .ii and module id file under R.work/name."""
    d = os.path.join(R.work, name)
    os.makedirs(d, exist_ok=True)
    cu = os.path.join(d, "k.cu")
    with open(cu, "w") as f:
        f.write(KERNEL.replace("MUL", mul) + extra)
    keep = os.path.join(d, "keep")
    os.makedirs(keep, exist_ok=True)
    r = subprocess.run([nvcc, "-c", "-arch=sm_90", "--keep", "--keep-dir", keep, cu, "-o",
                        os.path.join(keep, "k.o")], env=R.base, cwd=d, capture_output=True)
    ii, mid = os.path.join(keep, "k.cpp1.ii"), os.path.join(keep, "k.module_id")
    if not (os.path.exists(ii) and os.path.exists(mid)):
        # A source that does not compile: its .ii from the preprocessor.
        subprocess.run([nvcc, "-E", "-arch=sm_90", "-D__CUDA_ARCH__=900", cu, "-o", ii],
                       env=R.base, cwd=d, check=True)
        with open(mid, "w") as f:
            f.write("_0123abcd_4_k_cu__Z1kPfi")
    assert os.path.exists(ii), r.stderr
    return d, ii, mid


def cicc_args(d, ii, mid, tag="tmpxft_00001234_00000000-6_", inc=None, flags=None):
    """cicc's arguments as nvcc gives them, its outputs under d with the
    temporary prefix tag. Returns (args, outputs)."""
    outs = [os.path.join(d, tag + s) for s in ("k.cudafe1.c", "k.cudafe1.stub.c",
                                                "k.cudafe1.gpu", "k.ptx")]
    inc = inc or tag.replace("-6_", "-3_") + "k.fatbin.c"
    args = (flags or FLAGS) + ["--include_file_name", inc, "--module_id_file_name", mid,
                               "--gen_c_file_name", outs[0], "--stub_file_name", outs[1],
                               "--gen_device_file_name", outs[2], ii, "-o", outs[3]]
    return args, outs


def case_ok(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "ok")
    args, outs = cicc_args(d, ii, mid)
    res = three(R, "ok", args, outs)
    compare("ok", res)
    check(all(o is not None for o in res[0][3]) and b".entry" in res[0][3][3],
          "ok: plain wrote the four outputs, a PTX among them")


def case_error(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "error", extra="int broken = ;\n")
    args, outs = cicc_args(d, ii, mid)
    scratch = lambda: sorted(glob.glob(os.path.join(R.tmp, "*.lgenfe.bc")))
    before = scratch()
    res = three(R, "error", args, outs)
    left = scratch()
    check(res[0][0] != 0 and b"error" in res[0][2] and res[0][3] == (None,) * 4,
          "error: plain fails with diagnostics, no outputs (%d)" % res[0][0])
    # A failing cicc leaves its scratch file in TMPDIR: a file kcache could
    # not write on a replay, so such a run is never stored (it runs again).
    check(len(left) == len(before) + 3,
          "error: each failing cicc leaves a scratch file behind (%d)" % (len(left) - len(before)))
    compare("error", res, hits=False, stored=False)
    check(res[2][5].get("misses") == 1, "error warm: cicc runs again (%s)" % res[2][5])


def case_edited(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "edited")
    store = os.path.join(R.work, "store-edited")
    args, outs = cicc_args(d, ii, mid)
    R.run(args, env=R.env(store))
    first = [read(o) for o in outs]
    # The .ii edited: another multiplier.
    src = read(ii).replace(b"3.3f", b"4.4f")
    with open(ii, "wb") as f:
        f.write(src)
    R.run(args)
    plain = [read(o) for o in outs]
    for o in outs:
        os.unlink(o)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(plain[3] != first[3] and [read(o) for o in outs] == plain and tool.get("misses") == 1,
          "edited: the edited .ii is compiled again, its outputs plain's (%s)" % tool)
    # The module id file edited (cicc reads it; with --device-c the stub
    # records it).
    args, outs = cicc_args(d, ii, mid, flags=FLAGS + ["--device-c"])
    R.run(args, env=R.env(store))
    before = [read(o) for o in outs]
    with open(mid, "ab") as f:
        f.write(b"x")
    R.run(args)
    plain2 = [read(o) for o in outs]
    for o in outs:
        os.unlink(o)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(plain2 != before and [read(o) for o in outs] == plain2 and tool.get("misses") == 1,
          "edited: the module id file edited is a miss, the outputs plain's (%s)" % tool)


def case_tempnames(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "tempnames")
    store = os.path.join(R.work, "store-tempnames")
    args, outs = cicc_args(d, ii, mid, tag="tmpxft_0000aaaa_00000000-6_")
    R.run(args, env=R.env(store))
    # Other temporary names: the inputs copied, the outputs elsewhere, of
    # another length, another include name.
    d2 = os.path.join(d, "deeper", "dir")
    os.makedirs(d2)
    ii2, mid2 = os.path.join(d2, "tmpxft_0001bb_00000000-7_k.cpp1.ii"), \
        os.path.join(d2, "tmpxft_0001bb_00000000-4_k.module_id")
    shutil.copy(ii, ii2)
    shutil.copy(mid, mid2)
    for label, tag, inc, hit in (("tmpxft", "tmpxft_0001bb_00000000-6_", None, True),
                                 ("quoted", "odd name \"q\" ", "odd \"inc\".c", False)):
        args2, outs2 = cicc_args(d2, ii2, mid2, tag=tag, inc=inc)
        R.run(args2)
        plain = [read(o) for o in outs2]
        for o in outs2:
            os.unlink(o)
        rc, so, se, tool, _ = R.run(args2, env=R.env(store))
        got = [read(o) for o in outs2]
        check(rc == 0 and got == plain and plain[1] is not None,
              "tempnames %s: every output is plain cicc's under these names (the stub %s)"
              % (label, "equal" if got[1] == plain[1] else "differs"))
        check((tool.get("hits") == 1) == hit, "tempnames %s: %s (%s)"
              % (label, "a hit" if hit else "keyed as written: a miss", tool))
    # The witness: plain stubs differ only by the names.
    check(read(outs[1]) != plain[1], "tempnames: witness: the stub records the names")


def case_cwd(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "cwd")
    store = os.path.join(R.work, "store-cwd")
    w1, w2 = os.path.join(d, "w1"), os.path.join(d, "w2", "sub")
    os.makedirs(w1)
    os.makedirs(w2)
    for flags, hit in ((FLAGS, True), (FLAGS + ["-g"], False)):
        args, outs = cicc_args(d, ii, mid, flags=flags)
        R.run(args, env=R.env(store), cwd=w1)
        R.run(args, cwd=w1)
        p1 = [read(o) for o in outs]
        R.run(args, cwd=w2)
        p2 = [read(o) for o in outs]
        for o in outs:
            os.unlink(o)
        rc, so, se, tool, _ = R.run(args, env=R.env(store), cwd=w2)
        g = "-g" in flags
        check((p1 != p2) == g, "cwd %s: witness: plain outputs %s by the working directory"
              % ("-g" if g else "plain", "differ" if g else "do not differ"))
        check([read(o) for o in outs] == p2 and (tool.get("hits") == 1) == hit,
              "cwd %s: another working directory is %s, outputs plain's (%s)"
              % ("-g" if g else "plain", "a hit" if hit else "a miss", tool))


def case_pass(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "pass")
    args, outs = cicc_args(d, ii, mid)
    for name, a, extra in (("unknown", ["--no-such-option"] + args, {}),
                           ("edg-base", args, {"EDG_BASE": d})):
        store = os.path.join(R.work, "store-pass-" + name)
        res = []
        for phase in ("plain", "kcache"):
            for o in outs:
                if os.path.exists(o):
                    os.unlink(o)
            env = dict(R.base, **extra) if phase == "plain" else R.env(store, **extra)
            rc, so, se, tool, _ = R.run(a, env=env)
            res.append((rc, so, se, [read(o) for o in outs], tool))
        check(res[0][:4] == res[1][:4], "pass %s: as plain (status %d)" % (name, res[0][0]))
        check(res[1][4].get("passthrough") == 1 and res[1][4].get("reasons") == "option=1",
              "pass %s: passed through, reason option (%s)" % (name, res[1][4]))


def case_genid(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "genid")
    args, outs = cicc_args(d, ii, os.path.join(d, "tmpxft_00001234_00000000-4_k.module_id"))
    res = three(R, "genid", ["--gen_module_id_file"] + args, outs + [args[args.index(
        "--module_id_file_name") + 1]])
    compare("genid", res)
    check(res[0][3][4], "genid: plain cicc wrote a module id")


def big_source(R, nvcc):
    """A source cicc takes a few seconds on: cub's radix sort."""
    return prepare(R, nvcc, "big", extra='''
#include <cub/device/device_radix_sort.cuh>
void sort(const unsigned *a, unsigned *b, const float *c, float *e, int n, void *t, size_t s)
{
    cub::DeviceRadixSort::SortPairs(t, s, a, b, c, e, n);
}
''')


def case_killed(R, nvcc):
    d, ii, mid = big_source(R, nvcc)
    store = os.path.join(R.work, "store-killed")
    args, outs = cicc_args(d, ii, mid)
    p = subprocess.Popen([R.tool] + args, env=R.env(store), cwd=R.work,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    # cicc catches SIGTERM and exits 4 ("Compilation terminated."): a
    # failure kcache must not keep.
    check(p.returncode in (4, -signal.SIGTERM),
          "killed: the caller sees cicc's end on SIGTERM (%d)" % p.returncode)
    time.sleep(0.3)
    leftover = [x for x in os.popen("ps -eo pid,args").read().splitlines() if ii in x]
    check(not leftover, "killed: no cicc left running (%s)" % leftover)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(rc == 0 and tool.get("misses") == 1 and tool.get("stores") == 1,
          "killed: nothing was stored (the next run: %s)" % tool)
    return d, ii, mid, args, outs, store


def case_outputs(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "outputs")
    args, outs = cicc_args(os.path.join(d, "nodir"), ii, mid)
    store = os.path.join(R.work, "store-outputs")
    res = []
    for phase in ("plain", "cold", "warm"):
        env = None if phase == "plain" else R.env(store)
        rc, so, se, tool, _ = R.run(args, env=env)
        res.append((rc, so, se))
    check(res[0][0] != 0 and res[0] == res[1] == res[2],
          "outputs missing-dir: as plain (status %d)" % res[0][0])


def case_flight(R, nvcc):
    d, ii, mid = big_source(R, nvcc)
    store = os.path.join(R.work, "store-flight")
    procs, outsets = [], []
    for i in range(4):
        args, outs = cicc_args(d, ii, mid, tag="tmpxft_%08x_00000000-6_" % (i + 1))
        outsets.append(outs)
        procs.append(subprocess.Popen([R.tool] + args, env=R.env(store), cwd=R.work,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    hits = misses = 0
    for p in procs:
        so, se = p.communicate(timeout=300)
        t = tool_counts(se) or {}
        hits += t.get("hits", 0)
        misses += t.get("misses", 0)
    ptx = {read(o[3]) for o in outsets}
    check(misses == 1 and hits == 3 and len(ptx) == 1 and None not in ptx,
          "flight: four runs at once (other temporary names), one compiles (%d misses, %d hits)"
          % (misses, hits))


def case_version(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "version")
    store = os.path.join(R.work, "store-version")
    args, outs = cicc_args(d, ii, mid)
    R.run(args, env=R.env(store))
    ref = [read(o) for o in outs]
    other = os.path.join(R.work, "otherbin")
    os.makedirs(other)
    copy = os.path.join(other, "cicc")
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
          "version: a changed cicc is keyed by its own content: a miss, then a hit (%s)" % seen)
    script = os.path.join(other, "sh", "cicc")
    os.makedirs(os.path.dirname(script))
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho stand-in \"$@\" > \"$(dirname \"$0\")/ran\"\nexit 3\n")
    os.chmod(script, 0o755)
    res = []
    for env in (R.base, R.env(store)):
        r = subprocess.run([script] + args, env=env, cwd=R.work, capture_output=True)
        res.append((r.returncode, r.stdout, tool_counts(r.stderr)))
    check(res[0][:2] == res[1][:2] == (3, b"") and not (res[1][2] or {}).get("hits"),
          "version: a shell script named cicc runs as itself, untouched (%s)" % res)


def case_env(R, nvcc):
    d, ii, mid = prepare(R, nvcc, "env")
    args, outs = cicc_args(d, ii, mid)
    got = getenv_names(R, args)
    if got is None:
        return
    rc, names = got
    # tool.c's cicc_env and cicc_inert.
    listed = ["AS_SECURE_LOG_FILE", "EDG_BASE", "EDG_MODULES_PATH",
              "LIBNVVM_DISABLE_CONCURRENT_API", "LLVM_OVERRIDE_PRODUCER", "NOCOLOR", "NVVMCCWIZ",
              "NVVM_IR_VER_CHK", "NV_NVVM_VERSION", "USR_INCLUDE", "bar",
              "MALLOC_CONF", "PWD", "TEMP", "TEMPDIR", "TMP", "TMPDIR"]
    check(rc == 0 and names and set(names) <= set(listed),
          "env: cicc reads %s, all in kcache's lists" % names)


def case_nvcc(R, nvcc):
    d = os.path.join(R.work, "nvcc")
    os.makedirs(d)
    with open(os.path.join(d, "k.cu"), "w") as f:
        f.write(KERNEL.replace("MUL", "2.5f"))
    store = os.path.join(R.work, "store-nvcc")
    args = [nvcc, "-fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
            "arch=compute_90,code=[sm_90,compute_90]", "k.cu", "-o", "k.fatbin"]
    subprocess.run(args, cwd=d, check=True, env=R.base)
    plain = read(os.path.join(d, "k.fatbin"))
    seen = []
    for phase in ("cold", "warm"):
        os.unlink(os.path.join(d, "k.fatbin"))
        # nvcc itself not served whole (KCACHE_NVCC=0): its tools are.
        r = subprocess.run(args, cwd=d, env=R.env(store, KCACHE_NVCC="0"), capture_output=True)
        t = tool_counts(r.stderr) or {}
        seen.append((t.get("hits"), t.get("misses"), t.get("passthrough")))
        check(r.returncode == 0 and read(os.path.join(d, "k.fatbin")) == plain,
              "nvcc %s: the fatbinary is plain nvcc's, byte for byte" % phase)
    # Two cicc, two ptxas, one fatbinary.
    check(seen == [(0, 5, 0), (5, 0, 0)],
          "nvcc: its cicc, ptxas and fatbinary runs compile cold, are served warm (%s)" % seen)


def main():
    cicc, nvcc = sys.argv[1], sys.argv[2]
    if not (os.access(cicc, os.X_OK) and os.access(nvcc, os.X_OK)):
        print("FAIL: no cicc at %s or nvcc at %s" % (cicc, nvcc))
        return 1
    work = tempfile.mkdtemp(prefix="kc-cicc-")
    R = Runner(cicc, work)
    # cicc's scratch files (and those a failing cicc leaves) go here.
    R.tmp = os.path.join(work, "tmp")
    os.makedirs(R.tmp)
    R.base["TMPDIR"] = R.tmp
    try:
        for case in (case_ok, case_error, case_edited, case_tempnames, case_cwd, case_pass, case_genid,
                     case_killed, case_outputs, case_flight, case_version, case_env, case_nvcc):
            case(R, nvcc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f.splitlines()[0])
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
