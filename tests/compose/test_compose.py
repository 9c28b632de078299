#!/usr/bin/env python3
"""kcache composed with what else a process loads (issue 21, items 1 and 2).

Usage: test_compose.py NAME   (one of the functions named test_NAME below)

  local_driver  a library linked against libcuda.so.1 (the stand-in), loaded
                RTLD_LOCAL by a host that links no CUDA library: every hooked
                driver entry point answers as without the shim, cold and warm,
                and the warm run hits (no JIT in the stand-in)
  two_copies    the same with a second copy of libcuda.so.1 used through
                dlsym: the copies never share state
  local_rtc     the same for a library linked against NVRTC and nvJitLink
  next          a preloaded probe's dlsym(RTLD_NEXT)/dlvsym answers, from its
                constructor and at exit, kcache before/after it, on/disabled,
                libcuda loaded RTLD_LOCAL or RTLD_GLOBAL: glibc's for its place
  pycuda        PyCUDA's _driver.so loads PTX (module_from_buffer), cold and warm
  triton        Triton's launcher loads a cubin and PTX (load_binary)
  preload       libfaketime and libeatmydata (Debian) preloaded with kcache in
                both orders, kcache on and KCACHE_DISABLE=1: each keeps working
                (no recursion through dlsym(RTLD_NEXT)), and kcache still
                caches while composed (hits on the warm run)

Every run gets its own cache directory under $TMPDIR (build/tmp), removed at
the end. Exit 77 (skip) only when a Debian preload library, or PyCUDA or
Triton in the project venv (scripts/setup-venv), is not installed.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

SHIM = os.environ["KCACHE_SHIM"]
STANDIN = os.environ["KCACHE_TEST_STANDIN_DIR"]
HOST = os.environ["KCACHE_TEST_COMPOSE_HOST"]
CUDALIB = os.environ["KCACHE_TEST_COMPOSE_CUDALIB"]
RTCLIB = os.environ["KCACHE_TEST_COMPOSE_RTCLIB"]
NEXTPROBE = os.environ["KCACHE_TEST_COMPOSE_NEXTPROBE"]
DATA = os.environ["KCACHE_TEST_DRIVER_DATA"]
PTX = os.path.join(DATA, "k.ptx")
PTX2 = os.path.join(DATA, "k2.ptx")
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
EATMYDATA = "/usr/lib/x86_64-linux-gnu/libeatmydata.so.1"

TMP = tempfile.mkdtemp(prefix="kcache-compose-")
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def env_for(cache, preload=None, extra=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    e["LD_LIBRARY_PATH"] = STANDIN
    e["KCACHE_DIR"] = os.path.join(TMP, cache)
    e["KCACHE_STATS"] = "1"
    if preload:
        e["LD_PRELOAD"] = preload
    e.update(extra or {})
    return e


def run(args, cache="cache", preload=None, extra=None):
    p = subprocess.run(args, env=env_for(cache, preload, extra), capture_output=True,
                       text=True, timeout=120)
    return p


def stats(stderr, backend):
    """The backend's counts summed over every stats line: each process of
    the tree prints its own (Triton's launcher build runs gcc under the
    shim, and those children report zeros)."""
    total = None
    for m in re.finditer(r"\b" + backend + r" hits=(\d+) misses=(\d+) passthrough=(\d+)"
                         r" stores=(\d+) errors=(\d+)", stderr):
        one = dict(zip(("hits", "misses", "passthrough", "stores", "errors"),
                       map(int, m.groups())))
        total = one if total is None else {k: total[k] + one[k] for k in total}
    return total


def counts_of(path):
    c = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                for k, v in re.findall(r"(\w+)=(\d+)", line):
                    c[k] = c.get(k, 0) + int(v)
        os.unlink(path)
    return c


def cold_warm(args, backends, what, preload_extra=None, order="shim-first", extra=None,
              warm_jit=0):
    """Runs `args` without the shim, then cold and warm under it (with the
    libraries in preload_extra composed in `order`). Outputs must match; the
    cold run misses and stores, the warm run only hits. Returns the warm
    run's stats per backend."""
    base = run(args, preload=None, extra=extra)
    check(base.returncode == 0, "%s: runs without the shim (rc %d: %s)"
          % (what, base.returncode, base.stdout[-400:] + base.stderr[-400:]))
    pre = [SHIM] + (preload_extra or [])
    if order != "shim-first":
        pre = (preload_extra or []) + [SHIM]
    cache = "cache-%d" % cold_warm.n
    cold_warm.n += 1
    out = {}
    for phase in ("cold", "warm"):
        counts = os.path.join(TMP, "counts-" + phase)
        e = dict(extra or {}, KCACHE_TEST_STANDIN_COUNTS=counts)
        p = run(args, cache=cache, preload=":".join(pre), extra=e)
        c = counts_of(counts)
        check(p.returncode == base.returncode and p.stdout == base.stdout,
              "%s, %s: same rc and output as without the shim%s" % (
                  what, phase, "" if p.stdout == base.stdout else
                  "\n--- without ---\n%s--- with (rc %d) ---\n%s%s" % (
                      base.stdout, p.returncode, p.stdout, p.stderr[-1500:])))
        for b in backends:
            s = stats(p.stderr, b)
            check(s is not None, "%s, %s: a stats line for %s" % (what, phase, b))
            if s is None:
                continue
            if phase == "cold":
                # (A cold run may hit what it stored itself: the library
                # load of the module's PTX.)
                check(s["misses"] >= 1 and s["stores"] == s["misses"] and s["errors"] == 0,
                      "%s, cold: %s misses and stores (%s)" % (what, b, s))
            else:
                check(s["hits"] >= 1 and s["misses"] == 0 and s["passthrough"] == 0
                      and s["errors"] == 0, "%s, warm: %s only hits (%s)" % (what, b, s))
            out.setdefault(phase, {})[b] = s
        if phase == "warm" and "jit" in backends:
            check(c.get("jit", -1) == warm_jit, "%s, warm: the stand-in JIT-compiled %d (%s)"
                  % (what, warm_jit, c.get("jit")))
    return out


