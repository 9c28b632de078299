"""Compiles a fixed set of kernels through real NVRTC clients from PyPI and
writes every result into a dump file, for runs with and without the shim.

Run with the project venv's python (scripts/setup-venv):
    client_compile.py DUMP [--ptx]

Clients: cuda.core (Program(...).compile("cubin"/"ptx"/"ltoir")) and the raw
cuda.bindings.nvrtc calls (create, add name expression, compile, PTX, CUBIN,
log, lowered names). --ptx adds cuda.core's "ptx" target, which asks the
driver for its version (cuDriverGetVersion) before compiling: without a
libcuda, run it with the stand-in driver on LD_LIBRARY_PATH.

stdout gets one line, "client_compile: cacheable=N", the number of NVRTC
compiles the cache should serve on a warm run.
"""
import sys

from cuda.bindings import nvrtc
from cuda.core import Program, ProgramOptions

CCCL = "/usr/local/cuda/include/cccl"

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

COMPLEX = r"""
#include <cuda/std/complex>
using cplx = cuda::std::complex<float>;
extern "C" __global__ void rotate(cplx *z, float angle, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] *= cuda::std::polar(1.0f, angle);
}
"""

TEMPLATES = r"""
template <typename T, int N>
__global__ void scale(T *x, T s)
{
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * N;
#pragma unroll
    for (int k = 0; k < N; k++) x[i + k] *= s;
}
"""

BROKEN = r"""
extern "C" __global__ void broken(int *o) { o[0] = not_declared; }
"""


class Dump:
    def __init__(self):
        self.parts = []
        self.cacheable = 0

    def rec(self, label, data=b""):
        if isinstance(data, str):
            data = data.encode()
        self.parts.append(b"@%s len=%d\n" % (label.encode(), len(data)))
        self.parts.append(bytes(data) + b"\n")

    def bytes(self):
        return b"".join(self.parts)


def core_cases(d, with_ptx):
    def compile_(label, src, target, names=(), **opts):
        d.cacheable += 1
        prog = Program(src, "c++", ProgramOptions(**opts))
        try:
            obj = prog.compile(target, name_expressions=names)
        except Exception as e:  # a compile error: the message holds the log
            d.rec(f"core.{label}.error", f"{type(e).__name__}: {e}")
            return
        d.rec(f"core.{label}.code", bytes(obj.code))
        d.rec(f"core.{label}.format", str(obj.code_type))
        for n in names:
            d.rec(f"core.{label}.symbol[{n}]", obj.symbol_mapping.get(n, "?"))
        prog.close()

    compile_("saxpy.cubin", SAXPY, "cubin", arch="sm_90", name="saxpy")
    if with_ptx:
        # Another name: the same NVRTC compile as the CUBIN one would hit.
        compile_("saxpy.ptx", SAXPY, "ptx", arch="sm_90", name="saxpy_ptx")
    compile_("complex.cubin", COMPLEX, "cubin", arch="sm_90", std="c++17",
             include_path=[CCCL], name="complex")
    compile_("templates.cubin", TEMPLATES, "cubin",
             names=("scale<float, 4>", "scale<double, 2>", "scale<int, 8>"),
             arch="sm_90", name="templates")
    compile_("saxpy.ltoir", SAXPY, "ltoir", arch="sm_90",
             link_time_optimization=True, name="saxpy_lto")
    compile_("broken.cubin", BROKEN, "cubin", arch="sm_90", name="broken")


def raw_cases(d):
    def check(label, result):
        err = result[0]
        d.rec(f"{label}.rc", str(int(err)))
        return err == nvrtc.nvrtcResult.NVRTC_SUCCESS, result[1:]

    def run(label, src, name, opts, exprs=()):
        ok, (prog,) = check(f"raw.{label}.create", nvrtc.nvrtcCreateProgram(
            src.encode(), name.encode(), 0, [], []))
        if not ok:
            return
        for e in exprs:
            check(f"raw.{label}.add[{e}]",
                  nvrtc.nvrtcAddNameExpression(prog, e.encode()))
        d.cacheable += 1
        opts = [o.encode() for o in opts]
        check(f"raw.{label}.compile",
              nvrtc.nvrtcCompileProgram(prog, len(opts), opts))
        ok, (n,) = check(f"raw.{label}.log_size",
                         nvrtc.nvrtcGetProgramLogSize(prog))
        if ok:
            buf = b" " * n
            check(f"raw.{label}.log", nvrtc.nvrtcGetProgramLog(prog, buf))
            d.rec(f"raw.{label}.log.bytes", buf)
        for what, size_fn, get_fn in (
                ("ptx", nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX),
                ("cubin", nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)):
            ok, (n,) = check(f"raw.{label}.{what}_size", size_fn(prog))
            if ok:
                d.rec(f"raw.{label}.{what}_size.value", str(n))
                buf = b" " * n
                ok, _ = check(f"raw.{label}.{what}", get_fn(prog, buf))
                if ok:
                    d.rec(f"raw.{label}.{what}.bytes", buf)
        for e in exprs:
            ok, rest = check(f"raw.{label}.lowered[{e}]",
                             nvrtc.nvrtcGetLoweredName(prog, e.encode()))
            if ok:
                d.rec(f"raw.{label}.lowered[{e}].name", rest[0])
        check(f"raw.{label}.destroy", nvrtc.nvrtcDestroyProgram(prog))

    run("saxpy", SAXPY, "saxpy.cu", ["-arch=sm_90"])
    run("saxpy_ptx", SAXPY, "saxpy.cu", ["--gpu-architecture=compute_90"])
    run("templates", TEMPLATES, "templates.cu", ["-arch=compute_90"],
        exprs=("scale<float, 4>", "&scale<int, 8>"))
    run("complex", COMPLEX, "complex.cu",
        ["-arch=sm_90", "-std=c++17", f"-I{CCCL}"])
    run("broken", BROKEN, "broken.cu", ["-arch=sm_90"])


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    d = Dump()
    core_cases(d, "--ptx" in args)
    raw_cases(d)
    with open(args[0], "wb") as f:
        f.write(d.bytes())
    print(f"client_compile: cacheable={d.cacheable}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
