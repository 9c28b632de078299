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
import socket
import ssl
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


def host_files(root):
    """What every machine has and minbase may lack: /etc/hosts (bullseye's
    minbase has none, and `localhost` would not resolve). And the root's
    own libzstd (trixie's libcrypto.so.3, which Python's ssl module uses,
    needs it), from the root's own package (debootstrap's archive), in
    /opt/pyssl: strip_root removed it from the loader's path, and only the
    process that uses Python's ssl is given it (LD_LIBRARY_PATH)."""
    hosts = os.path.join(root, 'etc', 'hosts')
    if not os.path.exists(hosts):
        with open(hosts, 'w') as f:
            f.write('127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n')
    pyssl = os.path.join(root, 'opt', 'pyssl')
    os.makedirs(pyssl, exist_ok=True)
    debs = glob.glob(os.path.join(root, 'var', 'cache', 'apt', 'archives', 'libzstd1_*.deb'))
    if debs and not glob.glob(os.path.join(pyssl, 'libzstd.so.1*')):
        x = tempfile.mkdtemp(prefix='zstd-', dir=CACHE)
        try:
            if run(['dpkg-deb', '-x', debs[0], x]).returncode == 0:
                for f in glob.glob(os.path.join(x, 'lib', 'x86_64-linux-gnu', 'libzstd.so.1*')) + \
                        glob.glob(os.path.join(x, 'usr', 'lib', 'x86_64-linux-gnu', 'libzstd.so.1*')):
                    shutil.copy(f, pyssl, follow_symlinks=False)
        finally:
            shutil.rmtree(x, ignore_errors=True)


def make_root(suite):
    """A minbase root with python3, made once and cached."""
    root = os.path.join(CACHE, suite + '-test')
    stamp = suite + ' minbase python3, libstdc++ in /opt/cxx\n'
    sf = os.path.join(root, '.kcache-root')
    if os.path.isfile(sf) and open(sf).read() == stamp:
        strip_root(root)
        host_files(root)
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
    host_files(root)
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


