#!/usr/bin/env python3
"""NVRTC path tests: the test clients run with and without the kcache shim.

Usage: test_nvrtc.py TEST LINKED_CLIENT DLOPEN_CLIENT

TEST is one of:
  identity-linked, identity-dlopen
      no shim vs cold vs warm vs threaded warm vs KCACHE_DISABLE=1 vs
      KCACHE_NVRTC=0: every dump, stdout and stderr identical; then
      KCACHE_STATS=1: a cold store misses every cacheable compile, a warm one
      hits every one and misses none.
  threads      threads compiling identical and different programs at once, on
               a cold store and then a warm one.
  headers      a header under an -I directory: one changed byte recompiles, the
               old bytes hit again; a header appearing earlier on the include
               path recompiles; same in one long-lived process.
  modes        KCACHE_READONLY=1 and KCACHE_RECACHE=1.
  multiproc    8 processes (4 of each client) compile the set at once on a cold
               store; all outputs identical; a second wave is all hits.

Environment (tests/meson.build): KCACHE_SHIM, the shim to preload.
Exit status 0 on success, 1 on a failed check (with a message), 77 to skip.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types

STATS_RE = re.compile(
    rb"^kcache: stats: nvrtc hits=(\d+) misses=(\d+) passthrough=(\d+)"
    rb" stores=(\d+) errors=(\d+)", re.M)
STATS_LINE_RE = re.compile(rb"^kcache: stats: .*\n?", re.M)
SUMMARY_RE = re.compile(
    rb"threads=(\d+) cacheable=(\d+) uncached=(\d+) passthrough=(\d+)")

HEADER_VALUE = b"1234567"


class Failure(Exception):
    pass


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

def check(cond, msg):
    if not cond:
        raise Failure(msg)


class Run:
    """The result of one client run."""

    def __init__(self, label, proc, dump_path):
        self.label = label
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        with open(dump_path, "rb") as f:
            self.dump = f.read()
        m = SUMMARY_RE.search(self.stdout)
        check(m, f"{label}: no summary line on stdout: {self.stdout!r}")
        self.threads, self.cacheable, self.uncached, self.passthrough = (
            int(x) for x in m.groups())

    def stats(self):
        """(hits, misses, passthrough, stores, errors) from KCACHE_STATS."""
        lines = STATS_LINE_RE.findall(self.stderr)
        check(len(lines) == 1,
              f"{self.label}: expected exactly one 'kcache: stats:' line on "
              f"stderr, got {len(lines)}: {self.stderr[-2000:]!r}")
        m = STATS_RE.search(self.stderr)
        check(m, f"{self.label}: stats line does not match "
                 f"'nvrtc hits=.. misses=.. passthrough=.. stores=.. errors=..':"
                 f" {lines[0]!r}")
        return tuple(int(x) for x in m.groups())

    def pass_reasons(self):
        """NVRTC's pass-through reasons from the stats line ({} when none)."""
        m = re.search(rb"; passthrough ([^;\n]*)", self.stderr, re.M)
        out = {}
        for part in (m.group(1).decode().split(", ") if m else []):
            name, *kvs = part.split(" ")
            if name == "nvrtc":
                out = {k: int(v) for k, v in (kv.split("=") for kv in kvs)}
        return out

    def stderr_without_stats(self):
        return STATS_LINE_RE.sub(b"", self.stderr)


def parse_dump(data):
    """Splits a dump into [(section, case, [records])]."""
    out = []
    section = ""
    for block in re.split(rb"^(?====|###)", data, flags=re.M):
        if not block:
            continue
        if block.startswith(b"==="):
            section = block.split(b"\n", 1)[0].decode()
            continue
        head, _, body = block.partition(b"\n")
        case = head.decode().replace("### case ", "")
        records = []
        pos = 0
        while pos < len(body):
            nl = body.index(b"\n", pos)
            line = body[pos:nl]
            m = re.match(rb"@(\S+) rc=(-?\d+) len=(\d+)$", line)
            if m:
                n = int(m.group(3))
                records.append((m.group(1).decode(errors="replace"),
                                line, body[nl + 1:nl + 1 + n]))
                pos = nl + 1 + n + 1
            else:
                records.append((line.decode(errors="replace"), line, b""))
                pos = nl + 1
        out.append((section, case, records))
    return out


