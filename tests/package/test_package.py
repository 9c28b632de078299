#!/usr/bin/env python3
"""The package suite: scripts/package from a clean checkout, then what it
made, where its users are.

  1. A checkout of this tree (git clone, the working tree's uncommitted
     files laid over it, no build directory, no dist/): scripts/package
     writes the tarball and the wheel.
  2. In a Debian bullseye root (glibc 2.31, the floor) and a Debian trixie
     root (glibc 2.41), each made with debootstrap --variant=minbase plus
     python3 and nothing of kcache's (no RocksDB, zstd, lz4, hiredis,
     libsodium, binutils, and no C++ runtime where the loader looks:
     libstdc++.so.6 is moved to /opt/cxx, which only NVRTC's clients are
     given, as NVRTC's builtins library needs it), as an unprivileged
     user (nobody): `kcache --version` and `kcache stats` without it; the
     tarball
     unpacked; LD_PRELOAD of its shim into /bin/true and `python3 -c pass`
     (no output, status 0); a real NVRTC client (nvrtc_ctypes.py, the
     toolkit's libnvrtc bind-mounted read-only) without kcache, then under
     the tarball's kcache-run cold and warm: outputs identical to NVRTC's
     own, the warm run all hits, the owner started (its lock taken, the
     entries in RocksDB: `kcache stats`), `kcache stats` counting the
     same; the remote against a private redis-server (this machine's,
     on a unix socket bind-mounted in): `kcache remote ping`, a node
     that compiles and uploads, a fresh node served by the remote.
  3. On this machine, as nobody: the wheel pip-installed into a fresh
     venv; its kcache-run, kcache and `python -m kcache` work, the client
     cold and warm under them. Then a host process with RocksDB and the
     C++ runtime of its own (the system's librocksdb, loaded first and
     RTLD_GLOBAL) loads the wheel's libkcache-store.so as the shim does:
     both RocksDBs work, and no symbol of the store binds outside glibc
     (LD_DEBUG=bindings: host_libs.py).
  4. auditwheel show reports the tag the README states, and the wheel
     carries it; every ELF file of the tarball and of the installed wheel
     needs nothing outside glibc and the tree (objdump -p: NEEDED).
  5. docs/install.md's Dockerfile, built and run without a container engine
     (dockerfile.py): each instruction carried out over a Debian trixie
     root standing in for the CUDA image, then its ENTRYPOINT and CMD as
     the image's user, twice: NVRTC's own outputs, compiled then served.

Needs root (debootstrap, chroot, mounts: CI runs as root); without it the
test says so and is skipped (77). The roots and the RocksDB build are
cached (scripts/package's cache directory), so only the first run is long.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dockerfile  # noqa: E402

SRC = os.environ['KCACHE_SRC']
HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get('KCACHE_PACKAGE_CACHE') or os.path.join(
    os.environ.get('XDG_CACHE_HOME') or os.path.join(os.environ.get('HOME') or '/root', '.cache'),
    'kcache-package')
TOOLKIT = os.environ.get('KCACHE_TOOLKIT', '/usr/local/cuda')
MIRROR = os.environ.get('KCACHE_DEBIAN_MIRROR', 'http://deb.debian.org/debian')
ROOTS = [('bullseye', '2.31'), ('trixie', '2.41')]
NOBODY = 65534
KERNELS = ['ka', 'kb', 'kc']
ARCH = 'compute_80'

failures = []


def check(cond, what):
    print(('ok: ' if cond else 'FAIL: ') + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def run(args, timeout=600, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def nvrtc_dir():
    for d in ('lib64', 'targets/x86_64-linux/lib'):
        p = os.path.realpath(os.path.join(TOOLKIT, d))
        if glob.glob(os.path.join(p, 'libnvrtc.so.*')):
            return p
    raise SystemExit('no libnvrtc under ' + TOOLKIT)


def nvrtc_name(d):
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, 'libnvrtc.so.*'))
                   if re.match(r'libnvrtc\.so\.\d+$', os.path.basename(p)))
    return names[-1]


# ---- the roots ---------------------------------------------------------------


# What kcache links or loads, as a user's machine may lack it: removed from
# the test roots (minbase has some of them for apt and dpkg, which the test
# never runs). The C++ runtime is moved out of the loader's way to /opt/cxx:
# kcache needs nothing but glibc, but NVRTC does (libnvrtc-builtins.so needs
# libstdc++.so.6), so the clients alone get it (LD_LIBRARY_PATH). (libgcc_s
# stays: glibc itself loads it to unwind a cancelled thread.)
ABSENT = ('librocksdb', 'libzstd', 'liblz4', 'libxxhash', 'libhiredis', 'libsodium',
          'libsnappy', 'libgflags', 'libbz2')
CXX = ('libstdc++',)
# What an ELF file of the tarball or the wheel may need: glibc, and the
# store library beside it.
GLIBC_LIBS = {'libc.so.6', 'libm.so.6', 'libdl.so.2', 'libpthread.so.0', 'librt.so.1',
              'ld-linux-x86-64.so.2'}
TREE_LIBS = GLIBC_LIBS | {'libkcache-store.so'}


def needs_outside_glibc(tree):
    """[(file, library)] for every NEEDED entry of every ELF file under tree
    outside glibc and the tree; and how many ELF files there were."""
    bad, n = [], 0
    for d, _, fs in os.walk(tree):
        for f in sorted(fs):
            p = os.path.join(d, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, 'rb') as fh:
                if fh.read(4) != b'\x7fELF':
                    continue
            n += 1
            for lib in re.findall(r'NEEDED\s+(\S+)', run(['objdump', '-p', p]).stdout):
                if lib not in TREE_LIBS:
                    bad.append((os.path.relpath(p, tree), lib))
    return bad, n


def strip_root(root):
    cxx = os.path.join(root, 'opt', 'cxx')
    os.makedirs(cxx, exist_ok=True)
    for d in ('usr/lib/x86_64-linux-gnu', 'lib/x86_64-linux-gnu', 'usr/lib'):
        p = os.path.join(root, d)
        if os.path.isdir(p) and not os.path.islink(p):
            for f in os.listdir(p):
                if f.startswith(ABSENT) and '.so' in f:
                    os.unlink(os.path.join(p, f))
                elif f.startswith(CXX) and '.so' in f:
                    os.rename(os.path.join(p, f), os.path.join(cxx, f))


def make_root(suite):
    """A minbase root with python3, made once and cached."""
    root = os.path.join(CACHE, suite + '-test')
    stamp = suite + ' minbase python3, libstdc++ in /opt/cxx\n'
    sf = os.path.join(root, '.kcache-root')
    if os.path.isfile(sf) and open(sf).read() == stamp:
        strip_root(root)
        return root
    shutil.rmtree(root + '.tmp', ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    t = time.time()
    r = run(['debootstrap', '--variant=minbase', '--include=python3', suite, root + '.tmp',
             MIRROR], timeout=1800)
    if r.returncode != 0:
        raise SystemExit('debootstrap %s failed:\n%s' % (suite, (r.stdout + r.stderr)[-3000:]))
    with open(os.path.join(root + '.tmp', '.kcache-root'), 'w') as f:
        f.write(stamp)
    os.rename(root + '.tmp', root)
    strip_root(root)
    print('made the %s root in %.0f s' % (suite, time.time() - t), flush=True)
    return root


def root_procs(root):
    """Processes whose root directory is `root` (the owners we started)."""
    pids = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                if os.readlink('/proc/%s/root' % p) == root:
                    pids.append(int(p))
            except OSError:
                pass
    return pids


def end_root_procs(root, wait=15):
    deadline = time.time() + wait
    while root_procs(root) and time.time() < deadline:
        time.sleep(0.1)
    for pid in root_procs(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while root_procs(root) and time.time() < deadline + 5:
        time.sleep(0.05)


def in_root(root, work, nvrtc, script, timeout=600):
    """Runs `script` (sh) in the root as nobody, in a private mount
    namespace: the test's directory at /tmp/kc, the toolkit's NVRTC
    read-only at /opt/nvrtc, /proc."""
    mounts = ('set -e; r=%s; mkdir -p "$r/tmp/kc" "$r/opt/nvrtc" "$r/proc";'
              'mount --bind %s "$r/tmp/kc";'
              'mount --bind %s "$r/opt/nvrtc"; mount -o remount,bind,ro "$r/opt/nvrtc";'
              'mount -t proc proc "$r/proc";'
              'exec chroot --userspec=%d:%d "$r" env -i PATH=/usr/bin:/bin HOME=/tmp/kc/home '
              'LANG=C.UTF-8 LD_LIBRARY_PATH=/opt/nvrtc sh -c "$0"') % (sh_quote(root), sh_quote(work), sh_quote(nvrtc),
                                             NOBODY, NOBODY)
    return run(['unshare', '--mount', '--propagation', 'private', 'sh', '-c', mounts, script],
               timeout=timeout)


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


# ---- redis -------------------------------------------------------------------


class Redis:
    def __init__(self, d):
        self.dir = d
        self.sock = os.path.join(d, 's')
        os.makedirs(d)
        os.chmod(d, 0o755)
        self.p = subprocess.Popen(
            ['redis-server', '--port', '0', '--dir', d, '--save', '', '--appendonly', 'no',
             '--unixsocket', self.sock, '--unixsocketperm', '777',
             '--logfile', os.path.join(d, 'log')],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            if self.cli('PING').strip() == 'PONG':
                return
            time.sleep(0.025)
        raise SystemExit('redis-server did not start')

    def cli(self, *args):
        r = run(['redis-cli', '-s', self.sock] + list(args), timeout=30)
        return r.stdout

    def entries(self):
        return [k for k in self.cli('--scan', '--pattern', 'kcache:*').split()
                if not k.startswith(('kcache:lock:', 'kcache:writer:'))]

    def stop(self):
        self.p.kill()
        self.p.wait()


# ---- the checks --------------------------------------------------------------


def stats_line(err):
    m = re.search(r'^kcache: stats: nvrtc hits=(\d+) misses=(\d+)', err, re.M)
    return (int(m.group(1)), int(m.group(2))) if m else None


def remote_part(err):
    m = re.search(r'; remote hits=(\d+) misses=(\d+)', err)
    return (int(m.group(1)), int(m.group(2))) if m else None


def stats_field(text, name):
    m = re.search(r'^%s:\s+(\d+)' % re.escape(name), text, re.M)
    return int(m.group(1)) if m else None


def backend_nvrtc(text):
    m = re.search(r'^\s+nvrtc\s+hits (\d+)\s+misses (\d+)\s+passthrough \d+\s+stores (\d+)', text, re.M)
    return tuple(int(x) for x in m.groups()) if m else None


# What runs in a root (and, adapted, in the venv): the shim into /bin/true
# and python3, the client without kcache, cold, warm, then kcache stats
# once the owner has drained the spool into RocksDB.
NODE_SCRIPT = r'''
cd /tmp/kc
T=$1; NV=$2; shift 2
KS="ka kb kc"
mkdir -p home out
LD_PRELOAD=$T/lib/libkcache.so /bin/true > out/true.out 2>&1; echo $? > out/true.rc
LD_PRELOAD=$T/lib/libkcache.so python3 -c pass > out/py.out 2>&1; echo $? > out/py.rc
# NVRTC's clients get the C++ runtime NVRTC needs ($CXX: the root's
# /opt/cxx); kcache's own commands never do.
$T/bin/kcache --version > out/version 2>&1; echo $? > out/version.rc
LD_LIBRARY_PATH=$LD_LIBRARY_PATH$CXX python3 nvrtc_ctypes.py "$NV" compute_80 $KS > out/ref 2> out/ref.err
export KCACHE_DIR=/tmp/kc/store KCACHE_STATS=1 KCACHE_OWNER_IDLE_MS=500
for run in cold warm; do
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH$CXX $T/bin/kcache-run python3 nvrtc_ctypes.py "$NV" compute_80 $KS \
        > out/$run 2> out/$run.err
    echo $? > out/$run.rc
done
i=0
while :; do
    $T/bin/kcache stats > out/stats 2> out/stats.err || true
    grep -q '^Entries: *[1-9]' out/stats && ! ls store/spool/* >/dev/null 2>&1 && break
    i=$((i + 1)); [ $i -lt 300 ] || break
    sleep 0.1
done
'''

REMOTE_SCRIPT = r'''
cd /tmp/kc
T=$1; NV=$2; shift 2
mkdir -p home rout
$T/bin/kcache keygen home/w.key > rout/keygen 2>&1
export KCACHE_REMOTE=redis+unix:/tmp/kc/redis/s KCACHE_REMOTE_SIGNING_KEY=/tmp/kc/home/w.key \
    KCACHE_REMOTE_TRUSTED_KEYS=/tmp/kc/home/w.key.pub KCACHE_STATS=1 KCACHE_OWNER_IDLE_MS=500
KCACHE_DIR=/tmp/kc/ra $T/bin/kcache remote ping > rout/ping 2>&1; echo $? > rout/ping.rc
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/cxx
python3 nvrtc_ctypes.py "$NV" compute_80 rx ry > rout/ref 2> rout/ref.err
KCACHE_DIR=/tmp/kc/ra $T/bin/kcache-run python3 nvrtc_ctypes.py "$NV" compute_80 rx ry \
    > rout/a 2> rout/a.err
# The owner uploads after each synced batch: wait for both entries.
i=0
while [ ! -e rout/uploaded ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
KCACHE_DIR=/tmp/kc/rb $T/bin/kcache-run python3 nvrtc_ctypes.py "$NV" compute_80 rx ry \
    > rout/b 2> rout/b.err
'''


def check_node(where, out):
    def rd(n):
        p = os.path.join(out, n)
        return open(p).read() if os.path.exists(p) else ''
    check(rd('true.rc').strip() == '0' and rd('true.out') == '',
          '%s: LD_PRELOAD=libkcache.so /bin/true: status 0, no output (%r)' % (where, rd('true.out')[:300]))
    check(rd('py.rc').strip() == '0' and rd('py.out') == '',
          '%s: LD_PRELOAD=libkcache.so python3 -c pass: status 0, no output (%r)' % (where, rd('py.out')[:300]))
    ref = rd('ref')
    check(len(ref.splitlines()) == len(KERNELS) and all(l.endswith(' 0') for l in ref.splitlines()),
          '%s: NVRTC compiles the kernels without kcache (%s)' % (where, rd('ref.err')[-300:]))
    for r in ('cold', 'warm'):
        check(rd(r + '.rc').strip() == '0' and rd(r) == ref,
              '%s: %s run under kcache-run: NVRTC\'s own outputs (%s)' % (where, r, rd(r + '.err')[-400:]))
    check(stats_line(rd('cold.err')) == (0, len(KERNELS)),
          '%s: cold: %d misses (%s)' % (where, len(KERNELS), stats_line(rd('cold.err'))))
    check(stats_line(rd('warm.err')) == (len(KERNELS), 0),
          '%s: warm: %d hits, no compile (%s)' % (where, len(KERNELS), stats_line(rd('warm.err'))))
    st = rd('stats')
    check(stats_field(st, 'Entries') is not None and stats_field(st, 'Entries') >= len(KERNELS),
          '%s: the owner drained the spool into RocksDB: kcache stats counts entries (%s)'
          % (where, (st + rd('stats.err'))[:600]))
    check(backend_nvrtc(st) == (len(KERNELS), len(KERNELS), len(KERNELS)),
          '%s: kcache stats: nvrtc hits %d, misses %d, stores %d (%s)'
          % (where, len(KERNELS), len(KERNELS), len(KERNELS), backend_nvrtc(st)))


def check_remote(where, out):
    def rd(n):
        p = os.path.join(out, n)
        return open(p).read() if os.path.exists(p) else ''
    check(rd('ping.rc').strip() == '0', '%s: kcache remote ping from the tarball (%s)'
          % (where, rd('ping')[-400:]))
    check(rd('a') == rd('ref') and len(rd('ref').splitlines()) == 2,
          '%s: remote node A: NVRTC\'s own outputs (%s)' % (where, rd('a.err')[-400:]))
    check(rd('b') == rd('ref'), '%s: remote node B: NVRTC\'s own outputs (%s)' % (where, rd('b.err')[-400:]))
    check(stats_line(rd('a.err')) == (0, 2) and remote_part(rd('a.err')) is not None,
          '%s: node A compiled both, with the remote on (%s)' % (where, rd('a.err')[-300:]))
    # Two remote reads a kernel: its manifest, then its record.
    check(stats_line(rd('b.err')) == (2, 0) and remote_part(rd('b.err')) == (4, 0),
          '%s: a fresh node B: no compile, 4 remote hits, no remote miss (%s)'
          % (where, rd('b.err')[-300:]))
    check('not found' not in rd('a.err') + rd('b.err') + rd('ping'),
          '%s: no library missing (hiredis, libsodium come with the tarball)' % where)


def test_root(suite, glibc, tarball, version, work_root, nvrtc):
    root = make_root(suite)
    work = os.path.join(work_root, suite)
    for d in ('home', 'out', 'rout'):
        os.makedirs(os.path.join(work, d))
    shutil.copy(tarball, work)
    shutil.copy(os.path.join(HERE, 'nvrtc_ctypes.py'), work)
    for d, _, fs in os.walk(work):
        os.chown(d, NOBODY, NOBODY)
        for f in fs:
            os.chown(os.path.join(d, f), NOBODY, NOBODY)
    r = in_root(root, work, nvrtc, 'cd /tmp/kc && getconf GNU_LIBC_VERSION && '
                'tar xzf %s && ls /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu 2>/dev/null'
                % os.path.basename(tarball))
    check(r.returncode == 0 and ('glibc ' + glibc) in r.stdout,
          '%s: unpacked as nobody; glibc %s (%s)' % (suite, glibc, (r.stdout.splitlines() or [''])[0]
                                                   + r.stderr[-300:]))
    present = [n for n in ABSENT + CXX if n in r.stdout]
    check(not present, '%s: none of kcache\'s libraries, no C++ runtime where the loader looks (%s)'
          % (suite, present))
    T = '/tmp/kc/kcache-' + version
    NV = '/opt/nvrtc/' + nvrtc_name(nvrtc)
    try:
        r = in_root(root, work, nvrtc, 'set -- %s %s\nCXX=:/opt/cxx\n%s' % (T, NV, NODE_SCRIPT))
        check(r.returncode == 0, '%s: the node script ran (%s)' % (suite, r.stderr[-400:]))
        out = os.path.join(work, 'out')
        ver = open(os.path.join(out, 'version')).read() if os.path.exists(os.path.join(out, 'version')) else ''
        check(ver.startswith('kcache ' + version), '%s: kcache --version with no C++ runtime on the '
              'loader\'s path (%s)' % (suite, ver[-300:]))
        check_node(suite, out)

        redis = Redis(os.path.join(work, 'redis'))
        try:
            # The uploads are watched from here; the script waits for the mark.
            import threading
            done = threading.Event()

            def watch():
                # Node A's compiles are on the remote when the count is
                # at least one entry a kernel and has not moved for 1 s.
                deadline = time.time() + 60
                last, since = -1, time.time()
                while not done.is_set() and time.time() < deadline:
                    n = len(redis.entries())
                    if n != last:
                        last, since = n, time.time()
                    elif n >= 2 and time.time() - since >= 1.0:
                        break
                    time.sleep(0.1)
                open(os.path.join(work, 'rout', 'uploaded'), 'w').close()
            th = threading.Thread(target=watch)
            th.start()
            r = in_root(root, work, nvrtc, 'set -- %s %s\n%s' % (T, NV, REMOTE_SCRIPT))
            done.set()
            th.join()
            check(r.returncode == 0, '%s: the remote script ran (%s)' % (suite, r.stderr[-400:]))
            check(len(redis.entries()) >= 2, '%s: node A uploaded its compiles (%d entries)'
                  % (suite, len(redis.entries())))
            check_remote(suite, os.path.join(work, 'rout'))
        finally:
            redis.stop()
    finally:
        end_root_procs(root)


def test_wheel(wheel, work_root):
    """The wheel into a fresh venv, as nobody, on this machine."""
    work = os.path.join(work_root, 'wheel')
    os.makedirs(os.path.join(work, 'home'))
    shutil.copy(wheel, work)
    shutil.copy(os.path.join(HERE, 'nvrtc_ctypes.py'), work)
    for d, _, fs in os.walk(work):
        os.chown(d, NOBODY, NOBODY)
        for f in fs:
            os.chown(os.path.join(d, f), NOBODY, NOBODY)
    nv = os.path.join(nvrtc_dir(), nvrtc_name(nvrtc_dir()))
    env = {'PATH': '/usr/bin:/bin', 'HOME': os.path.join(work, 'home'), 'LANG': 'C.UTF-8'}
    script = r'''
cd "$1"; W=$2; NV=$3
python3 -m venv venv || exit 10
venv/bin/pip install -q --no-index --no-deps --disable-pip-version-check "$W" > pip.log 2>&1 || { cat pip.log; exit 11; }
mkdir -p out
venv/bin/kcache-run --version > out/run-version 2>&1 || exit 12
venv/bin/kcache --version > out/tool-version 2>&1 || exit 13
venv/bin/python -m kcache --version > out/m-version 2>&1 || exit 14
LD_PRELOAD=$(venv/bin/python -c 'import kcache; print(kcache.shim_path())') /bin/true > out/true.out 2>&1; echo $? > out/true.rc
LD_PRELOAD=$(venv/bin/python -c 'import kcache; print(kcache.shim_path())') python3 -c pass > out/py.out 2>&1; echo $? > out/py.rc
python3 nvrtc_ctypes.py "$NV" compute_80 ka kb kc > out/ref 2> out/ref.err
export KCACHE_DIR=$PWD/store KCACHE_STATS=1 KCACHE_OWNER_IDLE_MS=500
for run in cold warm; do
    venv/bin/kcache-run python3 nvrtc_ctypes.py "$NV" compute_80 ka kb kc > out/$run 2> out/$run.err
    echo $? > out/$run.rc
done
i=0
while :; do
    venv/bin/kcache stats > out/stats 2> out/stats.err || true
    grep -q '^Entries: *[1-9]' out/stats && ! ls store/spool/* >/dev/null 2>&1 && break
    i=$((i + 1)); [ $i -lt 300 ] || break
    sleep 0.1
done
'''
    r = run(['setpriv', '--reuid=%d' % NOBODY, '--regid=%d' % NOBODY, '--clear-groups',
             'sh', '-c', script, 'sh', work, os.path.join(work, os.path.basename(wheel)), nv],
            env=env, timeout=600)
    check(r.returncode == 0, 'wheel: pip install into a fresh venv as nobody; kcache-run, kcache, '
          'python -m kcache run (status %d: %s)' % (r.returncode, (r.stdout + r.stderr)[-600:]))
    out = os.path.join(work, 'out')
    if r.returncode == 0:
        for f, what in (('run-version', 'kcache-run'), ('tool-version', 'kcache'),
                        ('m-version', 'python -m kcache')):
            check(open(os.path.join(out, f)).read().startswith(('kcache-run ', 'kcache ')),
                  'wheel: %s --version' % what)
        check_node('wheel', out)
    # The owner the venv's tool started exits when idle.
    deadline = time.time() + 15
    while time.time() < deadline and run(['pgrep', '-u', str(NOBODY), '-f', work]).stdout.strip():
        time.sleep(0.1)
    for pid in run(['pgrep', '-u', str(NOBODY), '-f', work]).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    pkgs = glob.glob(os.path.join(work, 'venv', 'lib', 'python*', 'site-packages'))
    if r.returncode != 0 or not pkgs:
        return
    bad, n = needs_outside_glibc(pkgs[0])
    check(n >= 4 and not bad, 'objdump -p: the installed wheel\'s %d ELF files need glibc and the '
          'tree only: %s' % (n, bad))
    test_host_libs(work, env, glob.glob(os.path.join(pkgs[0], 'kcache', 'lib', 'libkcache-store.so')))


def test_host_libs(work, env, store):
    """A host with the system's RocksDB and libstdc++ loaded first, then the
    wheel's store (host_libs.py), as nobody; no symbol of the store binds
    outside glibc."""
    host = sorted(glob.glob('/usr/lib/x86_64-linux-gnu/librocksdb.so.*'))
    if not check(host and store, 'a system RocksDB (%s) and the wheel\'s store (%s)' % (host, store)):
        return
    shutil.copy(os.path.join(HERE, 'host_libs.py'), work)
    bind = os.path.join(work, 'out', 'bind')
    try:
        # (LD_DEBUG for python alone: setpriv's own output file, root's,
        # would keep python's, under the same pid, from opening it.)
        r = run(['setpriv', '--reuid=%d' % NOBODY, '--regid=%d' % NOBODY, '--clear-groups',
                 'env', 'LD_DEBUG=bindings', 'LD_DEBUG_OUTPUT=' + bind,
                 os.path.join(work, 'venv', 'bin', 'python'), os.path.join(work, 'host_libs.py'),
                 host[0], store[0], os.path.join(work, 'store'), os.path.join(work, 'hostdb')],
                env=env, timeout=120)
        out, err = r.stdout, r.stderr
    except subprocess.TimeoutExpired as t:
        out, err = t.stdout or '', 'timed out; %s' % (t.stderr or '')
        r = None
    out = out if isinstance(out, str) else out.decode()
    err = err if isinstance(err, str) else err.decode()
    m = re.search(r'^store entries: (\d+)$', out, re.M)
    check(r is not None and r.returncode == 0 and 'host rocksdb before: host-value' in out
          and 'host rocksdb after: host-value' in out and m and int(m.group(1)) >= len(KERNELS),
          'a host with the system\'s RocksDB and libstdc++ loaded first: its database and the '
          'wheel\'s store (dlopen RTLD_LOCAL) both work (%s)' % (out + err)[-600:])
    binds = set()
    for f in glob.glob(bind + '.*'):
        # (glibc's data the program holds copies of -- stderr, environ --
        # bind to the program: their version says whose they are.)
        for src, dst, sym, ver in re.findall(
                r'binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([^\']+)\'(?: \[(\S+)\])?',
                open(f, errors='replace').read()):
            if os.path.basename(src) == 'libkcache-store.so' and \
                    os.path.basename(dst) not in TREE_LIBS and not ver.startswith('GLIBC_'):
                binds.add('%s -> %s' % (sym, os.path.basename(dst)))
    check(not binds, 'LD_DEBUG=bindings: no symbol of the store binds outside glibc in that host '
          '(%d: %s)' % (len(binds), sorted(binds)[:8]))


def main():
    if os.geteuid() != 0:
        print('the package suite needs root (debootstrap, chroot, mount): CI runs it as root')
        return 77
    for t in ('debootstrap', 'redis-server', 'redis-cli', 'git', 'setpriv'):
        if shutil.which(t) is None and not (t == 'debootstrap'):
            print('missing %s (scripts/test installs it)' % t)
            return 1
    # The test roots (debootstrap: mostly network) while scripts/package
    # builds (mostly CPU): on a fresh machine the first run pays for both.
    import threading
    made = {}

    def make(suite):
        try:
            made[suite] = make_root(suite)
        except BaseException as e:  # noqa: B902 -- reported below
            made[suite] = e
    makers = [threading.Thread(target=make, args=(s,)) for s, _ in ROOTS]
    for t in makers:
        t.start()
    base = os.environ.get('TMPDIR') or tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix='package-', dir=base)
    os.chmod(work, 0o755)
    try:
        # 1. A clean checkout: the committed tree with the working tree's
        # changes laid over it (mtimes kept), nothing built.
        co = os.path.join(work, 'src')
        r = run(['git', 'clone', '-q', '--no-hardlinks', SRC, co])
        assert r.returncode == 0, r.stderr
        files = run(['git', '-C', SRC, 'ls-files', '-co', '--exclude-standard', '-z'])
        lay = subprocess.run('tar -c --null -T - -f - | tar -x -C %s' % sh_quote(co), shell=True,
                             cwd=SRC, input=files.stdout.encode(), capture_output=True)
        assert lay.returncode == 0, lay.stderr
        dist = os.path.join(work, 'dist')
        t = time.time()
        r = run([os.path.join(co, 'scripts', 'package'), '--dist', dist], timeout=3600)
        print('scripts/package: %.0f s' % (time.time() - t), flush=True)
        if not check(r.returncode == 0, 'scripts/package from a clean checkout (%s)' % r.stderr[-2000:]):
            return 1
        version = re.search(r"version: '([^']+)'", open(os.path.join(SRC, 'meson.build')).read()).group(1)
        tarball = os.path.join(dist, 'kcache-%s-linux-x86_64.tar.gz' % version)
        wheels = glob.glob(os.path.join(dist, 'kcache-%s-*.whl' % version))
        check(os.path.isfile(tarball), 'dist/ has ' + os.path.basename(tarball))
        check(len(wheels) == 1, 'dist/ has one wheel (%s)' % wheels)

        # 4. The tag: auditwheel's, the wheel's name's, the README's.
        show = open(os.path.join(dist, 'auditwheel-show.txt')).read()
        m = re.search(r'platform tag:\s*"?(manylinux_\d+_\d+_x86_64)', show)
        readme = open(os.path.join(SRC, 'README.md')).read()
        check(m is not None and m.group(1) in readme and wheels and m.group(1) in wheels[0],
              'auditwheel show reports %s, the tag the README states and the wheel carries (%s)'
              % (m.group(1) if m else None, show[-400:]))

        # The packaged shim asks nothing of glibc above the floor (objdump
        # -T), and its record beside it says so for kcache-run.
        ex = os.path.join(work, 'shim-check')
        os.makedirs(ex)
        run(['tar', 'xzf', tarball, '-C', ex])
        lib = os.path.join(ex, 'kcache-%s' % version, 'lib')
        syms = run(['objdump', '-T', os.path.join(lib, 'libkcache.so')]).stdout
        vers = sorted({tuple(int(x) for x in v.split('.'))
                       for v in re.findall(r'GLIBC_(\d+(?:\.\d+)+)', syms)})
        rec = open(os.path.join(lib, 'libkcache.so.glibc')).read().strip()
        check(vers and vers[-1] <= (2, 31) and '.'.join(map(str, vers[-1])) == rec,
              'objdump -T: the packaged shim needs glibc %s at most (floor 2.31; its record: %s)'
              % ('.'.join(map(str, vers[-1])) if vers else None, rec))
        bad, n = needs_outside_glibc(ex)
        check(n >= 4 and not bad, 'objdump -p: the tarball\'s %d ELF files need glibc and the tree only '
              '(no C++ runtime, RocksDB, zstd, lz4, xxhash): %s' % (n, bad))
        # The man pages: share/man/man1 of the tree, the wheel's data.
        man1 = os.path.join(ex, 'kcache-%s' % version, 'share', 'man', 'man1')
        check(all(os.path.isfile(os.path.join(man1, p)) for p in ('kcache.1', 'kcache-run.1')),
              'the tarball carries share/man/man1/kcache.1 and kcache-run.1')
        if wheels:
            import zipfile
            names = zipfile.ZipFile(wheels[0]).namelist()
            check(all(any(n.endswith('.data/data/share/man/man1/' + p) for n in names)
                      for p in ('kcache.1', 'kcache-run.1')),
                  'the wheel carries kcache.1 and kcache-run.1 as data (share/man/man1)')
        needed = re.findall(r'NEEDED\s+(\S+)', run(['objdump', '-p', os.path.join(lib, 'libkcache.so')]).stdout)
        check(set(needed) <= {'libc.so.6', 'libdl.so.2', 'libpthread.so.0', 'ld-linux-x86-64.so.2'},
              'the packaged shim needs libc, libdl, libpthread only (%s)' % needed)

        nvrtc = nvrtc_dir()
        for t in makers:
            t.join()
        for suite, glibc in ROOTS:
            if isinstance(made[suite], BaseException):
                check(False, 'the %s root: %s' % (suite, made[suite]))
                continue
            test_root(suite, glibc, tarball, version, work, nvrtc)
        if wheels:
            test_wheel(wheels[0], work)
        # 5. docs/install.md's Dockerfile, its instructions carried out.
        dk = os.path.join(work, 'docker')
        os.makedirs(dk)
        dockerfile.build_and_run(sys.modules[__name__], check, tarball, version, dk, nvrtc)
    finally:
        for t in makers:
            t.join()
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print('%d failed:' % len(failures))
        for f in failures:
            print('  ' + f)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
