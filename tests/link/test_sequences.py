#!/usr/bin/env python3
"""nvJitLink call sequences (test link-sequences): after create, every
sequence of up to three steps, and a fixed sample of four and five, from
nvJitLink's API -- add either of two PTX inputs (one calls a function the
other defines), add an input nvJitLink refuses, complete, each getter
(linked cubin, linked PTX, error log, info log) -- each on a fresh handle,
then destroy. Run plain, under kcache cold, warm, on a store another
process filled with the prefixes only, and on one filled in reverse order:
every code, size, log and byte must be nvJitLink's own.

Usage: test_sequences.py LIBNVJITLINK LIBNVRTC
"""
import itertools
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

STEPS = "ABXKCPEI"

GEN = r'''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
SRCS = {"a": b'extern __device__ float f(float); extern "C" __global__ void ka(float *p) { p[0] = f(p[0]); }',
        "b": b'__device__ float f(float x) { return x * 3.0f + 1.0f; }'}
for name, src in SRCS.items():
    h = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(h), src, name.encode() + b".cu", 0, None, None) == 0
    o = (ctypes.c_char_p * 2)(b"-arch=compute_80", b"-rdc=true")
    assert lib.nvrtcCompileProgram(h, 2, o) == 0
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(h, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(h, buf)
    open(sys.argv[2] + "/" + name + ".ptx", "wb").write(buf.raw)
'''

CLIENT = r'''
import ctypes, hashlib, sys
lib = ctypes.CDLL(sys.argv[1])
d = sys.argv[2]
DATA = {"A": (open(d + "/a.ptx", "rb").read(), b"a.ptx"), "B": (open(d + "/b.ptx", "rb").read(), b"b.ptx"),
        "X": (b"not a valid input at all", b"x.ptx")}
PTX = 2  # NVJITLINK_INPUT_PTX (NONE 0, CUBIN 1, PTX 2)

def blob(size_fn, get_fn, h, text):
    n = ctypes.c_size_t(0)
    rc = getattr(lib, size_fn)(h, ctypes.byref(n))
    if rc != 0:
        return "%d" % rc
    buf = ctypes.create_string_buffer(n.value + 1)
    rc2 = getattr(lib, get_fn)(h, buf)
    data = buf.raw[:n.value]
    if text:
        return "%d,%d,%d,%r" % (rc, n.value, rc2, data[:120])
    return "%d,%d,%d,%s" % (rc, n.value, rc2, hashlib.sha256(data).hexdigest()[:12])

for seq in sys.argv[3:]:
    h = ctypes.c_void_p()
    o = (ctypes.c_char_p * 1)(b"-arch=sm_80")
    out = ["create=%d" % lib.nvJitLinkCreate(ctypes.byref(h), 1, o)]
    for s in seq:
        if s in DATA:
            data, name = DATA[s]
            out.append("%s=%d" % (s, lib.nvJitLinkAddData(h, PTX, data, ctypes.c_size_t(len(data)), name)))
        elif s == "K":
            out.append("K=%d" % lib.nvJitLinkComplete(h))
        elif s == "C":
            out.append("C=" + blob("nvJitLinkGetLinkedCubinSize", "nvJitLinkGetLinkedCubin", h, False))
        elif s == "P":
            out.append("P=" + blob("nvJitLinkGetLinkedPtxSize", "nvJitLinkGetLinkedPtx", h, False))
        elif s == "E":
            out.append("E=" + blob("nvJitLinkGetErrorLogSize", "nvJitLinkGetErrorLog", h, True))
        elif s == "I":
            out.append("I=" + blob("nvJitLinkGetInfoLogSize", "nvJitLinkGetInfoLog", h, True))
    out.append("destroy=%d" % lib.nvJitLinkDestroy(ctypes.byref(h)))
    print(seq, " ".join(out), flush=True)
'''

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def sequences():
    seqs = ["".join(p) for n in range(1, 4) for p in itertools.product(STEPS, repeat=n)]
    rnd = random.Random(34)
    longer = set()
    while len(longer) < 120:
        n = rnd.choice((4, 5))
        s = [rnd.choice(STEPS) for _ in range(n)]
        k = rnd.randrange(1, n)
        s[k] = "K"
        longer.add("".join(s))
    return sorted(seqs + sorted(longer))


def main():
    jl, nvrtc = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="kcache-link-seq-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.pop("LD_PRELOAD", None)
        gen = os.path.join(tmp, "gen.py")
        open(gen, "w").write(GEN)
        subprocess.run([sys.executable, gen, nvrtc, tmp], check=True, env=env, timeout=300)
        client = os.path.join(tmp, "client.py")
        open(client, "w").write(CLIENT)
        tool, shim = os.environ["KCACHE_TOOL"], os.environ["KCACHE_SHIM"]
        seqs = sequences()

        def run(store, which, stats=False):
            e = env if store is None else dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool,
                                               LD_PRELOAD=shim, KCACHE_STATS="1" if stats else "0")
            p = subprocess.run([sys.executable, client, jl, tmp] + which, capture_output=True,
                               text=True, timeout=1200, env=e)
            check(p.returncode == 0, "%s: the client exits 0 (%s)" % (
                "plain" if store is None else os.path.basename(store), p.stderr[-300:]))
            return p.stdout.splitlines(), p.stderr

        def same(ref, got, label):
            diff = [(a, b) for a, b in zip(ref, got) if a != b]
            check(len(ref) == len(got) and not diff,
                  "%s: %d sequences, every code, size, log and byte nvJitLink's own%s" % (
                      label, len(ref), "" if not diff else
                      " (%d differ; first: nvJitLink %r, kcache %r)" % (len(diff), diff[0][0], diff[0][1])))

        ref, _ = run(None, seqs)
        store = os.path.join(tmp, "store")
        cold, _ = run(store, seqs)
        same(ref, cold, "cold")
        warm, err = run(store, seqs, stats=True)
        same(ref, warm, "warm")
        check("; link hits=0 " not in err, "warm: links were served (%s)" % err[-300:])
        pstore = os.path.join(tmp, "store-prefix")
        run(pstore, sorted({s[:-1] for s in seqs if len(s) > 1}))
        after, _ = run(pstore, seqs)
        same(ref, after, "after the prefixes were stored by another process")
        rstore = os.path.join(tmp, "store-reverse")
        rev, _ = run(rstore, seqs[::-1])
        same(ref[::-1], rev, "cold, in reverse order")
        again, _ = run(rstore, seqs)
        same(ref, again, "on the store filled in reverse order")
    finally:
        rm_settled(tmp)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