def describe_diff(a, b):
    """A readable account of the first difference between two dumps."""
    pa, pb = parse_dump(a), parse_dump(b)
    for (sa, ca, ra), (sb, cb, rb_) in zip(pa, pb):
        if (sa, ca) != (sb, cb):
            return f"sections differ: {sa} {ca} vs {sb} {cb}"
        for x, y in zip(ra, rb_):
            if x != y:
                return (f"{sa} case {ca}: record {x[0]}: {x[1][:120]!r} "
                        f"({len(x[2])} bytes) vs {y[1][:120]!r} "
                        f"({len(y[2])} bytes)")
        if len(ra) != len(rb_):
            return f"{sa} case {ca}: {len(ra)} records vs {len(rb_)}"
    if len(pa) != len(pb):
        return f"{len(pa)} sections vs {len(pb)}"
    return "dumps differ in framing"


def same_dump(ref, run, what=None):
    data = run.dump if what is None else what
    if data != ref.dump:
        raise Failure(f"{run.label}: dump differs from {ref.label}: "
                      f"{describe_diff(ref.dump, data)}")


def same_streams(ref, run, strip_stats=False):
    check(run.rc == ref.rc,
          f"{run.label}: exit status {run.rc}, {ref.label} had {ref.rc}")
    check(run.stdout == ref.stdout,
          f"{run.label}: stdout differs from {ref.label}:\n"
          f"{run.stdout[-1500:]!r}\nvs\n{ref.stdout[-1500:]!r}")
    err = run.stderr_without_stats() if strip_stats else run.stderr
    check(err == ref.stderr,
          f"{run.label}: stderr differs from {ref.label}:\n"
          f"{err[-1500:]!r}\nvs\n{ref.stderr[-1500:]!r}")


