#!/usr/bin/env python3
"""kcache's NVRTC handles answer as NVRTC's own (test nvrtc-handles-RELEASE).

kcache keeps a program NVRTC would accept and NVRTC creates its own only
when a call needs it, so a hit never runs NVRTC. Every function that takes
a program must then answer kcache's handle exactly as NVRTC answers its
own. Each case below runs in a fresh process, plain (NVRTC alone), under
kcache cold and warm (one store per case): its printed codes, sizes,
output digests and logs, and how the process ended (a crash included),
must be the plain run's. Cases: create's bad arguments (NULL program,
NULL source, numHeaders < 0, NULL header arrays or elements, NULL name,
empty source); NULL handles given to every function; getters before a
compile; name expressions before, during and after compiles; a second
compile; bad option arrays; getters given NULL; destroy's handling of the
handle; programs with in-memory headers (6 MB of them too, with every
buffer create was given overwritten and freed once it returns); threads
that each run their own program, and threads racing getters on one
program.

Every out-parameter starts as a sentinel, so a getter that sets it, sets it
to NULL or leaves it untouched reads differently; a buffer's bytes past the
announced size are compared too. Lowered names live until destroy: the
pointers handed out before a second (and third) compile are read after it,
with freed memory refilled (MALLOC_PERTURB_).

Use after destroy (a program destroyed twice, then compiled, asked, given
a name) makes NVRTC read freed memory: it crashes or answers from what it
finds there. kcache's handles answer NVRTC_ERROR_INVALID_PROGRAM there,
and the test requires that or NVRTC's own answer, never another.

The warm run of every case whose compiles succeed must be all hits, with
NVRTC never asked to create a program (KCACHE_LOG=debug's "NVRTC
creates" lines), unless a call no record answers needs one.

Usage: test_handles.py LIBNVRTC
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

CLIENT = r'''
import ctypes, hashlib, sys, threading
lib = ctypes.CDLL(sys.argv[1])
case = sys.argv[2]
P = ctypes.c_void_p
SRC = b'extern "C" __global__ void k(float *p) { p[0] *= 2.0f; }'
TSRC = b'template <int N> __global__ void t(float *p) { p[0] *= N; }'
HSRC = b'#include "h.h"\n#include "g.h"\nextern "C" __global__ void k(float *p) { p[0] *= F + G; }'
BAD = b'extern "C" __global__ void k(float *p) { p[0] *= undefined_name; }'
OPT = (ctypes.c_char_p * 1)(b"-arch=compute_80")
def say(*a):
    print(" ".join(str(x) for x in a), flush=True)
def arr(*v):
    return (ctypes.c_char_p * len(v))(*v)
def create(src=SRC, name=b"k.cu", n=0, hdrs=None, names=None):
    h = P()
    rc = lib.nvrtcCreateProgram(ctypes.byref(h), src, name, n, hdrs, names)
    return rc, h
GETTERS = ["PTX", "CUBIN", "LTOIR", "OptiXIR", "NVVM", "TileIR", "ProgramLog"]
# Every out-parameter starts as a sentinel, so that "set", "set to NULL"
# and "left untouched" read differently.
SENT = 0x5a5a5a5a5a5a
def outputs(h, tag):
    for g in GETTERS:
        sz = getattr(lib, "nvrtcGet%sSize" % g, None)
        if sz is None:
            continue
        n = ctypes.c_size_t(7)
        rc = sz(h, ctypes.byref(n))
        # The buffer's tail tells whether a getter wrote past the size.
        b = ctypes.create_string_buffer(b"\xa5" * (max(n.value, 1) + 8))
        rc2 = getattr(lib, "nvrtcGet%s" % g)(h, b)
        data = b.raw[:n.value]
        tail = b.raw[n.value:].hex()[:24]
        if g == "ProgramLog":
            say(tag, g, rc, n.value, rc2, repr(data), tail)
        else:
            say(tag, g, rc, n.value, rc2, hashlib.sha256(data).hexdigest()[:16], tail)
        say(tag, g, "null", sz(h, None), getattr(lib, "nvrtcGet%s" % g)(h, None))
    f = getattr(lib, "nvrtcGetPCHHeapSizeRequired", None)
    if f is not None:
        n = ctypes.c_size_t(7)
        say(tag, "pch-required", f(h, ctypes.byref(n)), n.value, f(h, None))
    f = getattr(lib, "nvrtcGetPCHCreateStatus", None)
    if f is not None:
        say(tag, "pch-status", f(h))
def lowered(h, e, out=True):
    """nvrtcGetLoweredName's code and what it left in the result:
    the name, NULL, or the sentinel untouched."""
    s = ctypes.c_void_p(SENT)
    rc = lib.nvrtcGetLoweredName(h, e, ctypes.byref(s) if out else None)
    v = s.value
    return rc, ("untouched" if v == SENT else "NULL" if v is None else ctypes.string_at(v))
def destroy(h, tag="destroy"):
    rc = lib.nvrtcDestroyProgram(ctypes.byref(h))
    say(tag, rc, h.value is None)

if case == "create-args":
    h = P()
    say("null-prog", lib.nvrtcCreateProgram(None, SRC, b"k.cu", 0, None, None))
    for tag, kw in [("null-src", dict(src=None)), ("neg", dict(n=-1)),
                    ("null-arrays", dict(n=1)),
                    ("names-null", dict(src=HSRC, n=1, hdrs=arr(b"#define F 3.0f\n"))),
                    ("hdrs-null", dict(src=HSRC, n=1, names=arr(b"h.h"))),
                    ("hdr-elem-null", dict(src=HSRC, n=2, hdrs=arr(b"#define F 3\n", None),
                                           names=arr(b"h.h", b"g.h"))),
                    ("name-elem-null", dict(src=HSRC, n=2, hdrs=arr(b"#define F 3\n", b"#define G 1\n"),
                                            names=arr(b"h.h", None))),
                    ("zero-with-arrays", dict(n=0, hdrs=arr(b"x"), names=arr(b"y.h"))),
                    ("null-name", dict(name=None)), ("empty-name", dict(name=b"")),
                    ("empty-src", dict(src=b""))]:
        rc, h = create(**kw)
        say(tag, rc, h.value is None)
        if rc == 0:
            say(tag, "compile", lib.nvrtcCompileProgram(h, 1, OPT))
            outputs(h, tag)
            destroy(h, tag + "-destroy")
elif case.startswith("null-"):
    fn = case[5:]
    n = ctypes.c_size_t(7)
    b = ctypes.create_string_buffer(16)
    if fn == "compile":
        say(fn, lib.nvrtcCompileProgram(None, 1, OPT))
    elif fn == "addname":
        say(fn, lib.nvrtcAddNameExpression(None, b"k"))
    elif fn == "lowered":
        say(fn, *lowered(None, b"k"))
    elif fn == "destroy":
        say(fn, lib.nvrtcDestroyProgram(None))
        z = P()
        say(fn, "ptr-to-null", lib.nvrtcDestroyProgram(ctypes.byref(z)))
    elif fn == "pch":
        f = getattr(lib, "nvrtcGetPCHCreateStatus", None)
        say(fn, f(None) if f else "absent")
    else:
        say(fn, getattr(lib, "nvrtcGet%sSize" % fn)(None, ctypes.byref(n)), n.value,
            getattr(lib, "nvrtcGet%s" % fn)(None, b))
elif case == "before-compile":
    rc, h = create()
    outputs(h, "before")
    say("lowered", *lowered(h, b"k"))
    destroy(h)
elif case == "names":
    rc, h = create(src=TSRC, name=b"t.cu")
    for e in [b"t<1>", b"t<2>", b"", b"t<1>", b"not_a_name"]:
        say("add", e, lib.nvrtcAddNameExpression(h, e))
    say("lowered-before", *lowered(h, b"t<1>"))
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    outputs(h, "after")
    for e in [b"t<1>", b"t<2>", b"", b"t<3>", b"not_a_name"]:
        say("lowered", e, *lowered(h, e))
    say("add-after", lib.nvrtcAddNameExpression(h, b"t<3>"))
    say("lowered-added-after", *lowered(h, b"t<3>"))
    destroy(h)
elif case == "names-null":
    rc, h = create(src=TSRC, name=b"t.cu")
    say("add-null", lib.nvrtcAddNameExpression(h, None))
    say("add", lib.nvrtcAddNameExpression(h, b"t<4>"))
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    say("lowered", *lowered(h, b"t<4>"))
    say("add-null-after", lib.nvrtcAddNameExpression(h, None))
    destroy(h)
elif case == "lowered-null":
    rc, h = create(src=TSRC, name=b"t.cu")
    say("add", lib.nvrtcAddNameExpression(h, b"t<5>"))
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    say("lowered-null-out", lowered(h, b"t<5>", out=False)[0])
    say("lowered-null-name", *lowered(h, None))
    say("lowered-unknown", *lowered(h, b"t<6>"))
    destroy(h)
elif case == "twice":
    rc, h = create()
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    outputs(h, "first")
    o2 = arr(b"-arch=sm_80", b"-lineinfo")
    say("compile2", lib.nvrtcCompileProgram(h, 2, o2))
    outputs(h, "second")
    destroy(h)
elif case.startswith("lowered-again"):
    # The names NVRTC lowered live until the program is destroyed, whatever
    # is compiled meanwhile: read them again after a second compile (freed
    # memory is refilled: MALLOC_PERTURB_).
    rc, h = create(src=TSRC, name=b"t.cu")
    say("add", lib.nvrtcAddNameExpression(h, b"t<1>"), lib.nvrtcAddNameExpression(h, b"t<2>"))
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    ptrs = []
    for e in [b"t<1>", b"t<2>"]:
        s = ctypes.c_void_p(SENT)
        say("lowered", e, lib.nvrtcGetLoweredName(h, e, ctypes.byref(s)))
        ptrs.append(s.value)
    say("first", *[ctypes.string_at(p) for p in ptrs])
    o2 = OPT if case == "lowered-again" else arr(b"-arch=compute_90", b"-lineinfo")
    say("compile2", lib.nvrtcCompileProgram(h, len(o2), o2))
    say("earlier", *[ctypes.string_at(p) for p in ptrs])
    for e in [b"t<1>", b"t<2>", b"t<3>"]:
        say("lowered2", e, *lowered(h, e))
    say("compile3", lib.nvrtcCompileProgram(h, 1, OPT))
    say("earlier3", *[ctypes.string_at(p) for p in ptrs])
    outputs(h, "third")
    destroy(h)
elif case == "bad-options":
    rc, h = create()
    say("neg", lib.nvrtcCompileProgram(h, -1, OPT))
    say("null-array", lib.nvrtcCompileProgram(h, 1, None))
    say("null-elem", lib.nvrtcCompileProgram(h, 1, arr(None)))
    say("unknown", lib.nvrtcCompileProgram(h, 1, arr(b"--no-such-option")))
    outputs(h, "after-unknown")
    say("good", lib.nvrtcCompileProgram(h, 1, OPT))
    outputs(h, "after-good")
    destroy(h)
elif case == "error":
    rc, h = create(src=BAD, name=b"bad.cu")
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    outputs(h, "bad")
    destroy(h)
elif case == "headers":
    hd = arr(b"#define F 3.0f\n", b"#define G (1.0f + " + b" + ".join(b"0.0f" for _ in range(20000)) + b")\n")
    rc, h = create(src=HSRC, n=2, hdrs=hd, names=arr(b"h.h", b"g.h"))
    say("create", rc)
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    outputs(h, "headers")
    destroy(h)
elif case == "headers-freed":
    # In-memory headers of 6 MB in all (kcache's copy of a program that big
    # is a mapping of its own), their buffers, the source's and the names'
    # overwritten and freed as soon as create returns: every later call
    # (the compile, a second compile on NVRTC's program, a copy of the
    # program the same headers make again) reads what create was given.
    def bufs(*v):
        return [ctypes.create_string_buffer(x) for x in v]
    def ptrs(bs):
        return (ctypes.c_void_p * len(bs))(*[ctypes.addressof(b) for b in bs])
    def spoil(bs):
        for b in bs:
            ctypes.memset(b, 0x2a, len(b) - 1)
    big = b"#define G 1.0f\n/*" + b"kcache " * 900000 + b"*/\n"
    for i in range(2):
        src, name = bufs(HSRC), bufs(b"k.cu")
        hd, nm = bufs(b"#define F 3.0f\n", big), bufs(b"h.h", b"g.h")
        h = P()
        rc = lib.nvrtcCreateProgram(ctypes.byref(h), src[0], name[0], 2, ptrs(hd), ptrs(nm))
        say("create", i, rc)
        spoil(src + name + hd + nm)
        del src, name, hd, nm
        say("compile", i, lib.nvrtcCompileProgram(h, 1, OPT))
        outputs(h, "freed-%d" % i)
        if i == 1:
            o2 = arr(b"-arch=compute_90", b"-lineinfo")
            say("compile2", lib.nvrtcCompileProgram(h, 2, o2))
            outputs(h, "freed-second")
        destroy(h)
    # Many headers (kcache copies 16 or more in one pass into a reserved
    # mapping), each one the source uses, all spoiled and freed at once.
    xs = range(20)
    src = bufs(b"".join(b'#include "x%d.h"\n' % j for j in xs) +
               b'extern "C" __global__ void k(float *p) { p[0] *= ' +
               b" + ".join(b"X%d" % j for j in xs) + b'; }')
    name = bufs(b"many.cu")
    hd = bufs(*[b"#define X%d %d.0f\n/*%s*/\n" % (j, j, b"x" * (j * 5000)) for j in xs])
    nm = bufs(*[b"x%d.h" % j for j in xs])
    h = P()
    rc = lib.nvrtcCreateProgram(ctypes.byref(h), src[0], name[0], len(xs), ptrs(hd), ptrs(nm))
    say("create many", rc)
    spoil(src + name + hd + nm)
    del src, name, hd, nm
    say("compile many", lib.nvrtcCompileProgram(h, 1, OPT))
    outputs(h, "freed-many")
    destroy(h)
elif case == "destroy":
    rc, h = create()
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    destroy(h)
    rc, h = create()
    destroy(h, "uncompiled")
elif case.startswith("after-destroy-"):
    what = case[len("after-destroy-"):]
    rc, h = create()
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    v = h.value
    destroy(h)
    h2 = P(v)
    n = ctypes.c_size_t(7)
    if what == "destroy":
        say(what, lib.nvrtcDestroyProgram(ctypes.byref(h2)))
    elif what == "compile":
        say(what, lib.nvrtcCompileProgram(h2, 1, OPT))
    elif what == "size":
        say(what, lib.nvrtcGetPTXSize(h2, ctypes.byref(n)), n.value)
    elif what == "addname":
        say(what, lib.nvrtcAddNameExpression(h2, b"k"))
elif case == "threads-own":
    res = {}
    def work(i):
        src = b'extern "C" __global__ void k%d(float *p) { p[0] *= %d.0f; }' % (i, i + 2)
        out = []
        for r in range(3):
            h = P()
            out.append(lib.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None))
            out.append(lib.nvrtcCompileProgram(h, 1, OPT))
            n = ctypes.c_size_t()
            out.append(lib.nvrtcGetPTXSize(h, ctypes.byref(n)))
            b = ctypes.create_string_buffer(n.value)
            out.append(lib.nvrtcGetPTX(h, b))
            out.append(hashlib.sha256(b.raw).hexdigest()[:16])
            out.append(lib.nvrtcDestroyProgram(ctypes.byref(h)))
        res[i] = out
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for i in sorted(res):
        say("thread", i, *res[i])
elif case == "threads-one":
    rc, h = create()
    say("compile", lib.nvrtcCompileProgram(h, 1, OPT))
    res = {}
    def work(i):
        out = []
        for r in range(50):
            n = ctypes.c_size_t()
            out.append(lib.nvrtcGetPTXSize(h, ctypes.byref(n)))
            b = ctypes.create_string_buffer(n.value)
            out.append(lib.nvrtcGetPTX(h, b))
            out.append(hashlib.sha256(b.raw).hexdigest()[:8])
            out.append(lib.nvrtcGetProgramLogSize(h, ctypes.byref(n)))
        res[i] = sorted(set(map(str, out)))
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for i in sorted(res):
        say("thread", i, *res[i])
    destroy(h)
else:
    sys.exit("no case " + case)
'''

NULL_FNS = ["compile", "addname", "lowered", "destroy", "pch", "PTX", "CUBIN", "LTOIR", "ProgramLog"]
CASES = (["create-args"] + ["null-" + f for f in NULL_FNS] +
         ["before-compile", "names", "names-null", "lowered-null", "twice", "bad-options",
          "error", "headers", "headers-freed", "destroy", "threads-own", "threads-one",
          "lowered-again", "lowered-again-other"] +
         ["after-destroy-" + w for w in ["destroy", "compile", "size", "addname"]])
# Cases whose compiles all hit when warm, NVRTC never asked for a program.
NO_NVRTC_WARM = {"headers", "destroy", "threads-own", "threads-one", "error", "lowered-null"}

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(lib, case, env):
    if case.startswith("lowered-again"):
        env = dict(env, MALLOC_PERTURB_="165")
    r = subprocess.run([sys.executable, "-c", CLIENT, lib, case], env=env, capture_output=True,
                       text=True, timeout=300)
    err = r.stderr
    return r.stdout, r.returncode, err


def main():
    lib = sys.argv[1]
    if not os.path.exists(lib):
        print("no NVRTC at %s (scripts/setup-wheels installs the releases)" % lib)
        return 1
    shim = os.environ["KCACHE_SHIM"]
    work = tempfile.mkdtemp(prefix="kc-handles-")
    try:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        for case in CASES:
            plain, prc, _ = run(lib, case, base)
            env = dict(base, LD_PRELOAD=shim, KCACHE_DIR=os.path.join(work, case),
                       KCACHE_LOG="debug", KCACHE_STATS="1")
            phases = ("cold", "warm")
            if case.startswith("lowered-again"):
                phases += ("warm-nodefer",)  # NVRTC's program made at create
            for phase in phases:
                out, rc, err = run(lib, case, dict(env, KCACHE_NVRTC_DEFER="0")
                                   if phase == "warm-nodefer" else env)
                warns = [ln for ln in err.splitlines() if "kcache: warn" in ln.lower()]
                if case.startswith("after-destroy-") and (out != plain or rc != prc):
                    # NVRTC reads freed memory (it may crash, or answer from
                    # what it finds); kcache's handle answers INVALID_PROGRAM (4).
                    head, last = out.strip().rsplit("\n", 1) if "\n" in out.strip() else ("", out)
                    check(rc == 0 and plain.startswith(head) and
                          re.fullmatch(r"\S+ 4( \d+)?", last.strip()) is not None,
                          "%s %s: NVRTC reads freed memory (%d: %r); kcache answers "
                          "INVALID_PROGRAM (%r)" % (case, phase, prc, plain.splitlines()[-1:], last))
                    continue
                check(out == plain and rc == prc,
                      "%s %s: as NVRTC's own (status %d, %d lines)%s"
                      % (case, phase, rc, len(plain.splitlines()),
                         "" if out == plain and rc == prc else
                         "\n--- plain (%d)\n%s--- kcache (%d)\n%s" % (prc, plain, rc, out)))
                check(not warns, "%s %s: no warning (%s)" % (case, phase, warns[:2]))
                if phase == "warm" and case in NO_NVRTC_WARM and prc == 0:
                    m = re.search(r"stats: nvrtc hits=(\d+) misses=(\d+)", err)
                    creates = err.count("NVRTC creates the program")
                    check(m is not None and int(m.group(1)) > 0 and m.group(2) == "0" and creates == 0,
                          "%s warm: all hits (%s), NVRTC created no program (%d)"
                          % (case, m.group(0) if m else None, creates))
                if phase == "cold" and case == "headers":
                    creates = err.count("NVRTC creates the program")
                    check(creates == 1, "headers cold: NVRTC created the program once, at the miss (%d)"
                          % creates)
    finally:
        rm_settled(work)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
