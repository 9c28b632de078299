#!/usr/bin/env python3
"""nvmath-python 1.0 with libmathdx 0.4 (tests/versions nvmath, scripts/bench).

Usage: nvmath_client.py OUT [fft|matmul|fft-later|matmul-later ...]
Compiles a cuFFTDx FFT and a cuBLASDx matmul to LTO-IR, as a kernel that
uses them would (libmathdx compiles with NVRTC 13.5 and
--use-bundled-headers=<a fresh directory of this process>), and writes to
OUT each one's symbol, LTO-IR size and digest, and the seconds it took.
"""
import hashlib
import os
import sys
import time

import numpy as np

out = open(sys.argv[1], "w")
which = sys.argv[2:] or ["fft", "matmul"]

# KC_NVMATH_SPLIT=1 (scripts/bench): the time spent inside libmathdx's
# calls (nvmath.bindings.mathdx's functions, wrapped before nvmath's device
# modules are imported; NVRTC is called from inside them), printed beside
# each compile's total.
in_mathdx = [0.0]
if os.environ.get("KC_NVMATH_SPLIT") == "1":
    from nvmath.bindings import mathdx

    def timed(f):
        def call(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                in_mathdx[0] += time.perf_counter() - t0
        return call

    for name in dir(mathdx):
        f = getattr(mathdx, name)
        if not name.startswith("_") and callable(f) and not isinstance(f, type):
            setattr(mathdx, name, timed(f))

# (After the patch: nvmath's modules keep some of these functions at import.)
from nvmath.device import cublasdx, cufftdx  # noqa: E402
from nvmath.device.common_cuda import CodeType, ComputeCapability  # noqa: E402


def compile_one(w, n):
    if w == "fft":
        cc = ComputeCapability(8, 0)
        fft = cufftdx.FFT(size=n, precision=np.float32, fft_type="c2c", execution="Thread",
                          direction="forward", sm=cc)
        return cufftdx.compile_fft_execute(fft, CodeType("lto", cc))
    cc = ComputeCapability(9, 0)
    mm = cublasdx.Matmul(size=(n, n, n), precision=np.float32, data_type="real",
                         arrangement=("row_major", "col_major", "col_major"),
                         block_size=64, sm=cc)
    return cublasdx.compile_blas_execute(mm, CodeType("lto", cc),
                                         execute_api="static_leading_dimensions")


for w in which:
    # "fft-later", "matmul-later": the same compile as a process's second
    # one (another size compiled first, its bundled headers installed).
    base = w.split("-")[0]
    if w.endswith("-later"):
        compile_one(base, 32 if base == "fft" else 8)
    t = time.time()
    in_mathdx[0] = 0.0
    code, sym = compile_one(base, 64 if base == "fft" else 16)
    dt = time.time() - t
    out.write("%s %s %d %s\n" % (w, sym, len(code.data), hashlib.sha256(code.data).hexdigest()))
    print("%s %.3f s" % (w, dt), file=sys.stderr, flush=True)
    if os.environ.get("KC_NVMATH_SPLIT") == "1":
        print("%s in libmathdx %.4f s" % (w, in_mathdx[0]), file=sys.stderr, flush=True)
out.close()
