#!/usr/bin/env python3
"""The driver's cuLink* call sequences (test link-culink-sequences), on the
stand-in driver (tests/standin): after a cuLinkCreate, every sequence of up
to three steps, and a fixed sample of four and five, of

  N  cuLinkCreate_v2: another link state, the one later steps use
  A  cuLinkAddData_v2: a valid PTX input (a.ptx: calls f, defined in b.ptx)
  X  cuLinkAddData_v2: an input the driver refuses (PTX that does not parse)
  F  cuLinkAddFile_v2: a valid PTX file (b.ptx)
  K  cuLinkComplete
  D  cuLinkDestroy (later steps use the destroyed handle)

then cuLinkDestroy of every state still alive. Every state has its own log
buffers (an info log; an error log shorter than some errors: the size the
driver writes back is the next write's bound, as documented), read after
every step with the sizes the driver wrote back. (Not CU_JIT_LOG_VERBOSE:
ptxas's verbose log times itself, and its cut then moves.) Run plain, under
kcache cold, warm, and on a store another process filled with the prefixes
only: every code, size, log and byte must be the plain run's.

Usage: test_culink_sequences.py LIBNVRTC
Environment: KCACHE_SHIM, KCACHE_TOOL, KCACHE_TEST_STANDIN_DIR.
"""
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

STEPS = "NAXFKD"

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
import ctypes, hashlib, re, sys
cu = ctypes.CDLL("libcuda.so.1")
d = sys.argv[1]
A = open(d + "/a.ptx", "rb").read().rstrip(b"\0") + b"\0"
X = b".version 8.0\n.target sm_80\n.address_size 64\nthis is not ptx at all;\n\0"
F = (d + "/b.ptx").encode()
PTX = 1  # CU_JIT_INPUT_PTX
# CU_JIT_INFO_LOG_BUFFER, _SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER, _SIZE_BYTES
OPTS = (3, 4, 5, 6)
INFO, ERR = 8192, 96  # the error log is cut (95 bytes and a NUL)

dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0

class State:
    def __init__(self, out):
        self.info = ctypes.create_string_buffer(b"I" * INFO, INFO)
        self.err = ctypes.create_string_buffer(b"E" * ERR, ERR)
        self.opt = (ctypes.c_int * 4)(*OPTS)
        self.val = (ctypes.c_void_p * 4)(ctypes.cast(self.info, ctypes.c_void_p), INFO,
                                          ctypes.cast(self.err, ctypes.c_void_p), ERR)
        self.h = ctypes.c_void_p()
        self.alive = True
        out.append("N=%d" % cu.cuLinkCreate_v2(4, self.opt, self.val, ctypes.byref(self.h)))

    def logs(self):
        def one(buf, n, fill, size):
            # nvJitLink's failed links end "ERROR <n>: finish", n from the
            # process's earlier links (9 in a first one): masked. The size
            # written back is shown against the text's own length, and the
            # bytes past the NUL must be the ones there before.
            text, nul, tail = buf.raw[:n].partition(b"\0")
            norm = re.sub(rb"ERROR [0-9]+:", b"ERROR n:", text)
            return "%d:%s:%r%s%s size-len=%s" % (
                len(norm), hashlib.sha256(norm).hexdigest()[:10], norm[:100], " nul" if nul else "",
                "" if tail == fill * len(tail) else " tail=" + hashlib.sha256(tail).hexdigest()[:10],
                size - len(text) if size is not None else None)
        return "[info %s; err %s]" % (one(self.info, INFO, b"I", self.val[1]),
                                      one(self.err, ERR, b"E", self.val[3]))

