#!/usr/bin/env python3
"""NVRTC 12.9+'s own cache beside kcache (tests/versions/test_versions.py
nvrtc_cache).

Usage: cache_client.py LIBNVRTC OUT
In one process: a program compiled twice with --enable-cache-trace (NVRTC
writes its cache's state into the log: its set-up on the first compile of
the process, "already initialized" later, hits and misses), then with
NVRTC's cache left as it is (on unless CUDA_CACHE_DISABLE=1), then with
--no-cache. Writes each compile's result, log and PTX to OUT.
"""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
out = open(sys.argv[2], "w")
SRC = b'extern "C" __global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n'
RUNS = [["--enable-cache-trace"], ["--enable-cache-trace"], [], ["--no-cache"]]
for extra in RUNS:
    p = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(p), SRC, b"k.cu", 0, None, None) == 0
    o = [b"-arch=compute_80"] + [x.encode() for x in extra]
    rc = lib.nvrtcCompileProgram(p, len(o), (ctypes.c_char_p * len(o))(*o))
    out.write("== %s: compile %d\n" % (" ".join(extra) or "(default)", rc))
    for g in ("ProgramLog", "PTX"):
        n = ctypes.c_size_t(0)
        getattr(lib, "nvrtcGet%sSize" % g)(p, ctypes.byref(n))
        b = ctypes.create_string_buffer(max(n.value, 1))
        getattr(lib, "nvrtcGet%s" % g)(p, b)
        out.write("%s (%d): %r\n" % (g, n.value, b.raw[:n.value]))
    lib.nvrtcDestroyProgram(ctypes.byref(p))
out.close()
