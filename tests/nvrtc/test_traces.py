#!/usr/bin/env python3
"""Nothing the shim does leaves a trace in the host (test nvrtc-traces): a
real NVRTC client (ctypes) takes a snapshot of what a process can see of
itself -- its open file descriptors (target and close-on-exec flag), its
signal mask, ignored, caught and pending signals, process group and
session, children (/proc/self/task/*/children and waitpid(-1, WNOHANG)),
umask, working directory, environment, file-size and descriptor limits --
at start, after misses that start the store's owner, after hits, after a
compile with --use-bundled-headers=DIR (NVRTC 13.5, when given) and after
misses and hits against a remote (a private redis-server on a unix
socket). Each snapshot under kcache must equal the same snapshot of the
same program run without it.

Usage: test_traces.py LIBNVRTC [LIBNVRTC-13.5]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HOST = r'''
import ctypes, fcntl, os, resource, sys, time
lib = ctypes.CDLL(sys.argv[1])
tag, bundled = sys.argv[2], sys.argv[3]

def snapshot(when):
    fds = []
    for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
        try:
            target = os.readlink("/proc/self/fd/%d" % fd)
            flags = fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue          # the listing's own descriptor
        if target.startswith("/proc/") and target.endswith("/fd"):
            continue
        # Anonymous objects carry an inode number: keep only their kind.
        if target.startswith(("anon_inode:", "pipe:", "socket:")):
            target = target.split("[")[0]
        fds.append("%d=%s%s" % (fd, target, " cloexec" if flags & fcntl.FD_CLOEXEC else ""))
    status = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"):
            status[k] = v.strip()
    kids = []
    for t in os.listdir("/proc/self/task"):
        try:
            kids += open("/proc/self/task/%s/children" % t).read().split()
        except OSError:
            pass
    try:
        w = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        w = "ECHILD"
    mask = os.umask(0o22); os.umask(mask)
    env = sorted(k for k in os.environ if k != "LD_PRELOAD" and not k.startswith("KCACHE_"))
    print("snapshot", when)
    print("  fds", " ".join(fds))
    print("  signals", status)
    print("  pgrp", os.getpgrp() == os.getpid() or os.getpgrp() == PGRP, "sid", os.getsid(0) == SID)
    print("  children", kids, "waitpid", w)
    print("  umask %o cwd %s" % (mask, os.getcwd() == CWD))
    print("  env", env)
    print("  limits", resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_FSIZE))
    sys.stdout.flush()

PGRP, SID, CWD = os.getpgrp(), os.getsid(0), os.getcwd()

def compile_one(i, opts=()):
    h = ctypes.c_void_p()
    src = b'extern "C" __global__ void k%d(float *p) { p[0] *= %d.0f; } // %s' % (i, i + 2, tag.encode())
    rc = lib.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None)
    o = [b"-arch=compute_80"] + list(opts)
    arr = (ctypes.c_char_p * len(o))(*o)
    rc2 = lib.nvrtcCompileProgram(h, len(o), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(h, ctypes.byref(n))
    lib.nvrtcDestroyProgram(ctypes.byref(h))
    print("compile", i, rc, rc2, n.value > 0)

snapshot("start")
for i in range(3):
    compile_one(i)
time.sleep(1.0)                     # the owner started (a miss) and is at work
snapshot("after misses")
for i in range(3):
    compile_one(i)
snapshot("after hits")
if bundled != "-":
    for rep in range(2):
        compile_one(7, [b"--use-bundled-headers=" + bundled.encode()])
    snapshot("after bundled headers")
time.sleep(0.5)
snapshot("end")
'''

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def compare(label, ref, got):
    check(ref.returncode == 0 and got.returncode == 0,
          "%s: both runs exit 0 (%d, %d; %s)" % (label, ref.returncode, got.returncode,
                                                  (ref.stderr + got.stderr)[-400:]))
    a, b = ref.stdout.splitlines(), got.stdout.splitlines()
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    check(len(a) == len(b) and not diff,
          "%s: every snapshot is what it is without kcache%s" % (
              label, "" if not diff else " (first difference: without %r, with %r)" % diff[0]))


def start_redis(tmp):
    d = os.path.join(tmp, "redis")
    os.makedirs(d)
    sock = os.path.join(d, "s")
    p = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock,
                          "--unixsocketperm", "700", "--dir", d, "--save", "",
                          "--appendonly", "no", "--logfile", os.path.join(d, "log")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):
        if os.path.exists(sock):
            return p, sock
        time.sleep(0.025)
    p.kill()
    raise RuntimeError("redis-server did not start")


def main():
    lib = sys.argv[1]
    lib135 = sys.argv[2] if len(sys.argv) > 2 and os.path.exists(sys.argv[2]) else None
    tmp = tempfile.mkdtemp(prefix="kcache-traces-")
    redis = None
    try:
        host = os.path.join(tmp, "host.py")
        open(host, "w").write(HOST)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.pop("LD_PRELOAD", None)
        tool = os.environ["KCACHE_TOOL"]
        shim = os.environ["KCACHE_SHIM"]

        def both(label, nvrtc, tag, bundled, extra):
            store = os.path.join(tmp, "store-" + label.replace(" ", "-"))
            bdir = "-"
            if bundled:
                bdir = os.path.join(tmp, "bundled-" + label.replace(" ", "-"))
            argv = [sys.executable, host, nvrtc, tag, bdir]
            ref = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
            if bundled:
                shutil.rmtree(bdir, ignore_errors=True)
            for run in ("cold", "warm"):
                kenv = dict(env, KCACHE_DIR=store, KCACHE_TOOL=tool, LD_PRELOAD=shim, **extra)
                got = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=kenv)
                compare("%s, %s" % (label, run), ref, got)
                if bundled:
                    shutil.rmtree(bdir, ignore_errors=True)

        both("local", lib, "local", False, {})
        if lib135:
            both("bundled headers", lib135, "bundled", True, {})
        else:
            check(False, "NVRTC 13.5 is installed (scripts/setup-wheels) for the bundled-headers case")
        if shutil.which("redis-server"):
            redis, sock = start_redis(tmp)
            key = os.path.join(tmp, "writer.key")
            subprocess.run([tool, "keygen", key], check=True, capture_output=True)
            extra = {"KCACHE_REMOTE": "redis+unix:" + sock,
                     "KCACHE_REMOTE_SIGNING_KEY": key,
                     "KCACHE_REMOTE_TRUSTED_KEYS": key + ".pub"}
            both("remote", lib, "remote", False, extra)
            # A second machine's store: every compile is a remote hit.
            kenv = dict(env, KCACHE_DIR=os.path.join(tmp, "store-remote2"), KCACHE_TOOL=tool,
                        LD_PRELOAD=shim, KCACHE_STATS="1", **extra)
            argv = [sys.executable, host, lib, "remote", "-"]
            ref = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
            got = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=kenv)
            compare("remote hits in a fresh store", ref, got)
            m = re.search(r"; remote hits=(\d+)", got.stderr)
            check(m is not None and int(m.group(1)) >= 3,
                  "a fresh store is served the three kernels by the remote (%s)" % got.stderr[-300:])
        else:
            check(False, "redis-server is installed (scripts/setup --test installs it)")
    finally:
        if redis is not None:
            redis.kill()
            redis.wait()
        rm_settled(tmp)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
