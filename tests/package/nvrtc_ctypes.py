#!/usr/bin/env python3
"""A real NVRTC client with nothing but the Python standard library: loads
libnvrtc through ctypes (dlopen RTLD_LOCAL and dlsym, as cuda-python's
bindings do), compiles each kernel given and prints one line per kernel:
its name, the sha256 of the PTX and of the log, NVRTC's result code.

    nvrtc_ctypes.py LIBNVRTC ARCH KERNEL-NAME...
"""
import ctypes
import hashlib
import sys

SRC = 'extern "C" __global__ void %s(float *x, int n)\n' \
      '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = x[i] * %d.0f + 1.0f; }\n'


def main():
    lib = ctypes.CDLL(sys.argv[1])
    arch = sys.argv[2].encode()
    for i, name in enumerate(sys.argv[3:]):
        prog = ctypes.c_void_p()
        src = (SRC % (name, i + 2)).encode()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, (name + '.cu').encode(), 0, None, None)
        assert rc == 0, 'nvrtcCreateProgram: %d' % rc
        opts = (ctypes.c_char_p * 1)(b'-arch=' + arch)
        crc = lib.nvrtcCompileProgram(prog, 1, opts)
        size = ctypes.c_size_t()
        ptx = b''
        if crc == 0:
            assert lib.nvrtcGetPTXSize(prog, ctypes.byref(size)) == 0
            buf = ctypes.create_string_buffer(size.value)
            assert lib.nvrtcGetPTX(prog, buf) == 0
            ptx = buf.raw
        assert lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) == 0
        log = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetProgramLog(prog, log) == 0
        print(name, hashlib.sha256(ptx).hexdigest(), hashlib.sha256(log.raw).hexdigest(), crc)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


if __name__ == '__main__':
    main()
