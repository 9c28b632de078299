"""nvvm_client.py: libNVVM's clients without a GPU, as test_nvvm.py runs them
(with and without the shim). Prints one line per observable: every return
code, log and result (size and SHA-256 prefix), so two runs compare as text.

Usage: nvvm_client.py SCENARIO...
  direct   cuda.bindings.nvvm: kernels verified, libdevice added lazily,
           compiled to PTX and to LTO-IR (-gen-lto)
  bad      IR that does not parse and IR that does not verify: codes and logs
  order    compile without a verify, verify after a compile, compile twice
  numba    numba-cuda compile_ptx and compile(output="ltoir"), 4 kernels
  core     cuda.core Program(code_type="nvvm") to PTX and LTO-IR
  threads  8 threads compiling the same 4 kernels at once
  same     the 4 kernels of `direct`, PTX only (for 8 processes at once)
  seq      every sequence of up to 3 steps (verify, compile, getters, add)
           after create, add, lazy-add libdevice, shorter ones first: each
           longer one meets its prefix already in the store

KCACHE_TEST_NVVM_LIB names the libnvvm to load (a wheel's); its libdevice
is looked for beside it. Default: the toolkit's, as cuda.pathfinder finds it.
"""
import ctypes
import hashlib
import os
import sys
import threading

LIB = os.environ.get("KCACHE_TEST_NVVM_LIB")
if LIB:
    ctypes.CDLL(LIB, mode=os.RTLD_NOW | os.RTLD_LOCAL)  # pathfinder takes a loaded one
    LIBDEVICE = os.path.join(os.path.dirname(LIB), "..", "nvvm", "libdevice", "libdevice.10.bc")
else:
    LIBDEVICE = "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc"

from cuda.bindings import nvvm  # noqa: E402


def digest(b):
    b = bytes(b)
    return "%d %s" % (len(b), hashlib.sha256(b).hexdigest()[:16])


def ir(k, extra=""):
    """A kernel calling libdevice's sinf, distinct for each k."""
    major, minor, dmaj, dmin = nvvm.ir_version()
    return ("""target triple = "nvptx64-nvidia-cuda"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
declare float @__nv_sinf(float)
define void @k%d(float* %%p) {
entry:
  %%v = load float, float* %%p
  %%s = call float @__nv_sinf(float %%v)
  %%m = fmul float %%s, %d.0
  store float %%m, float* %%p
  ret void
}
%s
!nvvm.annotations = !{!0}
!0 = !{void (float*)* @k%d, !"kernel", i32 1}
!nvvmir.version = !{!1}
!1 = !{i32 %d, i32 %d, i32 %d, i32 %d}
""" % (k, k + 1, extra, k, major, minor, dmaj, dmin)).encode()


def call(out, what, fn, *args):
    try:
        r = fn(*args)
        out.append("%s ok" % what)
        return r
    except nvvm.nvvmError as e:
        out.append("%s error %s" % (what, e.status))
        return None


def log(out, prog, what):
    n = call(out, what + " log size", nvvm.get_program_log_size, prog)
    if n:
        buf = bytearray(n)
        call(out, what + " log", nvvm.get_program_log, prog, buf)
        out.append("%s log %r" % (what, bytes(buf).rstrip(b"\0").decode(errors="replace")))


def result(out, prog, what):
    n = call(out, what + " result size", nvvm.get_compiled_result_size, prog)
    if n:
        buf = bytearray(n)
        call(out, what + " result", nvvm.get_compiled_result, prog, buf)
        out.append("%s result %s" % (what, digest(buf)))


LIBDEV = None


def program(out, mods, steps, opts, vopts=None):
    """mods: [(bytes, lazy)] added first; steps: 'v' verify, 'c' compile,
    'L' lazy-add libdevice, 'r' result, 's' result size only, 'g' log,
    'a' add another module."""
    global LIBDEV
    if LIBDEV is None:
        LIBDEV = open(LIBDEVICE, "rb").read()
    prog = nvvm.create_program()
    try:
        for i, (m, lazy) in enumerate(mods):
            f = nvvm.lazy_add_module_to_program if lazy else nvvm.add_module_to_program
            call(out, "add %d" % i, f, prog, m, len(m), "m%d" % i)
        for s in steps:
            if s == "v":
                v = opts if vopts is None else vopts
                call(out, "verify", nvvm.verify_program, prog, len(v), v)
                log(out, prog, "verify")
            elif s == "c":
                call(out, "compile", nvvm.compile_program, prog, len(opts), opts)
                log(out, prog, "compile")
            elif s == "L":
                call(out, "libdevice", nvvm.lazy_add_module_to_program, prog, LIBDEV, len(LIBDEV),
                     "")
            elif s == "r":
                result(out, prog, "compile")
            elif s == "s":
                n = call(out, "result size", nvvm.get_compiled_result_size, prog)
                out.append("result size %r" % (n,))
            elif s == "g":
                log(out, prog, "now")
            elif s == "a":
                m = ir(21).replace(b"@k21", b"@k21a")
                call(out, "add late", nvvm.add_module_to_program, prog, m, len(m), "late")
    finally:
        nvvm.destroy_program(prog)