cold_warm.n = 0


def check_disabled(args):
    """KCACHE_DISABLE=1: every call still reaches the real library."""
    base = run(args)
    p = run(args, cache="off", preload=SHIM, extra={"KCACHE_DISABLE": "1"})
    check(p.returncode == 0 and p.stdout == base.stdout,
          "KCACHE_DISABLE=1: same output as without the shim\n" + p.stdout[-600:])


def test_local_driver():
    """Item 1: libcuda linked by a library the host loads RTLD_LOCAL."""
    args = [HOST, CUDALIB, "compose_driver", PTX, PTX2]
    s = cold_warm(args, ("jit", "link"), "RTLD_LOCAL libcuda user")
    # Three JIT loads (cuModuleLoadData, cuModuleLoadDataEx reached through
    # cuGetProcAddress, cuLibraryLoadData) and one cuLink* link.
    w = s.get("warm", {})
    check(w.get("jit", {}).get("hits") == 3, "warm: all three loads hit (%s)" % w.get("jit"))
    check(w.get("link", {}).get("hits") == 1, "warm: the cuLink* link hits (%s)" % w.get("link"))
    check_disabled(args)


def test_two_copies():
    """Item 1: a second copy of libcuda.so.1 (another file) that the host
    dlopen()s RTLD_LOCAL and uses through dlsym, after the library bound to
    the first copy through kcache's exports: each copy keeps its own state
    (the second's functions are handed out untouched, so its two loads
    JIT-compile warm too, one through a hooked entry point the first
    copy's user never called; the first's hit)."""
    import shutil
    copy_dir = os.path.join(TMP, "copy")
    os.makedirs(copy_dir)
    copy = os.path.join(copy_dir, "libcuda.so.1")
    shutil.copy(os.path.join(STANDIN, "libcuda.so.1"), copy)
    args = [HOST, CUDALIB, "compose_driver", PTX, PTX2]
    second = {"KCACHE_TEST_COMPOSE_SECOND": copy,
              "KCACHE_TEST_COMPOSE_SECOND_FATBIN": os.path.join(FIX, "kptx.fatbin")}
    s = cold_warm(args, ("jit",), "two copies of libcuda",
                  extra=second, warm_jit=2)
    base = run(args, extra=second)
    check("second copy distinct: yes" in base.stdout and "second cuModuleLoadData: 0"
          in base.stdout and "second cuModuleLoadFatBinary: 0" in base.stdout,
          "the second copy is a distinct library that loads PTX and a fatbinary")
    check(s.get("warm", {}).get("jit", {}).get("hits") == 3,
          "warm: the first copy's three loads hit (%s)" % s.get("warm"))


def test_local_rtc():
    """Item 1: NVRTC and nvJitLink linked by a library loaded RTLD_LOCAL."""
    args = [HOST, RTCLIB, "compose_rtc", "sm_90"]
    s = cold_warm(args, ("nvrtc", "link"), "RTLD_LOCAL NVRTC/nvJitLink user")
    w = s.get("warm", {})
    check(w.get("nvrtc", {}).get("hits") == 2, "warm: both compiles hit (%s)" % w.get("nvrtc"))
    check(w.get("link", {}).get("hits") == 1, "warm: the nvJitLink link hits (%s)" % w.get("link"))
    check_disabled(args)


