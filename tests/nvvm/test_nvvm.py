#!/usr/bin/env python3
"""libNVVM compiles cached (suite 'nvvm').

Usage: test_nvvm.py TEST
  toolkit    the toolkit's libnvvm through cuda.bindings.nvvm, numba-cuda and
             cuda.core (tests/nvvm/nvvm_client.py: direct, bad, order, core,
             numba) without the shim, then cold and warm: every line
             identical; cold misses and stores, warm hits only
  wheel      the same with the nvidia-nvvm 13.5 wheel's libnvvm (installed by
             scripts/setup-wheels outside the venv); a store warmed by the
             toolkit's libNVVM serves none of it (another namespace)
  threads    8 threads compiling the same 4 programs at once: 4 verifies and
             4 compiles in all; identical to the library's own answers
  multiproc  8 processes at once on an empty store, the same 4 programs:
             verifies + compiles = distinct (8), identical outputs
  bundle     a store of NVVM entries exported, shown (its nvvm namespace
             usable here, as the tool computes it) and imported unsigned into
             an empty store, which then serves every verify and compile
  clients    real clients on the stand-in driver (tests/nvvm/clients.py):
             numba-cuda @cuda.jit (NVVM and the link served warm) and
             cuda-cccl make_reduce_into (NVRTC and the link served warm);
             cold and warm outputs identical to the run without the shim
  remote     a private redis-server (unix socket): node A compiles, its owner
             uploads the NVVM entries; a fresh node B is served every verify
             and compile from the remote, outputs identical
  switch     KCACHE_NVVM=0 and kcache-run --no-nvvm: no NVVM call counted;
             KCACHE_READONLY=1 stores nothing

Environment (tests/nvvm/meson.build): KCACHE_SHIM, KCACHE_SRC.
"""
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from kctest import rm_settled  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.environ["KCACHE_SHIM"]
SRC = os.environ.get("KCACHE_SRC", os.path.dirname(os.path.dirname(HERE)))
VENV = os.path.join(SRC, ".venv")
VENV_PY = os.environ.get("KCACHE_VENV_PYTHON", os.path.join(VENV, "bin", "python"))
CLIENT = os.path.join(HERE, "nvvm_client.py")
WHEELS = os.environ.get("KCACHE_WHEELS") or os.path.join(SRC, ".venv-wheels")
WHEEL_LIB = os.path.join(WHEELS, "nvvm-13.5", "nvidia", "cu13", "lib", "libnvvm.so.4")
RUN = os.path.join(SRC, "scripts", "kcache-run")

NVVM_RE = re.compile(r"nvvm hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)")
ALL = ["direct", "bad", "order", "core", "numba"]


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)
    print("ok: " + msg, flush=True)


