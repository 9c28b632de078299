#!/usr/bin/env python3
"""Why compiles passed through, said (test nvrtc-reasons): a real NVRTC
client (ctypes) compiles two programs kcache caches and two it leaves to
NVRTC (-time and --fdevice-time-trace write files), twice. Each run's
KCACHE_STATS line names the reason of every pass-through
("; passthrough nvrtc option=2") and none when nothing passed; `kcache
stats` counts them for both runs in its text, JSON and OpenMetrics forms.

Usage: test_reasons.py LIBNVRTC
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

CLIENT = r'''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
out = []
for i, extra in enumerate(sys.argv[3:]):
    h = ctypes.c_void_p()
    src = b'extern "C" __global__ void k%d(float *p) { p[0] *= %d.0f; }' % (i, i + 2)
    assert lib.nvrtcCreateProgram(ctypes.byref(h), src, b"k.cu", 0, None, None) == 0
    opts = [b"-arch=compute_80"] + ([extra.replace("DIR", sys.argv[2]).encode()] if extra != "-" else [])
    o = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(h, len(opts), o)
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(h, ctypes.byref(n))
    b = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(h, b)
    out.append("%d %d %d" % (i, rc, len(b.raw)))
    lib.nvrtcDestroyProgram(ctypes.byref(h))
print("\n".join(out))
'''

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    lib = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kcache-reasons-")
    try:
        client = os.path.join(tmp, "client.py")
        open(client, "w").write(CLIENT)
        store = os.path.join(tmp, "store")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        env.update(KCACHE_DIR=store, KCACHE_STATS="1", KCACHE_TOOL=os.environ["KCACHE_TOOL"],
                   LD_PRELOAD=os.environ["KCACHE_SHIM"])
        argv = [sys.executable, client, lib, tmp, "-", "-time=DIR/t.csv",
                "--fdevice-time-trace=DIR/trace.json", "-"]
        ref = subprocess.run(argv[:1] + argv[1:], capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in env.items() if k != "LD_PRELOAD"})
        for label in ("cold", "warm"):
            p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
            check(p.returncode == 0 and p.stdout == ref.stdout,
                  "%s: NVRTC's own answers (%s)" % (label, p.stderr[-300:]))
            check(re.search(r"nvrtc hits=\d+ misses=\d+ passthrough=2 ", p.stderr) is not None and
                  re.search(r"; passthrough nvrtc option=2(;|$)", p.stderr, re.M) is not None,
                  "%s: the stats line says 2 passed through, both for an option (%r)"
                  % (label, p.stderr[-300:]))
        p = subprocess.run(argv[:4] + ["-"], capture_output=True, text=True, timeout=120, env=env)
        check("; passthrough" not in p.stderr,
              "nothing passed through: no reasons on the stats line (%r)" % p.stderr[-300:])

        tool = os.environ["KCACHE_TOOL"]
        env.pop("LD_PRELOAD")

        def stats(*a):
            return subprocess.run([tool, "--dir", store, "stats"] + list(a), capture_output=True,
                                  text=True, timeout=60, env=env).stdout
        js = json.loads(stats("--json"))
        nv = [b for b in js["backends"] if b["name"] == "nvrtc"]
        check(len(nv) == 1 and nv[0]["passthrough"] == 4 and
              nv[0]["passthrough_reasons"] == {"option": 4},
              "kcache stats --json: nvrtc passthrough 4, passthrough_reasons option 4 (%s)" % nv)
        check(not any(b["name"].startswith("pass:") for b in js["backends"]),
              "kcache stats --json: the reasons are no backends of their own")
        text = stats()
        check(re.search(r"^  nvrtc +hits \d+  misses \d+  passthrough 4 \(option 4\)  stores", text,
                        re.M) is not None, "kcache stats: 'passthrough 4 (option 4)' (%s)" % text)
        om = stats("--openmetrics")
        check(re.search(r'^kcache_passthrough_reason_total\{dir="[^"]*",backend="nvrtc",'
                        r'reason="option"\} 4$', om, re.M) is not None,
              "kcache stats --openmetrics: kcache_passthrough_reason_total option 4")
    finally:
        rm_settled(tmp)
    if failures:
        print("%d failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