def in_root(root, work, nvrtc, script, timeout=600, ro=()):
    """Runs `script` (sh) in the root as nobody, in a private mount
    namespace: the test's directory at /tmp/kc, the toolkit's NVRTC
    read-only at /opt/nvrtc, /proc; and each (directory, where) of `ro`
    read-only at `where`."""
    extra = ''.join('mkdir -p "$r"%s; mount --bind %s "$r"%s; mount -o remount,bind,ro "$r"%s;'
                    % (sh_quote(w), sh_quote(d), sh_quote(w), sh_quote(w)) for d, w in ro)
    mounts = ('set -e; r=%s; mkdir -p "$r/tmp/kc" "$r/opt/nvrtc" "$r/proc";'
              'mount --bind %s "$r/tmp/kc";'
              'mount --bind %s "$r/opt/nvrtc"; mount -o remount,bind,ro "$r/opt/nvrtc";'
              'mount -t proc proc "$r/proc";' + extra.replace('%', '%%') +
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


class TlsRedis:
    """A private redis-server on a loopback TLS port only (--port 0), its
    certificate (localhost, 127.0.0.1) from a CA made here with openssl;
    the default user off, the ACL user kc with the password file's
    password. The roots share this machine's network."""
    USER = 'kc'

    def __init__(self, d):
        self.dir = d
        os.makedirs(d)
        os.chmod(d, 0o755)
        self.ca, self.pwfile = os.path.join(d, 'ca.crt'), os.path.join(d, 'redis.pw')
        p = lambda n: os.path.join(d, n)  # noqa: E731
        for args in (['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
                      '-subj', '/CN=kcache package test CA', '-keyout', p('ca.key'), '-out', self.ca,
                      '-addext', 'basicConstraints=critical,CA:TRUE',
                      '-addext', 'keyUsage=critical,keyCertSign,cRLSign'],
                     ['req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost',
                      '-keyout', p('server.key'), '-out', p('server.csr')]):
            r = run(['openssl'] + args)
            assert r.returncode == 0, r.stderr
        with open(p('server.ext'), 'w') as f:
            # What X509_STRICT (Python >= 3.13's default) asks of them too.
            f.write('subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n'
                    'keyUsage=critical,digitalSignature,keyEncipherment\n'
                    'subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n')
        r = run(['openssl', 'x509', '-req', '-in', p('server.csr'), '-CA', self.ca, '-CAkey', p('ca.key'),
                 '-CAcreateserial', '-days', '1', '-extfile', p('server.ext'), '-out', p('server.crt')])
        assert r.returncode == 0, r.stderr
        self.password = os.urandom(12).hex()
        with open(self.pwfile, 'w') as f:
            f.write(self.password + '\n')
        # The CA as a hashed directory too (SSL_CERT_DIR).
        os.makedirs(p('certs'))
        shutil.copy(self.ca, p('certs'))
        r = run(['openssl', 'rehash', p('certs')])
        assert r.returncode == 0, r.stderr
        # kcache reads them as nobody: files of that user, the password's 0600.
        for f in [self.ca, self.pwfile, p('certs')] + glob.glob(os.path.join(p('certs'), '*')):
            os.chown(f, NOBODY, NOBODY, follow_symlinks=False)
        os.chmod(self.pwfile, 0o600)
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            self.port = s.getsockname()[1]
        self.p = subprocess.Popen(
            ['redis-server', '--bind', '127.0.0.1', '--port', '0', '--tls-port', str(self.port),
             '--tls-cert-file', p('server.crt'), '--tls-key-file', p('server.key'),
             '--tls-ca-cert-file', self.ca, '--tls-auth-clients', 'no',
             '--user', 'default', 'off', '--user', self.USER, 'on', '>' + self.password, '~*', '&*', '+@all',
             '--dir', d, '--save', '', '--appendonly', 'no', '--logfile', p('log')],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            try:
                if self.cmd('PING') == b'PONG':
                    return
            except (OSError, ssl.SSLError):
                pass
            time.sleep(0.025)
        raise SystemExit('the TLS redis-server did not start (%s)' % p('log'))

    def url(self):
        return 'rediss://%s@localhost:%d' % (self.USER, self.port)

    def cmd(self, *args):
        """One command as kc over TLS; its reply (simple, bulk or array)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        with socket.create_connection(('127.0.0.1', self.port), timeout=10) as s, \
                ctx.wrap_socket(s, server_hostname='localhost') as t:
            def enc(parts):
                parts = [x.encode() for x in parts]
                return b'*%d\r\n' % len(parts) + b''.join(b'$%d\r\n%s\r\n' % (len(x), x) for x in parts)
            t.sendall(enc(['AUTH', self.USER, self.password]) + enc(list(args)))
            with t.makefile('rb') as f:
                def reply():
                    line = f.readline()
                    if line[:1] == b'*':
                        return [reply() for _ in range(int(line[1:]))]
                    if line[:1] == b'$':
                        data = f.read(int(line[1:]) + 2)
                        return data[:-2]
                    return line[1:].strip()
                reply()
                return reply()

    def entries(self):
        return [k for k in self.cmd('KEYS', 'kcache:*')
                if not k.startswith((b'kcache:lock:', b'kcache:writer:'))]

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

# rediss:// from the root, with the tarball's kcache-run and with the wheel's
# (pip-installed into a venv of the root's python3: minbase has no pip, so
# pip's own wheel runs it, with the install scheme sysconfig's, as pip
# chooses on Python >= 3.10: on 3.9 it would ask distutils, which
# bullseye's minbase lacks): node A compiles and uploads over TLS, a fresh
# node B is served by the remote in a process that also uses Python's ssl
# (ssl_compose.py) before and after kcache's connection.
TLS_SCRIPT = r'''
cd /tmp/kc
T=$1; NV=$2; URL=$3; shift 3
mkdir -p home tls
python3 -m venv --without-pip venv > tls/venv.log 2>&1 &&
    venv/bin/python -c 'import runpy, sys, sysconfig
sysconfig._PIP_USE_SYSCONFIG = True
sys.path.insert(0, "pip.whl")
sys.argv = ["pip"] + sys.argv[1:]
runpy.run_module("pip", run_name="__main__", alter_sys=True)' \
        install -q --no-index --no-deps --disable-pip-version-check ./kcache-*.whl >> tls/venv.log 2>&1
echo $? > tls/venv.rc
$T/bin/kcache keygen home/t.key > tls/keygen 2>&1
export KCACHE_REMOTE=$URL KCACHE_REMOTE_CA_FILE=/tmp/kc/redis-tls/ca.crt \
    KCACHE_REMOTE_PASSWORD_FILE=/tmp/kc/redis-tls/redis.pw \
    KCACHE_REMOTE_SIGNING_KEY=/tmp/kc/home/t.key KCACHE_REMOTE_TRUSTED_KEYS=/tmp/kc/home/t.key.pub \
    KCACHE_STATS=1 KCACHE_OWNER_IDLE_MS=500
for v in tarball wheel; do
    case $v in
    tarball) B=$T/bin K="ta tb" ;;
    wheel) B=/tmp/kc/venv/bin K="wa wb" ;;
    esac
    KCACHE_DIR=/tmp/kc/tls-$v-a $B/kcache remote ping > tls/$v.ping 2>&1; echo $? > tls/$v.ping.rc
    # No KCACHE_REMOTE_CA_FILE: the CA through SSL_CERT_FILE, through
    # SSL_CERT_DIR, and neither (the root has no trust store that holds it).
    for how in file dir none; do
        case $how in
        file) E=SSL_CERT_FILE=/tmp/kc/redis-tls/ca.crt ;;
        dir) E=SSL_CERT_DIR=/tmp/kc/redis-tls/certs ;;
        none) E= ;;
        esac
        env -u KCACHE_REMOTE_CA_FILE $E KCACHE_DIR=/tmp/kc/tls-$v-env $B/kcache remote ping \
            > tls/$v.env-$how 2>&1
        echo $? > tls/$v.env-$how.rc
    done
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/cxx python3 nvrtc_ctypes.py "$NV" compute_80 $K \
        > tls/$v.ref 2> tls/$v.ref.err
    KCACHE_DIR=/tmp/kc/tls-$v-a LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/cxx \
        $B/kcache-run python3 nvrtc_ctypes.py "$NV" compute_80 $K > tls/$v.a 2> tls/$v.a.err
    : > tls/$v.a-done
    i=0
    while [ ! -e tls/$v.uploaded ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    KCACHE_DIR=/tmp/kc/tls-$v-b LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/cxx:/opt/pyssl \
        $B/kcache-run python3 ssl_compose.py tls/$v.ssl "$NV" compute_80 $K > tls/$v.b 2> tls/$v.b.err
done
'''


def check_tls(where, out, redis, counts):
    def rd(n):
        p = os.path.join(out, n)
        return open(p).read() if os.path.exists(p) else ''
    for v in ('tarball', 'wheel'):
        w = '%s, %s, rediss://' % (where, v)
        if v == 'wheel':
            check(rd('venv.rc').strip() == '0', '%s: the wheel pip-installed into a venv of the root\'s '
                  'python3 (%s)' % (where, rd('venv.log')[-400:]))
        check(rd(v + '.ping.rc').strip() == '0', '%s: kcache remote ping (%s)' % (w, rd(v + '.ping')[-400:]))
        for how, var in (('file', 'SSL_CERT_FILE'), ('dir', 'SSL_CERT_DIR')):
            check(rd('%s.env-%s.rc' % (v, how)).strip() == '0',
                  '%s: no KCACHE_REMOTE_CA_FILE, the CA in %s: kcache remote ping verifies the server (%s)'
                  % (w, var, rd('%s.env-%s' % (v, how))[-300:]))
        check(rd(v + '.env-none.rc').strip() not in ('', '0') and 'did not verify' in rd(v + '.env-none'),
              '%s: neither: the server does not verify (%s)' % (w, rd(v + '.env-none')[-300:]))
        ref = rd(v + '.ref')
        check(len(ref.splitlines()) == 2 and rd(v + '.a') == ref,
              '%s: node A: NVRTC\'s own outputs (%s)' % (w, rd(v + '.a.err')[-400:]))
        check(stats_line(rd(v + '.a.err')) == (0, 2) and remote_part(rd(v + '.a.err')) is not None
              and 'warning' not in rd(v + '.a.err'),
              '%s: node A compiled both, the remote on, no warning (%s)' % (w, rd(v + '.a.err')[-400:]))
        check(counts.get(v, 0) >= 2, '%s: node A uploaded its compiles over TLS (%d entries)'
              % (w, counts.get(v, 0)))
        check(rd(v + '.b') == ref, '%s: a fresh node B: NVRTC\'s own outputs (%s)' % (w, rd(v + '.b.err')[-400:]))
        check(stats_line(rd(v + '.b.err')) == (2, 0) and remote_part(rd(v + '.b.err')) == (4, 0),
              '%s: a fresh node B: no compile, 4 remote hits, no remote miss (%s)'
              % (w, rd(v + '.b.err')[-300:]))
        rep = rd(v + '.ssl')
        check('before: +OK +PONG' in rep and 'after: +OK +PONG' in rep and
              'kcache tls object mapped: True' in rep and 'python libssl mapped: True' in rep,
              '%s: Python\'s ssl (its OpenSSL) works before and after kcache\'s TLS connection in '
              'the same process, both mapped (%s)' % (w, rep.replace('\n', '; ')))


def tls_exports(where, lib):
    """The TLS object exports its table alone and needs no libssl or
    libcrypto: OpenSSL and hiredis are linked in, hidden."""
    if not check(os.path.isfile(lib), '%s: carries lib/libkcache-remote-tls.so (rediss://)' % where):
        return
    syms = set(re.findall(r'^\S+\s+[A-Za-z]\s+(\S+)$', run(['nm', '-D', '--defined-only', lib]).stdout, re.M))
    needed = re.findall(r'NEEDED\s+(\S+)', run(['objdump', '-p', lib]).stdout)
    ossl = sorted(x for x in run(['nm', '-D', lib]).stdout.split()
                  if re.match(r'(SSL|EVP|X509|OPENSSL|CRYPTO|ERR|BIO|redis)_', x))
    check(syms - {'_init', '_fini'} == {'kc_remote_tls'} and not ossl and
          not [n for n in needed if n.startswith(('libssl', 'libcrypto'))],
          '%s: libkcache-remote-tls.so exports kc_remote_tls alone, names no OpenSSL or hiredis symbol, '
          'needs no libssl/libcrypto (defined %s; OpenSSL/hiredis %s; NEEDED %s)'
          % (where, sorted(syms)[:6], ossl[:6], needed))


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


def test_root(suite, glibc, tarball, wheel, version, work_root, nvrtc):
    root = make_root(suite)
    work = os.path.join(work_root, suite)
    for d in ('home', 'out', 'rout', 'tls'):
        os.makedirs(os.path.join(work, d))
    shutil.copy(tarball, work)
    if wheel:
        shutil.copy(wheel, work)
    pip = sorted(glob.glob(os.path.join(CACHE, 'wheels', 'pip-*.whl')))
    check(pip, '%s: pip\'s wheel (scripts/package\'s download, %s/wheels)' % (suite, CACHE))
    if pip:
        shutil.copy(pip[-1], os.path.join(work, 'pip.whl'))
    shutil.copy(os.path.join(HERE, 'nvrtc_ctypes.py'), work)
    shutil.copy(os.path.join(HERE, 'ssl_compose.py'), work)
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

        tls = TlsRedis(os.path.join(work, 'redis-tls'))
        try:
            import threading
            done, counts = threading.Event(), {}

            def watch():
                # After each node A, its uploads: the count grows by at
                # least one entry a kernel and then stays for 1 s.
                base = 0
                for v in ('tarball', 'wheel'):
                    while not done.is_set() and not os.path.exists(os.path.join(work, 'tls', v + '.a-done')):
                        time.sleep(0.1)
                    deadline = time.time() + 60
                    last, since = -1, time.time()
                    while not done.is_set() and time.time() < deadline:
                        n = len(tls.entries())
                        if n != last:
                            last, since = n, time.time()
                        elif n >= base + 2 and time.time() - since >= 1.0:
                            break
                        time.sleep(0.1)
                    counts[v] = max(last, 0) - base
                    base = max(last, base)
                    open(os.path.join(work, 'tls', v + '.uploaded'), 'w').close()
            th = threading.Thread(target=watch)
            th.start()
            # This machine's trust store (Debian's ca-certificates) in the
            # root, where the packaged OpenSSL, whose compiled-in default
            # is not the system's, must still find it, and SSL_CERT_FILE /
            # SSL_CERT_DIR still win over it.
            store = [(d, d) for d in ('/etc/ssl/certs', '/usr/share/ca-certificates') if os.path.isdir(d)]
            check(len(store) == 2, 'this machine has a Debian trust store to lend the roots (%s)' % store)
            r = in_root(root, work, nvrtc, 'set -- %s %s %s\n%s' % (T, NV, tls.url(), TLS_SCRIPT), ro=store)
            done.set()
            th.join()
            check(r.returncode == 0, '%s: the rediss:// script ran (%s)' % (suite, r.stderr[-400:]))
            check_tls(suite, os.path.join(work, 'tls'), tls, counts)
            # The system's trust store where each distribution keeps it
            # (the test CA its only certificate, nothing else in the
            # root): no KCACHE_REMOTE_CA_FILE, no SSL_CERT_*, the tarball's
            # kcache remote ping verifies the server.
            for name, where, f in (('Debian', '/etc/ssl/certs', 'ca-certificates.crt'),
                                   ('RHEL', '/etc/pki/tls/certs', 'ca-bundle.crt'),
                                   ('Fedora', '/etc/pki/ca-trust/extracted/pem', 'tls-ca-bundle.pem'),
                                   ('SUSE', '/var/lib/ca-certificates', 'ca-bundle.pem'),
                                   ('Alpine', '/etc/ssl', 'cert.pem')):
                d = os.path.join(work, 'trust-' + name)
                os.makedirs(d)
                shutil.copy(tls.ca, os.path.join(d, f))
                os.chmod(os.path.join(d, f), 0o644)
                r = in_root(root, work, nvrtc,
                            'export KCACHE_REMOTE=%s KCACHE_REMOTE_PASSWORD_FILE=/tmp/kc/redis-tls/redis.pw '
                            'KCACHE_REMOTE_SIGNING_KEY=/tmp/kc/home/t.key '
                            'KCACHE_REMOTE_TRUSTED_KEYS=/tmp/kc/home/t.key.pub '
                            'KCACHE_DIR=/tmp/kc/trust-store; %s/bin/kcache remote ping 2>&1'
                            % (tls.url(), T), ro=[(d, where)])
                check(r.returncode == 0, '%s: tarball, the trust store as %s keeps it (%s/%s): kcache remote '
                      'ping verifies the server (%s)' % (suite, name, where, f, (r.stdout + r.stderr)[-300:]))
            tls_exports('%s, tarball' % suite, os.path.join(work, 'kcache-' + version, 'lib',
                                                           'libkcache-remote-tls.so'))
            lib = glob.glob(os.path.join(work, 'venv', 'lib', 'python3*', 'site-packages', 'kcache', 'lib',
                                         'libkcache-remote-tls.so'))
            tls_exports('%s, the installed wheel' % suite, lib[0] if lib else 'the installed wheel\'s lib/')
        finally:
            tls.stop()
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
        if not check(r.returncode == 0, 'scripts/package from a clean checkout (%s)' % (
                r.stdout[-3000:] + r.stderr[-2000:])):
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
            test_root(suite, glibc, tarball, wheels[0] if wheels else None, version, work, nvrtc)
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
