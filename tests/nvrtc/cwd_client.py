#!/usr/bin/env python3
"""cwd_client: compiles the cases of a JSON file with NVRTC (through ctypes,
so the shim's dlsym hands out its wrappers) in the working directory it is
started in, and writes every getter's answer per case to a JSON file.

Usage: cwd_client.py LIBNVRTC CASES.json OUT.json
(KCACHE_TEST_RMDIR_CWD=1: the working directory, empty, is removed first;
KCACHE_TEST_COMM=TEXT: the process's name, /proc/self/comm, is set to TEXT
first, at most 15 bytes.)

A case: {"name": program name or null, "src": source, "opts": [...],
"headers": [[include name, text], ...]}. Output per case: compile rc and,
for PTX, CUBIN, LTO-IR, OptiX IR, NVVM (11.x, 12.x) and the log, those
the library has, the size rc and the bytes (hex), or null when the getter
fails.
"""
import ctypes
import json
import os
import sys


def main():
    lib, cases_path, out_path = sys.argv[1:4]
    if os.environ.get("KCACHE_TEST_RMDIR_CWD") == "1":
        os.rmdir(os.getcwd())  # compile where the directory is gone
    comm = os.environ.get("KCACHE_TEST_COMM")
    if comm is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(15, comm.encode(), 0, 0, 0) != 0:  # PR_SET_NAME
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME)")
    nvrtc = ctypes.CDLL(lib)
    with open(cases_path) as f:
        cases = json.load(f)
    out = []
    for c in cases:
        p = ctypes.c_void_p()
        hs = c.get("headers", [])
        n = len(hs)
        hsrc = (ctypes.c_char_p * max(n, 1))(*[h[1].encode() for h in hs])
        hname = (ctypes.c_char_p * max(n, 1))(*[h[0].encode() for h in hs])
        name = c["name"].encode() if c["name"] is not None else None
        rc = nvrtc.nvrtcCreateProgram(ctypes.byref(p), c["src"].encode(), name, n,
                                      hsrc if n else None, hname if n else None)
        if rc != 0:
            out.append({"create": rc})
            continue
        opts = [o.encode() for o in c["opts"]]
        arr = (ctypes.c_char_p * max(len(opts), 1))(*opts)
        r = {"compile": nvrtc.nvrtcCompileProgram(p, len(opts), arr)}
        for g in ("PTX", "CUBIN", "LTOIR", "OptiXIR", "NVVM", "ProgramLog"):
            if not hasattr(nvrtc, "nvrtcGet%sSize" % g):
                continue  # not in this release
            size = ctypes.c_size_t(0)
            src = getattr(nvrtc, "nvrtcGet%sSize" % g)(p, ctypes.byref(size))
            data = None
            if src == 0 and size.value > 0:
                buf = ctypes.create_string_buffer(size.value)
                if getattr(nvrtc, "nvrtcGet%s" % g)(p, buf) == 0:
                    data = buf.raw.hex()
            r[g] = [src, size.value, data]
        nvrtc.nvrtcDestroyProgram(ctypes.byref(p))
        out.append(r)
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
