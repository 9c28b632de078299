"""What the tests of tools run as processes share (tests/compilers): a
runner that starts a tool plain or under the preload and reads the
shim's stats line, the three-phase run (plain, cold, warm) and its
comparison, and the getenv logger that finds which variables a tool reads.
"""
import os
import re
import shutil
import subprocess

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def mode(path):
    try:
        return oct(os.stat(path).st_mode & 0o7777)
    except OSError:
        return None


def tool_counts(stderr):
    """The shim's tool counters summed over every stats line in stderr
    (one per preloaded process: nvcc's children each print theirs)."""
    tot = {"hits": 0, "misses": 0, "passthrough": 0, "stores": 0}
    seen = False
    for m in re.finditer(rb"tool hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+)",
                         stderr):
        seen = True
        for k, v in zip(["hits", "misses", "passthrough", "stores"], m.groups()):
            tot[k] += int(v)
    return tot if seen else None


class Runner:
    def __init__(self, tool, work):
        self.tool = tool
        self.ptxas = tool  # test_ptxas.py's name for it
        self.work = work
        self.shim = os.environ["KCACHE_SHIM"]
        self.base = {k: v for k, v in os.environ.items()
                     if not k.startswith("KCACHE_") and k != "LD_PRELOAD"}

    def env(self, store, **kw):
        e = dict(self.base, LD_PRELOAD=self.shim, KCACHE_DIR=store, KCACHE_STATS="1")
        e.update(kw)
        return e

    def run(self, args, env=None, cwd=None, umask=None):
        pre = (lambda: os.umask(umask)) if umask is not None else None
        r = subprocess.run([self.tool] + args, env=env or self.base, cwd=cwd or self.work,
                           capture_output=True, timeout=300, preexec_fn=pre)
        err = r.stderr
        stats = [ln for ln in err.splitlines() if ln.startswith(b"kcache: stats:")]
        err = b"\n".join(ln for ln in err.splitlines(keepends=False)
                         if not ln.startswith(b"kcache: stats:"))
        if r.stderr.endswith(b"\n") and err:
            err += b"\n"
        tool = {}
        if stats:
            m = re.search(rb"tool hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+)", stats[-1])
            if m:
                tool = dict(zip(["hits", "misses", "passthrough", "stores"], map(int, m.groups())))
            m = re.search(rb"passthrough tool((?: \w+=\d+)+)", stats[-1])
            if m:
                tool["reasons"] = m.group(1).decode().strip()
        return r.returncode, r.stdout, err, tool, stats


def _outs(out, f):
    return f(out) if isinstance(out, str) else tuple(f(o) for o in out)


def three(R, case, args, out, prep=None, umask=None, same_store=None, cwd=None):
    """plain, cold, warm of one run; each preceded by prep() and the
    output(s) removed (out: a path, or a list of them). Returns the three
    results with the outputs' bytes and modes."""
    store = same_store or os.path.join(R.work, "store-" + case)
    res = []
    for phase in ("plain", "cold", "warm"):
        for o in ([out] if isinstance(out, str) else out):
            if os.path.lexists(o):
                os.unlink(o)
        if prep:
            prep()
        env = None if phase == "plain" else R.env(store)
        rc, so, se, tool, _ = R.run(args, env=env, umask=umask, cwd=cwd)
        res.append((rc, so, se, _outs(out, read), _outs(out, mode), tool))
    return res


def _size(out):
    if out is None or isinstance(out, bytes):
        return None if out is None else len(out)
    return [_size(o) for o in out]


def compare(case, res, hits=True, norm=lambda s: s, stored=True):
    (prc, pso, pse, pout, pmode, _), cold, warm = res
    for phase, (rc, so, se, out, md, tool) in (("cold", cold), ("warm", warm)):
        check(rc == prc and out == pout and md == pmode,
              "%s %s: status %d, outputs %s bytes mode %s as plain (%d, %s, %s)"
              % (case, phase, rc, _size(out), md, prc, _size(pout), pmode))
        same = norm(so) == norm(pso) and norm(se) == norm(pse)
        check(same, "%s %s: streams as plain's%s" % (
            case, phase, "" if same else "\n--- plain\n%r\n%r\n--- kcache\n%r\n%r"
            % (pso, pse, so, se)))
    check(warm[1] == cold[1] and warm[2] == cold[2], "%s warm: the cold run's streams, byte for byte"
          % case)
    check(cold[5].get("misses") == 1 and cold[5].get("stores") == (1 if stored else 0),
          "%s cold: one miss, %s (%s)" % (case, "stored" if stored else "not stored", cold[5]))
    if hits:
        check(warm[5].get("hits") == 1 and warm[5].get("misses", 0) == 0,
              "%s warm: a hit (%s)" % (case, warm[5]))


GETENV_C = r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void say(const char *n) { char b[512]; int k = snprintf(b, sizeof b, "GETENV %s\n", n);
  if (k > 0) write(2, b, (size_t)k); }
char *getenv(const char *n) { static char *(*r)(const char *); if (!r) r = dlsym(RTLD_NEXT, "getenv");
  say(n); return r(n); }
char *secure_getenv(const char *n) { static char *(*r)(const char *);
  if (!r) r = dlsym(RTLD_NEXT, "secure_getenv"); say(n); return r(n); }
'''


def getenv_names(R, args, cwd=None):
    """The variables the tool reads running args (a preloaded logger of
    its getenv calls), or None without a C compiler (a failed check)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        check(False, "env: no C compiler to build the getenv logger")
        return None
    logger = os.path.join(R.work, "getenv.c")
    with open(logger, "w") as f:
        f.write(GETENV_C)
    so = os.path.join(R.work, "getenv.so")
    subprocess.run([cc, "-shared", "-fPIC", "-o", so, logger, "-ldl"], check=True)
    r = subprocess.run([R.tool] + args, env=dict(R.base, LD_PRELOAD=so), capture_output=True,
                       cwd=cwd or R.work)
    return r.returncode, sorted({ln.split()[1] for ln in r.stderr.decode().splitlines()
                                 if ln.startswith("GETENV ")})
