#!/usr/bin/env python3
"""NVRTC 13.5's bundled headers through ctypes (tests/versions/test_bundled.py).

Usage: bundled_client.py LIBNVRTC OUT
Compiles each program of CASES with --use-bundled-headers=DIR, DIR a fresh
directory per compile (as nvmath-python's libmathdx makes one per process),
and writes to OUT, for each: the compile's result, every getter's result
and bytes, and what DIR holds after it (names, sizes, digests; the version
marker's install time left out). The DIR of the compile is written as
<DIR>: any other bundled-headers path left in an output is an error (a hit
must never answer with another process's DIR). Then the bundled-headers
calls themselves: info, install (fresh, again, bad flags, NULL), remove.
"""
import ctypes
import hashlib
import os
import sys
import tempfile

lib = ctypes.CDLL(sys.argv[1])
out = open(sys.argv[2], "w")
TMP = os.environ.get("TMPDIR", "/tmp")

A = b"""#include <cuda/std/type_traits>
#include <cuda_fp16.h>
extern "C" __global__ void k(float *x) {
  x[threadIdx.x] = __half2float(__float2half(x[0])) + cuda::std::is_same<int, int>::value;
}
"""
# A diagnostic in a bundled header: the log names its path.
BAD = b"""#include <cuda/std/array>
extern "C" __global__ void k(float *x) { cuda::std::array<float, 2> a{}; x[0] = cuda::std::get<7>(a); }
"""
# Device code of a bundled header in line info.
LINES = b"""#include <cuda/std/complex>
extern "C" __global__ void k(float *x) {
  cuda::std::complex<float> c(x[0], x[1]);
  x[threadIdx.x] = (cuda::std::exp(c) * cuda::std::sqrt(c)).real();
}
"""
# CCCL's device assertions: __FILE__ of a bundled header in the LTO-IR.
ASSERTS = b"""#define CCCL_ENABLE_ASSERTIONS 1
#include <cuda/std/array>
extern "C" __global__ void k(float *x, int i) { cuda::std::array<float, 4> a{}; x[0] = a[i]; }
"""
CASES = [
    ("plain", A, ["-arch=compute_80"], None),
    ("ltoir", A, ["-arch=sm_80", "-dlto"], None),
    ("log-names-header", BAD, ["-arch=compute_80"], None),
    ("lineinfo", LINES, ["-arch=compute_80", "-lineinfo"], None),
    # Its LTO-IR names DIR, encrypted: only its size is comparable across
    # runs (the stats show it compiled, never served).
    ("ltoir-asserts", ASSERTS, ["-arch=sm_80", "-dlto"], None),
    # DIR installed before, one of its headers then edited by the host:
    # NVRTC compiles what DIR holds.
    ("edited-header", A, ["-arch=compute_80"], b'\nextern "C" __global__ void kc_edited() {}\n'),
]
GETTERS = ["PTX", "CUBIN", "LTOIR", "OptiXIR", "TileIR", "ProgramLog"]


def tree(d):
    rows = []
    for root, dirs, files in os.walk(d):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            rel = os.path.relpath(p, d)
            data = open(p, "rb").read()
            if rel == ".nvrtc_headers_version":
                data = b"".join(l for l in data.splitlines(True) if not l.startswith(b"timestamp"))
            rows.append("%s %d %s" % (rel, len(data), hashlib.sha256(data).hexdigest()[:16]))
    return rows


def show(b, d):
    s = b.replace(d.encode(), b"<DIR>")
    if b"nvrtc_bundled_headers_" in s:
        raise SystemExit("an output names another bundled headers directory: %r" % s[:300])
    return hashlib.sha256(s).hexdigest() + " " + repr(s[:160])


def install(d, flags):
    err = ctypes.c_char_p()
    return lib.nvrtcInstallBundledHeaders(d.encode() if d else None, flags, ctypes.byref(err))


for name, src, opts, edit in CASES:
    d = tempfile.mkdtemp(prefix="nvrtc_bundled_headers_", dir=TMP)
    if edit is not None:
        install(d, 0)
        with open(os.path.join(d, "cuda_fp16.h"), "ab") as f:
            f.write(edit)
    p = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(p), src, b"k.cu", 0, None, None) == 0
    o = [("--use-bundled-headers=" + d).encode()] + [x.encode() for x in opts]
    rc = lib.nvrtcCompileProgram(p, len(o), (ctypes.c_char_p * len(o))(*o))
    out.write("== %s: compile %d\n" % (name, rc))
    for g in GETTERS:
        n = ctypes.c_size_t(0)
        src_rc = getattr(lib, "nvrtcGet%sSize" % g)(p, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(n.value, 1))
        get_rc = getattr(lib, "nvrtcGet%s" % g)(p, buf) if n.value else -1
        shown = ("(names DIR)" if name == "ltoir-asserts" and g == "LTOIR"
                 else show(buf.raw[:n.value], d))
        out.write("%s: size %d rc %d get %d %s\n" % (g, n.value, src_rc, get_rc, shown))
    lib.nvrtcDestroyProgram(ctypes.byref(p))
    out.write("DIR:\n  " + "\n  ".join(tree(d)) + "\n")
    lib.nvrtcRemoveBundledHeaders(d.encode(), None)
    os.rmdir(d) if os.path.isdir(d) else None


class Info(ctypes.Structure):
    _fields_ = [("available", ctypes.c_int), ("compressedSize", ctypes.c_size_t),
                ("uncompressedSize", ctypes.c_size_t), ("cudaVersionMajor", ctypes.c_int),
                ("cudaVersionMinor", ctypes.c_int), ("numFiles", ctypes.c_uint)]


info = Info()
rc = lib.nvrtcGetBundledHeadersInfo(ctypes.byref(info), None)
out.write("info %d %s\n" % (rc, [getattr(info, f) for f, _ in Info._fields_]))
out.write("info NULL %d\n" % lib.nvrtcGetBundledHeadersInfo(None, None))
d = tempfile.mkdtemp(prefix="nvrtc_bundled_headers_", dir=TMP)
out.write("install %d, again %d, bad flags %d, NULL %d\n"
          % (install(d, 0), install(d, 0), install(d, 0x80), install(None, 0)))
out.write("installed: %d files\n" % len(tree(d)))
out.write("remove %d, then %s\n" % (lib.nvrtcRemoveBundledHeaders(d.encode(), None),
                                    sorted(os.listdir(d)) if os.path.isdir(d) else "gone"))
if os.path.isdir(d):
    os.rmdir(d)
out.close()
