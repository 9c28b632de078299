#!/usr/bin/env python3
"""scripts/bench section 10: one NVRTC compile through a given libnvrtc.

Usage: ver_bench.py LIBNVRTC
Compiles a fixed kernel (templates unrolled over 64 instances: about a
second of NVRTC) for compute_80 and prints one JSON line: the compile's
milliseconds (the call alone, as the host sees it), its result, and the
PTX's size and digest.
"""
import ctypes
import hashlib
import json
import sys
import time

SRC = b"""
template <int N> struct Step {
  __device__ static float f(float x) { return Step<N - 1>::f(x) * 1.0001f + N; }
};
template <> struct Step<0> { __device__ static float f(float x) { return x; } };
template <int K> __global__ void k(float *x) {
  float v = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 16; i++) v = Step<K>::f(v) + i;
  x[threadIdx.x] = v;
}
#define I(n) template __global__ void k<n>(float *);
I(1) I(2) I(3) I(4) I(5) I(6) I(7) I(8) I(9) I(10) I(11) I(12) I(13) I(14) I(15) I(16)
I(17) I(18) I(19) I(20) I(21) I(22) I(23) I(24) I(25) I(26) I(27) I(28) I(29) I(30) I(31) I(32)
I(33) I(34) I(35) I(36) I(37) I(38) I(39) I(40) I(41) I(42) I(43) I(44) I(45) I(46) I(47) I(48)
I(49) I(50) I(51) I(52) I(53) I(54) I(55) I(56) I(57) I(58) I(59) I(60) I(61) I(62) I(63) I(64)
"""
lib = ctypes.CDLL(sys.argv[1])
p = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(p), SRC, b"ver.cu", 0, None, None) == 0
opts = [b"-arch=compute_80", b"-std=c++17"]
t = time.perf_counter()
rc = lib.nvrtcCompileProgram(p, len(opts), (ctypes.c_char_p * len(opts))(*opts))
ms = (time.perf_counter() - t) * 1e3
n = ctypes.c_size_t(0)
lib.nvrtcGetPTXSize(p, ctypes.byref(n))
b = ctypes.create_string_buffer(max(n.value, 1))
lib.nvrtcGetPTX(p, b)
print(json.dumps({"first_ms": ms, "rc": rc, "ptx_bytes": n.value,
                  "sha": hashlib.sha256(b.raw[:n.value]).hexdigest()[:16]}))
