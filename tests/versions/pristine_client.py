#!/usr/bin/env python3
"""One NVRTC 13.5 compile with --use-bundled-headers=DIR through ctypes
(tests/versions pristine).

Usage: pristine_client.py LIBNVRTC OUT fresh|edited|prefilled|other|again|again-edit|again-swap
DIR is a fresh mkdtemp directory (0700, as libmathdx makes it); before the
compile it is left empty (fresh, other), or installed by the host and one
header edited so the PTX differs (edited), or given one file of the host's
own (prefilled). `other` compiles another program (the same headers);
`again*` compile a fresh DIR twice (see below). Writes
to OUT the compile's result, the PTX's and the log's digests (DIR written
as <DIR>) and removes DIR.

KC_TEST_DIR: DIR is that directory, shared with other processes (not
removed); KC_TEST_START: the compile starts at that time (time.time()), so
processes started together compile at the same moment.
"""
import ctypes
import hashlib
import os
import shutil
import sys
import tempfile
import time

lib = ctypes.CDLL(sys.argv[1])
mode = sys.argv[3]
SRC = {"a": b"""#include <cuda/std/type_traits>
#include <cuda_fp16.h>
extern "C" __global__ void k(float *x) {
  x[threadIdx.x] = __half2float(__float2half(x[0])) + cuda::std::is_same<int, int>::value;
}
""", "b": b"""#include <cuda/std/limits>
extern "C" __global__ void k(int *x) { x[0] = cuda::std::numeric_limits<int>::max(); }
"""}

shared = os.environ.get("KC_TEST_DIR")
d = shared or tempfile.mkdtemp(prefix="nvrtc_bundled_headers_",
                               dir=os.environ.get("TMPDIR", "/tmp"))
if mode == "edited":
    err = ctypes.c_char_p()
    assert lib.nvrtcInstallBundledHeaders(d.encode(), 0, ctypes.byref(err)) == 0
    with open(os.path.join(d, "cuda_fp16.h"), "ab") as f:
        f.write(b'\nextern "C" __global__ void kc_edited() {}\n')
elif mode == "prefilled":
    with open(os.path.join(d, "kc_own.txt"), "w") as f:
        f.write("the host's own file\n")
elif mode == "again-swap":
    # An older tree of NVRTC's headers, one edited, made before the first
    # compile: its files' times are all before DIR's fill.
    alt = tempfile.mkdtemp(prefix="kc_alt_", dir=os.environ.get("TMPDIR", "/tmp"))
    err = ctypes.c_char_p()
    assert lib.nvrtcInstallBundledHeaders(alt.encode(), 0, ctypes.byref(err)) == 0
    with open(os.path.join(alt, "cccl", "cuda", "std", "type_traits"), "ab") as f:
        f.write(b'\nextern "C" __global__ void kc_swapped() {}\n')
    time.sleep(0.05)


def compile_once():
    p = ctypes.c_void_p()
    src = SRC["b" if mode == "other" else "a"]
    assert lib.nvrtcCreateProgram(ctypes.byref(p), src, b"k.cu", 0, None, None) == 0
    o = [("--use-bundled-headers=" + d).encode(), b"-arch=compute_80"]
    rc = lib.nvrtcCompileProgram(p, len(o), (ctypes.c_char_p * len(o))(*o))
    out = ["compile %d" % rc]
    for g in ("PTX", "ProgramLog"):
        n = ctypes.c_size_t(0)
        assert getattr(lib, "nvrtcGet%sSize" % g)(p, ctypes.byref(n)) == 0
        buf = ctypes.create_string_buffer(max(n.value, 1))
        assert getattr(lib, "nvrtcGet%s" % g)(p, buf) == 0
        out.append("%s %d %s" % (g, n.value,
                                 hashlib.sha256(buf.raw[:n.value].replace(d.encode(), b"<DIR>"))
                                 .hexdigest()))
    lib.nvrtcDestroyProgram(ctypes.byref(p))
    return out


time.sleep(max(0.0, float(os.environ.get("KC_TEST_START", "0")) - time.time()))
res = compile_once()
if mode.startswith("again"):
    # The same compile again in the same DIR, as a process's later one:
    # unchanged (again), a header edited (again-edit), or DIR/cccl replaced
    # by an older edited tree renamed in (again-swap).
    if mode == "again-edit":
        with open(os.path.join(d, "cuda_fp16.h"), "ab") as f:
            f.write(b'\nextern "C" __global__ void kc_edited() {}\n')
    elif mode == "again-swap":
        os.rename(os.path.join(d, "cccl"), os.path.join(alt, "cccl.orig"))
        os.rename(os.path.join(alt, "cccl"), os.path.join(d, "cccl"))
        shutil.rmtree(alt)
    res += ["then"] + compile_once()
if os.environ.get("KC_TEST_LIST"):
    # What DIR holds: each entry's path, mode and bytes (the version
    # marker's install time apart: whether it is dated now), and whether
    # every entry is dated now (made, or its times set, by this compile).
    recent = True
    for root, dirs, files in sorted(os.walk(d)):
        for name in sorted(dirs + files):
            f = os.path.join(root, name)
            rel = os.path.relpath(f, d)
            st = os.lstat(f)
            recent = recent and abs(st.st_mtime - time.time()) < 120
            if os.path.isdir(f):
                res.append("dir %s %o" % (rel, st.st_mode & 0o7777))
                continue
            data = open(f, "rb").read()
            if name == ".nvrtc_headers_version":
                lines = data.decode().splitlines()
                ts = [int(x.split("=")[1]) for x in lines if x.startswith("timestamp=")]
                data = "\n".join(x for x in lines if not x.startswith("timestamp")).encode()
                res.append("marker-age-ok %s" % (len(ts) == 1 and abs(ts[0] - time.time()) < 120))
            res.append("file %s %o %d %s" % (rel, st.st_mode & 0o7777, st.st_nlink,
                                             hashlib.sha256(data).hexdigest()))
    res.append("entries-dated-now %s" % recent)
if os.environ.get("KC_TEST_MODIFY"):
    # The host changes what it was given: the store's copy must not see it.
    with open(os.path.join(d, "cuda_fp16.h"), "ab") as f:
        f.write(b"// the host's edit\n")
    os.unlink(os.path.join(d, "cuComplex.h"))
if not shared:
    shutil.rmtree(d)
with open(sys.argv[2], "w") as f:
    f.write("\n".join(res) + "\n")
