#!/usr/bin/env python3
"""kcache why (test nvrtc-why): a real NVRTC client (ctypes) compiles one
program under kcache; each next run changes one input, and `kcache why`
(text and --json) must name that input as the cause of the miss: the first
compile, a header file's content, a header now found where it was absent,
an option added, another NVRTC (a wheel's), the working directory of a
-lineinfo compile, and an entry that left the store (kcache clear) with
the same inputs. A hit writes no record. nvJitLink: the first link, an
input's content, an option added, another nvJitLink. libNVVM: the first
compile, a module's content, an option added.

Usage: test_why.py LIBNVRTC OTHER-LIBNVRTC LIBNVJITLINK [OTHER-LIBNVJITLINK [LIBNVVM]]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

CLIENT = r'''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
h = ctypes.c_void_p()
src = b'#include "a.h"\n#if __has_include("opt.h")\n#include "opt.h"\n#endif\n' \
      b'extern "C" __global__ void k(float *p) { p[0] *= A; }'
assert lib.nvrtcCreateProgram(ctypes.byref(h), src, b"why_kernel.cu", 0, None, None) == 0
opts = [o.encode() for o in sys.argv[2:]]
o = (ctypes.c_char_p * len(opts))(*opts)
rc = lib.nvrtcCompileProgram(h, len(opts), o)
print(rc)
lib.nvrtcDestroyProgram(ctypes.byref(h))
'''

LINK_CLIENT = r'''
import ctypes, sys
from ctypes import byref, c_char_p, c_size_t, c_void_p
nv = ctypes.CDLL(sys.argv[1])
jl = ctypes.CDLL(sys.argv[2])
src = b'extern "C" __global__ void k(float *p) { p[0] *= %s; }' % sys.argv[3].encode()
h = c_void_p()
assert nv.nvrtcCreateProgram(byref(h), src, b"l.cu", 0, None, None) == 0
assert nv.nvrtcCompileProgram(h, 1, (c_char_p * 1)(b"-arch=compute_80")) == 0
n = c_size_t()
nv.nvrtcGetPTXSize(h, byref(n))
ptx = ctypes.create_string_buffer(n.value)
nv.nvrtcGetPTX(h, ptx)
opts = [o.encode() for o in sys.argv[4:]]
lh = c_void_p()
assert jl.nvJitLinkCreate(byref(lh), len(opts), (c_char_p * len(opts))(*opts)) == 0
assert jl.nvJitLinkAddData(lh, 2, ptx, n.value, b"l.ptx") == 0
print(jl.nvJitLinkComplete(lh))
jl.nvJitLinkDestroy(byref(lh))
'''

NVVM_CLIENT = r'''
import ctypes, sys
from ctypes import byref, c_char_p, c_int, c_void_p
lib = ctypes.CDLL(sys.argv[1])
v = [c_int() for _ in range(4)]
lib.nvvmIRVersion(*[byref(x) for x in v])
ir = ("""target triple = "nvptx64-nvidia-cuda"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
define void @k(float* %%p) {
entry:
  %%v = load float, float* %%p
  %%m = fmul float %%v, %s
  store float %%m, float* %%p
  ret void
}
!nvvm.annotations = !{!0}
!0 = !{void (float*)* @k, !"kernel", i32 1}
!nvvmir.version = !{!1}
!1 = !{i32 %d, i32 %d, i32 %d, i32 %d}
""" % ((sys.argv[2],) + tuple(x.value for x in v))).encode()
p = c_void_p()
assert lib.nvvmCreateProgram(byref(p)) == 0
assert lib.nvvmAddModuleToProgram(p, ir, len(ir), b"k.ll") == 0
opts = [o.encode() for o in sys.argv[3:]]
print(lib.nvvmCompileProgram(p, len(opts), (c_char_p * max(1, len(opts)))(*opts)))
lib.nvvmDestroyProgram(byref(p))
'''

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    lib, other, jitlink = sys.argv[1], sys.argv[2], sys.argv[3]
    other_jitlink = sys.argv[4] if len(sys.argv) > 4 else None
    nvvm_lib = sys.argv[5] if len(sys.argv) > 5 else None
    tmp = tempfile.mkdtemp(prefix="kcache-why-")
    client = os.path.join(tmp, "client.py")
    open(client, "w").write(CLIENT)
    inc = os.path.join(tmp, "inc")
    os.mkdir(inc)
    open(os.path.join(inc, "a.h"), "w").write("#define A 2.0f\n")
    store = os.path.join(tmp, "store")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env.update(KCACHE_DIR=store, KCACHE_TOOL=os.environ["KCACHE_TOOL"],
               LD_PRELOAD=os.environ["KCACHE_SHIM"])
    tool = os.environ["KCACHE_TOOL"]
    base = ["-arch=compute_80", "-I" + inc]

    def run(opts, libpath=lib, cwd=tmp):
        p = subprocess.run([sys.executable, client, libpath] + opts, cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=120)
        check(p.returncode == 0 and p.stdout.strip() == "0", "compile ran (%r)" % p.stderr[-300:])

    def why(*args):
        p = subprocess.run([tool, "why"] + list(args), env=env, capture_output=True, text=True,
                           timeout=60)
        return p

    def last_json():
        p = why("--json")
        try:
            return json.loads(p.stdout)[-1]
        except (ValueError, IndexError):
            check(False, "kcache why --json is JSON (%r %r)" % (p.stdout, p.stderr))
            return {"cause": None, "differences": []}

    def expect(label, cause, what=None, kind=None, text=None):
        j = last_json()
        diffs = j.get("differences", [])
        ok = j.get("cause") == cause
        if what is not None:
            ok = ok and any(d["what"] == what and d["kind"] == kind for d in diffs)
        check(ok, "%s: cause %s %s %s (%r)" % (label, cause, what, kind, j))
        t = why().stdout
        check(text is None or text in t, "%s: the text says %r (%r)" % (label, text, t))

    p = why()
    check(p.returncode == 0 and "no miss is recorded" in p.stdout, "empty: %r" % p.stdout)
    run(base)
    expect("first", "first", text="its first compile")
    n_before = len(os.listdir(os.path.join(store, "why")))
    run(base)
    check(len(os.listdir(os.path.join(store, "why"))) == n_before, "a hit writes no record")

    open(os.path.join(inc, "a.h"), "w").write("#define A 3.0f /* edited */\n")
    run(base)
    expect("header edited", "differs", "changed", "file",
           text="header file %s: its content changed" % os.path.join(inc, "a.h"))

    open(os.path.join(inc, "opt.h"), "w").write("#define B 1\n")
    run(base)
    expect("header found", "differs", "found", "file",
           text="header file %s: now found" % os.path.join(inc, "opt.h"))

    run(base + ["-DEXTRA=1"])
    expect("option", "differs", "added", "option", text="option added: -DEXTRA=1")

    run(base, libpath=other)
    expect("library", "differs", "changed", "library", text="library nvrtc: ")

    d1, d2 = os.path.join(tmp, "w1"), os.path.join(tmp, "w2")
    os.mkdir(d1)
    os.mkdir(d2)
    run(base + ["-lineinfo"], cwd=d1)
    run(base + ["-lineinfo"], cwd=d2)
    expect("cwd", "differs", "changed", "cwd", text="the working directory: ")

    subprocess.run([tool, "clear"], env=env, capture_output=True, timeout=60)
    run(base + ["-lineinfo"], cwd=d2)
    expect("cleared", "left-the-store", text="the same inputs: its entry has left the store")

    p = why("--last", "3")
    check(p.stdout.count("nvrtc miss:") == 3, "--last 3 shows three (%r)" % p.stdout)
    p = why("why_kernel.cu")
    check(p.returncode == 0 and "why_kernel.cu" in p.stdout, "by name")
    p = why("nonexistent.cu")
    check(p.returncode == 1 and p.stderr.count("\n") == 1, "unknown name: one line, exit 1")
    p = why("--last", "x")
    check(p.returncode == 2, "bad --last: usage error")

    # nvJitLink: a link's inputs and options.
    lclient = os.path.join(tmp, "link.py")
    open(lclient, "w").write(LINK_CLIENT)

    def link(factor, opts, jitlink=jitlink):
        p = subprocess.run([sys.executable, lclient, lib, jitlink, factor] + opts, cwd=tmp,
                           env=env, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0 and p.stdout.strip() == "0", "link ran (%r)" % p.stderr[-300:])

    def last_link():
        p = why("--json", "--last", str(10 ** 6))
        links = [j for j in json.loads(p.stdout) if j["backend"] == "link"]
        return links[-1] if links else {}

    def expect_link(label, cause, what=None, kind=None):
        j = last_link()
        ok = j.get("cause") == cause and (what is None or any(
            d["what"] == what and d["kind"] == kind for d in j.get("differences", [])))
        check(ok, "link %s: cause %s %s %s (%r)" % (label, cause, what, kind, j))

    link("2.0f", ["-arch=sm_80"])
    expect_link("first", "first")
    link("3.0f", ["-arch=sm_80"])
    expect_link("input", "differs", "changed", "input")
    link("3.0f", ["-arch=sm_80", "-O0"])
    expect_link("option", "differs", "added", "option")
    if other_jitlink:
        link("3.0f", ["-arch=sm_80", "-O0"], jitlink=other_jitlink)
        expect_link("library", "differs", "changed", "library")
    # libNVVM: a module's content, an option.
    if nvvm_lib:
        nclient = os.path.join(tmp, "nvvm.py")
        open(nclient, "w").write(NVVM_CLIENT)

        def nvvm(factor, opts):
            p = subprocess.run([sys.executable, nclient, nvvm_lib, factor] + opts, cwd=tmp,
                               env=env, capture_output=True, text=True, timeout=120)
            check(p.returncode == 0 and p.stdout.strip() == "0",
                  "nvvm compile ran (%r %r)" % (p.stdout, p.stderr[-300:]))

        def expect_nvvm(label, cause, what=None, kind=None):
            p = why("--json", "--last", str(10 ** 6))
            js = [j for j in json.loads(p.stdout) if j["backend"] == "nvvm"]
            j = js[-1] if js else {}
            ok = j.get("cause") == cause and (what is None or any(
                d["what"] == what and d["kind"] == kind for d in j.get("differences", [])))
            check(ok, "nvvm %s: cause %s %s %s (%r)" % (label, cause, what, kind, j))

        nvvm("2.0", [])
        expect_nvvm("first", "first")
        nvvm("3.0", [])
        expect_nvvm("module", "differs", "changed", "input")
        nvvm("3.0", ["-opt=0"])
        expect_nvvm("option", "differs", "added", "option")
    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
