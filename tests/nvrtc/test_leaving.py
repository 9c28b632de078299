#!/usr/bin/env python3
"""Counters add up however a process leaves (test nvrtc-leaving): a host
(ctypes, the real NVRTC, nvJitLink and libNVVM) makes, per library, one
miss that is stored, one hit, one pass-through and a second stored miss,
then leaves by
exit(), _exit(), a signal's default action (SIGTERM), exec, or as a
forked child (exit or _exit; the parent made its own requests first), or
after a thread did the requests, or by exit() after threads started
and left while it compiled, or after a posix_spawn (vfork-style) child
exec'd. `kcache stats --json` on its store must
then show exactly what it did -- 2 misses, 2 stores, 1 hit, 1 pass-through
with its 1 reason, per library; pass-throughs equal to their reasons --
and as many entries as its stores (those of the plain exit() run: the same
requests); a child never reports its parent's events.

Usage: test_leaving.py LIBNVRTC LIBNVJITLINK LIBNVVM
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HOST = r'''
import ctypes, os, signal, sys, threading
rtc = ctypes.CDLL(sys.argv[1])
jl = ctypes.CDLL(sys.argv[2])
vm = ctypes.CDLL(sys.argv[3])
how, tag = sys.argv[4], sys.argv[5]
ir_ver = (ctypes.c_int * 4)()
vm.nvvmIRVersion(*[ctypes.byref(ir_ver, 4 * i) for i in range(4)])

def nvvm(i, empty=False):
    h = ctypes.c_void_p()
    vm.nvvmCreateProgram(ctypes.byref(h))
    ir = (b"" if empty else b"""target triple = "nvptx64-nvidia-cuda"
