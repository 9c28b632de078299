#!/usr/bin/env python3
"""The version matrix (suite 'versions'): NVRTC 11.8, 12.9, 13.5 and
nvJitLink 12.9, 13.5 from their pip wheels (scripts/setup-wheels puts each
in .venv-wheels/<release>/), besides the toolkit's 13.0.

Usage: test_versions.py TEST
  nvrtc    for each NVRTC release: ver_client built against that release's
           nvrtc.h and library, every getter the release declares (NVVM on
           11.x/12.x, LTO-IR/OptiX/PCH from 12.0, Tile IR from 13.3) with
           logs, errors, name expressions and headers, without kcache, cold
           and warm: identical dumps; warm serves every cacheable compile.
           Each getter a release lacks is named in the dump as skipped.
  link     for each nvJitLink release: the same through the versioned
           names its header has a program call (__nvJitLink*_12_9,
           _13_5), linked directly and through dlsym: identical dumps and
           cubins, warm all hits
  future   a release later than kcache's table (a stand-in library,
           future_jitlink.c, exporting __nvJitLink*_13_9 over 13.5's):
           its names are hooked by pattern, warm all hits; with one more
           entry point kcache does not know, every link passes through
  future_libs  forward safety of NVRTC and libNVVM (the toolkit's): a
           library of the real one's exports, each forwarding to it
           (write_forwarder), is cached like it, cold then warm all hits;
           with one more entry point kcache does not know, every compile
           passes through, identical (future_client.py)
  flight   4 processes at once on an empty store (NVRTC 13.5): identical
           dumps, each distinct compile made once
  nvrtc_cache  NVRTC 12.9+'s own cache (in the CUDA driver's compute
           cache; inert here, no driver) beside kcache, for 12.9, 13.0,
           13.5 (cache_client.py): without kcache, cold and warm the same
           logs and PTX; --enable-cache-trace (whose log is the cache's
           state) passes through, the others are served warm
  nvmath   nvmath-python 1.0 with libmathdx 0.4 (.venv-wheels/nvmath) on the
           stand-in driver: a cuFFTDx FFT and a cuBLASDx matmul compiled to
           LTO-IR (NVRTC 13.5, a fresh bundled-headers directory per
           process) without kcache, cold and warm: the same LTO-IR, warm
           served
  pristine a hit with a fresh (empty) bundled-headers DIR checks the headers
           below it against NVRTC's map of them (in the store) without
           reading one; an entry of an edited DIR is not served there; a
           DIR the host filled (edited, a file of its own) is read; a
           corrupt, truncated, group-readable or another user's map is
           ignored and made again (pristine_client.py)
  fill     a fresh bundled-headers DIR filled from the store's copy of
           NVRTC's install: what NVRTC's install writes (paths, modes under
           the umask, bytes, the marker dated now); the host's edits never
           reach the store's copy; a corrupt copy is dropped and made again
  fill_race  one fresh bundled-headers DIR shared by processes compiling
           at once, four under kcache (a warm store: each may fill DIR, from
           a ready copy or the store's copy, on the store's filesystem and on
           tmpfs) and two of NVRTC alone (at the same moment, then 0.03,
           0.15 and 1.5 s later), several rounds: every compile succeeds with
           NVRTC's output, DIR ends as NVRTC's install, a kcache process
           fills DIR in at least one round per filesystem
  bundled  NVRTC 13.5's --use-bundled-headers=DIR, a fresh DIR per compile
           (bundled_client.py): without kcache, cold and warm the same
           outputs and the same DIR; warm serves the compiles no output of
           which names DIR (PTX, LTO-IR, a host-edited header), compiles
           the others (a log naming a header, line info, CCCL's device
           assertions in LTO-IR); the bundled-headers calls unchanged

Environment (tests/versions/meson.build): KCACHE_SHIM, KCACHE_SRC,
KCACHE_TEST_CC, KCACHE_TEST_CLIENT_SRC, KCACHE_TEST_TOOLKIT.
"""
import fcntl
import hashlib
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

SHIM = os.environ["KCACHE_SHIM"]
TOOL = os.environ["KCACHE_TOOL"]
SRC = os.environ["KCACHE_SRC"]
CC = os.environ.get("KCACHE_TEST_CC", "cc")
CLIENT = os.environ.get("KCACHE_TEST_CLIENT_SRC",
                        os.path.join(SRC, "tests", "versions", "ver_client.c"))
TOOLKIT = os.environ.get("KCACHE_TEST_TOOLKIT", "/usr/local/cuda")
WHEELS = os.environ.get("KCACHE_WHEELS", os.path.join(SRC, ".venv-wheels"))

# release -> (include dir, lib dir, soname) of each library.
def nvrtc_of(rel):
    if rel == "13.0":
        return TOOLKIT + "/include", TOOLKIT + "/lib64", "libnvrtc.so.13"
    sub = "cu13" if rel.startswith("13") else "cuda_nvrtc"
    d = os.path.join(WHEELS, "nvrtc-" + rel, "nvidia", sub)
    so = {"11.8": "libnvrtc.so.11.2", "12.9": "libnvrtc.so.12"}.get(rel, "libnvrtc.so.13")
    return d + "/include", d + "/lib", so


def jitlink_of(rel):
    if rel == "13.0":
        return TOOLKIT + "/include", TOOLKIT + "/lib64", "libnvJitLink.so.13"
    sub = "cu13" if rel.startswith("13") else "nvjitlink"
    d = os.path.join(WHEELS, "nvjitlink-" + rel, "nvidia", sub)
    return d + "/include", d + "/lib", "libnvJitLink.so." + rel.split(".")[0]


NVRTC_RELEASES = ["11.8", "12.9", "13.0", "13.5"]
LINK_RELEASES = ["12.9", "13.0", "13.5"]
STATS_RE = r"%s hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)"


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)
    print("ok: " + msg, flush=True)


def need(path, what):
    if not os.path.exists(path):
        raise Failure("%s: %s is missing (scripts/setup installs it)" % (what, path))