PTX = ["-arch=compute_90", "-opt=3"]
LTO = ["-arch=compute_90", "-gen-lto"]


def direct(out):
    for k in range(4):
        program(out, [(ir(k), False)], "vLcr", PTX)
    for k in range(2):
        program(out, [(ir(k), False)], "vLcr", LTO)
    # Two modules, one lazy, and options in another order.
    program(out, [(ir(5), False), (ir(6).replace(b"@k6", b"@k6x"), True)], "vLcr",
            ["-opt=3", "-arch=compute_90"])


def bad(out):
    program(out, [(b"this is not IR", False)], "vcr", PTX)
    program(out, [(ir(1).replace(b"ret void", b"ret i32 0"), False)], "vLcr", PTX)
    program(out, [(ir(2), False)], "vLcr", ["-arch=compute_90", "-no-such-option"])
    program(out, [], "vcr", PTX)


def order(out):
    program(out, [(ir(7), False)], "Lcr", PTX)
    program(out, [(ir(7), False)], "vLcrvr", PTX)
    program(out, [(ir(8), False)], "Lcrcr", PTX)
    # The verify is served (the second program of this IR and options in
    # the process), the compile with other options misses: the real
    # program compiles without having been verified.
    program(out, [(ir(7), False)], "vLcr", LTO, vopts=PTX)


def seq(out):
    import itertools
    for n in range(1, 4):
        for steps in itertools.product("vcrsga", repeat=n):
            out.append("# L" + "".join(steps))
            program(out, [(ir(20), False)], "L" + "".join(steps), PTX)


def forkpass(out):
    """A pass-through (an empty module: an input kcache does not take), then
    a fork; the child leaves with exit() after one cached compile, its
    stderr in FORKPASS_ERR."""
    program(out, [(b"", False)], "v", PTX)
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.environ["FORKPASS_ERR"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        child = []
        program(child, [(ir(40), False)], "Lcr", PTX)
        sys.stdout.flush()
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    out.append("child status %d" % status)


def up1(out):
    """The outside testers' first process: create, add, lazy libdevice,
    compile."""
    program(out, [(ir(50), False)], "Lc", PTX)


def up2(out):
    """Their second: the same compile, then verify, the result's size, the
    result and the log."""
    program(out, [(ir(50), False)], "Lcvsrg", PTX)


def same(out):
    for k in range(4):
        program(out, [(ir(k), False)], "vLcr", PTX)


def threads(out):
    outs = [[] for _ in range(8)]
    ts = [threading.Thread(target=same, args=(o,)) for o in outs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i, o in enumerate(outs):
        check = o == outs[0]
        out.append("thread %d same as thread 0: %s" % (i, check))
    out.extend(outs[0])


def kernels():
    from numba import cuda

    def axpy(a, x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = a * x[i] + y[i]

    def sines(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = cuda.libdevice.sinf(x[i]) * 2.0

    def reduce_sum(x, out):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(out, 0, x[i])

    def stencil(x, y):
        i = cuda.grid(1)
        if 0 < i < x.size - 1:
            y[i] = (x[i - 1] + x[i] + x[i + 1]) / 3.0

    return [axpy, sines, reduce_sum, stencil]


def numba_(out):
    from numba import cuda, float32
    sigs = [(float32, float32[:], float32[:]), (float32[:],), (float32[:], float32[:]),
            (float32[:], float32[:])]
    for f, sig in zip(kernels(), sigs):
        ptx, _ = cuda.compile_ptx(f, sig, cc=(9, 0))
        out.append("numba ptx %s %s" % (f.__name__, digest(ptx.encode())))
        lto, _ = cuda.compile(f, sig, cc=(9, 0), output="ltoir")
        out.append("numba ltoir %s %s" % (f.__name__, digest(lto)))


def core(out):
    from cuda.core import Program, ProgramOptions
    for k in range(2):
        p = Program(ir(10 + k), "nvvm", ProgramOptions(arch="sm_90"))
        out.append("core ptx %d %s" % (k, digest(p.compile("ptx").code)))
        p = Program(ir(10 + k), "nvvm", ProgramOptions(arch="sm_90", link_time_optimization=True))
        out.append("core ltoir %d %s" % (k, digest(p.compile("ltoir").code)))


SCENARIOS = {"direct": direct, "bad": bad, "order": order, "numba": numba_, "core": core,
             "threads": threads, "same": same, "seq": seq, "forkpass": forkpass, "up1": up1, "up2": up2}


def main(argv):
    from cuda.pathfinder import load_nvidia_dynamic_lib
    out = ["nvvm %d.%d from %s" % (nvvm.version() + (load_nvidia_dynamic_lib("nvvm").abs_path,))]
    for s in argv[1:]:
        out.append("## " + s)
        SCENARIOS[s](out)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