for seq in sys.argv[2:]:
    out = []
    states = [State(out)]
    cur = states[0]
    out.append(cur.logs())
    for s in seq:
        if s == "N":
            cur = State(out)
            states.append(cur)
        elif s == "A":
            out.append("A=%d" % cu.cuLinkAddData_v2(cur.h, PTX, A, ctypes.c_size_t(len(A)), b"a.ptx",
                                                    0, None, None))
        elif s == "X":
            out.append("X=%d" % cu.cuLinkAddData_v2(cur.h, PTX, X, ctypes.c_size_t(len(X)), b"x.ptx",
                                                    0, None, None))
        elif s == "F":
            out.append("F=%d" % cu.cuLinkAddFile_v2(cur.h, PTX, F, 0, None, None))
        elif s == "K":
            cubin, size = ctypes.c_void_p(), ctypes.c_size_t(7)
            rc = cu.cuLinkComplete(cur.h, ctypes.byref(cubin), ctypes.byref(size))
            got = ctypes.string_at(cubin, size.value) if rc == 0 and cubin.value else b""
            out.append("K=%d,%d,%s" % (rc, size.value, hashlib.sha256(got).hexdigest()[:12]))
        elif s == "D":
            out.append("D=%d" % cu.cuLinkDestroy(cur.h))
            cur.alive = False
        out.append(cur.logs())
    for st in states:
        if st.alive:
            out.append("destroy=%d" % cu.cuLinkDestroy(st.h))
    print(seq, " | ".join(out), flush=True)
'''

LINK_RE = re.compile(r"link hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)")

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def sequences():
    seqs = ["".join(p) for n in range(1, 4) for p in itertools.product(STEPS, repeat=n)]
    rnd = random.Random(34)
    longer = set()
    while len(longer) < 60:
        n = rnd.choice((4, 5))
        s = [rnd.choice(STEPS) for _ in range(n)]
        s[rnd.randrange(1, n)] = "K"
        longer.add("".join(s))
    return sorted(seqs + sorted(longer))


def main():
    nvrtc = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kcache-culink-seq-")
    try:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        gen = os.path.join(tmp, "gen.py")
        open(gen, "w").write(GEN)
        subprocess.run([sys.executable, gen, nvrtc, tmp], check=True, env=env, timeout=300)
        env["LD_LIBRARY_PATH"] = os.environ["KCACHE_TEST_STANDIN_DIR"]
        client = os.path.join(tmp, "client.py")
        open(client, "w").write(CLIENT)
        tool, shim = os.environ["KCACHE_TOOL"], os.environ["KCACHE_SHIM"]
        seqs = sequences()

        def run(store, which):
            e = env if store is None else dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool,
                                               LD_PRELOAD=shim, KCACHE_STATS="1")
            p = subprocess.run([sys.executable, client, tmp] + which, capture_output=True,
                               text=True, timeout=600, env=e)
            check(p.returncode == 0, "%s: the client exits 0 (%s)" % (
                "plain" if store is None else os.path.basename(store), p.stderr[-300:]))
            m = LINK_RE.search(p.stderr)
            return p.stdout.splitlines(), tuple(int(x) for x in m.groups()) if m else None

        def same(ref, got, label):
            diff = [(a, b) for a, b in zip(ref, got) if a != b]
            first = ""
            if diff:
                a, b = diff[0][0].split(" | "), diff[0][1].split(" | ")
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                first = " (%d differ; first %s, call %d: driver %r, kcache %r)" % (
                    len(diff), a[0].split()[0], i, a[i] if i < len(a) else None,
                    b[i] if i < len(b) else None)
            check(len(ref) == len(got) and not diff,
                  "%s: %d sequences, every code, size, log and byte the driver's own%s"
                  % (label, len(ref), first))

        ref, _ = run(None, seqs)
        check(any("K=0," in l for l in ref) and
              any("K=218," in l for l in ref) and any("X=218" in l for l in ref),
              "plain: links succeed, fail (an undefined f) and an input is refused")
        store = os.path.join(tmp, "store")
        cold, st = run(store, seqs)
        same(ref, cold, "cold")
        check(st is not None and st[1] > 0 and st[3] > 0 and st[4] == 0,
              "cold: links missed and were stored, no error (%s)" % (st,))
        warm, st = run(store, seqs)
        same(ref, warm, "warm")
        check(st is not None and st[0] > 0 and st[1] == 0 and st[4] == 0,
              "warm: links were served, none missed (%s)" % (st,))
        pstore = os.path.join(tmp, "store-prefix")
        run(pstore, sorted({s[:-1] for s in seqs if len(s) > 1}))
        after, st = run(pstore, seqs)
        same(ref, after, "after the prefixes were stored by another process")
        check(st is not None and st[0] > 0 and st[4] == 0,
              "after the prefixes: some links served, no error (%s)" % (st,))
    finally:
        rm_settled(tmp)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
