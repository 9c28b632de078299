"""clients.py: real clients compiling and loading on the stand-in driver, as
test_nvvm.py's `clients` case and scripts/bench run them. Prints one line
per output (name, size, SHA-256 prefix) and, on stderr, the seconds each
phase took ("time PHASE S").

Usage: clients.py numba|cccl
  numba  numba-cuda @cuda.jit: 4 kernels compiled (NVVM), linked
         (nvJitLink) and loaded (cuModuleLoadData on the stand-in)
  cccl   cuda-cccl's cuda.compute make_reduce_into (NVRTC, nvJitLink, the
         library loaded on the stand-in)
"""
import hashlib
import sys
import time


def digest(b):
    b = bytes(b)
    return "%d %s" % (len(b), hashlib.sha256(b).hexdigest()[:16])


def numba_jit():
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from nvvm_client import kernels
    from numba import cuda, float32
    sigs = ["void(float32, float32[:], float32[:])", "void(float32[:])",
            "void(float32[:], float32[:])", "void(float32[:], float32[:])"]
    cuda.current_context()  # initialise outside the timed phase
    t0 = time.perf_counter()
    for f, sig in zip(kernels(), sigs):
        k = cuda.jit(sig)(f)
        ol = list(k.overloads.values())[0]
        lib = ol._codelibrary
        print("numba %s ptx %s" % (f.__name__, digest(lib.get_asm_str().encode())))
        cubin = lib.get_cubin()
        print("numba %s cubin %s" % (f.__name__, digest(getattr(cubin, "code", cubin))))
        print("numba %s loaded %s" % (f.__name__, bool(lib.get_cufunc())))
    print("time compile %.4f" % (time.perf_counter() - t0), file=sys.stderr)


def cccl():
    # numba-cuda first: its driver loads libnvJitLink RTLD_LOCAL before
    # libcccl.c.parallel.so links it.
    import numpy as np
    from numba import cuda
    import cuda.compute as cc
    d_in = cuda.to_device(np.arange(1000, dtype=np.int32))
    d_out = cuda.device_array(1, dtype=np.int32)
    h_init = np.array([0], dtype=np.int32)
    t0 = time.perf_counter()
    r = cc.make_reduce_into(d_in=d_in, d_out=d_out, op=cc.OpKind.PLUS, h_init=h_init)
    print("time build %.4f" % (time.perf_counter() - t0), file=sys.stderr)
    print("cccl reduce_into built: %s" % type(r).__name__)


if __name__ == "__main__":
    {"numba": numba_jit, "cccl": cccl}[sys.argv[1]]()
