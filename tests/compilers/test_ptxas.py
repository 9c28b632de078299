#!/usr/bin/env python3
"""ptxas run as a process, served whole (test compilers-ptxas-NAME).

The shim is inside every ptxas a preloaded program starts. Each case runs
the real ptxas plain (no kcache), under kcache cold and warm (a fresh
store per case), and compares what the caller sees: the exit status, the
output file's bytes and mode, standard output and standard error. A warm
run replays the cold run's streams byte for byte; the plain run's differ
from them only in ptxas's "Compile time = N ms" line. Cases:

- ok: a kernel compiled (-v, -lineinfo); warm is a hit, ptxas never runs
  (the warm run's stats line says hits=1, and a file-open trace of ptxas
  is absent: the output is written by kcache);
- modes: the output's mode under umask 077 and 002, and an existing output
  of mode 0600 keeps it;
- error: PTX that does not assemble: status, diagnostics, no output;
  replayed warm;
- edited: the input edited between runs: a miss, never the old cubin;
- tempnames: the same PTX at another temporary path is a hit (ptxas does
  not record the path: witnessed by comparing plain outputs), except with
  -g, where ptxas 13 records its command line in the cubin: a miss (kept
  for every release: 12.9's does not record it);
- unknown option, --help, an options file, a debugging variable ptxas
  reads (DUMP_KNOBS_TO_FILE): passed through with their reason;
- killed: ptxas killed mid-run (SIGTERM to the process the caller started):
  the caller sees the signal's status, nothing is stored;
- outputs: an unwritable directory, a missing one, /dev/stdout: as ptxas;
- through: an output ptxas writes through (a symbolic link, a second
  link, another owner's file, a read-only one): every path as plain's;
- flight: four identical runs at once compile once;
- nvcc: nvcc's own ptxas (temporary names, -m64 attached) served warm;
- env: the variables ptxas reads (its getenv calls, traced by a preloaded
  logger) are the ones tool.c's table lists.

Usage: test_ptxas.py PTXAS
"""
import glob
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toolrun  # noqa: E402
from toolrun import (Runner, check, failures, getenv_names, mode, read, three,  # noqa: E402
                     tool_counts)

PTX_SRC = r'''
.version {ver}
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p)
{{
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<8>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd2, %rd2, %rd3;
  ld.global.f32 %f1, [%rd2];
  mul.f32 %f2, %f1, {mul};
  fma.rn.f32 %f3, %f2, %f1, %f1;
  st.global.f32 [%rd2], %f3;
  ret;
}}
'''
BAD_PTX = PTX_SRC.replace("mul.f32 %f2", "mul.f32 %f99")



def norm(s):
    """A plain run's stream as the cold run's compares: no timing."""
    return re.sub(rb"Compile time = [0-9.]+ ms", b"Compile time = X ms", s)


