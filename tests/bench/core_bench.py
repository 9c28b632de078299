#!/usr/bin/env python3
"""core_bench: times the demo kernel set (examples/train.py) compiled through
cuda.core, in one process, with or without cuda.core's own persistent program
cache. scripts/bench runs it with and without the kcache shim preloaded.

    core_bench.py [--cache DIR [--unchecked]] [--repeat N] [--arch sm_90] KERNEL...

Before anything is timed, libnvrtc is mapped into the process: dlopen of the
very file cuda.bindings will use, through cuda.pathfinder, whose answer
cuda.bindings reuses. That is ~6-7 ms that every side pays, that no cache can
skip (cuda.core's key derivation needs NVRTC's version too) and whose spread
between processes is larger than a hit. Its time is printed apart
("load_ms"). "first_ms" is the first hit of a fresh process, from there on:
it still includes cuda.bindings resolving NVRTC's functions (through the
shim's dlsym, under kcache) and each side's first-use set-up.

Prints one JSON line per kernel: load_ms, the first compile's milliseconds,
p50/p99 of the rest in microseconds, the output size and, with --cache, how
cuda.core's cache was used. The code is what cuda.core's documentation asks of
a user for each kind of kernel, so that a hit gives what a compile gives:

  "compile(cache=)"   Program.compile(..., cache=FileStreamProgramCache)
  "key+tree digest"   include paths: cuda.core refuses cache= and requires an
                      extra_digest that fingerprints the headers NVRTC may
                      read. Which ones it reads is not known before compiling,
                      so the digest covers every file under the include paths
                      -- path, size and mtime, the same evidence kcache checks
                      on the headers actually read (hashing the bytes, as the
                      docs word it, costs several times more)
  "key+mapping"       name expressions: the same escape hatch. A cached
                      ObjectCode loses symbol_mapping, so the mapping is kept
                      in the cache beside the cubin and restored on a hit;
                      without it get_kernel(name expression) fails after a hit

--unchecked takes the shortcuts instead: a constant extra_digest (no header is
checked; an edited header is served stale) and no symbol mapping ("key+const
digest", "key, mapping dropped"). scripts/bench shows both.

Each timed call covers Program() and compile (and, for the escape hatch, the
key derivation, digest, cache reads and ObjectCode construction), as a user's
code would run it.
"""
import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import cuda.pathfinder  # noqa: E402
from cuda.core import ObjectCode, Program, ProgramOptions  # noqa: E402

import train  # noqa: E402


def tree_digest(dirs):
    """Path, size and mtime of every file under `dirs`."""
    h = hashlib.blake2b(digest_size=32)
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs.sort()
            for f in sorted(files):
                p = os.path.join(root, f)
                st = os.stat(p)
                h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.digest()


def compile_fn(name, src, extra, names, arch, cache, unchecked):
    opts = ProgramOptions(name=name, arch=arch, **extra)
    if cache is None:
        def run():
            prog = Program(src, "c++", opts)
            obj = prog.compile("cubin", name_expressions=names)
            n = len(bytes(obj.code))
            prog.close()
            return n
        return run, None
    if not names and "include_path" not in extra:
        def run():
            prog = Program(src, "c++", opts)
            obj = prog.compile("cubin", cache=cache)
            n = len(bytes(obj.code))
            prog.close()
            return n
        return run, "compile(cache=)"
    from cuda.core.utils import make_program_cache_key
    incs = extra.get("include_path") or []
    incs = [incs] if isinstance(incs, str) else list(incs)
    keep_mapping = bool(names) and not unchecked

    def run():
        digest = None
        if incs:
            digest = b"kcache-bench-fixed" if unchecked else tree_digest(incs)
        key = make_program_cache_key(code=src, code_type="c++", options=opts,
                                     target_type="cubin",
                                     name_expressions=names,
                                     extra_digest=digest)
        mkey = hashlib.blake2b(key + b"\0symbol_mapping").digest()
        data = cache.get(key)
        mapping = None
        if data is not None and keep_mapping:
            m = cache.get(mkey)
            mapping = ({k: v.encode() for k, v in json.loads(m).items()}
                       if m is not None else None)
            if mapping is None:
                data = None
        if data is None:
            prog = Program(src, "c++", opts)
            obj = prog.compile("cubin", name_expressions=names)
            cache[key] = obj
            if keep_mapping:
                cache[mkey] = json.dumps({k: v.decode() for k, v in
                                          obj.symbol_mapping.items()}).encode()
            prog.close()
        else:
            obj = ObjectCode.from_cubin(data, symbol_mapping=mapping)
        return len(bytes(obj.code))
    if unchecked:
        how = "key+const digest" if incs else "key, mapping dropped"
    else:
        how = "key+tree digest" if incs else "key+mapping"
    return run, how


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", metavar="DIR")
    ap.add_argument("--unchecked", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("kernels", nargs="+")
    args = ap.parse_args()
    cache = None
    if args.cache:
        from cuda.core.utils import FileStreamProgramCache
        cache = FileStreamProgramCache(args.cache)
    table = {k[0]: k for k in train.KERNELS}
    for k in args.kernels:
        if k not in table:
            ap.error(f"unknown kernel {k}")
    t0 = time.perf_counter()
    cuda.pathfinder.load_nvidia_dynamic_lib("nvrtc")
    load_ms = (time.perf_counter() - t0) * 1e3
    for k in args.kernels:
        name, src, extra, names = table[k]
        run, how = compile_fn(name, src, extra, names, args.arch, cache, args.unchecked)
        times = []
        nbytes = 0
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            nbytes = run()
            times.append(time.perf_counter() - t0)
        rest = sorted(times[1:])
        rec = {"kernel": name, "load_ms": round(load_ms, 3),
               "first_ms": round(times[0] * 1e3, 3),
               "p50_us": round(rest[len(rest) // 2] * 1e6, 2) if rest else 0.0,
               "p99_us": round(rest[min(len(rest) - 1, int(len(rest) * 0.99))] * 1e6, 2)
               if rest else 0.0,
               "bytes": nbytes}
        if how:
            rec["core_cache"] = how
        print(json.dumps(rec), flush=True)
        load_ms = 0.0
    if cache is not None:
        cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
