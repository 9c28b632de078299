#!/usr/bin/env python3
"""Links cached: nvJitLink and the driver's cuLink* under the shim (suite 'link').

Usage: test_link.py TEST
  identity-linked  every scenario of link_client (linked against nvJitLink)
                   without the shim, cold and warm: identical dumps and cubins;
                   the cold run misses each distinct link, the warm hits all
  identity-dlopen  the same through dlopen + dlsym (cuda.bindings' way)
  edit             a library added by file (nvJitLinkAddFile) edited: its
                   content is a miss, a touch alone a hit
  options          -arch, -O, -lineinfo, input order: distinct keys
  threads          8 threads at once, cold and warm
  multiproc        8 processes at once on an empty store: identical results,
                   total links = distinct links
  switch           KCACHE_LINK=0, KCACHE_READONLY=1, KCACHE_RECACHE=1
  culink           cuLink* against the stand-in driver, logs and all
  late             a file added (nvJitLinkAddFile, cuLinkAddFile) that changes
                   or goes after the add, while the store knows its first
                   content: the link is of the bytes the file held at the add
  core             cuda.core's Linker (nvJitLink backend) from the venv
  numba            numba-cuda from the venv, no GPU: NVVM to PTX/LTO-IR, its
                   linker's three links to cubins, cold and warm

Environment (tests/link/meson.build): KCACHE_SHIM, KCACHE_TOOL,
KCACHE_TEST_LINK_LINKED, KCACHE_TEST_LINK_DLOPEN, KCACHE_TEST_STANDIN_DIR,
KCACHE_TEST_NVCC.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.environ["KCACHE_SHIM"]
LINKED = os.environ["KCACHE_TEST_LINK_LINKED"]
DLOPEN = os.environ["KCACHE_TEST_LINK_DLOPEN"]
STANDIN = os.environ["KCACHE_TEST_STANDIN_DIR"]
NVCC = os.environ.get("KCACHE_TEST_NVCC", "/usr/local/cuda/bin/nvcc")
SRC = os.environ.get("KCACHE_SRC", os.path.dirname(os.path.dirname(HERE)))
VENV_PY = os.environ.get("KCACHE_VENV_PYTHON", os.path.join(SRC, ".venv", "bin", "python"))

LINK_RE = re.compile(r"link hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)")

# Scenarios of link_client run: 13, of which ptx2-early repeats ptx2's link.
N_SCENS = 13
N_DISTINCT = 12
# cuLink scenarios: 7, all distinct.
N_CU = 7

G_SRC = "__device__ float g(float v) { return v * %s; }\n"
B_SRC = "__device__ float f(float v) { return v * 2.0f + 1.0f; }\n"


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)
    print("ok: " + msg, flush=True)


def base_env(store):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env["KCACHE_DIR"] = store
    env["KCACHE_STATS"] = "1"
    return env


def run(argv, store, shim=True, standin=False, **kv):
    env = base_env(store)
    if shim:
        env["LD_PRELOAD"] = SHIM
    if standin:
        env["LD_LIBRARY_PATH"] = STANDIN
    env.update({k: str(v) for k, v in kv.items()})
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)
    if p.returncode != 0:
        raise Failure("%s exited %d:\n%s\n%s" % (" ".join(argv), p.returncode,
                                                 p.stdout[-2000:], p.stderr[-3000:]))
    return p.stdout, p.stderr


def stats(err):
    """(hits, misses, passthrough, stores, errors) of the link backend."""
    m = LINK_RE.search(err)
    if m is None:
        raise Failure("no link stats on stderr: %r" % err[-1500:])
    return tuple(int(x) for x in m.groups())


def warnings(err):
    return [l for l in err.splitlines() if l.startswith("kcache:") and "stats:" not in l]


def outputs(d):
    """The cubins the clients wrote (out-*, core-*), by name."""
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
            if f.startswith(("out-", "core-"))}


def clear_outputs(d):
    for f in os.listdir(d):
        if f.startswith(("out-", "core-")):
            os.unlink(os.path.join(d, f))


def nvcc_lib(d, name, src, lto):
    cu = os.path.join(d, name + ".cu")
    with open(cu, "w") as f:
        f.write(src)
    args = [NVCC, "-arch=sm_90", "-rdc=true", "-lib", "-o", os.path.join(d, "lib%s.a" % name), cu]
    if lto:
        args.insert(1, "-dlto")
    subprocess.run(args, check=True, capture_output=True, timeout=240, cwd=d)


def prepare(tmp):
    """Inputs: NVRTC's LTO-IR and PTX (link_client gen, no shim), libg.a (LTO-IR
    library, nvcc -dlto -lib) and libb.a (SASS + PTX library)."""
    d = os.path.join(tmp, "in")
    os.makedirs(d)
    run([LINKED, "gen", d], os.path.join(tmp, "unused"), shim=False)
    if not os.path.exists(NVCC):
        raise Failure("no nvcc at %s: the library scenarios need it" % NVCC)
    nvcc_lib(d, "g", G_SRC % "3.0f", True)
    nvcc_lib(d, "b", B_SRC, False)
    return d


def normalize(dump):
    """A verbose link's info log holds ptxas's compile times, which differ
    from run to run with or without kcache (a hit replays the stored run's):
    the times, and the log's size and digest, are masked in the blocks of
    the verbose scenarios; everything else is compared as it is."""
    blocks = re.split(r"^(?=@)", dump, flags=re.M)
    out = []
    for b in blocks:
        if b.startswith(("@ptx2-verbose", "@cu-verbose")):
            b = re.sub(r"Compile time = [0-9.]+ ms", "Compile time = T ms", b)
            b = re.sub(r"(info-log: size rc=\d+ size=)\d+", r"\1N", b)
            b = re.sub(r"(info-log: get rc=\d+ fnv=)\w+", r"\1X", b)
            b = re.sub(r"(info fnv=)\w+", r"\1X", b)
            b = re.sub(r"(option 4 value=)\d+", r"\1N", b)
        out.append(b)
    return "".join(out)


def compare(label, ref, got):
    ref, got = normalize(ref), normalize(got)
    if ref == got:
        return
    for a, b in zip(ref.splitlines(), got.splitlines()):
        if a != b:
            raise Failure("%s differs from nvJitLink's own:\n  %s\n  %s" % (label, a, b))
    raise Failure("%s differs in length" % label)


# ---- tests ------------------------------------------------------------------------

def t_identity(tmp, client):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    ref, _ = run([client, "run", d], store, shim=False)
    ref_out = outputs(d)
    check(len(ref_out) >= 11 and "complete rc=4" in ref, "reference run: %d cubins, the undefined "
          "symbol fails with NVJITLINK_ERROR_PTX_COMPILE" % len(ref_out))
    check(re.search(r"info-log text: \[.+", ref) is not None, "reference run: -verbose fills the "
          "info log")
    for label in ("cold", "warm", "warm again"):
        clear_outputs(d)
        out, err = run([client, "run", d], store)
        compare(label, ref, out)
        check(outputs(d) == ref_out, "%s: every cubin byte-identical to nvJitLink's own" % label)
        h, m, p, s, e = stats(err)
        if label == "cold":
            check((h, m, p, s, e) == (N_SCENS - N_DISTINCT, N_DISTINCT, 0, N_DISTINCT, 0),
                  "cold: %d distinct links missed and stored, the repeat hit (%s)"
                  % (N_DISTINCT, (h, m, p, s, e)))
        else:
            check((h, m, p, e) == (N_SCENS, 0, 0, 0), "%s: every link a hit (%s)"
                  % (label, (h, m, p, s, e)))
        check(not warnings(err), "%s: no warning (%s)" % (label, warnings(err)))


def t_edit(tmp):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    lib = os.path.join(d, "libg.a")

    def once(label, expect_hit):
        ref, _ = run([LINKED, "run", d, "1", "lib"], store, shim=False)
        out, err = run([LINKED, "run", d, "1", "lib"], store)
        compare(label, ref, out)
        h, m, _, _, _ = stats(err)
        check((h, m) == ((1, 0) if expect_hit else (0, 1)),
              "%s: %s, output as nvJitLink's own (%s)" % (label, "hit" if expect_hit else "miss", (h, m)))
        return ref

    first = once("cold", False)
    once("warm", True)
    with open(lib, "rb") as f:
        first_bytes = f.read()
    # The library's content changes: its link must not be served.
    st = os.stat(lib)
    nvcc_lib(d, "g", G_SRC % "5.0f", True)
    edited = once("libg.a rebuilt with another g()", False)
    check(edited != first, "the rebuilt library links to another cubin")
    # Edited again with its old mtime put back: the fingerprint no longer
    # holds (size or ctime), the content decides.
    nvcc_lib(d, "g", G_SRC % "7.0f", True)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    once("libg.a rebuilt, mtime set back", False)
    # A touch alone: same content, a hit.
    os.utime(lib)
    once("libg.a touched", True)
    # Back to the first bytes (nvcc's archives differ from build to build):
    # the first link, served.
    with open(lib, "wb") as f:
        f.write(first_bytes)
    out = once("libg.a as at first", True)
    check(out == first, "the first content links to the first cubin again")


def t_options(tmp):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    names = ["lto2", "lto2-O0", "lto2-sm80", "lto2-lineinfo", "lto2-ba"]
    for n in names:
        ref, _ = run([LINKED, "run", d, "1", n], store, shim=False)
        out, err = run([LINKED, "run", d, "1", n], store)
        compare(n, ref, out)
        h, m, _, s, _ = stats(err)
        check((h, m, s) == (0, 1, 1), "%s: a key of its own (missed and stored: %s)" % (n, (h, m, s)))
    o = outputs(d)
    check(o["out-lto2"] != o["out-lto2-sm80"], "-arch=sm_80 links another cubin")
    check(o["out-lto2"] != o["out-lto2-lineinfo"], "-lineinfo links another cubin")
    print("note: -O0 %s the cubin" % ("changes" if o["out-lto2"] != o["out-lto2-O0"] else "does not change"))
    for n in names:
        out, err = run([LINKED, "run", d, "1", n], store)
        check(stats(err)[:2] == (1, 0), "%s again: a hit" % n)


def t_threads(tmp):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    ref, _ = run([LINKED, "run", d, "1"], store, shim=False)
    ref = ref.replace("threads=1 ", "threads=8 ")
    ref_out = outputs(d)
    keep = os.path.join(tmp, "threads")
    os.makedirs(keep, exist_ok=True)
    for label in ("cold", "warm"):
        threads_run(label, d, store, keep, ref, ref_out)


def threads_run(label, d, store, keep, ref, ref_out):
    """One run of 8 threads: every thread saw what nvJitLink gives one
    (verbose links' compile times masked: they differ between threads with
    or without kcache)."""
    clear_outputs(d)
    out, err = run([LINKED, "run", d, "8"], store, KCACHE_TEST_LINK_THREAD_OUT=keep)
    dumps = []
    for i in range(8):
        with open(os.path.join(keep, "thread-%d.out" % i)) as f:
            dumps.append(normalize(f.read()))
    check(all(x == dumps[0] for x in dumps), "%s: 8 threads saw the same results" % label)
    out = re.sub(r"differing=\d+", "differing=0", out)
    compare(label, ref, out)
    check(outputs(d) == ref_out, "%s: cubins byte-identical" % label)
    h, m, p, s, e = stats(err)
    check(h + m == 8 * N_SCENS and p == 0 and e == 0,
          "%s: %d links, each a hit or a miss (%s)" % (label, 8 * N_SCENS, (h, m, p, s, e)))
    if label == "warm":
        check(h == 8 * N_SCENS, "warm: all hits")


def t_multiproc(tmp):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    ref, _ = run([LINKED, "run", d, "1"], store, shim=False)
    env = base_env(store)
    env["LD_PRELOAD"] = SHIM
    procs = [subprocess.Popen([LINKED if i % 2 == 0 else DLOPEN, "run", d, "1"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    total = [0] * 5
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=280)
        if p.returncode != 0:
            raise Failure("process %d exited %d: %s" % (i, p.returncode, err[-2000:]))
        compare("process %d" % i, ref, out)
        for k, v in enumerate(stats(err)):
            total[k] += v
    h, m, pt, s, e = total
    # The linked client calls __nvJitLink*_13_0, the dlopen'd one the
    # unversioned names: the name a link is made through is part of its key
    # (a release's versioned entry points may answer in that release's
    # codes), so each distinct link is made once per name variant.
    n = 2 * N_DISTINCT
    check(m == n and s == n, "8 processes at once: %d links in all = the distinct links of the "
          "two name variants (%s)" % (m, total))
    check(h == 8 * N_SCENS - n and pt == 0 and e == 0, "the rest were served (%s)" % total)


def t_switch(tmp):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    ref, _ = run([LINKED, "run", d], store, shim=False)
    out, err = run([LINKED, "run", d], store, KCACHE_LINK=0)
    compare("KCACHE_LINK=0", ref, out)
    check(stats(err) == (0, 0, 0, 0, 0), "KCACHE_LINK=0: no link touched (%s)" % (stats(err),))
    out, err = run([LINKED, "run", d], store, KCACHE_READONLY=1)
    compare("KCACHE_READONLY=1", ref, out)
    check(stats(err)[1] == N_SCENS and stats(err)[3] == 0, "read-only on an empty store: misses, "
          "nothing stored (%s)" % (stats(err),))
    out, err = run([LINKED, "run", d], store)
    check(stats(err)[:2] == (N_SCENS - N_DISTINCT, N_DISTINCT), "then a normal run still misses")
    out, err = run([LINKED, "run", d], store, KCACHE_RECACHE=1)
    compare("KCACHE_RECACHE=1", ref, out)
    check(stats(err)[0] == 0 and stats(err)[1] == N_SCENS, "recache: every link linked again (%s)"
          % (stats(err),))
    out, err = run([LINKED, "run", d], store, KCACHE_DISABLE=1)
    compare("KCACHE_DISABLE=1", ref, out)


def t_culink(tmp):
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    counts = os.path.join(tmp, "counts")
    ref, _ = run([LINKED, "culink", d], store, shim=False, standin=True)
    ref_out = outputs(d)
    check("complete rc=0" in ref and "complete rc=218" in ref, "reference: links, and an undefined "
          "symbol refused (CUDA_ERROR_INVALID_PTX)")
    check(re.search(r"info fnv=\w+ \[.+", ref) is not None, "reference: CU_JIT_LOG_VERBOSE fills "
          "the info log buffer")
    for label, expect in (("cold", (0, N_CU)), ("warm", (N_CU, 0))):
        clear_outputs(d)
        if os.path.exists(counts):
            os.unlink(counts)
        out, err = run([LINKED, "culink", d], store, standin=True, KCACHE_TEST_STANDIN_COUNTS=counts)
        compare("cuLink " + label, ref, out)
        check(outputs(d) == ref_out, "cuLink %s: cubins byte-identical" % label)
        h, m, p, s, e = stats(err)
        check((h, m, p, e) == expect + (0, 0), "cuLink %s: %s (%s)" % (label, expect, (h, m, p, s, e)))
        jit = int(re.search(r"jit=(\d+)", open(counts).read()).group(1))
        if label == "warm":
            check(jit == 0, "warm: the stand-in compiled nothing")
        else:
            check(jit > 0, "cold: the stand-in compiled (%d)" % jit)


def t_late(tmp):
    """Inputs added by file are linked as they were when added, whatever
    happens to the file before the library would read a deferred one (issue
    21, item 3): one path reused for two inputs, rewritten or removed before
    the completion, a library rebuilt in place; nvJitLink (both clients) and
    cuLink on the stand-in. Each link is run by the library alone, then
    under the shim on a store primed with the file's first content (so the
    first add is deferred), then again (warm)."""
    d = prepare(tmp)
    nvcc_lib(d, "g5", G_SRC % "5.0f", True)
    with open(os.path.join(d, "empty.ptx"), "wb"):
        pass
    os.makedirs(os.path.join(d, "adir.ptx"))
    S90, LTO = "-arch=sm_90", "-arch=sm_90,-lto"
    cases = [
        # (label, api, options, steps of the priming link, steps)
        ("reuse", "seq", S90, ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "put:y.ptx:tmp.ptx", "file:ptx:tmp.ptx"]),
        ("rewritten", "seq", S90,
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "data:ptx:y.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "put:y.ptx:tmp.ptx"]),
        ("removed", "seq", S90,
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "data:ptx:y.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "rm:tmp.ptx"]),
        ("library", "seq", LTO,
         ["data:ltoir:m.ltoir", "put:libg.a:tmp.a", "file:lib:tmp.a"],
         ["data:ltoir:m.ltoir", "put:libg.a:tmp.a", "file:lib:tmp.a", "put:libg5.a:tmp.a",
          "data:ltoir:b.ltoir"]),
        ("missing", "seq", S90, ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "file:ptx:nothere.ptx", "data:ptx:y.ptx"]),
        ("notfile", "seq", S90, ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "file:ptx:adir.ptx", "file:ptx:empty.ptx"]),
        ("cu-reuse", "cuseq", None, ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "put:y.ptx:tmp.ptx", "file:ptx:tmp.ptx"]),
        ("cu-rewritten", "cuseq", None,
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "data:ptx:y.ptx"],
         ["put:x.ptx:tmp.ptx", "file:ptx:tmp.ptx", "put:y.ptx:tmp.ptx"]),
    ]
    only = os.environ.get("KCACHE_TEST_LATE_ONLY")
    for label, api, opts, prime, steps in cases:
        if only and label != only:
            continue
        for client in ((LINKED, DLOPEN) if api == "seq" else (LINKED,)):
            cname = "dlopen" if client == DLOPEN else "linked"
            store = os.path.join(tmp, "store-%s-%s" % (label, cname))
            cu = api == "cuseq"

            def argv(lab, st):
                return [client, api, d, lab] + ([] if cu else [opts]) + st

            clear_outputs(d)
            ref, _ = run(argv(label, steps), store, shim=False, standin=cu)
            ref_out = outputs(d)
            _, err = run(argv("prime", prime), store, standin=cu)
            check(stats(err)[3] == 1, "%s (%s): the priming link stored" % (label, cname))
            for when in ("primed", "warm"):
                clear_outputs(d)
                out, err = run(argv(label, steps), store, standin=cu)
                compare("%s (%s, %s)" % (label, cname, when), ref, out)
                check(outputs(d) == ref_out, "%s (%s, %s): the link of the bytes each file "
                      "held when added, as the library's own (%s)"
                      % (label, cname, when, stats(err)))
                check(not warnings(err), "%s (%s, %s): no warning" % (label, cname, when))


def t_core(tmp):
    if not os.path.exists(VENV_PY):
        print("SKIP: no venv python at %s" % VENV_PY)
        return 77
    d = prepare(tmp)
    store = os.path.join(tmp, "store")
    script = os.path.join(HERE, "core_link.py")
    argv = [VENV_PY, script, d]
    ref, _ = run(argv, store, shim=False, CUDA_HOME="/usr/local/cuda", PYTHONDONTWRITEBYTECODE=1)
    ref_out = outputs(d)
    check("nvJitLink" in ref and "ERROR_PTX_COMPILE" in ref, "cuda.core links with nvJitLink; the "
          "undefined symbol is its error")
    # The C client's nvJitLink cubin of the same link is cuda.core's.
    run([LINKED, "run", d, "1", "lto2"], store, shim=False)
    check(outputs(d)["out-lto2"] == ref_out["core-lto2"], "cuda.core's cubin is nvJitLink's own")
    for label, expect in (("cold", (0, 4)), ("warm", (4, 0))):
        clear_outputs(d)
        out, err = run(argv, store, CUDA_HOME="/usr/local/cuda", PYTHONDONTWRITEBYTECODE=1)
        compare("cuda.core " + label, ref, out)
        check(outputs(d) == ref_out, "cuda.core %s: cubins byte-identical" % label)
        h, m, p, s, e = stats(err)
        check((h, m, p, e) == expect + (0, 0), "cuda.core %s: %s (%s)" % (label, expect, (h, m, p, s, e)))


def t_numba(tmp):
    """numba-cuda (no GPU here): its NVVM compiles to PTX and LTO-IR and its
    linker's three links to cubins, under the shim: outputs as without it;
    cold three link misses, warm three hits."""
    if not os.path.exists(VENV_PY):
        print("SKIP: no venv python at %s" % VENV_PY)
        return 77
    script = os.path.join(HERE, "numba_link.py")
    store = os.path.join(tmp, "store")
    env = dict(CUDA_HOME="/usr/local/cuda", PYTHONDONTWRITEBYTECODE=1,
               NUMBA_CACHE_DIR=os.path.join(tmp, "numba-cache"))
    ref, _ = run([VENV_PY, script], store, shim=False, **env)
    check(ref.count("cubin from") == 3, "numba links three cubins without a GPU")
    for label, expect in (("cold", (0, 3)), ("warm", (3, 0))):
        out, err = run([VENV_PY, script], store, **env)
        check(out == ref, "numba %s: outputs as without kcache" % label)
        h, m, p, s, e = stats(err)
        check((h, m, p, e) == expect + (0, 0), "numba %s: %s (%s)" % (label, expect, (h, m, p, s, e)))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    t = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kcache-link-")
    try:
        if t == "identity-linked":
            rc = t_identity(tmp, LINKED)
        elif t == "identity-dlopen":
            rc = t_identity(tmp, DLOPEN)
        elif t in ("edit", "options", "threads", "multiproc", "switch", "culink", "late", "core",
                   "numba"):
            rc = globals()["t_" + t](tmp)
        else:
            print(__doc__, file=sys.stderr)
            return 2
        return rc or 0
    except Failure as e:
        print("FAIL: %s" % e, flush=True)
        return 1
    finally:
        rm_settled(tmp)


if __name__ == "__main__":
    sys.exit(main())