def ptx(work, name, mul="2.0", ver="8.0", bad=False):
    path = os.path.join(work, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    src = (BAD_PTX if bad else PTX_SRC).format(ver=ver, mul="0f40000000" if mul == "2.0" else
                                                "0f40400000")
    with open(path, "w") as f:
        f.write(src)
    return path


def compare(case, res, hits=True):
    toolrun.compare(case, res, hits, norm)


def case_ok(R):
    src = ptx(R.work, "ok/k.ptx")
    out = os.path.join(R.work, "ok/k.cubin")
    res = three(R, "ok", ["-v", "-lineinfo", "--gpu-name=sm_90", src, "-o", out], out)
    compare("ok", res)
    check(res[0][3] is not None and res[0][3][:4] == b"\x7fELF", "ok: plain wrote a cubin")
    # ptxas never ran warm: strace sees no open of the PTX by anyone.
    if shutil.which("strace"):
        os.unlink(out)
        tr = os.path.join(R.work, "ok/trace")
        subprocess.run(["strace", "-f", "-e", "trace=openat,open", "-o", tr, R.ptxas, "-v",
                        "-lineinfo", "--gpu-name=sm_90", src, "-o", out],
                       env=R.env(os.path.join(R.work, "store-ok")), capture_output=True,
                       cwd=R.work, timeout=120)
        opened = [ln for ln in open(tr) if "k.ptx" in ln and "ENOENT" not in ln]
        check(len(opened) == 1 and read(out) == res[0][3],
              "ok warm: the PTX is read once (to key it), ptxas never opens it (%d)" % len(opened))


def case_modes(R):
    src = ptx(R.work, "modes/k.ptx")
    out = os.path.join(R.work, "modes/k.cubin")
    for um in (0o077, 0o002):
        res = three(R, "modes-%o" % um, ["--gpu-name=sm_90", src, "-o", out], out, umask=um)
        compare("modes-%o" % um, res)

    def existing():
        with open(out, "wb") as f:
            f.write(b"old")
        os.chmod(out, 0o600)
    store = os.path.join(R.work, "store-modes-existing")
    res = []
    for phase in ("plain", "cold", "warm"):
        existing()
        rc, so, se, tool, _ = R.run(["--gpu-name=sm_90", src, "-o", out],
                                    env=None if phase == "plain" else R.env(store))
        res.append((rc, so, se, read(out), mode(out), tool))
    compare("modes-existing", res)


def case_error(R):
    src = ptx(R.work, "error/bad.ptx", bad=True)
    out = os.path.join(R.work, "error/bad.cubin")
    res = three(R, "error", ["--gpu-name=sm_90", src, "-o", out], out)
    check(res[0][0] != 0 and res[0][2] != b"", "error: plain fails with diagnostics (%d)" % res[0][0])
    compare("error", res)


def case_edited(R):
    src = ptx(R.work, "edited/k.ptx")
    out = os.path.join(R.work, "edited/k.cubin")
    store = os.path.join(R.work, "store-edited")
    args = ["--gpu-name=sm_90", src, "-o", out]
    R.run(args, env=R.env(store))
    first = read(out)
    ptx(R.work, "edited/k.ptx", mul="3.0")
    R.run(args)
    plain = read(out)
    os.unlink(out)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(plain != first and read(out) == plain and tool.get("misses") == 1,
          "edited: the edited PTX is compiled again, its cubin is plain's (%s)" % tool)


def case_tempnames(R):
    store = os.path.join(R.work, "store-tempnames")
    a = ptx(R.work, "tmp/tmpa1b2c3.ptx")
    b = ptx(R.work, "tmp/tmpz9y8x7.ptx")
    for flags, expect_hit in (([], True), (["-g"], False)):
        outs = []
        for src in (a, b):
            out = src + ".o"
            if os.path.exists(out):
                os.unlink(out)
            R.run(flags + ["--gpu-name=sm_90", src, "-o", out])
            outs.append(read(out))
            os.unlink(out)
        witness = outs[0] == outs[1]
        # Without -g no release records the path; with -g ptxas 13 records
        # its command line (12.9 does not: kcache keeps it anyway).
        check(witness or not expect_hit, "tempnames %s: ptxas does not record the path (plain "
              "outputs %s)" % (flags, "equal" if witness else "differ"))
        R.run(flags + ["--gpu-name=sm_90", a, "-o", a + ".o"], env=R.env(store))
        rc, so, se, tool, _ = R.run(flags + ["--gpu-name=sm_90", b, "-o", b + ".o"],
                                    env=R.env(store))
        check(read(b + ".o") == outs[1] and (tool.get("hits") == 1) == expect_hit,
              "tempnames %s: another temporary name is %s (%s)"
              % (flags, "a hit" if expect_hit else "a miss", tool))
        for p in (a + ".o", b + ".o"):
            if os.path.exists(p):
                os.unlink(p)


def case_pass(R):
    src = ptx(R.work, "pass/k.ptx")
    out = os.path.join(R.work, "pass/k.cubin")
    optf = os.path.join(R.work, "pass/opts")
    with open(optf, "w") as f:
        f.write("--gpu-name=sm_90\n")
    for name, args, extra, reason in (
            ("unknown", ["--no-such-option", "--gpu-name=sm_90", src, "-o", out], {}, "option"),
            ("help", ["--help"], {}, "option"),
            ("optfile", ["--options-file", optf, src, "-o", out], {}, "option"),
            ("knobs", ["--gpu-name=sm_90", src, "-o", out],
             {"DUMP_KNOBS_TO_FILE": os.path.join(R.work, "pass/knobs.txt")}, "option"),
            ("stdin-input", ["--gpu-name=sm_90", "/dev/stdin", "-o", out], {}, "input")):
        store = os.path.join(R.work, "store-pass-" + name)
        res = []
        for phase in ("plain", "kcache"):
            if os.path.exists(out):
                os.unlink(out)
            env = dict(R.base, **extra) if phase == "plain" else R.env(store, **extra)
            rc, so, se, tool, _ = R.run(args, env=env)
            res.append((rc, norm(so), norm(se), read(out), tool))
        check(res[0][:4] == res[1][:4], "pass %s: as plain (status %d)" % (name, res[0][0]))
        check(res[1][4].get("passthrough") == 1 and res[1][4].get("reasons") == reason + "=1",
              "pass %s: passed through, reason %s (%s)" % (name, reason, res[1][4]))


def case_killed(R):
    # A PTX large enough to take a while: many copies of the kernel.
    body = PTX_SRC.format(ver="8.0", mul="0f40000000")
    head, entry = body.split(".visible", 1)
    src = os.path.join(R.work, "killed/big.ptx")
    os.makedirs(os.path.dirname(src), exist_ok=True)
    with open(src, "w") as f:
        f.write(head)
        for i in range(3000):
            f.write(".visible" + entry.replace("entry k(", "entry k%d(" % i))
    out = os.path.join(R.work, "killed/big.cubin")
    store = os.path.join(R.work, "store-killed")
    args = ["--gpu-name=sm_90", src, "-o", out]
    p = subprocess.Popen([R.ptxas] + args, env=R.env(store), cwd=R.work,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    check(p.returncode == -signal.SIGTERM, "killed: the caller sees SIGTERM (%d)" % p.returncode)
    time.sleep(0.3)
    leftover = [x for x in os.popen("ps -eo pid,args").read().splitlines() if src in x]
    check(not leftover, "killed: no ptxas left running (%s)" % leftover)
    rc, so, se, tool, _ = R.run(args, env=R.env(store))
    check(rc == 0 and tool.get("misses") == 1, "killed: nothing was stored (the next run: %s)" % tool)


def case_outputs(R):
    src = ptx(R.work, "outputs/k.ptx")
    ro = os.path.join(R.work, "outputs/ro")
    os.makedirs(ro, exist_ok=True)
    os.chmod(ro, 0o555)
    cases = [("missing-dir", os.path.join(R.work, "outputs/nodir/k.cubin")),
             ("dev-stdout", "/dev/stdout")]
    if os.geteuid() != 0:
        cases.append(("unwritable", os.path.join(ro, "k.cubin")))
    for name, out in cases:
        store = os.path.join(R.work, "store-outputs-" + name)
        res = []
        for phase in ("plain", "cold", "warm"):
            env = None if phase == "plain" else R.env(store)
            rc, so, se, tool, _ = R.run(["--gpu-name=sm_90", src, "-o", out], env=env)
            res.append((rc, norm(so), norm(se)))
        check(res[0] == res[1] == res[2], "outputs %s: as plain (status %d)" % (name, res[0][0]))
    # Standard output closed: as plain, and passed through.
    out = os.path.join(R.work, "outputs/closed.cubin")
    res = []
    for env in (None, R.env(os.path.join(R.work, "store-outputs-closed"))):
        if os.path.exists(out):
            os.unlink(out)
        r = subprocess.run([R.ptxas, "-v", "--gpu-name=sm_90", src, "-o", out], env=env or R.base,
                           cwd=R.work, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
        res.append((r.returncode, read(out)))
    check(res[0] == res[1] and res[0][1] is not None,
          "outputs: standard output closed: as plain (status %d)" % res[0][0])
    # The missing directory appears: the failure is not replayed.
    out = os.path.join(R.work, "outputs/nodir/k.cubin")
    os.makedirs(os.path.dirname(out))
    rc, so, se, tool, _ = R.run(["--gpu-name=sm_90", src, "-o", out],
                                env=R.env(os.path.join(R.work, "store-outputs-missing-dir")))
    check(rc == 0 and read(out) is not None and tool.get("hits", 0) == 0,
          "outputs: once the output's directory exists, ptxas succeeds (%d, %s)" % (rc, tool))
    os.chmod(ro, 0o755)


def fs_state(paths):
    """What a caller sees at each path: a link's target, or a file's
    bytes, mode, owner, group and link count (None: nothing there)."""
    st = []
    for p in paths:
        try:
            ls = os.lstat(p)
        except FileNotFoundError:
            st.append(None)
            continue
        if stat.S_ISLNK(ls.st_mode):
            st.append(("link", os.readlink(p)))
        else:
            st.append(("file", read(p), stat.S_IMODE(ls.st_mode), ls.st_uid, ls.st_gid,
                       ls.st_nlink))
    return st


def case_through(R):
    """An output that ptxas writes through (it opens it O_WRONLY|O_CREAT|
    O_TRUNC, in place): a symbolic link (to a file, and dangling), a file
    with a second link, a file of another owner, a read-only file. The
    warm run (a hit) leaves every path as the plain run does: the link
    kept and its target written, both links the new bytes, the owner and
    mode kept; a file the tool cannot open makes the tool run."""
    src = ptx(R.work, "through/k.ptx")
    d = os.path.join(R.work, "through")
    real = os.path.join(d, "real")
    out = os.path.join(d, "k.cubin")
    target = os.path.join(real, "t.cubin")
    other = os.path.join(real, "other.cubin")

    def old(path, md=0o644):
        os.makedirs(real, exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"old")
        os.chmod(path, md)

    def symlink():
        old(target, 0o640)
        os.symlink("real/t.cubin", out)

    def dangling():
        os.makedirs(real, exist_ok=True)
        os.symlink("real/t.cubin", out)

    def hardlink():
        old(out, 0o600)
        os.link(out, other)

    def foreign():
        old(out, 0o664)
        os.chown(out, 65534, 65534)

    def readonly():
        old(out, 0o444)

    cases = [("symlink", symlink), ("dangling", dangling), ("hardlink", hardlink)]
    if os.geteuid() == 0:
        cases.append(("owner", foreign))   # root writes into another's file, keeps its owner
    else:
        cases.append(("readonly", readonly))  # the tool cannot open it: neither can a hit
    for name, prep in cases:
        store = os.path.join(R.work, "store-through-" + name)
        res = []
        for phase in ("plain", "cold", "warm"):
            shutil.rmtree(d, ignore_errors=True)
            src = ptx(R.work, "through/k.ptx")
            prep()
            env = None if phase == "plain" else R.env(store)
            rc, so, se, tool, _ = R.run(["--gpu-name=sm_90", src, "-o", out], env=env)
            res.append((rc, norm(so), norm(se), fs_state([out, target, other]), tool))
        (prc, pso, pse, pst, _), cold, warm = res
        for phase, (rc, so, se, st, tool) in (("cold", cold), ("warm", warm)):
            check((rc, so, se, st) == (prc, pso, pse, pst),
                  "through %s %s: status, streams and every path as plain (%s)\n  plain %s\n  "
                  "kcache %s" % (name, phase, tool, (prc, pst), (rc, st)))
        if prc == 0:
            check(warm[4].get("hits") == 1, "through %s warm: a hit (%s)" % (name, warm[4]))
        leftover = [f for f in os.listdir(d) + os.listdir(real) if ".kcache-" in f]
        check(not leftover, "through %s: no temporary left (%s)" % (name, leftover))


def case_flight(R):
    src = ptx(R.work, "flight/k.ptx", mul="3.0")
    store = os.path.join(R.work, "store-flight")
    procs = []
    for i in range(4):
        out = os.path.join(R.work, "flight/k%d.cubin" % i)
        procs.append(subprocess.Popen([R.ptxas, "--gpu-name=sm_90", src, "-o", out],
                                      env=R.env(store), cwd=R.work, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    misses = hits = 0
    for p in procs:
        so, se = p.communicate(timeout=300)
        m = re.search(rb"tool hits=(\d+) misses=(\d+)", se)
        if m:
            hits += int(m.group(1))
            misses += int(m.group(2))
    outs = {read(os.path.join(R.work, "flight/k%d.cubin" % i)) for i in range(4)}
    check(misses == 1 and hits == 3 and len(outs) == 1,
          "flight: four runs at once, one compiles (%d misses, %d hits, %d outputs)"
          % (misses, hits, len(outs)))
    # One output path written by four runs at once (cold and warm): every
    # run succeeds and the file is whole, never a mix or a temporary left.
    same = os.path.join(R.work, "flight/same.cubin")
    for phase in ("cold", "warm"):
        ps = [subprocess.Popen([R.ptxas, "--gpu-name=sm_90", src, "-o", same],
                               env=R.env(os.path.join(R.work, "store-flight-same")), cwd=R.work,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
        rcs = [p.wait(timeout=300) for p in ps]
        for p in ps:
            p.stdout.close()
            p.stderr.close()
        left = [f for f in os.listdir(os.path.dirname(same)) if ".kcache-" in f]
        check(rcs == [0] * 4 and read(same) in outs and not left,
              "flight: one output path, four runs at once (%s): all succeed, the file whole, "
              "no temporary left (%s)" % (phase, left))


def case_env(R):
    src = ptx(R.work, "env/k.ptx")
    got = getenv_names(R, ["-v", "-lineinfo", "--gpu-name=sm_90", src, "-o", src + ".o"])
    if got is None:
        return
    rc, names = got
    # tool.c's ptxas_env and ptxas_inert.
    listed = ["CAN_FINALIZE_DEBUG", "DUMP_KNOBS_TO_FILE", "MAKEFLAGS", "OPENSSL_ia32cap"]
    check(rc == 0 and set(names) <= set(listed),
          "env: ptxas reads %s, all in kcache's list %s" % (names, listed))


def case_nvcc(R):
    """nvcc runs ptxas with its own temporary names and -m64 attached:
    the second nvcc's ptxas is a hit, its cubin nvcc's own."""
    nvcc = os.path.join(os.path.dirname(R.ptxas), "nvcc")
    if not os.access(nvcc, os.X_OK):
        return
    d = os.path.join(R.work, "nvcc")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "k.cu"), "w") as f:
        f.write('extern "C" __global__ void k(float *p) { p[threadIdx.x] *= 3.0f; }\n')
    store = os.path.join(R.work, "store-nvcc")
    args = [nvcc, "-cubin", "-arch=sm_90", "k.cu", "-o", "k.cubin"]
    subprocess.run(args, cwd=d, check=True, env=R.base)
    plain = read(os.path.join(d, "k.cubin"))
    tools = []
    for phase in ("cold", "warm"):
        os.unlink(os.path.join(d, "k.cubin"))
        # nvcc itself not served whole (KCACHE_NVCC=0): its tools are.
        r = subprocess.run(args, cwd=d, env=R.env(store, KCACHE_NVCC="0"), capture_output=True)
        t = tool_counts(r.stderr)
        tools.append((t["hits"], t["misses"]) if t else None)
        check(r.returncode == 0 and read(os.path.join(d, "k.cubin")) == plain,
              "nvcc %s: nvcc's cubin" % phase)
    # Its ptxas and cicc (served too): both compile cold, both served warm.
    check(tools == [(0, 2), (2, 0)],
          "nvcc: its cicc and ptxas compile cold, are served warm (%s)" % tools)


def main():
    ptxas = sys.argv[1]
    if not os.access(ptxas, os.X_OK):
        print("no ptxas at %s" % ptxas)
        return 1
    work = tempfile.mkdtemp(prefix="kc-ptxas-")
    R = Runner(ptxas, work)
    ver = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", ver)
    global PTX_SRC, BAD_PTX
    if m and (int(m.group(1)), int(m.group(2))) < (13, 0):
        pass  # every release here takes PTX 8.0
    try:
        for case in (case_ok, case_modes, case_error, case_edited, case_tempnames, case_pass,
                     case_killed, case_outputs, case_through, case_flight, case_env, case_nvcc):
            case(R)
    finally:
        for d in glob.glob(os.path.join(work, "outputs", "ro")):
            os.chmod(d, 0o755)
        shutil.rmtree(work, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