class Env:
    def __init__(self, tmp):
        self.tmp = tmp
        self.shim = os.environ.get("KCACHE_SHIM", "")
        check(self.shim and os.path.exists(self.shim),
              f"KCACHE_SHIM={self.shim!r} does not exist (build the shim)")
        self.base = {k: v for k, v in os.environ.items()
                     if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}
        self.base["HOME"] = os.path.join(tmp, "home")
        self.base.pop("XDG_CACHE_HOME", None)
        os.makedirs(self.base["HOME"], exist_ok=True)
        self.incdirs = [os.path.join(tmp, "incA"), os.path.join(tmp, "incB")]
        for d in self.incdirs:
            os.makedirs(d, exist_ok=True)
        self.header = os.path.join(self.incdirs[1], "kc_test_header.h")
        self.write_header(self.header, HEADER_VALUE)
        self.trace = os.path.join(tmp, "trace")
        self.n = 0

    @staticmethod
    def write_header(path, value):
        with open(path, "wb") as f:
            f.write(b"/* kcache test header */\n#pragma once\n"
                    b"#define KC_TEST_VALUE " + value + b"u\n")

    def store(self, name):
        d = os.path.join(self.tmp, "store-" + name)
        os.makedirs(d, exist_ok=True)
        return d

    def env(self, shim=True, store=None, **kv):
        e = dict(self.base)
        if shim:
            e["LD_PRELOAD"] = self.shim
        e["KCACHE_DIR"] = store or self.store("unused")
        for k, v in kv.items():
            e[k] = str(v)
        return e

    def args(self, client, dump, cases=None, threads=0, rounds=0):
        a = [client, "--dump", dump, "--trace", self.trace]
        for d in self.incdirs:
            a += ["--incdir", d]
        if cases:
            a += ["--cases", ",".join(cases)]
        if threads:
            a += ["--threads", str(threads)]
        if rounds:
            a += ["--rounds", str(rounds)]
        return a

    def run(self, label, client, shim=True, store=None, cases=None,
            threads=0, timeout=120, **kv):
        self.n += 1
        dump = os.path.join(self.tmp, f"dump{self.n}")
        proc = subprocess.run(
            self.args(client, dump, cases, threads),
            env=self.env(shim, store, **kv), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        check(proc.returncode == 0,
              f"{label}: client exited with {proc.returncode}; stderr:\n"
              f"{proc.stderr.decode(errors='replace')[-3000:]}")
        r = Run(label, proc, dump)
        print(f"  ran {label}: cacheable={r.cacheable} uncached={r.uncached} "
              f"passthrough={r.passthrough}", flush=True)
        return r


def expect_reasons(run, passthrough):
    """Every pass-through has its reason on the stats line; the client's
    own (time trace, PCH) are options kcache leaves to NVRTC."""
    why = run.pass_reasons()
    check(sum(why.values()) == passthrough,
          f"{run.label}: the stats line's reasons {why} account for all {passthrough} "
          f"pass-throughs")
    check(why.get("option", 0) >= run.passthrough,
          f"{run.label}: at least {run.passthrough} pass-throughs for an option ({why})")


def expect_warm(run):
    """Every cacheable compile hit, nothing compiled."""
    hits, misses, passthrough, stores, errors = run.stats()
    check(hits == run.cacheable,
          f"{run.label}: nvrtc hits={hits}, expected {run.cacheable} "
          f"(every cacheable compile)")
    check(misses <= run.uncached,
          f"{run.label}: nvrtc misses={misses}; a warm store may miss only "
          f"the {run.uncached} compiles whose errors are never cached")
    check(passthrough >= run.passthrough,
          f"{run.label}: nvrtc passthrough={passthrough}, expected at least "
          f"{run.passthrough} (time trace, PCH)")
    expect_reasons(run, passthrough)
    check(errors == 0, f"{run.label}: nvrtc errors={errors}")
    check(stores == 0, f"{run.label}: nvrtc stores={stores} on a warm store")


def expect_cold(run, stored=True):
    """Every cacheable compile missed (and, unless read-only, was stored)."""
    hits, misses, passthrough, stores, errors = run.stats()
    check(hits == 0, f"{run.label}: nvrtc hits={hits} on a cold store")
    check(run.cacheable <= misses <= run.cacheable + run.uncached,
          f"{run.label}: nvrtc misses={misses}, expected {run.cacheable} "
          f"(+ up to {run.uncached} uncached errors)")
    check(passthrough >= run.passthrough,
          f"{run.label}: nvrtc passthrough={passthrough}, expected at least "
          f"{run.passthrough}")
    expect_reasons(run, passthrough)
    check(errors == 0, f"{run.label}: nvrtc errors={errors}")
    if stored:
        # Identical artifacts may share a record, so at most one per compile.
        check(0 < stores <= run.cacheable,
              f"{run.label}: nvrtc stores={stores}, expected 1.."
              f"{run.cacheable}")
    else:
        check(stores == 0, f"{run.label}: nvrtc stores={stores} read-only")


def split_threads(dump):
    """Thread sections of a threaded dump: {index: bytes}."""
    parts = re.split(rb"^=== thread (\d+)\n", dump, flags=re.M)
    check(parts[0] == b"", "threaded dump does not start with a thread mark")
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def drop_case(dump, case):
    return re.sub(rb"^### case " + case.encode() + rb"\n.*?(?=^###|\Z)", b"",
                  dump, flags=re.M | re.S)


def check_threaded(ref, run):
    """Each thread's records equal the single-threaded reference (threads
    other than 0 do not run the PCH case)."""
    sections = split_threads(run.dump)
    check(len(sections) == run.threads,
          f"{run.label}: {len(sections)} thread sections")
    for t, body in sorted(sections.items()):
        want = ref.dump if t == 0 else drop_case(ref.dump, "pch")
        if body != want:
            raise Failure(f"{run.label}: thread {t} differs from {ref.label}: "
                          f"{describe_diff(want, body)}")


# ---- tests ----------------------------------------------------------------

def test_identity(env, client):
    ref = env.run("no shim", client, shim=False)
    store = env.store("identity")
    cold = env.run("cold", client, store=store)
    warm = env.run("warm", client, store=store)
    threaded = env.run("threaded warm", client, store=store, threads=3)
    disabled = env.run("KCACHE_DISABLE=1", client, store=store,
                       KCACHE_DISABLE=1)
    nvrtc_off = env.run("KCACHE_NVRTC=0", client, store=store, KCACHE_NVRTC=0)
    for r in (cold, warm, disabled, nvrtc_off):
        same_dump(ref, r)
        same_streams(ref, r)
    check_threaded(ref, threaded)
    check(threaded.stderr == ref.stderr,
          f"threaded warm: stderr {threaded.stderr[-1500:]!r}")

    # Counted: a fresh store misses everything, then hits everything.
    store2 = env.store("identity-stats")
    cold_s = env.run("cold, stats", client, store=store2, KCACHE_STATS=1)
    same_dump(ref, cold_s)
    same_streams(ref, cold_s, strip_stats=True)
    expect_cold(cold_s)
    warm_s = env.run("warm, stats", client, store=store2, KCACHE_STATS=1)
    same_dump(ref, warm_s)
    same_streams(ref, warm_s, strip_stats=True)
    expect_warm(warm_s)
    # The first store (filled without stats) serves everything too.
    warm1 = env.run("warm (first store), stats", client, store=store,
                    KCACHE_STATS=1)
    expect_warm(warm1)
    # Switched off: nothing is looked up or counted as a hit.
    for label, kv in (("KCACHE_NVRTC=0, stats", {"KCACHE_NVRTC": 0}),):
        off = env.run(label, client, store=store2, KCACHE_STATS=1, **kv)
        same_dump(ref, off)
        m = STATS_RE.search(off.stderr)
        if m:
            check(int(m.group(1)) == 0 and int(m.group(2)) == 0,
                  f"{label}: nvrtc hits/misses counted while off: "
                  f"{m.group(0)!r}")


def test_threads(env, linked, dlopen):
    ref = env.run("no shim", linked, shim=False)
    store = env.store("threads")
    # Cold: threads race to compile identical programs.
    cold = env.run("threaded cold (linked)", linked, store=store, threads=4,
                   KCACHE_STATS=1)
    check_threaded(ref, cold)
    hits, misses, _, _, errors = cold.stats()
    check(errors == 0, f"{cold.label}: errors={errors}")
    check(hits + misses >= cold.cacheable,
          f"{cold.label}: hits+misses={hits + misses} < {cold.cacheable}")
    warm = env.run("threaded warm (dlopen)", dlopen, store=store, threads=4,
                   KCACHE_STATS=1)
    check_threaded(ref, warm)
    expect_warm(warm)


def set_value(env, path, value):
    env.write_header(path, value)


def ptx_of(run, case="incdir"):
    for section, c, records in parse_dump(run.dump):
        if c == case:
            for name, _, data in records:
                if name == "ptx.bytes":
                    return data
    raise Failure(f"{run.label}: no PTX for case {case}")


def test_headers(env, client):
    cases = ["incdir", "ptx"]
    store = env.store("headers")
    hdr, shadow = env.header, os.path.join(env.incdirs[0], "kc_test_header.h")

    def stats_run(label, **kv):
        return env.run(label, client, store=store, cases=cases,
                       KCACHE_STATS=1, **kv)

    ref = env.run("no shim", client, shim=False, cases=cases)
    check(HEADER_VALUE in ptx_of(ref), "the PTX does not show the header value")
    first = stats_run("cold")
    expect_cold(first)
    same_dump(ref, first)
    warm = stats_run("warm")
    expect_warm(warm)
    same_dump(ref, warm)

    # One byte changed, same size: must recompile and show the new value.
    set_value(env, hdr, b"1234568")
    ref2 = env.run("no shim, header changed", client, shim=False, cases=cases)
    check(b"1234568" in ptx_of(ref2), "changed header not in the PTX")
    changed = stats_run("header changed")
    same_dump(ref2, changed)
    hits, misses, *_ = changed.stats()
    check(misses == 1 and hits == changed.cacheable - 1,
          f"header changed: hits={hits} misses={misses}, expected the "
          f"incdir compile to miss and the other to hit")

    # Restored: the original entry serves again.
    set_value(env, hdr, HEADER_VALUE)
    restored = stats_run("header restored")
    same_dump(ref, restored)
    expect_warm(restored)

    # Rewritten with the same bytes (new mtime): still a hit.
    os.utime(hdr, (1, 1))
    set_value(env, hdr, HEADER_VALUE)
    rewritten = stats_run("header rewritten, same bytes")
    same_dump(ref, rewritten)
    expect_warm(rewritten)

    # A header appearing earlier on the include path shadows the old one.
    set_value(env, shadow, b"7654321")
    ref3 = env.run("no shim, shadowing header", client, shim=False,
                   cases=cases)
    check(b"7654321" in ptx_of(ref3), "shadowing header not in the PTX")
    shadowed = stats_run("shadowing header")
    same_dump(ref3, shadowed)
    hits, misses, *_ = shadowed.stats()
    check(misses == 1, f"shadowing header: misses={misses}, expected 1 "
                       f"(the header probed and not found earlier now exists)")
    os.unlink(shadow)
    unshadowed = stats_run("shadowing header removed")
    same_dump(ref, unshadowed)
    expect_warm(unshadowed)

    # One long-lived process: the header changes between two compiles, to a
    # value this store has never seen.
    set_value(env, hdr, b"1234569")
    ref4 = env.run("no shim, third value", client, shim=False, cases=cases)
    set_value(env, hdr, HEADER_VALUE)
    dump = os.path.join(env.tmp, "rounds")
    p = subprocess.Popen(env.args(client, dump, cases, rounds=3),
                         env=env.env(store=store, KCACHE_STATS=1),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline()
        check(b"round 0 done" in line, f"rounds: {line!r}")
        set_value(env, hdr, b"1234569")
        p.stdin.write(b"go\n")
        p.stdin.flush()
        line = p.stdout.readline()
        check(b"round 1 done" in line, f"rounds: {line!r}")
        set_value(env, hdr, HEADER_VALUE)
        p.stdin.write(b"go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 0, f"rounds: exit {p.returncode}: {err[-2000:]!r}")
    with open(dump, "rb") as f:
        data = f.read()
    rounds = re.split(rb"^=== round \d+\n", data, flags=re.M)[1:]
    check(len(rounds) == 3, f"rounds: {len(rounds)} rounds in the dump")
    check(rounds[0] == ref.dump, "rounds: round 0 differs from no shim: "
          + describe_diff(ref.dump, rounds[0]))
    check(rounds[1] == ref4.dump,
          "rounds: in one process, the changed header was not noticed: "
          + describe_diff(ref4.dump, rounds[1]))
    check(rounds[2] == ref.dump, "rounds: round 2 differs from no shim: "
          + describe_diff(ref.dump, rounds[2]))
    m = STATS_RE.search(err)
    check(m, f"rounds: no stats line: {err[-1000:]!r}")
    hits, misses = int(m.group(1)), int(m.group(2))
    # Round 0 hits both; round 1 misses incdir (the new header has not been
    # seen in this store); round 2 hits the original again.
    check(misses == 1 and hits == 5,
          f"rounds: hits={hits} misses={misses}, expected 5 and 1")


def test_modes(env, client):
    # Everything but the slow and the process-state cases.
    cases = ["ptx", "cubin", "name_expr", "incdir", "mem_headers",
             "compile_error", "dlto", "bad_option", "null_args"]
    ref = env.run("no shim", client, shim=False, cases=cases)
    store = env.store("modes")

    ro = env.run("KCACHE_READONLY=1, empty store", client, store=store,
                 cases=cases, KCACHE_STATS=1, KCACHE_READONLY=1)
    same_dump(ref, ro)
    same_streams(ref, ro, strip_stats=True)
    expect_cold(ro, stored=False)
    ro2 = env.run("KCACHE_READONLY=1 again", client, store=store,
                  cases=cases, KCACHE_STATS=1, KCACHE_READONLY=1)
    expect_cold(ro2, stored=False)
    after = env.run("after read-only runs", client, store=store, cases=cases,
                    KCACHE_STATS=1)
    same_dump(ref, after)
    expect_cold(after)            # read-only stored nothing
    warm = env.run("warm", client, store=store, cases=cases, KCACHE_STATS=1)
    expect_warm(warm)
    ro3 = env.run("KCACHE_READONLY=1, warm store", client, store=store,
                  cases=cases, KCACHE_STATS=1, KCACHE_READONLY=1)
    same_dump(ref, ro3)
    expect_warm(ro3)

    rc = env.run("KCACHE_RECACHE=1", client, store=store, cases=cases,
                 KCACHE_STATS=1, KCACHE_RECACHE=1)
    same_dump(ref, rc)
    same_streams(ref, rc, strip_stats=True)
    expect_cold(rc)               # compiles everything and stores it again
    warm2 = env.run("warm after recache", client, store=store, cases=cases,
                    KCACHE_STATS=1)
    same_dump(ref, warm2)
    expect_warm(warm2)


def test_multiproc(env, linked, dlopen):
    # The PCH case is left out: it is slow and tested elsewhere.
    cases = [c for c in subprocess.run([linked, "--list"], check=True,
                                       stdout=subprocess.PIPE).stdout
             .decode().split() if c != "pch"]
    ref = env.run("no shim", linked, shim=False, cases=cases)
    store = env.store("multiproc")

    def wave(name):
        procs = []
        r, w = os.pipe()
        try:
            for i in range(8):
                client = linked if i % 2 == 0 else dlopen
                dump = os.path.join(env.tmp, f"{name}-{i}")
                args = env.args(client, dump, cases) + ["--barrier-stdin"]
                args[args.index("--trace") + 1] = env.trace + f".{name}{i}"
                p = subprocess.Popen(args, stdin=r,
                                     env=env.env(store=store, KCACHE_STATS=1),
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
                procs.append((p, dump))
        finally:
            os.close(r)
            os.close(w)   # EOF on every client's stdin: all start at once
        runs = []
        for i, (p, dump) in enumerate(procs):
            out, err = p.communicate(timeout=240)
            check(p.returncode == 0,
                  f"{name} process {i}: exit {p.returncode}: {err[-2000:]!r}")
            run = Run(f"{name} process {i}", types.SimpleNamespace(
                returncode=p.returncode, stdout=out, stderr=err), dump)
            same_dump(ref, run)
            check(run.stdout == ref.stdout, f"{run.label}: stdout differs")
            check(run.stderr_without_stats() == ref.stderr,
                  f"{run.label}: stderr {err[-1500:]!r}")
            runs.append(run)
        return runs

    first = wave("wave1")
    total_hits = total_misses = 0
    for run in first:
        hits, misses, _, _, errors = run.stats()
        check(errors == 0, f"{run.label}: errors={errors}")
        check(hits + misses >= run.cacheable,
              f"{run.label}: hits+misses={hits + misses} < {run.cacheable}")
        total_hits += hits
        total_misses += misses
    print(f"  wave 1: hits={total_hits} misses={total_misses}")
    for run in wave("wave2"):
        expect_warm(run)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    test, linked, dlopen = sys.argv[1:]
    keep = os.environ.get("KCACHE_TEST_KEEP")
    tmp = tempfile.mkdtemp(prefix="kcache-nvrtc-")
    try:
        env = Env(tmp)
        if test == "identity-linked":
            test_identity(env, linked)
        elif test == "identity-dlopen":
            test_identity(env, dlopen)
        elif test == "threads":
            test_threads(env, linked, dlopen)
        elif test == "headers":
            test_headers(env, dlopen)
        elif test == "modes":
            test_modes(env, linked)
        elif test == "multiproc":
            test_multiproc(env, linked, dlopen)
        else:
            print(f"unknown test {test}", file=sys.stderr)
            return 2
    except Failure as e:
        print(f"FAIL {test}: {e}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:
        print(f"FAIL {test}: timed out: {e}", file=sys.stderr)
        return 1
    finally:
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            rm_settled(tmp)
    print(f"PASS {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
