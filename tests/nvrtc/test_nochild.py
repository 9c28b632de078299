#!/usr/bin/env python3
"""The store's owner is never the host's child (test nvrtc-nochild): a real
NVRTC client (ctypes) compiles kernels that miss, so the shim starts the
owner, in four hosts: a SIGCHLD handler, SIGCHLD ignored, a thread calling
waitpid(-1) in a loop, and asyncio running subprocesses of its own. Each
host then says which children it found (waitpid(-1, WNOHANG)) and how many
SIGCHLD arrived; under kcache that is exactly what it is without it (none,
or the asyncio host's own), and the owner did start (the store was drained).

Usage: test_nochild.py LIBNVRTC
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HOST = r'''
import ctypes, os, signal, sys, threading, time
lib = ctypes.CDLL(sys.argv[1])
mode, tag = sys.argv[2], sys.argv[3]
got = []
reaped = []
if mode == "handler":
    signal.signal(signal.SIGCHLD, lambda s, f: got.append(s))
elif mode == "ignore":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
elif mode == "waitloop":
    signal.signal(signal.SIGCHLD, lambda s, f: got.append(s))
    def loop():
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid:
                    reaped.append(pid)
            except ChildProcessError:
                pass
            time.sleep(0.001)
    threading.Thread(target=loop, daemon=True).start()

def compile_all():
    for i in range(3):
        h = ctypes.c_void_p()
        src = b'extern "C" __global__ void k%d(float *p) { p[0] *= %d.0f; } // %s' % (i, i + 2, tag.encode())
        assert lib.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None) == 0
        opts = (ctypes.c_char_p * 1)(b"-arch=compute_80")
        print("compile", i, lib.nvrtcCompileProgram(h, 1, opts))
        lib.nvrtcDestroyProgram(ctypes.byref(h))
        time.sleep(0.3)

if mode == "asyncio":
    import asyncio
    async def main():
        signal.signal(signal.SIGCHLD, signal.getsignal(signal.SIGCHLD))
        p = await asyncio.create_subprocess_exec("true")
        print("own child", await p.wait())
        compile_all()
        await asyncio.sleep(0.5)
        p = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
        print("own child", await p.wait())
    asyncio.run(main())
else:
    compile_all()
    time.sleep(0.5)
try:
    print("waitpid", os.waitpid(-1, os.WNOHANG))
except ChildProcessError:
    print("waitpid ECHILD")
print("sigchld", len(got), "reaped", len(reaped))
'''

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    lib = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kcache-nochild-")
    try:
        host = os.path.join(tmp, "host.py")
        open(host, "w").write(HOST)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.pop("LD_PRELOAD", None)
        tool = os.environ["KCACHE_TOOL"]
        for mode in ("handler", "ignore", "waitloop", "asyncio"):
            store = os.path.join(tmp, "store-" + mode)
            argv = [sys.executable, host, lib, mode, mode]
            ref = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
            kenv = dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool, LD_PRELOAD=os.environ["KCACHE_SHIM"])
            p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=kenv)
            check(ref.returncode == 0 and p.returncode == 0 and p.stdout == ref.stdout,
                  "%s host: what it sees is what it sees without kcache (%r, without: %r; %s)"
                  % (mode, p.stdout.splitlines()[-2:], ref.stdout.splitlines()[-2:],
                     p.stderr[-300:]))
            # The owner ran: the spool drains into the database.
            drained = False
            for _ in range(200):
                spool = os.path.join(store, "spool")
                if os.path.isdir(os.path.join(store, "db")) and (
                        not os.path.isdir(spool) or not [f for f in os.listdir(spool)
                                                         if f.endswith(".put")]):
                    drained = True
                    break
                time.sleep(0.1)
            check(drained, "%s host: the owner started and drained the spool" % mode)
    finally:
        rm_settled(tmp)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
