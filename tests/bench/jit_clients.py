"""The driver-path clients for scripts/bench's clients section, on the
stand-in driver (it JITs PTX with nvJitLink, so a load costs a JIT):

  pycuda PTX...            PyCUDA's module_from_buffer (cuModuleLoadDataEx
                           from its extension, loaded RTLD_LOCAL) and
                           get_function of each PTX file
  triton CUBIN NAME PTX... Triton's launcher (cuda_utils.so, compiled at run
                           time) load_binary of each PTX file (its first
                           .entry) and of CUBIN's function NAME

Prints "time load S" (the PTX loads) and, for triton, "time cubin S" to
stderr; stdout names what was loaded, so runs can be compared.
"""
import re
import sys
import time

ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")


def entry(ptx):
    m = ENTRY.search(ptx)
    if m is None:
        raise SystemExit("no .entry in a PTX file")
    return m.group(1).decode()


def pycuda(paths):
    import pycuda.driver as cuda
    cuda.init()
    ctx = cuda.Device(0).make_context()
    spent = 0.0
    for p in paths:
        ptx = open(p, "rb").read()
        t = time.perf_counter()
        mod = cuda.module_from_buffer(ptx)
        f = mod.get_function(entry(ptx))
        spent += time.perf_counter() - t
        print("loaded", p.rsplit("/", 1)[-1], f is not None)
    ctx.pop()
    ctx.detach()
    print("time load %.6f" % spent, file=sys.stderr)


def triton(cubin, name, paths):
    from triton.backends.nvidia.driver import CudaDriver, CudaUtils
    print("active", CudaDriver.is_active())  # as Triton starts: cuInit
    u = CudaUtils()  # compiles or reuses the launcher: not timed
    spent = 0.0
    for p in paths:
        ptx = open(p, "rb").read()
        t = time.perf_counter()
        mod, fun, regs, spills, maxt = u.load_binary(entry(ptx), ptx, 0, 0)
        spent += time.perf_counter() - t
        print("loaded", p.rsplit("/", 1)[-1], regs, spills, maxt)
        u.unload_module(mod)
    data = open(cubin, "rb").read()
    t = time.perf_counter()
    mod, fun, regs, spills, maxt = u.load_binary(name, data, 0, 0)
    cub = time.perf_counter() - t
    u.unload_module(mod)
    print("loaded cubin", regs, spills, maxt)
    print("time load %.6f" % spent, file=sys.stderr)
    print("time cubin %.6f" % cub, file=sys.stderr)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "pycuda":
        pycuda(sys.argv[2:])
    elif len(sys.argv) >= 5 and sys.argv[1] == "triton":
        triton(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
