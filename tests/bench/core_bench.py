#!/usr/bin/env python3
"""core_bench: times the demo kernel set (examples/train.py) compiled through
cuda.core, in one process, with or without cuda.core's own persistent program
cache. scripts/bench runs it with and without the kcache shim preloaded.

    core_bench.py [--cache DIR] [--repeat N] [--arch sm_90] KERNEL...

Prints one JSON line per kernel: the first compile's milliseconds (the one a
fresh process pays), p50/p99 of the rest in microseconds, the output size and,
with --cache, how cuda.core's cache was used:

  "compile(cache=)"   Program.compile(..., cache=FileStreamProgramCache)
  "key+extra_digest"  cuda.core refuses cache= for include paths; its
                      documented escape hatch is make_program_cache_key with
                      a caller-supplied extra_digest. We pass a constant, so
                      this hit checks no header (kcache's checks every one)
  "key"               name expressions: the same escape hatch; the symbol
                      mapping is not carried across a cuda.core cache hit

Each timed call covers Program() and compile (and, for the escape hatch, the
key derivation and ObjectCode construction), as a user's code would run it.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

from cuda.core import ObjectCode, Program, ProgramOptions  # noqa: E402

import train  # noqa: E402


def compile_fn(name, src, extra, names, arch, cache):
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
    extra_digest = b"kcache-bench-fixed" if "include_path" in extra else None

    def run():
        key = make_program_cache_key(code=src, code_type="c++", options=opts,
                                     target_type="cubin",
                                     name_expressions=names,
                                     extra_digest=extra_digest)
        data = cache.get(key)
        if data is None:
            prog = Program(src, "c++", opts)
            obj = prog.compile("cubin", name_expressions=names)
            cache[key] = obj
            prog.close()
        else:
            obj = ObjectCode.from_cubin(data)
        return len(bytes(obj.code))
    return run, "key+extra_digest" if extra_digest else "key"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", metavar="DIR")
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
    for k in args.kernels:
        name, src, extra, names = table[k]
        run, how = compile_fn(name, src, extra, names, args.arch, cache)
        times = []
        nbytes = 0
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            nbytes = run()
            times.append(time.perf_counter() - t0)
        rest = sorted(times[1:])
        rec = {"kernel": name, "first_ms": round(times[0] * 1e3, 3),
               "p50_us": round(rest[len(rest) // 2] * 1e6, 2) if rest else 0.0,
               "p99_us": round(rest[min(len(rest) - 1, int(len(rest) * 0.99))] * 1e6, 2)
               if rest else 0.0,
               "bytes": nbytes}
        if how:
            rec["core_cache"] = how
        print(json.dumps(rec), flush=True)
    if cache is not None:
        cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
