#!/usr/bin/env python3
"""NVRTC call sequences (test nvrtc-sequences): after create, every
sequence of up to three steps, and a fixed sample of four and five, from
NVRTC's API -- add a name expression, compile (PTX, cubin, LTO IR, a bad
option), each getter (PTX, cubin, LTO IR, log, lowered name) -- each on a
fresh program, then destroy. Run plain, under kcache cold (each sequence
meets its prefixes stored by the same process), warm, on a store that
another process filled with the prefixes only, and on one filled in the
reverse order: every code, size, log and
byte must be NVRTC's own. A served compile must leave the program as the
compile would, whatever call comes next.

Usage: test_sequences.py LIBNVRTC
"""
import itertools
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

STEPS = "NCDLXPBIGW"

CLIENT = r'''
import ctypes, hashlib, sys
lib = ctypes.CDLL(sys.argv[1])
SRC = b"""
#include "k.h"
template <typename T> __global__ void k(T *p) { p[threadIdx.x] = p[threadIdx.x] * SCALE + 1; }
extern "C" __global__ void plain(float *p) { p[0] = SCALE; }
"""
HDR = b"#define SCALE 3\n"
OPTS = {"C": [b"-arch=compute_80"], "D": [b"-arch=sm_80"], "L": [b"-arch=sm_80", b"-dlto"],
        "X": [b"--no-such-option"]}

def got(name, *args):
    return getattr(lib, name)(*args)

def blob(size_fn, get_fn, h):
    n = ctypes.c_size_t(0)
    rc = got(size_fn, h, ctypes.byref(n))
    if rc != 0:
        return "%d" % rc
    buf = ctypes.create_string_buffer(n.value + 1)
    rc2 = got(get_fn, h, buf)
    data = buf.raw[:n.value]
    if size_fn == "nvrtcGetProgramLogSize":
        return "%d,%d,%d,%r" % (rc, n.value, rc2, data[:160])
    return "%d,%d,%d,%s" % (rc, n.value, rc2, hashlib.sha256(data).hexdigest()[:12])

for seq in sys.argv[2:]:
    h = ctypes.c_void_p()
    hdrs = (ctypes.c_char_p * 1)(HDR)
    names = (ctypes.c_char_p * 1)(b"k.h")
    out = ["create=%d" % got("nvrtcCreateProgram", ctypes.byref(h), SRC, b"seq.cu", 1, hdrs, names)]
    for s in seq:
        if s == "N":
            out.append("N=%d" % got("nvrtcAddNameExpression", h, b"k<int>"))
        elif s in OPTS:
            o = OPTS[s]
            arr = (ctypes.c_char_p * len(o))(*o)
            out.append("%s=%d" % (s, got("nvrtcCompileProgram", h, len(o), arr)))
        elif s == "P":
            out.append("P=" + blob("nvrtcGetPTXSize", "nvrtcGetPTX", h))
        elif s == "B":
            out.append("B=" + blob("nvrtcGetCUBINSize", "nvrtcGetCUBIN", h))
        elif s == "I":
            out.append("I=" + blob("nvrtcGetLTOIRSize", "nvrtcGetLTOIR", h))
        elif s == "G":
            out.append("G=" + blob("nvrtcGetProgramLogSize", "nvrtcGetProgramLog", h))
        elif s == "W":
            p = ctypes.c_char_p()
            rc = got("nvrtcGetLoweredName", h, b"k<int>", ctypes.byref(p))
            out.append("W=%d,%s" % (rc, p.value if rc == 0 else None))
    out.append("destroy=%d" % got("nvrtcDestroyProgram", ctypes.byref(h)))
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
    # Longer ones: each has a compile among its first three steps, so that
    # what follows it meets a served program.
    longer = set()
    while len(longer) < 160:
        n = rnd.choice((4, 5))
        s = [rnd.choice(STEPS) for _ in range(n)]
        s[rnd.randrange(3)] = rnd.choice("CDL")
        longer.add("".join(s))
    return sorted(seqs + sorted(longer))


def main():
    lib = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kcache-nvrtc-seq-")
    try:
        client = os.path.join(tmp, "client.py")
        open(client, "w").write(CLIENT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.pop("LD_PRELOAD", None)
        tool, shim = os.environ["KCACHE_TOOL"], os.environ["KCACHE_SHIM"]
        seqs = sequences()

        def run(store, which, stats=False):
            e = env if store is None else dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool,
                                               LD_PRELOAD=shim, KCACHE_STATS="1" if stats else "0")
            p = subprocess.run([sys.executable, client, lib] + which, capture_output=True,
                               text=True, timeout=1200, env=e)
            check(p.returncode == 0, "%s: the client exits 0 (%s)" % (
                "plain" if store is None else store, p.stderr[-300:]))
            return p.stdout.splitlines(), p.stderr

        def same(ref, got, label):
            diff = [(a, b) for a, b in zip(ref, got) if a != b]
            check(len(ref) == len(got) and not diff,
                  "%s: %d sequences, every code, size, log and byte NVRTC's own%s" % (
                      label, len(ref), "" if not diff else
                      " (%d differ; first: NVRTC %r, kcache %r)" % (len(diff), diff[0][0], diff[0][1])))

        ref, _ = run(None, seqs)
        store = os.path.join(tmp, "store")
        cold, _ = run(store, seqs)
        same(ref, cold, "cold")
        warm, err = run(store, seqs, stats=True)
        same(ref, warm, "warm")
        check("kcache: stats:" in err and " hits=0 " not in err.split("kcache: stats:")[1][:40],
              "warm: compiles were served (%s)" % err[-300:])
        # Another process stored only the prefixes (every sequence less its
        # last step); this one runs the whole sequences on that store.
        pstore = os.path.join(tmp, "store-prefix")
        prefixes = sorted({s[:-1] for s in seqs if len(s) > 1})
        run(pstore, prefixes)
        after, _ = run(pstore, seqs)
        same(ref, after, "after the prefixes were stored by another process")
        # A store filled in the other order: a program's later compile (after
        # a cubin or LTO IR the earlier left) comes before any clean one, so
        # a result captured from a program in another state would be served.
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
