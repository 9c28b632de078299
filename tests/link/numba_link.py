"""numba_link.py: numba-cuda compiling and linking without a GPU, as
test_link.py's `numba` case runs it (with and without the shim).

numba compiles Python kernels with NVVM (not NVRTC) to PTX and LTO-IR for
a compute capability; its linker (numba.cuda.cudadrv.driver._Linker, over
cuda.core's Linker and nvJitLink) makes cubins without a device. Prints one
line per output: its name, size and SHA-256 prefix.
"""
import hashlib
import sys

from numba import cuda, float32
from numba.cuda.cudadrv.driver import _Linker


def digest(b):
    b = bytes(b)
    return "%d %s" % (len(b), hashlib.sha256(b).hexdigest()[:16])


def kernel(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] * 2.0 + 1.0


def main():
    sig = (float32[:], float32[:])
    ptx, _ = cuda.compile_ptx(kernel, sig, cc=(9, 0))
    print("ptx", digest(ptx.encode()))
    lto, _ = cuda.compile(kernel, sig, cc=(9, 0), output="ltoir")
    print("ltoir", digest(lto))

    link = _Linker(cc=(9, 0))
    link.add_ptx(ptx.encode())
    print("cubin from ptx", digest(link.complete().code))

    link = _Linker(cc=(9, 0), lto=True)
    link.add_ltoir(lto)
    print("cubin from ltoir", digest(link.complete().code))

    link = _Linker(cc=(9, 0), lto=True)
    link.add_ltoir(lto)
    link.add_file_guess_ext("/usr/local/cuda/lib64/libcudadevrt.a")
    print("cubin from ltoir + libcudadevrt.a", digest(link.complete().code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
