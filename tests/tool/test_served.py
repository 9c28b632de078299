#!/usr/bin/env python3
"""kcache config names the libraries the shim last served (test
tool_served): each process that used NVRTC, nvJitLink, libNVVM or libcuda
under the shim records, at exit, the path it was served by in the store
(KCACHE_DIR/libraries); `kcache config` lists the four, "none recorded"
for the others, "(no longer there)" for a path gone since.

  - an empty store: none recorded, and config creates nothing
  - a process using NVRTC: NVRTC's path, the others none; the same path
    as its stats line's `; libraries nvrtc=`
  - one using nvJitLink and libNVVM: those added, NVRTC's kept
  - one using the stand-in driver (a PTX module load: the JIT): libcuda's
  - the same NVRTC again: the file is not rewritten (the same inode)
  - another NVRTC (the 13.5 wheel's, when scripts/setup-wheels made it):
    NVRTC's line changes, the others stay
  - KCACHE_READONLY=1: nothing recorded
  - NVRTC loaded through a link that is then removed: "(no longer there)"

Usage: test_served.py LIBNVRTC LIBNVJITLINK LIBNVVM [LIBNVRTC_OTHER]
Environment: KCACHE_SHIM, KCACHE_TOOL, KCACHE_TEST_STANDIN_DIR, KCACHE_SRC.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HOST = r'''
import ctypes, sys
what, lib = sys.argv[1], sys.argv[2]
if what == "nvrtc":
    rtc = ctypes.CDLL(lib)
    h = ctypes.c_void_p()
    src = b'extern "C" __global__ void k(float *p) { p[0] *= 2.0f; }'
    assert rtc.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None) == 0
    o = (ctypes.c_char_p * 1)(b"-arch=compute_80")
    assert rtc.nvrtcCompileProgram(h, 1, o) == 0
    rtc.nvrtcDestroyProgram(ctypes.byref(h))
elif what == "link+nvvm":
    jl, vm = ctypes.CDLL(lib), ctypes.CDLL(sys.argv[3])
    ptx = open(sys.argv[4], "rb").read() + b"\0"
    h = ctypes.c_void_p()
    o = (ctypes.c_char_p * 1)(b"-arch=sm_80")
    assert jl.nvJitLinkCreate(ctypes.byref(h), 1, o) == 0
    assert jl.nvJitLinkAddData(h, 2, ptx, ctypes.c_size_t(len(ptx)), b"k.ptx") == 0
    assert jl.nvJitLinkComplete(h) == 0
    jl.nvJitLinkDestroy(ctypes.byref(h))
    p = ctypes.c_void_p()
    assert vm.nvvmCreateProgram(ctypes.byref(p)) == 0
    vm.nvvmAddModuleToProgram(p, b"", ctypes.c_size_t(0), b"empty")  # a pass-through counts too
    vm.nvvmVerifyProgram(p, 0, None)
    vm.nvvmDestroyProgram(ctypes.byref(p))
elif what == "cuda":
    cu = ctypes.CDLL("libcuda.so.1")
    ptx = open(lib, "rb").read() + b"\0"
    dev, ctx, mod = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    assert cu.cuModuleLoadData(ctypes.byref(mod), ptx) == 0
    cu.cuModuleUnload(mod)
'''

LABELS = ("NVRTC", "nvJitLink", "libNVVM", "libcuda")

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    rtc, jl, vm = sys.argv[1:4]
    other = sys.argv[4] if len(sys.argv) > 4 else None
    tool, shim = os.environ["KCACHE_TOOL"], os.environ["KCACHE_SHIM"]
    standin = os.environ["KCACHE_TEST_STANDIN_DIR"]
    src = os.environ.get("KCACHE_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
    kptx = os.path.join(src, "tests", "driver", "data", "k.ptx")
    tmp = tempfile.mkdtemp(prefix="kcache-served-")
    try:
        host = os.path.join(tmp, "host.py")
        open(host, "w").write(HOST)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.pop("LD_PRELOAD", None)
        env.pop("LD_LIBRARY_PATH", None)
        store = os.path.join(tmp, "store")

        def run(*argv, **kv):
            e = dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool, LD_PRELOAD=shim, KCACHE_STATS="1",
                     LD_LIBRARY_PATH=standin)
            e.update(kv)
            p = subprocess.run([sys.executable, host] + list(argv), capture_output=True,
                               text=True, timeout=300, env=e)
            check(p.returncode == 0, "%s: the host ran (%s)" % (argv[0], p.stderr[-400:]))
            line = [l for l in p.stderr.splitlines() if l.startswith("kcache: stats:")]
            m = re.search(r"; libraries (.*)$", line[-1]) if line else None
            return dict(kv.split("=", 1) for kv in m.group(1).split()) if m else {}

        def config():
            p = subprocess.run([tool, "--dir", store, "config"], capture_output=True, text=True,
                               timeout=60, env=env)
            check(p.returncode == 0 and p.stderr == "", "config ran (%s)" % p.stderr[-300:])
            lines = p.stdout.splitlines()
            head = [i for i, l in enumerate(lines) if l.startswith("libraries the shim last served")]
            check(len(head) == 1 and lines[head[0]].endswith("(%s/libraries):" % store),
                  "config has one libraries section, naming the file (%s)" %
                  (lines[head[0]] if head else None))
            got = {}
            for l in lines[head[0] + 1:head[0] + 5] if head else []:
                k, _, v = l.strip().partition(" ")
                got[k] = v.strip()
            check(sorted(got) == sorted(LABELS), "config lists the four libraries (%s)" % got)
            return got

        none = "none recorded"
        got = config()
        check(all(v == none for v in got.values()), "empty store: none recorded (%s)" % got)
        check(not os.path.exists(store), "config created no store")

        libs = run("nvrtc", rtc)
        got = config()
        check(got["NVRTC"] == rtc and libs.get("nvrtc") == rtc,
              "NVRTC: config names %s, as the stats line (%s)" % (got["NVRTC"], libs))
        check(got["nvJitLink"] == none and got["libNVVM"] == none and got["libcuda"] == none,
              "NVRTC: the others none recorded (%s)" % got)
        ino = os.stat(os.path.join(store, "libraries")).st_ino

        libs = run("link+nvvm", jl, vm, kptx)
        got = config()
        check(got["nvJitLink"] == jl and got["libNVVM"] == vm and got["NVRTC"] == rtc,
              "nvJitLink and libNVVM added, NVRTC kept (%s)" % got)
        check(libs.get("link") == jl and libs.get("nvvm") == vm,
              "the stats line names the same (%s)" % libs)

        libs = run("cuda", kptx)
        got = config()
        cuda = libs.get("cuda")
        check(cuda is not None and os.path.dirname(os.path.realpath(cuda)) ==
              os.path.realpath(standin) and got["libcuda"] == cuda,
              "libcuda: the stand-in's (%s; stats line %s)" % (got["libcuda"], cuda))
        check(got["NVRTC"] == rtc and got["nvJitLink"] == jl, "the others kept (%s)" % got)

        ino = os.stat(os.path.join(store, "libraries")).st_ino
        run("nvrtc", rtc)
        check(os.stat(os.path.join(store, "libraries")).st_ino == ino,
              "the same NVRTC again: the file is not rewritten")

        if other and os.path.exists(other):
            run("nvrtc", other)
            got = config()
            check(got["NVRTC"] == other and got["nvJitLink"] == jl and got["libcuda"] == cuda,
                  "another NVRTC: its path, the others kept (%s)" % got)
        else:
            print("skip: no other NVRTC (%s; scripts/setup-wheels makes it)" % other)

        os.makedirs(os.path.join(tmp, "lnk"))
        link = os.path.join(tmp, "lnk", os.path.basename(rtc))
        os.symlink(rtc, link)
        libs = run("nvrtc", link, KCACHE_READONLY="1")
        got = config()
        check(libs.get("nvrtc") == link and got["NVRTC"] != link,
              "KCACHE_READONLY=1: served by %s, nothing recorded (%s)" % (libs, got["NVRTC"]))
        run("nvrtc", link)
        os.unlink(link)
        got = config()
        check(got["NVRTC"] == link + " (no longer there)",
              "a library gone since: (no longer there) (%s)" % got["NVRTC"])
    finally:
        rm_settled(tmp)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
