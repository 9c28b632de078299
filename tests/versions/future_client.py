#!/usr/bin/env python3
"""future_client.py: compiles through the NVRTC or libNVVM at a path, as a
Python client does (ctypes, dlsym), and prints every observable (codes,
sizes, the log, the result's digest) so two runs compare as text
(test_versions.py future_libs).

Usage: future_client.py nvrtc|nvvm LIBRARY OUT
"""
import ctypes
import hashlib
import sys

what, path, out = sys.argv[1:4]
lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
c_p, c_sz = ctypes.c_void_p, ctypes.c_size_t
lines = []


def buf(get_size, get, h):
    n = c_sz(0)
    rc = get_size(h, ctypes.byref(n))
    b = ctypes.create_string_buffer(n.value)
    rc2 = get(h, b) if rc == 0 else None
    return rc, rc2, n.value, hashlib.sha256(b.raw).hexdigest()[:16]


SRC = [b'extern "C" __global__ void k%d(float *p) { p[threadIdx.x] *= %d.0f; }' % (i, i + 2)
       for i in range(3)] + [b'extern "C" __global__ void bad() { undeclared(); }']
IR = b"""target triple = "nvptx64-nvidia-cuda"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
define void @k%d(float* %%p) {
entry:
  %%v = load float, float* %%p
  %%m = fmul float %%v, %d.0
  store float %%m, float* %%p
  ret void
}
!nvvm.annotations = !{!0}
!0 = !{void (float*)* @k%d, !"kernel", i32 1}
!nvvmir.version = !{!1}
!1 = !{i32 %d, i32 %d, i32 %d, i32 %d}
"""

if what == "nvrtc":
    for i, src in enumerate(SRC):
        h = c_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None)
        opts = (ctypes.c_char_p * 1)(b"-arch=compute_80")
        crc = lib.nvrtcCompileProgram(h, 1, opts)
        log = buf(lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog, h)
        ptx = buf(lib.nvrtcGetPTXSize, lib.nvrtcGetPTX, h)
        lines.append("program %d: create %d compile %d log %s ptx %s" % (i, rc, crc, log, ptx))
        lib.nvrtcDestroyProgram(ctypes.byref(h))
else:
    v = [ctypes.c_int() for _ in range(4)]
    lib.nvvmIRVersion(*[ctypes.byref(x) for x in v])
    ir = [x.value for x in v]
    for i in range(3):
        h = c_p()
        rc = lib.nvvmCreateProgram(ctypes.byref(h))
        m = IR % tuple([i, i + 2, i] + ir)
        arc = lib.nvvmAddModuleToProgram(h, m, c_sz(len(m)), b"k.ll")
        opts = (ctypes.c_char_p * 1)(b"-arch=compute_80")
        vrc = lib.nvvmVerifyProgram(h, 1, opts)
        crc = lib.nvvmCompileProgram(h, 1, opts)
        log = buf(lib.nvvmGetProgramLogSize, lib.nvvmGetProgramLog, h)
        res = buf(lib.nvvmGetCompiledResultSize, lib.nvvmGetCompiledResult, h)
        lines.append("program %d: create %d add %d verify %d compile %d log %s result %s"
                     % (i, rc, arc, vrc, crc, log, res))
        lib.nvvmDestroyProgram(ctypes.byref(h))
open(out, "w").write("\n".join(lines) + "\n")