OSYNC = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_SYNC, 0o600)
print("O_SYNC kept" if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_SYNC == os.O_SYNC else "O_SYNC dropped")
os.close(fd)
os.unlink(sys.argv[1])
"""


def test_preload():
    """Item 2: other interposers that find their next definition with
    dlsym(RTLD_NEXT), preloaded with kcache in either order."""
    for lib in (FAKETIME, EATMYDATA):
        if not os.path.exists(lib):
            print("SKIP: %s is not installed (scripts/setup installs libfaketime and "
                  "libeatmydata1)" % lib)
            raise SystemExit(77)
    py = "/usr/bin/python3"
    fake = {"FAKETIME": "@2001-02-03 04:05:06"}
    probe = os.path.join(TMP, "osync")
    cases = [
        # (library, program, extra environment, expected output)
        (FAKETIME, [py, "-c", "import readline, time; print(time.strftime('%Y'))"], fake,
         "2001\n"),
        (FAKETIME, ["date", "+%Y"], fake, "2001\n"),
        (FAKETIME, ["cat", PTX2], fake, open(PTX2).read()),
        (EATMYDATA, [py, "-c", OSYNC, probe], {}, "O_SYNC dropped\n"),
        (EATMYDATA, ["cat", PTX2], {}, open(PTX2).read()),
    ]
    for lib, args, extra, want in cases:
        alone = run(args, preload=lib, extra=extra)
        check(alone.returncode == 0 and alone.stdout == want,
              "%s alone: %s (%r)" % (os.path.basename(lib), args[0], alone.stdout[:80]))
        for order in ((SHIM, lib), (lib, SHIM)):
            for disable in ("0", "1"):
                p = run(args, cache="cache-pre", preload=":".join(order),
                        extra=dict(extra, KCACHE_DISABLE=disable))
                check(p.returncode == 0 and p.stdout == want,
                      "LD_PRELOAD=%s KCACHE_DISABLE=%s %s: rc %d, output %r" % (
                          ":".join(os.path.basename(o) for o in order), disable,
                          " ".join(os.path.basename(a) for a in args[:2]), p.returncode,
                          p.stdout[:80]))
    # kcache caches while composed, in both orders, with both libraries:
    # NVRTC and nvJitLink from a library loaded RTLD_LOCAL, and the driver.
    for lib, extra in ((FAKETIME, fake), (EATMYDATA, {})):
        for order in ("shim-first", "shim-last"):
            what = "composed with %s (%s)" % (os.path.basename(lib), order)
            cold_warm([HOST, RTCLIB, "compose_rtc", "sm_90"], ("nvrtc", "link"),
                      "rtc " + what, [lib], order, extra)
            cold_warm([HOST, CUDALIB, "compose_driver", PTX, PTX2], ("jit",),
                      "driver " + what, [lib], order, extra)


def probe(order, global_, disable):
    """Runs the RTLD_LOCAL libcuda user with the dlsym(RTLD_NEXT) probe
    preloaded (alone, or with kcache in `order`); returns {(phase, name):
    object}."""
    out = os.path.join(TMP, "probe")
    if os.path.exists(out):
        os.unlink(out)
    pre = {"P": NEXTPROBE, "PK": NEXTPROBE + ":" + SHIM, "KP": SHIM + ":" + NEXTPROBE}[order]
    p = run([HOST, CUDALIB, "compose_driver", PTX, PTX2], cache="cache-probe", preload=pre,
            extra={"KCACHE_TEST_NEXTPROBE": out, "KCACHE_TEST_COMPOSE_GLOBAL": global_,
                   "KCACHE_DISABLE": disable})
    check(p.returncode == 0, "probe %s global=%s disable=%s: rc %d" % (
        order, global_, disable, p.returncode))
    got = {}
    if os.path.exists(out):
        for line in open(out):
            phase, name, obj = line.split()
            got[(phase, name)] = obj
    return got


def test_next():
    """Item 2: what another preloaded object's dlsym(RTLD_NEXT) and
    dlvsym(RTLD_NEXT) answer, from its constructor (before kcache's, when it
    is preloaded after kcache) and at exit, with kcache before or after it,
    on and disabled, with libcuda loaded RTLD_LOCAL (in no scope of the
    probe's) or RTLD_GLOBAL. The answer is glibc's for the probe's place:
    the same object as without kcache, except kcache's own exports where
    kcache comes after the probe (stat, open: kcache is then the next
    definition) and a hooked CUDA function the real library defines there,
    handed out as kcache's wrapper (not when disabled); never the probe's
    own definition."""
    hooked = ("cuModuleLoadData", "cuMemAlloc_v2", "nvrtcCreateProgram")
    for global_ in ("0", "1"):
        base = probe("P", global_, "0")
        check(len(base) >= 18 and "SELF" not in base.values(),
              "probe alone, global=%s: %d answers" % (global_, len(base)))
        for order in ("KP", "PK"):
            for disable in ("0", "1"):
                got = probe(order, global_, disable)
                for (phase, name), want in sorted(base.items()):
                    if order == "PK" and name in ("stat", "open"):
                        want = "libkcache.so"
                    elif name in hooked and disable == "0" and want != "NULL":
                        want = "libkcache.so"
                    have = got.get((phase, name))
                    check(have == want, "LD_PRELOAD=%s global=%s KCACHE_DISABLE=%s: %s "
                          "dlsym(RTLD_NEXT, %s) = %s (want %s)" % (
                              "kcache:probe" if order == "KP" else "probe:kcache", global_,
                              disable, phase, name, have, want))


VENV_PY = os.environ.get("KCACHE_VENV_PYTHON",
                         os.path.join(os.environ.get("KCACHE_SRC", "."), ".venv", "bin", "python"))
HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.environ.get("KCACHE_TEST_DRIVER_FIXTURES", "")


def venv_has(module):
    if not os.path.exists(VENV_PY):
        return False
    return subprocess.run([VENV_PY, "-c", "import " + module], capture_output=True,
                          env=env_for("none")).returncode == 0


def client(script, args, jit_misses, extra_for):
    """A real client without the shim, then cold and warm under it: same
    stdout and stderr (less the stats line); the warm run loads from the
    cache (JIT hits, no JIT in the stand-in)."""
    base_e = extra_for("base")
    base = run([VENV_PY, os.path.join(HERE, script)] + args, extra=base_e)
    check(base.returncode == 0, "%s without the shim: rc %d\n%s" % (
        script, base.returncode, base.stderr[-2000:]))
    strip = re.compile(r"^kcache: stats: .*\n?", re.M)
    for phase in ("cold", "warm"):
        counts = os.path.join(TMP, "counts-" + phase)
        e = dict(extra_for(phase), KCACHE_TEST_STANDIN_COUNTS=counts)
        p = run([VENV_PY, os.path.join(HERE, script)] + args, cache="cache-" + script,
                preload=SHIM, extra=e)
        c = counts_of(counts)
        check(p.returncode == base.returncode and p.stdout == base.stdout
              and strip.sub("", p.stderr) == base.stderr,
              "%s, %s: same rc, stdout and stderr as without the shim%s" % (
                  script, phase, "" if p.returncode == 0 else "\n" + p.stderr[-2000:]))
        s = stats(p.stderr, "jit")
        if phase == "cold":
            check(s is not None and s["misses"] == jit_misses and s["stores"] == jit_misses
                  and s["errors"] == 0, "%s, cold: %d JIT misses stored (%s)"
                  % (script, jit_misses, s))
        else:
            check(s is not None and s["hits"] == jit_misses and s["misses"] == 0
                  and s["errors"] == 0, "%s, warm: %d JIT hits (%s)" % (script, jit_misses, s))
            check(c.get("jit", -1) == 0, "%s, warm: no JIT in the stand-in (%s)"
                  % (script, c.get("jit")))


def test_pycuda():
    """Item 1: PyCUDA (PyPI sdist built against the toolkit) loads PTX."""
    if not venv_has("pycuda.driver"):
        print("SKIP: no pycuda in %s (scripts/setup-venv installs it)" % VENV_PY)
        raise SystemExit(77)
    client("pycuda_load.py", [PTX, PTX2], 2, lambda phase: {})


def test_triton():
    """Item 1: Triton's launcher (compiled at run time, linked against
    libcuda.so.1) loads a cubin (passed through) and PTX (cached)."""
    if not venv_has("triton"):
        print("SKIP: no triton in %s (scripts/setup-venv installs it)" % VENV_PY)
        raise SystemExit(77)
    cubin = os.path.join(FIX, "k90.cubin")
    check(os.path.exists(cubin), "the sm_90 cubin fixture exists (%s)" % cubin)

    def extra(phase):
        # The launcher is compiled by the run without the shim and again,
        # under it, by the cold run (a fresh Triton cache), reused warm.
        cache = os.path.join(TMP, "triton-" + ("base" if phase == "base" else "shim"))
        return {"TRITON_CACHE_DIR": cache, "TRITON_LIBCUDA_PATH": STANDIN,
                "TRITON_HOME": cache}
    client("triton_load.py", [cubin, PTX], 1, extra)


def main():
    if len(sys.argv) != 2 or "test_" + sys.argv[1] not in globals():
        print(__doc__, file=sys.stderr)
        return 2
    try:
        globals()["test_" + sys.argv[1]]()
    finally:
        rm_settled(TMP)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