target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
define void @k%d(float* %%p) {
entry:
  %%v = load float, float* %%p
  %%m = fmul float %%v, %d.0
  store float %%m, float* %%p
  ret void
}
; %s
!nvvm.annotations = !{!0}
!0 = !{void (float*)* @k%d, !"kernel", i32 1}
!nvvmir.version = !{!1}
!1 = !{i32 %d, i32 %d, i32 %d, i32 %d}
""" % ((i, i + 2, tag.encode(), i) + tuple(ir_ver)))
    vm.nvvmAddModuleToProgram(h, ir, ctypes.c_size_t(len(ir)), b"k.ll")
    o = (ctypes.c_char_p * 1)(b"-arch=compute_80")
    rc = vm.nvvmCompileProgram(h, 1, o)
    n = ctypes.c_size_t()
    vm.nvvmGetCompiledResultSize(h, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    vm.nvvmGetCompiledResult(h, ptx)
    vm.nvvmDestroyProgram(ctypes.byref(h))
    return rc, ptx.raw

def nvrtc(i, bad=False):
    h = ctypes.c_void_p()
    src = b'extern "C" __global__ void k%d(float *p) { p[0] *= %d.0f; } // %s' % (i, i + 2, tag.encode())
    rtc.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None)
    o = (ctypes.c_char_p * 1)(None if bad else b"-arch=compute_80")
    rc = rtc.nvrtcCompileProgram(h, 1, o)
    n = ctypes.c_size_t()
    rtc.nvrtcGetPTXSize(h, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    rtc.nvrtcGetPTX(h, ptx)
    rtc.nvrtcDestroyProgram(ctypes.byref(h))
    return ptx.raw

def link(ptx, extra=None):
    h = ctypes.c_void_p()
    o = (ctypes.c_char_p * 1)(b"-arch=sm_80")
    jl.nvJitLinkCreate(ctypes.byref(h), 1, o)
    jl.nvJitLinkAddData(h, 2, ptx, ctypes.c_size_t(len(ptx)), b"a.ptx")
    if extra is not None:
        jl.nvJitLinkAddData(h, 2, extra, ctypes.c_size_t(len(extra)), b"x.ptx")
    jl.nvJitLinkComplete(h)
    jl.nvJitLinkDestroy(ctypes.byref(h))

def work(base):
    p0 = nvrtc(base)          # miss, stored
    nvrtc(base)               # hit
    nvrtc(base, bad=True)     # pass-through: a NULL option (input)
    link(p0)                  # miss, stored
    link(p0)                  # hit
    link(p0, b"garbage")      # pass-through: refused
    p1 = nvrtc(base + 1)      # miss, stored
    link(p1)                  # miss, stored
    nvvm(base)                # miss, stored
    nvvm(base)                # hit
    nvvm(base, empty=True)    # pass-through: an empty module (input)
    rc, ptx = nvvm(base + 1)  # miss, stored
    assert rc == 0 and b".entry k%d" % (base + 1) in ptx, (rc, ptx[:200])

sys.stdout.flush()
if how.startswith("fork"):
    work(0)
    pid = os.fork()
    if pid == 0:
        work(10)
        if how == "fork_exit":
            sys.exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
    os._exit(0)               # the parent's own counts: lost after its last miss only
if how == "thread":
    t = threading.Thread(target=work, args=(0,))
    t.start(); t.join()
    os._exit(0)
if how == "threads_exiting":
    # Threads start and leave while another compiles: none takes its counts.
    stop = []
    def churn():
        while not stop:
            u = threading.Thread(target=lambda: None)
            u.start(); u.join()
    c = [threading.Thread(target=churn) for _ in range(3)]
    [x.start() for x in c]
    work(0)
    stop.append(1)
    [x.join() for x in c]
    sys.exit(0)
if how == "vfork":
    # posix_spawn: glibc's vfork-style clone, no fork handlers; the child
    # execs and reports nothing, the parent leaves by exit().
    work(0)
    pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    os.waitpid(pid, 0)
    sys.exit(0)
work(0)
if how == "exit":
    sys.exit(0)
if how == "_exit":
    os._exit(0)
if how == "signal":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
if how == "exec":
    os.execv("/bin/true", ["true"])
'''

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    rtc, jl, vm = sys.argv[1], sys.argv[2], sys.argv[3]
    tool, shim = os.environ["KCACHE_TOOL"], os.environ["KCACHE_SHIM"]
    tmp = tempfile.mkdtemp(prefix="kcache-leaving-")
    try:
        host = os.path.join(tmp, "host.py")
        open(host, "w").write(HOST)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.pop("LD_PRELOAD", None)

        def stats(store):
            # The owner adds the spool's logs up; kcache stats reads both.
            out = None
            for _ in range(100):
                p = subprocess.run([tool, "--dir", store, "stats", "--json"], capture_output=True,
                                   text=True, timeout=60)
                out = json.loads(p.stdout)
                if out.get("spool_entries", 0) == 0:
                    break
                time.sleep(0.1)
            return out

        per_entries = None
        for how in ("exit", "_exit", "signal", "exec", "fork_exit", "fork__exit", "thread",
                    "threads_exiting", "vfork"):
            store = os.path.join(tmp, "store-" + how)
            p = subprocess.run([sys.executable, host, rtc, jl, vm, how, how], capture_output=True,
                               text=True, timeout=300,
                               env=dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool, LD_PRELOAD=shim,
                                        KCACHE_STATS="1" if how == "exit" else "0"))
            check(p.returncode in (0, -15), "%s: the host ran (%d, %s)" % (how, p.returncode,
                                                                          p.stderr[-300:]))
            s = stats(store)
            procs = 2 if how.startswith("fork") else 1
            seen = set()
            stores = 0
            for b in s["backends"]:
                stores += b["stores"]
                if b["name"] not in ("nvrtc", "link", "nvvm"):
                    continue
                seen.add(b["name"])
                reasons = sum(b["passthrough_reasons"].values())
                got = (b["misses"], b["stores"], b["hits"], b["passthrough"], reasons)
                # A process leaving without exit handlers (_exit, a signal,
                # exec) loses at most its hits and pass-throughs after its
                # last miss: here none.
                want = (2 * procs, 2 * procs, procs, procs, procs)
                check(got == want, "%s: %s misses, stores, hits, pass-throughs, reasons %s "
                      "(the program did %s)" % (how, b["name"], got, want))
                check(b["passthrough"] == reasons,
                      "%s: %s pass-throughs (%d) equal their reasons (%s)"
                      % (how, b["name"], b["passthrough"], b["passthrough_reasons"]))
            check(seen == {"nvrtc", "link", "nvvm"}, "%s: kcache stats shows nvrtc, link and nvvm "
                  "(%s)" % (how, sorted(seen)))
            # Stores equal the entries stored: per libNVVM store its record;
            # per NVRTC store its record and its headers' manifest; per
            # nvJitLink store its record and the marker of its one input.
            per_store = {"nvrtc": 2, "link": 2, "nvvm": 1}
            for b in s["backends"]:
                if b["name"] not in per_store:
                    continue
                ent = sum(n["entries"] for n in s["namespaces"]
                          if n["name"].startswith(b["name"] + ":"))
                check(ent == per_store[b["name"]] * b["stores"],
                      "%s: %s's namespace holds %d entries for its %d stores (%d each)"
                      % (how, b["name"], ent, b["stores"], per_store[b["name"]]))
            if how == "exit":
                # The stats line names the library each backend was served by.
                line = [l for l in p.stderr.splitlines() if l.startswith("kcache: stats:")]
                libs = dict(kv.split("=", 1) for kv in
                            line[-1].split("; libraries ", 1)[1].split()) if line and \
                    "; libraries " in line[-1] else {}
                want = {"nvrtc": rtc, "link": jl, "nvvm": vm}
                check({k: os.path.realpath(v) for k, v in libs.items()} ==
                      {k: os.path.realpath(v) for k, v in want.items()},
                      "exit: the stats line names the libraries served (%s)" % libs)
                per_entries = s["entries"]
            check(s["entries"] == per_entries * procs,
                  "%s: the store holds %d entries (the exit() run's %d x %d processes)"
                  % (how, s["entries"], per_entries, procs))
    finally:
        rm_settled(tmp)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
