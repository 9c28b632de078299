#!/usr/bin/env python3
"""nvcc run as a process, served whole (test compilers-nvcc).

The shim is inside nvcc and, through the inherited preload, inside every
program nvcc runs (sh, gcc, cc1plus, cudafe++, cicc, ptxas, fatbinary).
Each case runs the real nvcc plain (no kcache), under kcache cold and warm
(a fresh store per case) and compares what the caller sees: the exit
status, the outputs' bytes and modes, standard output and standard error.
nvcc itself is not deterministic: it embeds its temporary files' names in
the host object, so two plain runs differ in a few bytes. A warm run serves
the cold run's bytes: the test checks that a warm output differs from a
plain one in no more bytes than two plain runs differ from each other, and
that the device code (the ELF section .nv_fatbin of the object) is the
plain run's, byte for byte. Cases:

- c: nvcc -c -o with -Xcompiler and -Xptxas options (ptxas -v writes to
  standard error): a hit warm, streams replayed byte for byte;
- ptx, cubin, fatbin: -ptx, -cubin, -fatbin -o: a hit, identical bytes;
- md: -MD -MF: the dependency file is the plain run's, byte for byte;
- error: a compile error: status and diagnostics replayed, no output;
- header: an edited header is a miss (never the old object);
- include: a header that appears earlier on the include path is a miss;
- path: a gcc that appears earlier on PATH (a probe of nvcc's tree) is a
  miss, and that gcc runs;
- static: a statically linked host compiler stand-in (-ccbin) reports
  nothing: never stored, passed through with its reason;
- unnamed: --keep (temporary files kept), a source on standard input, an
  output no argument names (-c without -o): passed through with a reason;
- killed: nvcc killed mid-run: the caller sees the signal, nothing stored;
- flight: four identical compiles at once compile once;
- existing: an output already there (a symbolic link, a second link, a
  mode of its own): every path as plain's (-c replaces it, -cubin writes
  through it), served only where both ways leave the same;
- switch: KCACHE_NVCC=0: nvcc runs, not served whole; its cicc, ptxas and
  fatbinary runs are served warm (each prints its own counters).

Usage: test_nvcc.py NVCC
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
from kctest import elf_section as section, rm_settled  # noqa: E402

KERNEL = r'''
#include "k.h"
__global__ void scale(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * VAL + 1.0f;
}
void launch(float *x, int n) { scale<<<(n + 127) / 128, 128>>>(x, n); }
'''

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


class Runner:
    def __init__(self, nvcc, work):
        self.nvcc = nvcc
        self.work = work
        self.shim = os.environ["KCACHE_SHIM"]
        self.base = {k: v for k, v in os.environ.items()
                     if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}
        # nvcc's temporary files, in the work directory: a killed nvcc's
        # children leave theirs behind.
        self.base["TMPDIR"] = os.path.join(work, "tmp")
        os.makedirs(self.base["TMPDIR"])

    def env(self, store, **kw):
        e = dict(self.base, LD_PRELOAD=self.shim, KCACHE_DIR=store, KCACHE_STATS="1")
        e.update(kw)
        return e

    def run(self, args, env=None, cwd=None):
        r = subprocess.run([self.nvcc] + args, env=env or self.base, cwd=cwd or self.work,
                           capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
        return parse(r.returncode, r.stdout, r.stderr)


def parse(rc, out, err):
    stats = [ln for ln in err.splitlines() if ln.startswith(b"kcache: stats:")]
    kept = b"\n".join(ln for ln in err.splitlines() if not ln.startswith(b"kcache: stats:"))
    if err.endswith(b"\n") and kept:
        kept += b"\n"
    tool = {}
    if stats:
        m = re.search(rb"tool hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+)", stats[-1])
        if m:
            tool = dict(zip(["hits", "misses", "passthrough", "stores"], map(int, m.groups())))
        m = re.search(rb"passthrough tool((?: \w+=\d+)+)", stats[-1])
        if m:
            tool["reasons"] = m.group(1).decode().strip()
    return rc, out, kept, tool


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def mode(path):
    try:
        return oct(os.stat(path).st_mode & 0o7777)
    except OSError:
        return None


def ndiff(a, b):
    if a is None or b is None:
        return None if a is not b else 0
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def source(work, case, val="2.0f"):
    d = os.path.join(work, case)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "k.cu"), "w") as f:
        f.write(KERNEL)
    with open(os.path.join(d, "k.h"), "w") as f:
        f.write("#define VAL %s\n" % val)
    return d


def phases(R, case, args, outs, cwd, store=None, plain2=True):
    """plain, plain again, cold, warm: each with the outputs removed first."""
    store = store or os.path.join(R.work, "store-" + case)
    res = {}
    for phase in ("plain", "plain2", "cold", "warm"):
        if phase == "plain2" and not plain2:
            continue
        for o in outs:
            if os.path.lexists(o):
                os.unlink(o)
        env = R.base if phase.startswith("plain") else R.env(store)
        rc, so, se, tool = R.run(args, env=env, cwd=cwd)
        res[phase] = (rc, so, se, [read(o) for o in outs], [mode(o) for o in outs], tool)
    return res


def norm(s):
    """A plain run's stream as the cold run's compares: no timing."""
    return re.sub(rb"Compile time = [0-9.]+ ms", b"Compile time = X ms", s)


def compare(case, res, outs, exact=False):
    p, cold, warm = res["plain"], res["cold"], res["warm"]
    for phase, r in (("cold", cold), ("warm", warm)):
        check(r[0] == p[0] and r[4] == p[4], "%s %s: status %d and modes %s as plain's (%d, %s)"
              % (case, phase, r[0], r[4], p[0], p[4]))
        same = norm(r[1]) == norm(p[1]) and norm(r[2]) == norm(p[2])
        check(same, "%s %s: streams as plain's (ptxas's compile time aside)%s" % (
            case, phase, "" if same else
            "\n--- plain\n%r\n%r\n--- kcache\n%r\n%r" % (p[1], p[2], r[1], r[2])))
    check(warm[3] == cold[3] and warm[1] == cold[1] and warm[2] == cold[2],
          "%s warm: the cold run's outputs and streams, byte for byte" % case)
    for i, o in enumerate(outs):
        if exact:
            check(warm[3][i] == p[3][i], "%s warm: %s is plain's, byte for byte"
                  % (case, os.path.basename(o)))
        else:
            noise = ndiff(p[3][i], res["plain2"][3][i])
            d = ndiff(warm[3][i], p[3][i])
            check(d is not None and d <= max(noise, 8),
                  "%s warm: %s differs from plain in %s bytes, two plain runs in %s"
                  % (case, os.path.basename(o), d, noise))
    check(cold[5].get("misses") == 1 and cold[5].get("stores") == 1,
          "%s cold: one miss, stored (%s)" % (case, cold[5]))
    check(warm[5].get("hits") == 1 and warm[5].get("misses", 0) == 0,
          "%s warm: a hit (%s)" % (case, warm[5]))


def case_c(R):
    d = source(R.work, "c")
    out = os.path.join(d, "k.o")
    args = ["-c", "k.cu", "-o", "k.o", "-arch=sm_80", "-Xcompiler", "-O2,-fno-strict-aliasing",
            "-Xptxas", "-v"]
    res = phases(R, "c", args, [out], d)
    compare("c", res, [out])
    fp, fw = section(res["plain"][3][0], ".nv_fatbin"), section(res["warm"][3][0], ".nv_fatbin")
    check(fp is not None and fp == fw, "c warm: the device code (.nv_fatbin, %s bytes) is plain's"
          % (None if fp is None else len(fp)))
    check(b"registers" in res["warm"][2], "c warm: ptxas -v's report replayed on standard error")
    # Only nvcc's own stats line: none of its tree's programs prints one
    # (it would be stored and replayed as nvcc's output).
    store = os.path.join(R.work, "store-c2")
    r = subprocess.run([R.nvcc] + args, env=R.env(store), cwd=d, capture_output=True, timeout=600)
    n = r.stderr.count(b"kcache: stats:")
    check(n == 1, "c cold: one stats line, nvcc's (%d)" % n)


def case_phases(R):
    for flag, ext in (("-ptx", "ptx"), ("-cubin", "cubin"), ("-fatbin", "fatbin")):
        case = flag[1:]
        d = source(R.work, case)
        out = os.path.join(d, "k." + ext)
        res = phases(R, case, [flag, "-arch=sm_80", "k.cu", "-o", "k." + ext], [out], d)
        compare(case, res, [out], exact=True)


def case_md(R):
    d = source(R.work, "md")
    outs = [os.path.join(d, "k.o"), os.path.join(d, "k.d")]
    res = phases(R, "md", ["-c", "k.cu", "-o", "k.o", "-MD", "-MF", "k.d"], outs, d)
    compare("md", res, outs[:1])
    check(res["warm"][3][1] is not None and res["warm"][3][1] == res["plain"][3][1],
          "md warm: the dependency file is plain's, byte for byte")


def case_error(R):
    d = source(R.work, "error")
    with open(os.path.join(d, "bad.cu"), "w") as f:
        f.write("__global__ void k() { undefined_thing(); }\n")
    out = os.path.join(d, "bad.o")
    res = phases(R, "error", ["-c", "bad.cu", "-o", "bad.o"], [out], d, plain2=False)
    compare("error", res, [out], exact=True)
    check(res["plain"][0] != 0 and b"undefined_thing" in res["warm"][2],
          "error warm: the diagnostics replayed (status %d)" % res["warm"][0])


def case_header(R):
    d = source(R.work, "header")
    store = os.path.join(R.work, "store-header")
    out = os.path.join(d, "k.o")
    args = ["-c", "k.cu", "-o", "k.o"]
    R.run(args, env=R.env(store), cwd=d)
    first = read(out)
    with open(os.path.join(d, "k.h"), "w") as f:
        f.write("#define VAL 3.0f\n")
    rc, _, _, tool = R.run(args, env=R.env(store), cwd=d)
    second = read(out)
    check(rc == 0 and tool.get("misses") == 1 and second != first,
          "header edited: a miss, a new object (%s)" % tool)
    rc, _, _, tool = R.run(args, env=R.env(store), cwd=d)
    check(tool.get("hits") == 1 and read(out) == second, "header edited: then a hit (%s)" % tool)


def case_include(R):
    d = source(R.work, "include")
    os.makedirs(os.path.join(d, "first"), exist_ok=True)
    store = os.path.join(R.work, "store-include")
    args = ["-c", "k.cu", "-o", "k.o", "-Ifirst", "-I."]
    R.run(args, env=R.env(store), cwd=d)
    rc, _, _, tool = R.run(args, env=R.env(store), cwd=d)
    check(tool.get("hits") == 1, "include: a hit before (%s)" % tool)
    # k.cu includes "k.h" from its own directory first; a <> include is
    # searched on -I: use one through a second header.
    with open(os.path.join(d, "k.cu"), "w") as f:
        f.write("#include <extra.h>\n" + KERNEL)
    with open(os.path.join(d, "extra.h"), "w") as f:
        f.write("#define EXTRA 1\n")
    R.run(args, env=R.env(store), cwd=d)
    rc, _, _, tool = R.run(args, env=R.env(store), cwd=d)
    check(tool.get("hits") == 1, "include: a hit with extra.h from . (%s)" % tool)
    with open(os.path.join(d, "first", "extra.h"), "w") as f:
        f.write("#define EXTRA 2\n#error from first\n")
    rc, _, se, tool = R.run(args, env=R.env(store), cwd=d)
    check(rc != 0 and b"from first" in se and tool.get("misses") == 1,
          "include: a header earlier on the include path is a miss (%d, %s)" % (rc, tool))


def case_path(R):
    d = source(R.work, "path")
    bind = os.path.join(d, "bin")
    os.makedirs(bind, exist_ok=True)
    store = os.path.join(R.work, "store-path")
    env = R.env(store, PATH=bind + ":" + R.base["PATH"])
    args = ["-c", "k.cu", "-o", "k.o"]
    R.run(args, env=env, cwd=d)
    _, _, _, tool = R.run(args, env=env, cwd=d)
    check(tool.get("hits") == 1, "path: a hit before (%s)" % tool)
    gcc = shutil.which("gcc", path=R.base["PATH"])
    with open(os.path.join(bind, "gcc"), "w") as f:
        f.write("#!/bin/sh\necho wrapped-gcc >&2\nexec %s \"$@\"\n" % gcc)
    os.chmod(os.path.join(bind, "gcc"), 0o755)
    rc, _, se, tool = R.run(args, env=env, cwd=d)
    check(rc == 0 and b"wrapped-gcc" in se and tool.get("misses") == 1,
          "path: a gcc earlier on PATH is a miss, and runs (%s)" % tool)
    # -ccbin another host compiler: another key.
    rc, _, se, tool = R.run(args + ["-ccbin", gcc], env=env, cwd=d)
    check(rc == 0 and tool.get("misses") == 1, "path: -ccbin another compiler, a miss (%s)" % tool)


def case_static(R):
    d = source(R.work, "static")
    sw = os.path.join(d, "sw.c")
    gxx = shutil.which("g++", path=R.base["PATH"])
    with open(sw, "w") as f:
        f.write('#include <unistd.h>\nint main(int c, char **v) { (void)c; v[0] = "g++"; '
                'execv("%s", v); return 127; }\n' % gxx)
    exe = os.path.join(d, "host-static")
    r = subprocess.run(["gcc", "-static", "-O2", sw, "-o", exe], capture_output=True)
    check(r.returncode == 0, "static: a statically linked stand-in built (%s)" % r.stderr[-200:])
    if r.returncode != 0:
        return
    store = os.path.join(R.work, "store-static")
    out = os.path.join(d, "k.o")
    args = ["-c", "k.cu", "-o", "k.o", "-ccbin", exe]
    rc0, _, _, _ = R.run(args, cwd=d)
    plain = read(out)
    for i in range(2):
        rc, _, _, tool = R.run(args, env=R.env(store), cwd=d)
        check(rc == rc0 == 0 and tool.get("passthrough") == 1 and tool.get("stores") == 0
              and "unkeyable=1" in tool.get("reasons", "")
              and ndiff(read(out), plain) is not None,
              "static %d: passed through (unkeyable), never stored (%s)" % (i, tool))


def case_unnamed(R):
    d = source(R.work, "unnamed")
    store = os.path.join(R.work, "store-unnamed")
    for i in range(2):
        rc, _, _, tool = R.run(["-c", "k.cu", "-o", "k.o", "--keep"], env=R.env(store), cwd=d)
        check(rc == 0 and tool.get("passthrough") == 1 and "option=1" in tool.get("reasons", ""),
              "unnamed --keep %d: passed through (%s)" % (i, tool))
    # A source read from standard input: not a file the tree opens.
    for i in range(2):
        r = subprocess.run([R.nvcc, "-x", "cu", "-c", "-", "-o", "stdin.o", "-I."],
                           env=R.env(store), cwd=d, input=KERNEL.encode(), capture_output=True,
                           timeout=600)
        rc, _, _, tool = parse(r.returncode, r.stdout, r.stderr)
        check(rc == 0 and tool.get("passthrough") == 1 and "input=1" in tool.get("reasons", ""),
              "unnamed stdin %d: passed through (%s)" % (i, tool))
    # -odir-less output: nvcc -c without -o writes k.o, a file no argument
    # names: run, never stored.
    for i in range(2):
        rc, _, _, tool = R.run(["-c", "k.cu"], env=R.env(store), cwd=d)
        check(rc == 0 and tool.get("stores") == 0 and tool.get("hits", 0) == 0
              and os.path.exists(os.path.join(d, "k.o")),
              "unnamed -c without -o %d: run, not stored (%s)" % (i, tool))


SORT = r'''
#include <cub/device/device_radix_sort.cuh>
void sort(const unsigned *k_in, unsigned *k_out, const float *v_in, float *v_out, int n,
          void *tmp, size_t bytes, cudaStream_t s)
{
    cub::DeviceRadixSort::SortPairs(tmp, bytes, k_in, k_out, v_in, v_out, n, 0, 32, s);
}
'''


def case_killed(R):
    d = source(R.work, "killed")
    with open(os.path.join(d, "sort.cu"), "w") as f:
        f.write(SORT)
    store = os.path.join(R.work, "store-killed")
    # A compile of several seconds: SIGTERM reaches nvcc mid-run.
    args = [R.nvcc, "-c", "sort.cu", "-o", "sort.o", "-arch=sm_80"]
    status = []
    for env in (R.base, R.env(store)):
        p = subprocess.Popen(args, env=env, cwd=d, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        time.sleep(2.0)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
        status.append(p.returncode)
    # nvcc catches SIGTERM, removes its temporary files and exits 255.
    check(status[0] == status[1], "killed: the caller sees plain nvcc's status (%s)" % status)
    rc, _, _, tool = R.run(args[1:], env=R.env(store), cwd=d)
    check(rc == 0 and tool.get("misses") == 1 and tool.get("stores") == 1,
          "killed: nothing was stored, the next run compiles (%s)" % tool)


def case_flight(R):
    d = source(R.work, "flight")
    store = os.path.join(R.work, "store-flight")
    procs = []
    for i in range(4):
        procs.append(subprocess.Popen([R.nvcc, "-c", "k.cu", "-o", "k%d.o" % i], env=R.env(store),
                                      cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    tools = []
    for p in procs:
        o, e = p.communicate(timeout=600)
        tools.append(parse(p.returncode, o, e))
    # Each names its own output: four keys. The same output, four times:
    # one key, one compile.
    procs = []
    for i in range(4):
        procs.append(subprocess.Popen([R.nvcc, "-c", "k.cu", "-o", "same.o", "-DX=1"],
                                      env=R.env(store), cwd=d, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    tools = []
    for p in procs:
        o, e = p.communicate(timeout=600)
        tools.append(parse(p.returncode, o, e))
    misses = sum(t[3].get("misses", 0) for t in tools)
    hits = sum(t[3].get("hits", 0) for t in tools)
    check(all(t[0] == 0 for t in tools) and misses == 1 and hits == 3,
          "flight: four identical compiles at once, one compile (%d misses, %d hits)"
          % (misses, hits))


def case_switch(R):
    d = source(R.work, "switch")
    store = os.path.join(R.work, "store-switch")
    args = ["-c", "k.cu", "-o", "k.o"]
    R.run(args, cwd=d)
    plain = read(os.path.join(d, "k.o"))
    seen = []
    for phase in ("cold", "warm"):
        os.unlink(os.path.join(d, "k.o"))
        r = subprocess.run([R.nvcc] + args, env=R.env(store, KCACHE_NVCC="0"), cwd=d,
                           capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
        lines = re.findall(rb"tool hits=(\d+) misses=(\d+)", r.stderr)
        seen.append((r.returncode, sum(int(h) for h, _ in lines), sum(int(m) for _, m in lines)))
        check(r.returncode == 0 and section(read(os.path.join(d, "k.o")), ".nv_fatbin") ==
              section(plain, ".nv_fatbin"), "switch %s: the device code is plain's" % phase)
    # No line is nvcc's own (it is no tree): cicc, ptxas, fatbinary, each
    # a miss cold and a hit warm.
    check(seen[0][1:] == (0, 3) and seen[1][1:] == (3, 0),
          "switch: KCACHE_NVCC=0 serves nvcc's tools, not nvcc (cold, warm: %s)" % seen)


def case_existing(R):
    """An output already there. nvcc's -c object is written by GNU as,
    which unlinks it first (a new file: a symbolic link or a second link
    replaced, the mode a new file gets); -cubin's by ptxas in place
    (through a link, the mode kept). A warm run leaves every path as the
    plain run does: served where both ways leave the same (a file of the
    caller's own with the mode a new one gets), else nvcc runs (a
    pass-through with its reason)."""
    um = os.umask(0)
    os.umask(um)
    new_mode = 0o666 & ~um

    def state(paths):
        st = []
        for p in paths:
            if not os.path.lexists(p):
                st.append(None)
            elif os.path.islink(p):
                st.append(("link", os.readlink(p)))
            else:
                b = read(p)
                ls = os.lstat(p)
                st.append(("old" if b == b"old" else "new", oct(ls.st_mode & 0o7777),
                           ls.st_uid, ls.st_nlink))
        return st

    for flag, ext in (("-c", "o"), ("-cubin", "cubin")):
        for name in ("default", "mode", "symlink", "hardlink"):
            case = "existing-%s-%s" % (ext, name)
            d = source(R.work, case)
            out, target, other = (os.path.join(d, "k." + ext), os.path.join(d, "t." + ext),
                                  os.path.join(d, "other." + ext))
            store = os.path.join(R.work, "store-" + case)
            res = {}
            for phase in ("plain", "cold", "warm"):
                for p in (out, target, other):
                    if os.path.lexists(p):
                        os.unlink(p)
                if name == "symlink":
                    with open(target, "wb") as f:
                        f.write(b"old")
                    os.symlink("t." + ext, out)
                else:
                    with open(out, "wb") as f:
                        f.write(b"old")
                    os.chmod(out, new_mode if name == "default" else 0o600)
                    if name == "hardlink":
                        os.link(out, other)
                env = R.base if phase == "plain" else R.env(store)
                rc, so, se, tool = R.run([flag, "-arch=sm_80", "k.cu", "-o", "k." + ext],
                                         env=env, cwd=d)
                res[phase] = (rc, so, se, state([out, target, other]), tool, read(out))
            p = res["plain"]
            for phase in ("cold", "warm"):
                r = res[phase]
                check(r[0] == p[0] and r[3] == p[3],
                      "%s %s: status and every path as plain's (%s; plain %s, kcache %s)"
                      % (case, phase, r[4], p[3], r[3]))
                check(norm(r[1]) == norm(p[1]) and norm(r[2]) == norm(p[2]),
                      "%s %s: streams as plain's" % (case, phase))
            if ext == "cubin":
                check(res["warm"][5] == p[5], "%s warm: the cubin is plain's" % case)
            w = res["warm"][4]
            if name == "default":
                check(w.get("hits") == 1, "%s warm: served (%s)" % (case, w))
            else:
                check(w.get("hits", 0) == 0 and w.get("passthrough") == 1,
                      "%s warm: nvcc runs, a pass-through (%s)" % (case, w))


def main():
    nvcc = sys.argv[1]
    if not os.path.exists(nvcc):
        print("FAIL: no nvcc at " + nvcc)
        return 1
    work = tempfile.mkdtemp(prefix="kcache-nvcc-")
    R = Runner(nvcc, work)
    only = sys.argv[2:]
    cases = [case_c, case_phases, case_md, case_error, case_header, case_include, case_path,
             case_static, case_unnamed, case_killed, case_flight, case_switch, case_existing]
    try:
        for c in cases:
            if not only or c.__name__[5:] in only:
                c(R)
    finally:
        rm_settled(work)
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