def build(tmp, name, rel, jitlink=False, dlsym=False):
    """ver_client against release rel's headers and libraries."""
    inc, lib, so = nvrtc_of(rel)
    need(os.path.join(lib, so), "NVRTC " + rel)
    major, minor = rel.split(".")
    args = [CC, "-O1", "-Wall", "-Werror", "-Wno-deprecated-declarations",
            "-DKC_REL_MAJOR=" + major, "-DKC_REL_MINOR=" + minor]
    libs = ["-L" + lib, "-l:" + so]
    rpath = [lib]
    if jitlink:
        jinc, jlib, jso = jitlink_of(rel)
        need(os.path.join(jlib, jso), "nvJitLink " + rel)
        args += ["-DKC_JITLINK", "-I" + jinc]
        if dlsym:
            args += ["-DKC_DLSYM", '-DKC_JL_SONAME="%s"' % jso]
        else:
            libs += ["-L" + jlib, "-l:" + jso]
        rpath.append(jlib)
    out = os.path.join(tmp, name)
    args += ["-I" + inc, "-o", out, CLIENT] + libs + ["-Wl,--disable-new-dtags", "-Wl,-rpath," + ":".join(rpath), "-ldl"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise Failure("cannot build %s:\n%s" % (name, p.stderr[-3000:]))
    return out


def run(argv, store=None, timeout=280, env=None):
    extra = env or {}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(extra)
    if store is not None:
        env.update(KCACHE_DIR=store, KCACHE_STATS="1", LD_PRELOAD=SHIM)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise Failure("%s exited %d:\n%s" % (" ".join(argv), p.returncode, p.stderr[-3000:]))
    return p.stderr


def stats(err, backend):
    m = re.search(STATS_RE % backend, err)
    if m is None:
        raise Failure("no %s stats on stderr (the calls were not intercepted): %r"
                      % (backend, err[-800:]))
    return tuple(int(x) for x in m.groups())


def warnings(err):
    return [l for l in err.splitlines() if l.startswith("kcache:") and "stats:" not in l]


def same(a, b, label):
    ta, tb = open(a).read(), open(b).read()
    if ta == tb:
        return
    for x, y in zip(ta.splitlines(), tb.splitlines()):
        if x != y:
            raise Failure("%s differs from the library's own:\n  %s\n  %s" % (label, x, y))
    raise Failure("%s differs in length" % label)


# ---- tests ---------------------------------------------------------------------------

# The NVRTC cases (ver_client run_nvrtc): bad_option's error is never cached.
N_NVRTC = {"11.8": 8, "12.9": 8, "13.0": 8, "13.5": 9}


def t_nvrtc(tmp):
    for rel in NVRTC_RELEASES:
        exe = build(tmp, "nvrtc-" + rel, rel)
        ref = os.path.join(tmp, "ref-%s.txt" % rel)
        run([exe, "nvrtc", ref])
        text = open(ref).read()
        check(text.startswith("version " + rel), "NVRTC %s: the client loads that release" % rel)
        skips = sorted(set(re.findall(r"^skipped: (\S+)", text, re.M)))
        print("  %s skips by name: %s" % (rel, ", ".join(skips) or "nothing"), flush=True)
        if rel in ("11.8", "12.9"):
            check(re.search(r"@dlto(?:.|\n)*?nvvm: size rc=0 size=[1-9]", text) is not None,
                  "NVRTC %s: -dlto has NVVM to get" % rel)
        if rel == "13.5":
            check(re.search(r"@tile(?:.|\n)*?tileir: size rc=0 size=[1-9]", text) is not None,
                  "NVRTC 13.5: --enable-tile has Tile IR to get")
        store = os.path.join(tmp, "store-" + rel)
        n = N_NVRTC[rel]
        for label in ("cold", "warm"):
            got = os.path.join(tmp, "%s-%s.txt" % (label, rel))
            err = run([exe, "nvrtc", got], store)
            same(ref, got, "NVRTC %s %s" % (rel, label))
            h, m, p, s, e = stats(err, "nvrtc")
            if label == "cold":
                check((h, m, p, s, e) == (0, n, 0, n - 1, 0),
                      "NVRTC %s cold: identical to NVRTC's own, %d misses (%s)"
                      % (rel, n, (h, m, p, s, e)))
            else:
                check((h, m, p, e) == (n - 1, 1, 0, 0),
                      "NVRTC %s warm: identical, every cacheable compile served (%s)"
                      % (rel, (h, m, p, s, e)))
            check(not warnings(err), "NVRTC %s %s: no warning %s" % (rel, label, warnings(err)))


N_LINK = 5


def t_link(tmp):
    for rel in LINK_RELEASES:
        d = os.path.join(tmp, "in-" + rel)
        os.makedirs(d)
        modes = ["linked", "dlsym"]
        for mode in modes:
            exe = build(tmp, "link-%s-%s" % (rel, mode), rel, jitlink=True,
                        dlsym=mode == "dlsym")
            if mode == "linked":
                run([exe, "gen", d])
                nm = subprocess.run(["nm", "-D", exe], capture_output=True, text=True).stdout
                want = "__nvJitLinkCreate_" + rel.replace(".", "_")
                check(want in nm, "nvJitLink %s: the header has the program call %s" % (rel, want))
            ref = os.path.join(tmp, "ref.txt")
            run([exe, "link", d, ref])
            outs = sorted(f for f in os.listdir(d) if f.startswith("out-"))
            refd = os.path.join(tmp, "ref-out")
            os.makedirs(refd)
            for f in outs:
                os.rename(os.path.join(d, f), os.path.join(refd, f))
            check(len(outs) >= 3, "nvJitLink %s %s: %d cubins" % (rel, mode, len(outs)))
            store = os.path.join(tmp, "store-%s-%s" % (rel, mode))
            for label in ("cold", "warm"):
                got = os.path.join(tmp, "got.txt")
                err = run([exe, "link", d, got], store)
                same(ref, got, "nvJitLink %s %s %s" % (rel, mode, label))
                for f in outs:
                    check(filecmp.cmp(os.path.join(refd, f), os.path.join(d, f), shallow=False),
                          "nvJitLink %s %s %s: %s byte-identical" % (rel, mode, label, f))
                    os.unlink(os.path.join(d, f))
                h, m, p, s, e = stats(err, "link")
                want = (0, N_LINK, 0, N_LINK, 0) if label == "cold" else (N_LINK, 0, 0, 0, 0)
                got_t = (h, m, p, s, e) if label == "cold" else (h, m, p, 0, e)
                check(got_t == want, "nvJitLink %s %s %s: %s (%s)"
                      % (rel, mode, label, "every link missed and stored" if label == "cold"
                         else "every link served", (h, m, p, s, e)))
                check(not warnings(err), "no warning %s" % warnings(err))
            for f in outs:
                os.unlink(os.path.join(refd, f))
            os.rmdir(refd)


def build_future(tmp, extra):
    jinc, jlib, jso = jitlink_of("13.5")
    need(os.path.join(jlib, jso), "nvJitLink 13.5")
    out = os.path.join(tmp, "libnvJitLink_future%s.so" % ("x" if extra else ""))
    args = [CC, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-DKC_FUTURE=_13_9",
            "-I" + jinc, "-o", out, os.path.join(os.path.dirname(CLIENT), "future_jitlink.c"),
            "-L" + jlib, "-l:" + jso, "-Wl,--disable-new-dtags", "-Wl,-rpath," + jlib]
    if extra:
        args.insert(1, "-DKC_FUTURE_EXTRA")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise Failure("cannot build %s:\n%s" % (out, p.stderr[-3000:]))
    return out


def t_future(tmp):
    d = os.path.join(tmp, "in")
    os.makedirs(d)
    gen = build(tmp, "gen", "13.5", jitlink=True)
    run([gen, "gen", d])
    for extra in (False, True):
        lib = build_future(tmp, extra)
        # The client of release 13.9: dlsym of __nvJitLink*_13_9 in lib.
        inc, nlib, so = nvrtc_of("13.5")
        jinc, _, _ = jitlink_of("13.5")
        exe = os.path.join(tmp, "future-client")
        args = [CC, "-O1", "-Wall", "-Werror", "-DKC_REL_MAJOR=13", "-DKC_REL_MINOR=9",
                "-DKC_JITLINK", "-DKC_DLSYM", '-DKC_JL_SONAME="%s"' % lib, "-I" + jinc,
                "-I" + inc, "-o", exe, CLIENT, "-L" + nlib, "-l:" + so,
                "-Wl,--disable-new-dtags", "-Wl,-rpath," + nlib, "-ldl"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise Failure("cannot build the 13.9 client:\n" + p.stderr[-3000:])
        ref = os.path.join(tmp, "ref.txt")
        run([exe, "link", d, ref])
        store = os.path.join(tmp, "store-%d" % extra)
        what = "with an unknown entry point" if extra else "13.9"
        for label in ("cold", "warm"):
            got = os.path.join(tmp, "got.txt")
            err = run([exe, "link", d, got], store)
            same(ref, got, "release %s %s" % (what, label))
            h, m, p_, s, e = stats(err, "link")
            if extra:
                check((h, m, p_, e) == (0, 0, N_LINK, 0),
                      "%s %s: identical, every link passes through (%s)"
                      % (what, label, (h, m, p_, s, e)))
            elif label == "cold":
                check((h, m, p_, s, e) == (0, N_LINK, 0, N_LINK, 0),
                      "release 13.9 cold: identical, its versioned names hooked by pattern "
                      "(%s)" % ((h, m, p_, s, e),))
            else:
                check((h, m, p_, e) == (N_LINK, 0, 0, 0),
                      "release 13.9 warm: identical, every link served (%s)"
                      % ((h, m, p_, s, e),))
        for f in os.listdir(d):
            if f.startswith("out-"):
                os.unlink(os.path.join(d, f))


def write_forwarder(tmp, real, soname, extra):
    """A shared library SONAME in its own directory under tmp exporting
    every function REAL exports (and, given, one more, EXTRA), each a jump
    to REAL's: a later release of that library as kcache meets it. REAL is
    reached through a link of another name, so the shim takes the forwarder
    for the library (classify_info goes by the file's name)."""
    d = os.path.join(tmp, "%s-%s" % (soname, extra or "same"))
    os.makedirs(d)
    inner = os.path.join(d, "inner-real.so")
    os.symlink(os.path.realpath(real), inner)
    nm = subprocess.run(["nm", "-D", "--defined-only", real], capture_output=True, text=True,
                        check=True).stdout
    names = sorted(set(f[2].split("@")[0] for f in (l.split() for l in nm.splitlines())
                       if len(f) == 3 and f[1] == "T"))
    c = ["#include <dlfcn.h>", "#include <stdio.h>", "#include <stdlib.h>",
         "__attribute__((used)) static void *kc_fwd[%d];" % len(names),
         "static const char *const kc_names[] = {%s};" % ", ".join('"%s"' % n for n in names),
         "__attribute__((constructor)) static void kc_init(void)", "{",
         '    void *h = dlopen("%s", RTLD_NOW | RTLD_LOCAL);' % inner,
         '    if (h == NULL) { fprintf(stderr, "forwarder: %s\\n", dlerror()); abort(); }',
         "    for (int i = 0; i < %d; i++)" % len(names),
         "        if ((kc_fwd[i] = dlsym(h, kc_names[i])) == NULL) abort();", "}"]
    for i, n in enumerate(names + ([extra] if extra else [])):
        slot = 0 if n == extra else i
        c.append('__asm__(".text\\n.globl %s\\n.type %s,@function\\n%s:\\n'
                 '    jmp *kc_fwd+%d(%%rip)\\n.size %s,.-%s\\n");' % (n, n, n, 8 * slot, n, n))
    src = os.path.join(d, "forwarder.c")
    open(src, "w").write("\n".join(c) + "\n")
    out = os.path.join(d, soname)
    p = subprocess.run([CC, "-shared", "-fPIC", "-O1", "-Wl,--build-id", "-Wl,-soname," + soname,
                        "-o", out, src, "-ldl"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise Failure("cannot build %s:\n%s" % (out, p.stderr[-3000:]))
    return out


def t_future_libs(tmp):
    client = os.path.join(os.path.dirname(CLIENT), "future_client.py")
    libs = {"nvrtc": (os.path.join(TOOLKIT, "lib64", "libnvrtc.so.13"), "libnvrtc.so.13",
                      "nvrtcGetFutureIRSize"),
            "nvvm": (os.path.join(TOOLKIT, "lib", "libnvvm.so"), "libnvvm.so.4",
                     "nvvmGetCompiledFutureResultSize")}
    for what, (real, soname, new_name) in libs.items():
        need(real, "the toolkit's " + soname)
        env = {"LD_LIBRARY_PATH": os.path.dirname(os.path.realpath(real))}
        for extra in (None, new_name):
            lib = write_forwarder(tmp, real, soname, extra)
            ref = os.path.join(tmp, "ref.txt")
            run([sys.executable, client, what, lib, ref], env=env)
            store = os.path.join(tmp, "store-%s-%s" % (what, extra or "same"))
            cold = None
            for label in ("cold", "warm"):
                got = os.path.join(tmp, "got.txt")
                err = run([sys.executable, client, what, lib, got], store,
                          env=dict(env, KCACHE_LOG="info"))
                tag = "%s %s %s" % (what, "with " + extra if extra else "forwarder", label)
                same(ref, got, tag)
                h, m, p_, s_, e = stats(err, what)
                if extra:
                    check(h == 0 and m == 0 and p_ > 0 and e == 0,
                          "%s: identical, every compile passes through (%s)"
                          % (tag, (h, m, p_, s_, e)))
                    check(re.search(r"; passthrough %s unknown_export=%d(;|$)" % (what, p_), err, re.M),
                          "%s: the stats line gives the reason (%r)" % (tag, err[-300:]))
                    check(any(extra in l for l in warnings(err)),
                          "%s: the unknown entry point is named (%s)" % (tag, warnings(err)))
                elif label == "cold":
                    cold = m
                    check(h == 0 and m > 0 and p_ == 0 and e == 0,
                          "%s: identical, compiled and stored (%s)" % (tag, (h, m, p_, s_, e)))
                else:
                    check(h == cold and m == 0 and p_ == 0 and e == 0,
                          "%s: identical, every compile served (%s)" % (tag, (h, m, p_, s_, e)))
                    check("; passthrough " not in err,
                          "%s: no reason on the stats line when nothing passed (%r)"
                          % (tag, err[-300:]))
            if extra:
                # kcache stats counts them too, with their reason, though no
                # request of those processes used the store.
                want = {"unknown_export": 2 * p_}
                got = None
                for _ in range(100):
                    out = subprocess.run([os.environ["KCACHE_TOOL"], "--dir", store, "stats",
                                          "--json"], capture_output=True, text=True,
                                         timeout=60).stdout
                    got = [b.get("passthrough_reasons") for b in json.loads(out)["backends"]
                           if b["name"] == what]
                    if got == [want]:
                        break
                    time.sleep(0.1)
                check(got == [want], "%s with %s: kcache stats --json: passthrough_reasons %s (%s)"
                      % (what, extra, want, got))


def t_flight(tmp):
    rel = "13.5"
    exe = build(tmp, "nvrtc-" + rel, rel)
    ref = os.path.join(tmp, "ref.txt")
    run([exe, "nvrtc", ref])
    store = os.path.join(tmp, "store")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(KCACHE_DIR=store, KCACHE_STATS="1", LD_PRELOAD=SHIM)
    procs = [subprocess.Popen([exe, "nvrtc", os.path.join(tmp, "p%d.txt" % i)], env=env,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    misses = hits = 0
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=280)
        check(p.returncode == 0, "process %d exited 0" % i)
        same(ref, os.path.join(tmp, "p%d.txt" % i), "process %d" % i)
        h, m, _, _, e = stats(err, "nvrtc")
        check(e == 0, "process %d: no error" % i)
        hits += h
        misses += m
    n = N_NVRTC[rel]
    # bad_option is compiled by each (never cached): 4; the rest once.
    check(misses == (n - 1) + 4 and hits == 3 * (n - 1),
          "single flight: each distinct compile made once (%d misses, %d hits)" % (misses, hits))


def t_nvrtc_cache(tmp):
    client = os.path.join(SRC, "tests", "versions", "cache_client.py")
    for rel in ("12.9", "13.0", "13.5"):
        inc, libdir, so = nvrtc_of(rel)
        lib = os.path.join(libdir, so)
        need(lib, "NVRTC " + rel)
        store = os.path.join(tmp, "store-" + rel)
        outs = {}
        for run_ in ("ref", "cold", "warm"):
            outs[run_] = os.path.join(tmp, "%s-%s.txt" % (rel, run_))
            err = run([sys.executable, client, lib, outs[run_]], None if run_ == "ref" else store)
            if run_ != "ref":
                same(outs["ref"], outs[run_], "NVRTC %s, %s run" % (rel, run_))
                h, m, pt, _, e = stats(err, "nvrtc")
                want = (0, 2, 2) if run_ == "cold" else (2, 0, 2)
                check((h, m, pt) == want and e == 0,
                      "NVRTC %s %s: %d hits, %d misses, %d pass-through (%d, %d, %d)"
                      % ((rel, run_) + want + (h, m, pt)))


def nvmath_env(tmp):
    """PYTHONPATH, LD_LIBRARY_PATH and TMPDIR for nvmath_client.py: nvmath
    and libmathdx from .venv-wheels/nvmath, NVRTC 13.5, the stand-in driver;
    libmathdx's bundled-headers directory (one per process, left behind at
    exit) in the test's own directory."""
    nm = os.path.join(WHEELS, "nvmath")
    need(os.path.join(nm, "nvmath"), "nvmath-python")
    libs = [nvrtc_of("13.5")[1], os.path.join(nm, "nvidia", "cu13", "lib"),
            os.environ["KCACHE_TEST_STANDIN_DIR"]]
    return {"PYTHONPATH": nm, "LD_LIBRARY_PATH": ":".join(libs), "TMPDIR": tmp}


def t_nvmath(tmp):
    client = os.path.join(SRC, "tests", "versions", "nvmath_client.py")
    py = os.environ.get("KCACHE_VENV_PYTHON", os.path.join(SRC, ".venv", "bin", "python"))
    need(py, "the project venv's python")
    store = os.path.join(tmp, "store")
    outs = {}
    n = 0
    for run_ in ("ref", "cold", "warm"):
        outs[run_] = os.path.join(tmp, run_ + ".txt")
        env = nvmath_env(tmp)
        if run_ == "warm":
            env["KCACHE_LOG"] = "debug"
        err = run([py, "-X", "faulthandler", client, outs[run_]],
                  None if run_ == "ref" else store,
                  timeout=900, env=env)
        print(err.strip().replace("\n", "; ") if run_ == "ref" else "", flush=True)
        if run_ != "ref":
            same(outs["ref"], outs[run_], run_ + " run")
            h, m, pt, _, e = stats(err, "nvrtc")
            if run_ == "cold":
                # libmathdx compiles each function with NVRTC more than once.
                n = m
                check(h == 0 and m >= 2 and pt == 0 and e == 0,
                      "cold: %d NVRTC compiles, all misses, no pass-through (%d hits, %d)"
                      % (m, h, pt))
            else:
                check(h == n and m == 0 and pt == 0 and e == 0,
                      "warm: all %d served (%d hits, %d misses, %d pass-through)"
                      % (n, h, m, pt))
                # The process's first compile meets libmathdx's fresh DIR:
                # its headers are checked by NVRTC's map, none read; the
                # later ones, with the same DIR, by the map too (nearly
                # none read: a file of the fill's last clock tick is).
                c = [tuple(int(x) for x in g) for g in re.findall(CHECK_RE, err)]
                check(c and c[0][0] >= 1 and c[0][1] == c[0][0] and c[0][2] == 0,
                      "warm: the first compile reads no header below libmathdx's fresh "
                      "DIR (checked, by the map, read: %s)" % c)
                check(len(c) >= 2 and all(x[1] >= 1 and x[2] * 4 <= x[0] for x in c[1:]),
                      "warm: the later compiles check their headers by the map too "
                      "(checked, by the map, read: %s)" % c)


def t_bundled(tmp):
    lib = os.path.join(nvrtc_of("13.5")[1], nvrtc_of("13.5")[2])
    need(lib, "NVRTC 13.5")
    client = os.path.join(SRC, "tests", "versions", "bundled_client.py")
    store = os.path.join(tmp, "store")
    outs = {}
    for run_ in ("ref", "cold", "warm"):
        outs[run_] = os.path.join(tmp, run_ + ".txt")
        err = run([sys.executable, client, lib, outs[run_]], None if run_ == "ref" else store)
        if run_ != "ref":
            same(outs["ref"], outs[run_], run_ + " run")
            h, m, pt, st, e = stats(err, "nvrtc")
            check(e == 0 and pt == 0, "%s: no error, no pass-through" % run_)
            want = (0, 6) if run_ == "cold" else (3, 3)
            check((h, m) == want, "%s: %d hits, %d misses (%d, %d)" % ((run_,) + want + (h, m)))
    leftover = [f for f in os.listdir(os.environ.get("TMPDIR", "/tmp"))
                if f.startswith("kcache-bundled-")]
    check(not leftover, "the witness directories are removed (%s)" % leftover)


CHECK_RE = (r"headers below the bundled headers directory: (\d+) checked, (\d+) by "
            r"NVRTC's own map, (\d+) read")


def t_pristine(tmp):
    """A hit's check of the headers below a DIR the shim's own install just
    filled from empty reads none of them (NVRTC's map of its bundled
    headers, kept in the store, answers); an entry stored from a DIR with
    an edited header still misses there, and a DIR the host filled before
    (installed and edited, or given a file of its own) is checked as
    before: read."""
    lib = os.path.join(nvrtc_of("13.5")[1], nvrtc_of("13.5")[2])
    need(lib, "NVRTC 13.5")
    client = os.path.join(SRC, "tests", "versions", "pristine_client.py")
    store = os.path.join(tmp, "store")
    n = [0]

    def go(mode, shim=True, warn=0):
        n[0] += 1
        out = os.path.join(tmp, "%d-%s.txt" % (n[0], mode))
        err = run([sys.executable, client, lib, out, mode], store if shim else None,
                  env={"KCACHE_LOG": "debug"} if shim else None)
        if not shim:
            return open(out).read(), None, None
        h, m, pt, _, e = stats(err, "nvrtc")
        w = [x for x in warnings(err) if not x.startswith(("kcache: debug:", "kcache: info:"))]
        check(e == 0 and pt == 0 and len(w) == warn,
              "%d %s: no error, no pass-through, %d warning(s) %s" % (n[0], mode, warn, w))
        c = [tuple(int(x) for x in g) for g in re.findall(CHECK_RE, err)]
        return open(out).read(), (h, m), c

    ref = {m: go(m, False)[0] for m in ("fresh", "edited", "prefilled", "other")}
    check(ref["fresh"] != ref["edited"], "the edited header changes the PTX")

    def case(mode, want_hm, label, warn=0):
        out, hm, c = go(mode, warn=warn)
        check(out == ref[mode], "%s: the output is NVRTC's own" % label)
        check(hm == want_hm, "%s: %s hits, misses (want %s)" % (label, hm, want_hm))
        return c

    # A store holding only the entry of an edited DIR.
    case("edited", (0, 1), "edited DIR, empty store")
    c = case("fresh", (0, 1), "fresh DIR after an edited DIR's entry: not served")
    check(len(c) == 1 and c[0][0] >= 1 and c[0][2] == 0,
          "fresh DIR: the edited entry's headers checked without reading one (%s)" % c)
    c = case("fresh", (1, 0), "fresh DIR: served")
    check(len(c) == 1 and c[0][0] >= 1 and c[0][1] == c[0][0] and c[0][2] == 0,
          "fresh DIR: every header checked by NVRTC's map, none read (%s)" % c)
    maps = [x for x in os.listdir(os.path.join(store, "bundled")) if "." not in x]
    check(len(maps) == 1, "one map of NVRTC 13.5's bundled headers in the store (%s)" % maps)
    path = os.path.join(store, "bundled", maps[0])
    check(os.stat(path).st_mode & 0o777 == 0o600, "the map is the owner's only")
    # A DIR the host filled is checked by reading what it holds.
    c = case("edited", (1, 0), "edited DIR: its own entry served, not the fresh DIR's")
    check(len(c) == 1 and c[0][1] == 0 and c[0][2] >= 1,
          "edited DIR: its headers read, the map not used (%s)" % c)
    c = case("prefilled", (1, 0), "DIR with a file of the host's: served")
    check(len(c) == 1 and c[0][1] == 0 and c[0][2] >= 1,
          "DIR with a file of the host's: not taken as NVRTC's install (%s)" % c)
    # The map built in another process, for another program, serves this one.
    case("other", (0, 1), "other program, fresh DIR")
    good = open(path, "rb").read()
    # A map that fails its checks is ignored (today's full check), then made again.
    bads = [("corrupt", good[:-1] + bytes([good[-1] ^ 1]), 0o600, None),
            ("truncated", good[:len(good) // 2], 0o600, None),
            ("readable by others", good, 0o644, None)]
    if os.geteuid() == 0:
        bads.append(("of another user", good, 0o600, 65534))
    else:
        print("skipped: another user's map (needs root to give the file away)", flush=True)
    for label, bad, mode, owner in bads:
        with open(path, "wb") as f:
            f.write(bad)
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner, owner)
        c = case("fresh", (1, 0), "fresh DIR, map %s" % label, warn=1)
        check(len(c) == 1 and c[0][1] == 0 and c[0][2] >= 1,
              "map %s: not used, the headers are read (%s)" % (label, c))
        st = os.stat(path)
        check(open(path, "rb").read() == good and st.st_mode & 0o777 == 0o600
              and st.st_uid == os.geteuid(),
              "map %s: made again, the same" % label)
    c = case("fresh", (1, 0), "fresh DIR, the map made again")
    check(len(c) == 1 and c[0][1] == c[0][0] and c[0][2] == 0,
          "the map made again serves (%s)" % c)
    # A process's later compile with the same DIR: the map answers for each
    # header whose stat proves it unchanged since the fill; a header edited
    # since, or an older edited tree renamed in, is read (NVRTC's output).
    for m in ("again", "again-edit", "again-swap"):
        ref[m] = go(m, False)[0]
    check(len({ref["again"], ref["again-edit"], ref["again-swap"]}) == 3,
          "the edit and the swap change the later compile's PTX")
    c = case("again", (2, 0), "a later compile in the same DIR: served")
    check(len(c) == 2 and c[1][0] >= 1 and c[1][1] >= 1 and c[1][2] * 4 <= c[1][0],
          "a later compile in the same DIR: its headers checked by the map, "
          "(nearly) none read (%s)" % c)
    for m, what in (("again-edit", "a header edited after the fill"),
                    ("again-swap", "DIR/cccl replaced by an older edited tree")):
        out, _, c = go(m)
        check(out == ref[m], "%s: the later compile's output is NVRTC's own" % what)
        check(len(c) >= 2 and c[1][2] >= 1, "%s: the later compile reads (%s)" % (what, c))


def owner_settle(store):
    """The owner run to its end in the foreground, once an owner a run
    started has ended (its lock free): the ready copies made."""
    lock = os.path.join(store, "owner.lock")
    if os.path.exists(lock):
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.flock(f, fcntl.LOCK_UN)
    p = subprocess.run([TOOL, "owner", "--idle-ms", "0"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
                       | {"KCACHE_DIR": store}, timeout=300)
    check(p.returncode == 0 and "another owner" not in p.stderr,
          "kcache owner: exit %d %s" % (p.returncode, p.stderr[-500:]))


def t_fill(tmp):
    """A hit (or a miss) whose bundled-headers DIR is empty fills it from the
    store's copy of NVRTC's install, not NVRTC's install: the DIR then holds
    what NVRTC's own install writes (every path, mode under the umask, link
    count and byte; the version marker dated now); the host's edits of its
    DIR never reach the store's copy; a copy that differs from the map is
    dropped (one warning), NVRTC installs, and a good copy is kept again;
    a miss after a fill compiles as NVRTC does."""
    lib = os.path.join(nvrtc_of("13.5")[1], nvrtc_of("13.5")[2])
    need(lib, "NVRTC 13.5")
    client = os.path.join(SRC, "tests", "versions", "pristine_client.py")
    store = os.path.join(tmp, "store")
    n = [0]
    last = [""]  # the last run's stderr

    def go(mode, shim=True, umask=0o022, modify=False, warn=0, owner=True):
        n[0] += 1
        out = os.path.join(tmp, "%d-%s.txt" % (n[0], mode))
        env = {"KC_TEST_LIST": "1"}
        if modify:
            env["KC_TEST_MODIFY"] = "1"
        if not owner:
            # No owner started by this run: the ready copies stay as settle() left them.
            env["KCACHE_TOOL"] = "/bin/true"
        if shim:
            env["KCACHE_LOG"] = "debug"
        old = os.umask(umask)
        try:
            err = run([sys.executable, client, lib, out, mode], store if shim else None, env=env)
        finally:
            os.umask(old)
        if not shim:
            return open(out).read(), None, None
        last[0] = err
        h, m, pt, _, e = stats(err, "nvrtc")
        w = [x for x in warnings(err) if not x.startswith(("kcache: debug:", "kcache: info:"))]
        check(e == 0 and pt == 0 and len(w) == warn,
              "%d %s: no error, no pass-through, %d warning(s) %s" % (n[0], mode, warn, w))
        return (open(out).read(), (h, m),
                "store" if "from the store's copy" in err else "ready" if "from a ready copy" in err
                else None)

    def settle():
        owner_settle(store)

    def tree():
        t = [x for x in os.listdir(os.path.join(store, "bundled")) if x.endswith(".tree")]
        if len(t) != 1:
            return None, t
        root = os.path.join(store, "bundled", t[0])
        files = {}
        for r, _, fs in os.walk(root):
            for f in fs:
                if f != ".nvrtc_headers_version":  # its install time
                    files[os.path.relpath(os.path.join(r, f), root)] = open(os.path.join(r, f), "rb").read()
        return root, files

    ref = go("fresh", shim=False)[0]
    # NVRTC's modes under each umask: directories 0755, files and the
    # marker 0666, its lock 0644, each less the umask.
    UMASKS = (0o022, 0o027, 0o000, 0o002, 0o077)
    refs = {um: go("fresh", shim=False, umask=um)[0] for um in UMASKS}
    ref027 = refs[0o027]
    refo = go("other", shim=False)[0]
    check("marker-age-ok True" in ref and ref.count("\nfile ") > 2000,
          "NVRTC's install: %d files, its marker dated now" % ref.count("\nfile "))
    check(len(set(refs.values())) == len(UMASKS) and refs[0o022] == ref,
          "the umask decides NVRTC's modes")
    check("dir cccl 755" in refs[0o000] and "dir cccl 755" in refs[0o002] and
          "file .nvrtc_install.lock 644 " in refs[0o002] and "dir cccl 700" in refs[0o077],
          "NVRTC's install: directories 0755 and its lock 0644, less the umask")
    out, hm, filled = go("fresh")
    check(out == ref and hm == (0, 1) and not filled,
          "cold: NVRTC installs (%s, filled %s), DIR as NVRTC's" % (hm, filled))
    root, files = tree()
    check(root is not None and os.stat(root).st_mode & 0o777 == 0o700 and len(files) > 2000,
          "the store keeps one private copy of the install (%s)" % (root,))
    for label, mode, um, want in [("warm", "fresh", 0o022, ref)] + [
            ("warm, umask %03o" % u, "fresh", u, refs[u]) for u in UMASKS[1:]]:
        out, hm, filled = go(mode, umask=um)
        check(hm == (1, 0) and filled, "%s: a hit, DIR filled from the store's copy (%s, %s)"
              % (label, hm, filled))
        check(out == want, "%s: DIR holds what NVRTC's install writes (paths, modes, links, bytes, "
              "a marker dated now)%s" % (label, "" if out == want else
                                         "\n" + "\n".join(sorted(set(out.splitlines()) ^ set(want.splitlines())))[:1500]))
    before = tree()[1]
    out, hm, filled = go("fresh", modify=True)
    check(out == ref and filled and tree()[1] == before,
          "the host's edit and removal in its DIR leave the store's copy as it was")
    out, hm, filled = go("other")
    check(out == refo and hm == (0, 1) and filled,
          "a miss after a fill compiles as NVRTC does (%s, filled %s)" % (hm, filled))
    # A copy that differs from the map: dropped, NVRTC installs, kept again.
    # (With no ready copy: those are made from the copy before it changed.)
    settle()
    for x in os.listdir(os.path.join(store, "bundled")):
        if ".ready." in x:
            shutil.rmtree(os.path.join(store, "bundled", x))
    victim = os.path.join(root, "cuda_fp16.h")
    with open(victim, "ab") as f:
        f.write(b"// not NVRTC's\n")
    # The owner checks every file it copies against the map: none made.
    settle()
    check(not [x for x in os.listdir(os.path.join(store, "bundled")) if ".ready." in x],
          "a corrupt store copy: the owner makes no ready copy of it (%s)"
          % sorted(os.listdir(os.path.join(store, "bundled"))))
    out, hm, filled = go("fresh", warn=1, owner=False)
    check(out == ref and hm == (1, 0) and not filled,
          "a corrupt copy: one warning, NVRTC installs, DIR as NVRTC's (%s, filled %s)" % (hm, filled))
    check(tree()[1] == before, "a good copy is kept again (%s)" % (tree()[0],))
    out, hm, filled = go("fresh")
    check(out == ref and filled, "then served from it again")

    # Ready copies: the owner keeps two per umask a host asked for, with
    # that umask's modes; a hit moves one into its DIR, which then holds
    # what NVRTC's install writes, every entry dated now.
    bdir = os.path.join(store, "bundled")
    hexid = os.path.basename(tree()[0])[:-len(".tree")]

    def ready(umask):
        pre = "%s.ready.%03o." % (hexid, umask)
        return sorted(os.path.join(bdir, x) for x in os.listdir(bdir) if x.startswith(pre))

    def backdate(root):
        for r, ds, fs in os.walk(root):
            for x in ds + fs:
                os.utime(os.path.join(r, x), (time.time() - 86400, time.time() - 86400))

    settle()
    check(os.path.exists(os.path.join(bdir, hexid + ".want.022")) and
          os.path.exists(os.path.join(bdir, hexid + ".want.027")),
          "a want for each umask a hit filled a DIR with (%s)" % sorted(os.listdir(bdir)))
    for um in UMASKS:
        r = ready(um)
        check(len(r) == 2, "umask %03o: two ready copies (%s; %s)" % (um, r, sorted(os.listdir(bdir))))
        modes = set()
        for root, ds, fs in os.walk(r[0]):
            modes |= {("d", os.lstat(os.path.join(root, x)).st_mode & 0o7777) for x in ds}
            modes |= {("f", os.lstat(os.path.join(root, x)).st_mode & 0o7777) for x in fs}
        check(modes == {("d", 0o755 & ~um), ("f", 0o666 & ~um)},
              "umask %03o: a ready copy has that umask's modes (%s)" % (um, modes))
        for x in r:
            backdate(x)
        out, hm, filled = go("fresh", umask=um, owner=False)
        check(hm == (1, 0) and filled == "ready" and len(ready(um)) == 1,
              "umask %03o: a hit moves a ready copy in (%s, %s)" % (um, hm, filled))
        check(out == refs[um] and "entries-dated-now True" in out,
              "umask %03o: DIR from a ready copy holds what NVRTC's install writes, "
              "every entry dated now%s" % (um, "" if out == refs[um] else "\n" + "\n".join(
                  sorted(set(out.splitlines()) ^ set(refs[um].splitlines())))[:1500]))
    left = [x for x in os.listdir(bdir) if ".claim." in x or ".prep." in x]
    check(not left, "no claimed or half-made copy is left (%s)" % left)
    # The owner's proof: a ready copy it made and checked carries in its
    # name the time since which nothing of it changed (a local filesystem
    # with nanosecond times); a hit takes each file whose ctime is older
    # for checked, none read. A copy without the proof (an older owner's)
    # is read as before.
    PROVED = re.compile(r"from a ready copy: ([0-9]+) files \(([0-9]+) by their ctime\)")
    for x in ready(0o022):
        shutil.rmtree(x)
    settle()
    r = ready(0o022)
    check(len(r) == 2 and all(re.search(r"\.t[0-9]+_[0-9]{9}$", x) for x in r),
          "the owner's ready copies carry its proof (%s)" % r)
    out, hm, filled = go("fresh", owner=False)
    pm = PROVED.search(last[0])
    check(out == ref and filled == "ready" and pm is not None and pm.group(1) == pm.group(2) and
          int(pm.group(1)) > 2000,
          "a ready copy the owner made: every file proved by its ctime, none read (%s)"
          % (pm.group(0) if pm else [x for x in last[0].splitlines() if "bundled" in x][-3:]))
    r = ready(0o022)
    bare = re.sub(r"\.t[0-9]+_[0-9]{9}$", "", r[0])
    os.rename(r[0], bare)
    out, hm, filled = go("fresh", owner=False)
    check(out == ref and filled == "ready" and not PROVED.search(last[0]) and not os.path.exists(bare),
          "a ready copy without the proof: claimed, every file read (%s)"
          % [x for x in last[0].splitlines() if "bundled" in x][-2:])
    # A ready copy that is not NVRTC's (a byte, a mode, an extra file) is
    # not served: the store's copy fills DIR, no warning.
    # (Rewritten in place after the owner made it, the same size, its
    # times set back or not: its ctime is newer than the owner's proof.)
    def flip(r, rel, back):
        f = os.path.join(r, rel)
        st = os.stat(f)
        with open(f, "r+b") as h:
            h.seek(st.st_size // 2)
            b = h.read(1)
            h.seek(st.st_size // 2)
            h.write(bytes([b[0] ^ 1]))
        if back:
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        check(os.stat(f).st_size == st.st_size, "flipped in place: %s" % rel)

    def deep(r):
        for root, _, fs in os.walk(os.path.join(r, "cccl")):
            fs = [x for x in fs if os.path.getsize(os.path.join(root, x)) > 0]
            if root.count(os.sep) - r.count(os.sep) >= 3 and fs:
                return os.path.relpath(os.path.join(root, sorted(fs)[0]), r)
        return "cuComplex.h"

    for label, spoil in (("an edited header", lambda r: open(os.path.join(r, "cuda_fp16.h"), "ab")
                          .write(b"// not NVRTC's\n")),
                         ("a header's mode", lambda r: os.chmod(os.path.join(r, "cuComplex.h"),
                                                                0o666)),
                         ("a file of another's", lambda r: open(os.path.join(r, "cccl", "x.h"), "w")
                          .write("//\n")),
                         ("a header missing", lambda r: os.unlink(os.path.join(r, "cuComplex.h"))),
                         ("a byte flipped in place", lambda r: flip(r, "cuda_fp16.h", False)),
                         ("a byte flipped, its times set back",
                          lambda r: flip(r, "cuda_fp16.h", True)),
                         ("a deep header's byte flipped, its times set back",
                          lambda r: flip(r, deep(r), True))):
        settle()
        r = ready(0o022)
        for x in r[1:]:
            shutil.rmtree(x)
        spoil(r[0])
        out, hm, filled = go("fresh", owner=False)
        check(out == ref and hm == (1, 0) and filled == "store" and not ready(0o022),
              "a ready copy with %s: not used, the store's copy fills DIR (%s, %s)"
              % (label, hm, filled))
    # The host's edits of a DIR filled from a ready copy reach nothing of the store's.
    settle()
    before, pool = tree()[1], set(ready(0o022))
    out, hm, filled = go("fresh", modify=True, owner=False)
    left = set(ready(0o022))
    check(filled == "ready" and tree()[1] == before and len(left) == 1 and left < pool and
          open(os.path.join(left.pop(), "cuda_fp16.h"), "rb").read() == before["cuda_fp16.h"],
          "the host's edit in a DIR from a ready copy leaves the store's copies as they were")
    # A read-only store is never written: its hits copy, the ready copies stay.
    settle()
    pool = set(ready(0o022))
    n[0] += 1
    o = os.path.join(tmp, "%d-readonly.txt" % n[0])
    err = run([sys.executable, client, lib, o, "fresh"], store,
              env={"KC_TEST_LIST": "1", "KCACHE_LOG": "debug", "KCACHE_READONLY": "1",
                   "KCACHE_TOOL": "/bin/true"})
    check(open(o).read() == ref and "from the store's copy" in err and set(ready(0o022)) == pool,
          "a read-only store: DIR from the store's copy, no ready copy claimed")
    # Processes racing for the ready copies: each claimed once, the rest copy.
    settle()
    procs = []
    for i in range(4):
        o = os.path.join(tmp, "race-%d.txt" % i)
        e = dict({k: v for k, v in os.environ.items()
                  if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")},
                 KC_TEST_LIST="1", KCACHE_LOG="debug", KCACHE_TOOL="/bin/true", KCACHE_DIR=store,
                 KCACHE_STATS="1", LD_PRELOAD=SHIM)
        procs.append((o, subprocess.Popen([sys.executable, client, lib, o, "fresh"], env=e,
                                          stderr=subprocess.PIPE, text=True)))
    srcs = []
    for o, p in procs:
        err = p.communicate(timeout=280)[1]
        check(p.returncode == 0 and open(o).read() == ref,
              "racing hits: each DIR as NVRTC's (exit %d)" % p.returncode)
        srcs.append("ready" if "from a ready copy" in err else "store" if "from the store's copy"
                    in err else None)
    check(sorted(srcs) == ["ready", "ready", "store", "store"],
          "racing hits: the two ready copies claimed once each, the others copied (%s)" % srcs)
    # The store's copy and map gone: the owner removes the wants and their copies.
    shutil.rmtree(tree()[0])
    os.unlink(os.path.join(bdir, hexid))
    settle()
    check(not [x for x in os.listdir(bdir) if ".ready." in x or ".want." in x],
          "no store copy or map: no ready copy or want is left (%s)" % sorted(os.listdir(bdir)))


# How much later NVRTC alone starts in each fill_race round.
PLAIN_LATE = [0.0, 0.03, 0.15, 1.5]


def t_fill_race(tmp):
    """One fresh bundled-headers DIR shared by processes that compile at the
    same moment, four under kcache with a warm store (each may fill DIR:
    from a ready copy on the store's filesystem, from the store's copy on
    tmpfs) and two of NVRTC alone: every compile succeeds with NVRTC's own
    output, and DIR ends as NVRTC's install leaves it. A fill only adds to
    DIR under NVRTC's install lock; it never removes or replaces a file
    another process may be reading."""
    lib = os.path.join(nvrtc_of("13.5")[1], nvrtc_of("13.5")[2])
    need(lib, "NVRTC 13.5")
    client = os.path.join(SRC, "tests", "versions", "pristine_client.py")
    store = os.path.join(tmp, "store")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}

    def listing(d):
        """What DIR holds: each entry's path, type and mode, a file's bytes
        (the version marker's without its install time)."""
        rows = []
        for root, ds, fs in os.walk(d):
            for name in ds + fs:
                f = os.path.join(root, name)
                st = os.lstat(f)
                row = "%s %s %o" % (os.path.relpath(f, d), "d" if name in ds else "f",
                                    st.st_mode & 0o7777)
                if name in fs:
                    data = open(f, "rb").read()
                    if name == ".nvrtc_headers_version":
                        data = b"".join(x for x in data.splitlines(True)
                                        if not x.startswith(b"timestamp"))
                    row += " " + hashlib.sha256(data).hexdigest()[:16]
                rows.append(row)
        return sorted(rows)

    ref = os.path.join(tmp, "ref.txt")
    d = tempfile.mkdtemp(prefix="kc_race_", dir=tmp)
    run([sys.executable, client, lib, ref, "fresh"], env={"KC_TEST_DIR": d})
    ref, want = open(ref).read(), listing(d)
    shutil.rmtree(d)
    # Warm: the entry and the store's copy (cold), then a hit that fills a
    # DIR and asks for ready copies.
    for i in range(2):
        run([sys.executable, client, lib, os.path.join(tmp, "warm%d.txt" % i), "fresh"], store)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    where = [("the store's filesystem", tmp)] + ([("tmpfs", shm)] if shm else [])
    if shm is None:
        print("skipped: tmpfs rounds (no writable /dev/shm)", flush=True)
    rounds = int(os.environ.get("KC_TEST_ROUNDS", "4"))
    filled = {label: 0 for label, _ in where}
    for label, parent in where:
        for r in range(rounds):
            if parent == tmp:
                owner_settle(store)  # two ready copies
            d = tempfile.mkdtemp(prefix="kc_race_", dir=parent)
            start = time.time() + 2.0
            # NVRTC alone starts with the others, then a little and a lot
            # later: on a busy machine a plain install can win every
            # same-moment round (stop 52's CI: 0 fills in 4), and a round
            # where kcache starts first is the one that shows a fill racing
            # a plain install (or a plain NVRTC meeting a filled DIR).
            late = PLAIN_LATE[r % len(PLAIN_LATE)]
            procs = []
            try:
                for i in range(6):
                    o = os.path.join(tmp, "race-%d.txt" % i)
                    if os.path.exists(o):
                        os.unlink(o)
                    e = dict(base, KC_TEST_DIR=d,
                             KC_TEST_START="%.6f" % (start + (late if i >= 4 else 0.0)))
                    if i < 4:
                        e.update(KCACHE_DIR=store, KCACHE_STATS="1", LD_PRELOAD=SHIM,
                                 KCACHE_TOOL="/bin/true", KCACHE_LOG="debug")
                    procs.append((i, o, subprocess.Popen([sys.executable, client, lib, o, "fresh"],
                                                         env=e, stderr=subprocess.PIPE, text=True)))
                bad, fills = [], 0
                for i, o, p in procs:
                    err = p.communicate(timeout=280)[1]
                    who = "kcache" if i < 4 else "NVRTC alone"
                    got = open(o).read() if os.path.exists(o) else ""
                    if p.returncode != 0 or got != ref:
                        bad.append("%d (%s): exit %d, %r %s"
                                   % (i, who, p.returncode, got[:40], err[-400:]))
                    elif i < 4 and stats(err, "nvrtc")[:2] + stats(err, "nvrtc")[4:] != (1, 0, 0):
                        bad.append("%d (%s): not one hit, no error: %s" % (i, who, err[-400:]))
                    fills += "nvrtc: bundled headers in %s from " % d in err
                filled[label] += fills
                check(not bad, "%s, round %d: 4 kcache and 2 plain processes (%.2f s later) in "
                      "one fresh DIR, each with NVRTC's output (%d filled it)%s"
                      % (label, r, late, fills, "".join("\n  " + b for b in bad)))
                got = listing(d)
                check(got == want, "%s, round %d: DIR holds what NVRTC's install writes%s"
                      % (label, r, "" if got == want else "\n" + "\n".join(
                          sorted(set(got) ^ set(want)))[:1500]))
            finally:
                for _, _, p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                shutil.rmtree(d, ignore_errors=True)
        check(filled[label] >= 1, "%s: a kcache process filled DIR in %d of %d rounds"
              % (label, filled[label], rounds))


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("nvrtc", "link", "future", "future_libs", "flight",
                                                 "bundled", "nvrtc_cache", "nvmath",
                                                 "pristine", "fill", "fill_race"):
        print(__doc__, file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="kcache-versions-")
    try:
        globals()["t_" + sys.argv[1]](tmp)
        return 0
    except Failure as e:
        print("FAIL: %s" % e, flush=True)
        return 1
    finally:
        rm_settled(tmp)


if __name__ == "__main__":
    sys.exit(main())