def env_for(store, shim, **kv):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KCACHE_") and k not in ("LD_PRELOAD",)}
    env["KCACHE_DIR"] = store
    env["KCACHE_STATS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    if shim:
        env["LD_PRELOAD"] = SHIM
    env.update({k: str(v) for k, v in kv.items()})
    return env


def start(scen, store, shim=True, prefix=(), **kv):
    return subprocess.Popen(list(prefix) + [VENV_PY, CLIENT] + scen, env=env_for(store, shim, **kv),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, what):
    out, err = p.communicate(timeout=280)
    if p.returncode != 0:
        raise Failure("%s exited %d:\n%s\n%s" % (what, p.returncode, out[-2000:], err[-3000:]))
    return out, err


def run(scen, store, shim=True, **kv):
    return finish(start(scen, store, shim, **kv), " ".join(scen))


def stats(err):
    """(hits, misses, passthrough, stores, errors) of the nvvm backend."""
    m = NVVM_RE.search(err)
    if m is None:
        raise Failure("no nvvm stats on stderr: %r" % err[-1500:])
    return tuple(int(x) for x in m.groups())


def warnings(err):
    return [l for l in err.splitlines() if l.startswith("kcache:") and "stats:" not in l]


def same(ref, got, what):
    if ref != got:
        a, b = ref.splitlines(), got.splitlines()
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                raise Failure("%s differs at line %d: %r != %r" % (what, i + 1, x, y))
        raise Failure("%s differs in length (%d != %d lines)" % (what, len(a), len(b)))
    print("ok: %s identical to libNVVM's own (%d lines)" % (what, len(ref.splitlines())), flush=True)


def cold_warm(tmp, scen, tag, **kv):
    store = os.path.join(tmp, "store-" + tag)
    ref, _ = run(scen, store, shim=False, **kv)
    cold, err = run(scen, store, **kv)
    same(ref, cold, tag + " cold")
    h, m, p, s, e = stats(err)
    # `order` verifies one program as an earlier one of the same process
    # did: that verify is served even on a cold store.
    inproc = 1 if "order" in scen else 0
    check(h == inproc and m > 0 and s == m and p == 0 and e == 0,
          "%s cold: every other verify and compile missed and was stored (%s)" % (tag, stats(err)))
    check(not warnings(err), "%s cold: no warning (%s)" % (tag, warnings(err)))
    if "order" in scen:
        dbg = run(["order"], os.path.join(tmp, "store-" + tag + "-debug"), KCACHE_LOG="debug",
                  **kv)[1].splitlines()
        nv = [l.split(":")[2].strip() for l in dbg if l.startswith("kcache: debug: nvvm ")]
        check(nv[-2:] == ["nvvm verify hit", "nvvm compile miss"],
              "%s: a verify served, then a compile that missed (%s)" % (tag, nv[-2:]))
    warm, err = run(scen, store, **kv)
    same(ref, warm, tag + " warm")
    h2, m2, p2, s2, e2 = stats(err)
    check(h2 == m + h and m2 == 0 and s2 == 0 and e2 == 0,
          "%s warm: every verify and compile served (%s)" % (tag, stats(err)))
    return store, ref


def t_sequences(tmp):
    """Every call sequence after create, add, lazy-add libdevice, plain,
    cold (each sequence meets its prefixes already stored by the same
    process) and warm: the same codes, sizes, logs and bytes."""
    store = os.path.join(tmp, "store-seq")
    ref, _ = run(["seq"], store, shim=False)
    cold, err = run(["seq"], store)
    same(ref, cold, "sequences cold")
    check(not warnings(err) and stats(err)[4] == 0, "sequences cold: no warning, no error (%s)"
          % (stats(err),))
    warm, err = run(["seq"], store)
    same(ref, warm, "sequences warm")
    h, m, p, s, e = stats(err)
    check(m == 0 and e == 0 and h > 0, "sequences warm: every verify and compile served (%s)"
          % (stats(err),))


def t_forkpass(tmp):
    """A child of fork reports only what it did: the parent's pass-through
    and its reason are not on the child's stats line."""
    store = os.path.join(tmp, "store-fork")
    cerr = os.path.join(tmp, "child.err")
    out, err = run(["forkpass"], store, FORKPASS_ERR=cerr)
    check("child status 0" in out, "the child left with exit(0)")
    check(stats(err)[2] == 1 and "; passthrough nvvm input=1" in err,
          "the parent: one pass-through, one reason (%s)" % [l for l in err.splitlines()
                                                              if "stats:" in l])
    child = open(cerr).read()
    h, m, p, s, e = stats(child)
    check(p == 0 and "passthrough nvvm" not in child and m == 1 and s == 1,
          "the child: its own miss and store, none of its parent's pass-through or reasons (%s)"
          % [l for l in child.splitlines() if "stats:" in l])


# The last commit whose libNVVM hooks stored a verify run on an uncompiled
# program after a served compile (an empty result, served for good after).
OLD_COMMIT = "e931bfb"


def t_upgrade(tmp):
    """A store filled by kcache at OLD_COMMIT through the outside testers'
    sequence (one process compiles; another compiles, served, then
    verifies and reads the result) holds an empty result under the
    verify's key; opened by this kcache it serves libNVVM's own answer."""
    src = os.environ["KCACHE_SRC"]
    have = subprocess.run(["git", "-C", src, "cat-file", "-e", OLD_COMMIT + "^{commit}"],
                          capture_output=True)
    check(have.returncode == 0, "the repository holds %s (a clone with its history)" % OLD_COMMIT)
    old = os.path.join(tmp, "old")
    os.makedirs(old)
    arch = subprocess.run(["git", "-C", src, "archive", OLD_COMMIT], capture_output=True,
                          check=True).stdout
    subprocess.run(["tar", "-x", "-C", old], input=arch, check=True)
    ob = os.path.join(tmp, "old-build")
    for cmd in (["meson", "setup", ob, old],
                ["ninja", "-C", ob, "shim/libkcache.so", "tools/kcache",
                 "store/db/libkcache-store.so"]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        check(p.returncode == 0, "kcache %s builds (%s)" % (OLD_COMMIT, p.stdout[-300:] + p.stderr[-300:]))
    old_env = {"KCACHE_TOOL": os.path.join(ob, "tools", "kcache")}
    store = os.path.join(tmp, "store-upgrade")
    ref, _ = run(["up2"], store, shim=False)
    for scen in ("up1", "up2"):
        p = subprocess.Popen([VENV_PY, CLIENT, scen],
                             env=dict(env_for(store, False, **old_env),
                                      LD_PRELOAD=os.path.join(ob, "shim", "libkcache.so")),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        finish(p, "kcache %s: %s" % (OLD_COMMIT, scen))
    p = subprocess.Popen([VENV_PY, CLIENT, "up2"],
                         env=dict(env_for(store, False, **old_env),
                                  LD_PRELOAD=os.path.join(ob, "shim", "libkcache.so")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    poisoned, _ = finish(p, "kcache %s: up2 again" % OLD_COMMIT)
    check(poisoned != ref, "kcache %s serves a wrong verify result from that store (the defect "
          "reproduced)" % OLD_COMMIT)
    got, err = run(["up2"], store)
    same(ref, got, "this kcache on the store %s filled" % OLD_COMMIT)
    check(not warnings(err), "no warning (%s)" % warnings(err))


def t_toolkit(tmp):
    cold_warm(tmp, ALL, "toolkit")


def t_wheel(tmp):
    check(os.path.exists(WHEEL_LIB), "the nvidia-nvvm wheel is installed (%s)" % WHEEL_LIB)
    store, ref = cold_warm(tmp, ALL, "wheel", KCACHE_TEST_NVVM_LIB=WHEEL_LIB)
    check("nvvm-13.5" in ref.splitlines()[0], "the wheel's libnvvm is the one used: %s"
          % ref.splitlines()[0])
    # The toolkit's libNVVM on the wheel's store: another namespace, misses.
    out, err = run(["direct"], store)
    tref, _ = run(["direct"], store, shim=False)
    same(tref, out, "toolkit on the wheel's store")
    h, m, p, s, e = stats(err)
    check(h == 0 and m > 0, "a store of the wheel's libNVVM serves none of the toolkit's (%s)"
          % (stats(err),))


def t_threads(tmp):
    store = os.path.join(tmp, "store")
    ref, _ = run(["threads"], store, shim=False)
    check(ref.count("same as thread 0: True") == 8, "8 threads agree without the shim")
    cold, err = run(["threads"], store)
    same(ref, cold, "threads cold")
    h, m, p, s, e = stats(err)
    check(m == 8 and h == 56 and e == 0, "8 threads x (4 verifies + 4 compiles): 8 compiled, "
          "56 served (%s)" % (stats(err),))
    warm, err = run(["threads"], store)
    same(ref, warm, "threads warm")
    check(stats(err)[:2] == (64, 0), "threads warm: all served (%s)" % (stats(err),))


def t_multiproc(tmp):
    store = os.path.join(tmp, "store")
    ref, _ = run(["same"], store, shim=False)
    procs = [start(["same"], store) for _ in range(8)]
    total = [0] * 5
    for i, p in enumerate(procs):
        out, err = finish(p, "process %d" % i)
        same(ref, out, "process %d" % i)
        for k, v in enumerate(stats(err)):
            total[k] += v
    check(total[1] == 8 and total[0] == 56 and total[4] == 0,
          "8 processes: verifies + compiles = distinct (8 misses, 56 hits: %s)" % (total,))


def t_switch(tmp):
    store = os.path.join(tmp, "store")
    ref, _ = run(["direct"], store, shim=False)
    out, err = run(["direct"], store, KCACHE_NVVM=0)
    same(ref, out, "KCACHE_NVVM=0")
    check(stats(err) == (0, 0, 0, 0, 0), "KCACHE_NVVM=0: nothing counted (%s)" % (stats(err),))
    p = start(["direct"], store, shim=False, prefix=[RUN, "--no-nvvm", "--stats", "--"])
    out, err = finish(p, "kcache-run --no-nvvm")
    same(ref, out, "kcache-run --no-nvvm")
    check(stats(err) == (0, 0, 0, 0, 0), "kcache-run --no-nvvm: nothing counted (%s)"
          % (stats(err),))
    out, err = run(["direct"], store, KCACHE_READONLY=1)
    same(ref, out, "KCACHE_READONLY=1")
    h, m, p, s, e = stats(err)
    check(m > 0 and s == 0, "KCACHE_READONLY=1: compiled, nothing stored (%s)" % (stats(err),))


def tool(*args):
    p = subprocess.run([os.environ["KCACHE_TOOL"]] + list(args), capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items()
                                         if not k.startswith("KCACHE_")})
    if p.returncode != 0:
        raise Failure("kcache %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr))
    return p.stdout


def t_bundle(tmp):
    a, ref = cold_warm(tmp, ["direct", "bad"], "a")
    bundle = os.path.join(tmp, "a.kcb")
    tool("--dir", a, "export", "-o", bundle)
    show = tool("bundle", "show", bundle)
    nss = re.findall(r"^  (nvvm:\S+)$", show, re.M)
    check(len(nss) == 1, "the bundle holds one nvvm namespace (%r)" % show)
    check("; usable here" in show.split(nss[0], 1)[1].splitlines()[1],
          "bundle show: the nvvm namespace is usable here (%r)" % show)
    # ls names what each entry is for: libNVVM's results (NVRTC's record
    # layout) as nvvm, their header manifests as manifests.
    ls = [l.split() for l in tool("--dir", a, "ls").splitlines()]
    kinds = sorted(set((f[1].split(":")[0], f[2]) for f in ls))
    check(kinds == [("nvvm", "nvvm")], "ls: every entry of the nvvm namespace has kind nvvm "
          "(%r)" % kinds)
    b = os.path.join(tmp, "store-b")
    out = tool("--dir", b, "import", bundle, "--trust-unsigned")
    check("imported" in out, "import: %r" % out)
    got, err = run(["direct", "bad"], b)
    same(ref, got, "served from the imported bundle")
    h, m, p, s_, e = stats(err)
    check(h > 0 and m == 0, "the imported store serves every verify and compile (%s)"
          % (stats(err),))


CLIENTS = os.path.join(HERE, "clients.py")
BACKEND_RE = r"%s hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+) errors=(\d+)"


def backend(err, name):
    m = re.search(BACKEND_RE % name, err)
    if m is None:
        raise Failure("no %s stats on stderr: %r" % (name, err[-1500:]))
    return tuple(int(x) for x in m.groups())


def client(which, store, shim=True):
    env = env_for(store, shim, LD_LIBRARY_PATH=os.environ["KCACHE_TEST_STANDIN_DIR"])
    p = subprocess.run([VENV_PY, CLIENTS, which], env=env, capture_output=True, text=True,
                       timeout=280)
    if p.returncode != 0:
        raise Failure("clients.py %s exited %d:\n%s\n%s" % (which, p.returncode, p.stdout[-2000:],
                                                           p.stderr[-3000:]))
    return p.stdout, p.stderr


def t_clients(tmp):
    for which, served in (("numba", ("nvvm", "link")), ("cccl", ("nvrtc", "link"))):
        store = os.path.join(tmp, "store-" + which)
        ref, _ = client(which, store, shim=False)
        cold, err = client(which, store)
        same(ref, cold, which + " cold")
        for b in served:
            h, m = backend(err, b)[:2]
            check(m > 0 and h == 0, "%s cold: %s compiled and stored (%s)"
                  % (which, b, backend(err, b)))
        warm, err = client(which, store)
        same(ref, warm, which + " warm")
        for b in served:
            h, m = backend(err, b)[:2]
            check(h > 0 and m == 0, "%s warm: %s served (%s)" % (which, b, backend(err, b)))


def settle(store, timeout=60):
    """Waits until the store's owner has drained (and uploaded) everything
    but counter logs (a process that only hit leaves one and starts no
    owner)."""
    spool, lock = os.path.join(store, "spool"), os.path.join(store, "owner.lock")
    deadline = time.monotonic() + timeout
    while True:
        busy = os.path.isdir(spool) and any(n[:2] in ("p-", "d-", "h-", "x-")
                                            for n in os.listdir(spool))
        if not busy and os.path.exists(lock):
            with open(lock) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    busy = True
        if not busy:
            return
        if time.monotonic() > deadline:
            raise Failure("the owner of %s did not finish" % store)
        time.sleep(0.05)


def t_remote(tmp):
    check(shutil.which("redis-server") is not None, "redis-server is installed")
    rdir = os.path.join(tmp, "redis")
    os.makedirs(rdir)
    sock = os.path.join(rdir, "s")
    srv = subprocess.Popen(["redis-server", "--port", "0", "--dir", rdir, "--save", "",
                            "--appendonly", "no", "--unixsocket", sock, "--unixsocketperm", "700",
                            "--logfile", os.path.join(rdir, "log")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.025)
        key = os.path.join(tmp, "writer.key")
        tool("keygen", key)
        kv = {"KCACHE_REMOTE": "redis+unix:" + sock, "KCACHE_REMOTE_SIGNING_KEY": key,
              "KCACHE_REMOTE_TRUSTED_KEYS": key + ".pub",
              "KCACHE_TOOL": os.environ["KCACHE_TOOL"], "KCACHE_OWNER_IDLE_MS": "300"}
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        ref, _ = run(["direct", "bad"], a, shim=False)
        cold, err = run(["direct", "bad"], a, **kv)
        same(ref, cold, "node A cold")
        h, m = stats(err)[:2]
        check(m > 0 and h == 0, "node A compiled (%s)" % (stats(err),))
        settle(a)
        got, err = run(["direct", "bad"], b, **kv)
        same(ref, got, "node B served by the remote")
        h2, m2 = stats(err)[:2]
        rm = re.search(r"; remote hits=(\d+)", err)
        check(m2 == 0 and h2 == m and rm is not None and int(rm.group(1)) == m,
              "node B: no compile, every verify and compile a remote hit (%s, remote %s)"
              % (stats(err), rm and rm.group(1)))
        settle(b)
    finally:
        srv.kill()
        srv.wait()


TESTS = {"upgrade": t_upgrade, "sequences": t_sequences, "forkpass": t_forkpass, "remote": t_remote, "clients": t_clients, "bundle": t_bundle, "toolkit": t_toolkit, "wheel": t_wheel, "threads": t_threads, "multiproc": t_multiproc,
         "switch": t_switch}


def main(argv):
    if len(argv) != 2 or argv[1] not in TESTS:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.environ.get("KCACHE_TEST_TMP") or None
    tmp = tempfile.mkdtemp(prefix="kcache-nvvm-", dir=root)
    try:
        TESTS[argv[1]](tmp)
    except Failure as e:
        print("FAIL: %s" % e, flush=True)
        return 1
    finally:
        rm_settled(tmp)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
