#!/usr/bin/env python3
"""The remote over TLS and with ACL users (issue 48, one server), on the
nodes of test_remote_e2e.py against private redis-servers with a TLS port
and certificates this script makes with openssl.

    test_remote_tls.py MODE NVRTC_BENCH KC_REMOTE_FORGE

MODE:
  serve    rediss:// with KCACHE_REMOTE_CA_FILE and an ACL user
           (rediss://USER@host, the password from KCACHE_REMOTE_PASSWORD_FILE):
           a node compiles and its owner uploads over TLS; a fresh node is
           served everything, NVRTC's own bytes, one full handshake in the
           process and its other connections resuming the session; neither
           the password nor a kernel's source or PTX crosses the wire in the
           clear (a relay records the bytes, and tcpdump captures the
           loopback when installed; both see them over redis://); the
           password is in no log line (debug), `kcache config` output or
           file of the nodes' stores and homes
  refuse   each failure costs the run nothing (NVRTC's own bytes), is
           counted, and says why in one warning: an untrusted CA, a wrong
           host name, a MITM relay presenting its own certificate (it gets
           no byte; trusting its CA would give it the password), an expired
           certificate, a plain server on rediss://,
           a TLS server on redis://, mutual TLS required without a client
           certificate (and with one: served), a wrong password, an ACL user
           denied writes (the node reads only: one warning, counted);
           KCACHE_REMOTE_TLS_VERIFY=0 connects to an unverifiable server,
           warns once, and `kcache config` says so
  shards   two TLS shards, 4 nodes x 4 processes (the 4-node trial over
           TLS): one compile per kernel, NVRTC's own bytes, a fresh
           read-only node served every signed entry
  cluster  the same against a 3+3 Redis Cluster over TLS
           (rediss-cluster://; tls-cluster, tls-replication)
  trial    test_remote_e2e.py's trial (4 nodes x 4 processes, header edits,
           KCACHE_REMOTE unset), its server over TLS
  cluster-down  test_remote_e2e.py's cluster-down, every server over TLS
"""
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
MODE = sys.argv[1]
sys.argv = [sys.argv[0], 'trust'] + sys.argv[2:]
import test_remote_e2e as e  # noqa: E402

check, KERNELS, K = e.check, e.KERNELS, e.K
PASSWORD = 'pw-7Gq2-never-in-clear'
FAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1'


def sh(*args, env=None):
    r = subprocess.run(list(args), capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, (args, r.stderr)


class Pki:
    """Two CAs and the certificates the cases need, made with openssl."""

    def __init__(self, root):
        self.d = os.path.join(root, 'pki')
        os.makedirs(self.d)
        self.ca = self.make_ca('ca')
        self.other_ca = self.make_ca('other-ca')
        self.server = self.cert('server', self.ca, 'DNS:localhost,IP:127.0.0.1')
        self.wrong_name = self.cert('wrong', self.ca, 'DNS:elsewhere.example')
        self.untrusted = self.cert('untrusted', self.other_ca, 'DNS:localhost,IP:127.0.0.1')
        self.expired = self.cert('expired', self.ca, 'DNS:localhost,IP:127.0.0.1', old=True)
        self.client = self.cert('client', self.ca, 'DNS:client', client=True)
        # A cluster node's: a server's, and a client's on the cluster bus
        # and the replication link (tls-cluster, tls-replication).
        self.node = self.cert('node', self.ca, 'DNS:localhost,IP:127.0.0.1', client=None)
        # A relay's own, trusted by nobody kcache trusts.
        self.mitm = self.cert('mitm', self.other_ca, 'DNS:localhost,IP:127.0.0.1')

    def p(self, name):
        return os.path.join(self.d, name)

    def make_ca(self, name):
        sh('openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '30',
           '-subj', '/CN=kcache test ' + name, '-keyout', self.p(name + '.key'),
           '-out', self.p(name + '.crt'))
        os.chmod(self.p(name + '.key'), 0o600)
        return name

    def cert(self, name, ca, san, old=False, client=False):
        key, csr, crt, ext = (self.p(name + s) for s in ('.key', '.csr', '.crt', '.ext'))
        sh('openssl', 'req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=' + name,
           '-keyout', key, '-out', csr)
        os.chmod(key, 0o600)
        with open(ext, 'w') as f:
            f.write('subjectAltName=%s\nextendedKeyUsage=%s\n'
                    % (san, 'serverAuth,clientAuth' if client is None
                       else 'clientAuth' if client else 'serverAuth'))
        env = None
        if old:  # valid for a day, twenty years ago
            env = dict(os.environ, LD_PRELOAD=FAKETIME, FAKETIME='@2005-01-01 00:00:00')
        sh('openssl', 'x509', '-req', '-in', csr, '-CA', self.p(ca + '.crt'),
           '-CAkey', self.p(ca + '.key'), '-CAcreateserial', '-days', '1', '-extfile', ext,
           '-out', crt, env=env)
        return name


class TlsRedis:
    """A private redis-server on a loopback TLS port only (--port 0), or
    on a plain port; ACL users alice (all) and reader (-@write)."""

    def __init__(self, ctx, pki, cert='server', tls=True, clients='no'):
        self.dir = os.path.join(ctx.root, 'tls%d' % len(ctx.servers))
        os.makedirs(self.dir)
        ctx.servers.append(self)
        self.pki, self.tls = pki, tls
        self.port = e.free_port()
        args = ['redis-server', '--bind', '127.0.0.1', '--dir', self.dir, '--save', '',
                '--appendonly', 'no', '--logfile', os.path.join(self.dir, 'log'),
                '--user', 'default', 'off',
                '--user', 'alice', 'on', '>' + PASSWORD, '~*', '&*', '+@all',
                '--user', 'reader', 'on', '>' + PASSWORD, '~*', '&*', '+@all', '-@write']
        if tls:
            args += ['--port', '0', '--tls-port', str(self.port),
                     '--tls-cert-file', pki.p(cert + '.crt'), '--tls-key-file',
                     pki.p(cert + '.key'), '--tls-ca-cert-file', pki.p('ca.crt'),
                     '--tls-auth-clients', clients]
        else:
            args += ['--port', str(self.port)]
        self.p = subprocess.Popen(args, preexec_fn=e._die_with_us, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        for _ in range(400):
            with socket.socket() as s:
                if s.connect_ex(('127.0.0.1', self.port)) == 0:
                    return
            time.sleep(0.025)
        raise RuntimeError('redis-server did not start in ' + self.dir)

    def url(self, scheme='rediss', user='alice', host='localhost'):
        return '%s://%s@%s:%d' % (scheme, user, host, self.port)

    def cmd(self, *args):
        """One command as alice, over TLS with the client certificate."""
        s = socket.create_connection(('127.0.0.1', self.port), timeout=10)
        if self.tls:
            c = ssl.create_default_context(cafile=self.pki.p('ca.crt'))
            c.load_cert_chain(self.pki.p('client.crt'), self.pki.p('client.key'))
            s = c.wrap_socket(s, server_hostname='localhost')
        with s:
            parts = [a if isinstance(a, bytes) else str(a).encode()
                     for a in ('AUTH', 'alice', PASSWORD)] + \
                    [a if isinstance(a, bytes) else str(a).encode() for a in args]
            s.sendall(b'*3\r\n' + b''.join(b'$%d\r\n%s\r\n' % (len(p), p) for p in parts[:3]) +
                      b'*%d\r\n' % len(args) +
                      b''.join(b'$%d\r\n%s\r\n' % (len(p), p) for p in parts[3:]))
            with s.makefile('rb') as f:
                e._reply(f)
                return e._reply(f)

    def entries(self):
        return sorted(k.decode() for k in self.cmd('KEYS', 'kcache:*')
                      if not k.startswith((b'kcache:lock:', b'kcache:writer:')))

    def stop(self):
        if self.p is not None:
            self.p.kill()
            self.p.wait()
            self.p = None


class Relay(e.Relay):
    """A relay that keeps every byte, both ways."""

    def __init__(self, port):
        self.seen, self.lock = bytearray(), threading.Lock()
        super().__init__(port)

    def seen_chunk(self, data, up):
        with self.lock:
            self.seen += data


class E2eTls:
    """test_remote_e2e.py's servers and nodes over TLS (its TLS switch):
    TLS ports only, the cluster bus and replication over TLS, the default
    user off and alice (the password file's) for clients, replicas and
    redis-cli."""

    def __init__(self, pki, pw):
        self.pki, self.pw = pki, pw

    def server_args(self, args, port):
        i = args.index('--port')
        args[i + 1] = '0'
        return args + ['--tls-port', str(port), '--tls-cert-file', self.pki.p('node.crt'),
                       '--tls-key-file', self.pki.p('node.key'), '--tls-ca-cert-file',
                       self.pki.p('ca.crt'), '--tls-auth-clients', 'no', '--tls-cluster', 'yes',
                       '--tls-replication', 'yes', '--user', 'default', 'off',
                       '--user', 'alice', 'on', '>' + PASSWORD, '~*', '&*', '+@all',
                       '--masteruser', 'alice', '--masterauth', PASSWORD]

    # The TLS handshake is bounded by the connect timeout (100 ms by
    # default); here 16 processes handshake at once with each server on a
    # machine running other builds beside: a second, as docs/sharing.md
    # says to set for a loaded or far server.
    ATTRS = '|connect-timeout=1000'

    def url(self, port):
        return 'rediss://alice@127.0.0.1:%d%s' % (port, self.ATTRS)

    def cluster_url(self, ports):
        return 'rediss-cluster://alice@' + ','.join('127.0.0.1:%d' % p for p in ports) + \
            self.ATTRS

    def cmd(self, port, *args):
        s = socket.create_connection(('127.0.0.1', port), timeout=10)
        c = ssl.create_default_context(cafile=self.pki.p('ca.crt'))
        with c.wrap_socket(s, server_hostname='127.0.0.1') as t:
            parts = [('AUTH', 'alice', PASSWORD), args]
            t.sendall(b''.join(
                b'*%d\r\n' % len(a) + b''.join(
                    b'$%d\r\n%s\r\n' % (len(x), x)
                    for x in (y if isinstance(y, bytes) else str(y).encode() for y in a))
                for a in parts))
            with t.makefile('rb') as f:
                e._reply(f)
                return e._reply(f)

    def cli_args(self):
        return ['--tls', '--cacert', self.pki.p('ca.crt'), '--user', 'alice', '--pass', PASSWORD,
                '--no-auth-warning']

    def env(self):
        return {'KCACHE_REMOTE_PASSWORD_FILE': self.pw, 'KCACHE_REMOTE_CA_FILE': self.pki.p('ca.crt')}


class Mitm:
    """A relay on the path that ends TLS with its own certificate (its CA
    one kcache does not trust, the server's names) and speaks TLS to the
    real server: what the client sends it arrives in clear here, if the
    client goes on."""

    def __init__(self, pki, port):
        self.to, self.got, self.handshakes = port, bytearray(), 0
        self.pki = pki
        self.srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.srv.load_cert_chain(pki.p('mitm.crt'), pki.p('mitm.key'))
        self.s = socket.socket()
        self.s.bind(('127.0.0.1', 0))
        self.s.listen(16)
        self.port = self.s.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                a, _ = self.s.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(a,), daemon=True).start()

    def serve(self, a):
        try:
            a.settimeout(10)
            t = self.srv.wrap_socket(a, server_side=True)
            self.handshakes += 1
            up = ssl.create_default_context(cafile=self.pki.p('ca.crt')).wrap_socket(
                socket.create_connection(('127.0.0.1', self.to)), server_hostname='localhost')
            threading.Thread(target=self.pump, args=(up, t, False), daemon=True).start()
            self.pump(t, up, True)
        except (OSError, ssl.SSLError):
            a.close()

    def pump(self, x, y, keep):
        try:
            while True:
                d = x.recv(65536)
                if not d:
                    break
                if keep:
                    self.got += d
                y.sendall(d)
        except (OSError, ssl.SSLError):
            pass


class Capture:
    """tcpdump on the loopback for some ports (pcap bytes), when tcpdump is
    installed and may capture; else None (the Relay's bytes then stand
    alone)."""

    def __init__(self, root, ports):
        self.p, self.path = None, os.path.join(root, 'lo-%d.pcap' % ports[0])
        if shutil.which('tcpdump') is None:
            print('tcpdump is not installed: the relay\'s record alone is checked')
            return
        flt = ' or '.join('tcp port %d' % p for p in ports)
        self.p = subprocess.Popen(['tcpdump', '-i', 'lo', '--immediate-mode', '-U', '-s', '0', '-w', self.path, flt],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  preexec_fn=e._die_with_us)
        line = self.p.stderr.readline().decode(errors='replace')
        if 'listening' not in line:
            self.p.kill()
            self.p.wait()
            self.p = None
            print('tcpdump cannot capture here (%s): the relay\'s record alone is checked'
                  % line.strip())

    def bytes(self):
        if self.p is None:
            return None
        # Packets reach tcpdump a moment after they crossed lo: wait until
        # the file stops growing (at most 3 s), then stop it.
        last, deadline = -1, time.monotonic() + 3
        while time.monotonic() < deadline:
            size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
            if size == last and size > 24:
                break
            last = size
            time.sleep(0.3)
        self.p.terminate()
        self.p.wait()
        self.p.stderr.close()
        with open(self.path, 'rb') as f:
            return f.read()


# What no byte on the wire of a TLS run may hold: the password, the
# kernels' source and their PTX.
def secrets():
    out = [PASSWORD.encode(), b'.visible .entry']
    out += [src.split('{')[-1].strip().encode()[:24] for src in e.K_SRC.values()]
    return out


def files_holding(root, needle):
    """The files under root whose bytes hold needle."""
    hits = []
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, 'rb') as fh:
                        if needle in fh.read():
                            hits.append(p)
            except OSError:
                pass
    return hits


def setup(ctx):
    pki = Pki(ctx.root)
    pw = os.path.join(ctx.root, 'redis.pw')
    with open(pw, 'w') as f:
        f.write(PASSWORD + '\n')
    os.chmod(pw, 0o600)
    return pki, pw


def tls_env(pki, pw, **kw):
    env = {'KCACHE_REMOTE_PASSWORD_FILE': pw, 'KCACHE_REMOTE_CA_FILE': pki.p('ca.crt')}
    env.update(kw)
    return env


def warnings(run):
    return [ln for ln in run.stderr.splitlines() if 'warning: remote' in ln]


def serve(ctx):
    pki, pw = setup(ctx)
    rs = TlsRedis(ctx, pki)
    relay = Relay(rs.port)
    cap = Capture(ctx.root, [rs.port, relay.port])
    url = 'rediss://alice@localhost:%d' % relay.port
    dbg = dict(tls_env(pki, pw), KCACHE_LOG='debug')
    writer = ctx.node(url, extra=dbg)
    r = writer.start(KERNELS, ctx).wait()
    logs = r.stderr
    e.check_outputs([r], ctx.ref, 'rediss:// writer')
    check(r.misses == K and not warnings(r), 'the writer compiled, no warning (%s)'
          % warnings(r))
    writer.settle()
    check(len(rs.entries()) == 2 * K, 'its owner uploaded over TLS (%d entries)'
          % len(rs.entries()))
    reader = ctx.node(url, writer=False, extra=dbg)
    r = reader.start(KERNELS, ctx).wait()
    logs += r.stderr
    e.check_outputs([r], ctx.ref, 'rediss:// fresh node')
    check(r.misses == 0 and r.remote is not None and r.remote['hits'] >= K,
          'a fresh node is served everything over TLS (misses %d, %s)' % (r.misses, r.remote))
    made = r.stderr.count('TLS session made')
    resumed = r.stderr.count('TLS session resumed')
    check(made == 1 and resumed >= 2 * K - 1,
          'one full handshake per process and server, the next connections resume its '
          'session (%d made, %d resumed)' % (made, resumed))
    # kcache stats counts them: each connection a session made or resumed.
    rem = reader.stats()['remote']
    smade, sres = rem.get('tls_sessions_made'), rem.get('tls_sessions_resumed')
    check(smade is not None and sres is not None and smade >= made and sres >= resumed and
          smade + sres == rem['connects'],
          'kcache stats counts the TLS sessions made and resumed (%s made, %s resumed, %d '
          'connections; the host\'s log: %d made, %d resumed)'
          % (smade, sres, rem['connects'], made, resumed))
    time.sleep(0.2)
    with relay.lock:
        seen = bytes(relay.seen)
    wire = cap.bytes()
    for what, got in (('relayed', seen), ('captured on lo by tcpdump', wire)):
        if got is None:
            continue
        leaked = [x for x in secrets() if x in got]
        check(len(got) > 1000 and not leaked and b'AUTH' not in got,
              'neither the password nor a kernel\'s source or PTX crossed the wire in the '
              'clear (%d bytes %s; %s)' % (len(got), what, leaked))
    # The same captures see them over redis:// (the checks can fail).
    plain = TlsRedis(ctx, pki, tls=False)
    relay2 = Relay(plain.port)
    cap2 = Capture(ctx.root, [plain.port])
    n = ctx.node('redis://alice@127.0.0.1:%d' % relay2.port, extra=tls_env(pki, pw))
    n.start(KERNELS[:1], ctx).wait()
    n.settle()
    time.sleep(0.2)
    wire2 = cap2.bytes()
    check(PASSWORD.encode() in bytes(relay2.seen) and
          (wire2 is None or (PASSWORD.encode() in wire2 and b'.visible .entry' in wire2)),
          'over redis:// the captures see the password and the PTX (they work)')
    # Nowhere else either: no log line (debug), `kcache config`, no file
    # of the nodes' stores and homes.
    check(PASSWORD not in logs, 'the password is in no log line (KCACHE_LOG=debug)')
    out = subprocess.run([e.TOOL, 'config'], env=reader.environ(), capture_output=True,
                         text=True, timeout=60)
    check(PASSWORD not in out.stdout + out.stderr and 'KCACHE_REMOTE_CA_FILE' in out.stdout,
          '`kcache config` shows the TLS settings, never the password')
    held = [p for nd in (writer, reader, n) for p in files_holding(nd.root, PASSWORD.encode())]
    check(not held, 'no file of the nodes\' stores or homes holds the password (%s)' % held)


def refuse(ctx):
    pki, pw = setup(ctx)

    def case(what, url, extra, want, reason):
        n = ctx.node(url, writer=False, extra=extra)
        r = n.start(KERNELS, ctx).wait()
        ws = warnings(r)
        e.check_outputs([r], ctx.ref, what)
        counted = r.remote is not None and r.remote['errors'] + r.remote['timeouts'] >= 1
        check(len(ws) == 1 and re.search(want, ws[0]) is not None and counted,
              '%s: one warning saying %s, counted (%s; %s)' % (what, reason, ws, r.remote))

    good = TlsRedis(ctx, pki)
    env = tls_env(pki, pw)
    case('an untrusted CA', good.url(), tls_env(pki, pw, KCACHE_REMOTE_CA_FILE=pki.p(
        'other-ca.crt')), r'did not verify', 'the certificate did not verify')
    wrong = TlsRedis(ctx, pki, cert='wrong')
    case('a wrong host name', wrong.url(), env, r'did not verify: [Hh]ostname mismatch',
         'hostname mismatch')
    case('a wrong IP', wrong.url(host='127.0.0.1'), env, r'did not verify: IP address mismatch',
         'the IP is not in the certificate')
    mitm = Mitm(pki, good.port)
    case('a relay presenting its own certificate (MITM)', 'rediss://alice@localhost:%d'
         % mitm.port, env, r'did not verify', 'the certificate did not verify')
    check(mitm.handshakes == 0 and PASSWORD.encode() not in bytes(mitm.got)
          and not mitm.got, 'the MITM relay got no TLS session and no byte of the client\'s '
          '(%d sessions, %d bytes)' % (mitm.handshakes, len(mitm.got)))
    # The relay is a working MITM: a client that trusted its CA would give
    # it the password (the check above can fail).
    n = ctx.node('rediss://alice@localhost:%d' % mitm.port, writer=False,
                 extra=tls_env(pki, pw, KCACHE_REMOTE_CA_FILE=pki.p('other-ca.crt')))
    r = n.start(KERNELS[:1], ctx).wait()
    check(mitm.handshakes >= 1 and PASSWORD.encode() in bytes(mitm.got),
          'a client trusting the relay\'s CA gives it the password (the MITM works: %s)'
          % warnings(r))
    expired = TlsRedis(ctx, pki, cert='expired')
    case('an expired certificate', expired.url(), env, r'certificate has expired', 'expired')
    plain = TlsRedis(ctx, pki, tls=False)
    case('a plain server on rediss://', plain.url(host='127.0.0.1'), env,
         r'no TLS|plain Redis', 'no TLS')
    case('a TLS server on redis://', good.url(scheme='redis', host='127.0.0.1'), env,
         r'rediss://', 'to use rediss://')
    case('a wrong password', good.url(), dict(env, KCACHE_REMOTE_PASSWORD_FILE=None) | {
        'KCACHE_REMOTE': 'rediss://alice:wrong@localhost:%d' % good.port},
        r'WRONGPASS', 'WRONGPASS')
    mutual = TlsRedis(ctx, pki, clients='yes')
    case('mutual TLS without a client certificate', mutual.url(), env,
         r'certificate', 'a client certificate is wanted')
    n = ctx.node(mutual.url(), extra=tls_env(pki, pw, KCACHE_REMOTE_CERT_FILE=pki.p(
        'client.crt'), KCACHE_REMOTE_KEY_FILE=pki.p('client.key')))
    r = n.start(KERNELS, ctx).wait()
    n.settle()
    e.check_outputs([r], ctx.ref, 'mutual TLS with a client certificate')
    check(not warnings(r) and len(mutual.entries()) == 2 * K,
          'mutual TLS with a client certificate: uploads (%s)' % warnings(r))
    os.chmod(pki.p('client.key'), 0o644)
    n2 = ctx.node(mutual.url(), writer=False, extra=tls_env(
        pki, pw, KCACHE_REMOTE_CERT_FILE=pki.p('client.crt'),
        KCACHE_REMOTE_KEY_FILE=pki.p('client.key')))
    r = n2.start(KERNELS, ctx).wait()
    ws = warnings(r)
    check(r.rc == 0 and r.outputs() == ctx.ref and len(ws) == 1 and 'KEY_FILE' in ws[0]
          and '0600' in ws[0], 'a key file others can read is refused (%s)' % ws)
    os.chmod(pki.p('client.key'), 0o600)

    # A user denied writes: the node reads (served) and uploads nothing.
    ro = TlsRedis(ctx, pki)
    w = ctx.node(ro.url(user='reader'), extra=env)
    r = w.start(KERNELS, ctx).wait()
    w.settle()
    e.check_outputs([r], ctx.ref, 'an ACL user denied writes')
    ws = warnings(r)
    check(len(ws) == 1 and 'refuses writes' in ws[0] and r.remote['errors'] >= 1,
          'a user denied writes: the node reads only, one warning, counted (%s; %s)'
          % (ws, r.remote))
    check(len(ro.entries()) == 0, 'a user denied writes uploads nothing')

    # Verification off: an unverifiable server is used, with one warning.
    n = ctx.node(good.url(), writer=False, extra=tls_env(
        pki, pw, KCACHE_REMOTE_CA_FILE=pki.p('other-ca.crt'), KCACHE_REMOTE_TLS_VERIFY='0'))
    r = n.start(KERNELS, ctx).wait()
    ws = warnings(r)
    e.check_outputs([r], ctx.ref, 'KCACHE_REMOTE_TLS_VERIFY=0')
    check(len(ws) == 1 and 'not verified' in ws[0] and r.remote['errors'] == 0,
          'KCACHE_REMOTE_TLS_VERIFY=0 connects and warns once (%s; %s)' % (ws, r.remote))
    out = subprocess.run([e.TOOL, 'config'], env=n.environ(), capture_output=True, text=True,
                         timeout=60).stdout
    check(re.search(r'KCACHE_REMOTE_TLS_VERIFY.*NOT verified', out) is not None,
          '`kcache config` says verification is off')


def over_tls(ctx):
    """test_remote_e2e.py's servers and nodes over TLS from here on."""
    pki, pw = setup(ctx)
    if os.environ.get('KC_TLS_TEST_PLAIN') != '1':  # a comparison by hand
        e.TLS = E2eTls(pki, pw)
    return pki, pw


def serve_all(ctx, nodes, url, entries, what):
    """nodes x 4 processes, cold: one compile per kernel, NVRTC's own
    bytes, both entries of each uploaded signed; a fresh read-only node
    (it trusts the writers' key, verifies every entry) is served all."""
    runs = e.cluster_run(ctx, nodes, 4)
    e.check_outputs(runs, ctx.ref, what + ': %d nodes x 4 processes, cold' % len(nodes))
    check(e.misses(runs) == K, what + ': %d compiles for %d kernels' % (e.misses(runs), K))
    ws = [w for r in runs for w in warnings(r)]
    check(not ws, what + ': no warning (%s)' % ws[:2])
    st = [n.stats() for n in nodes]
    check(all(x['remote'][f] == 0 for x in st for f in ('errors', 'timeouts', 'bad')),
          what + ': no remote error, timeout or bad entry')
    got = entries()
    check(len(got) == 2 * K, what + ': the servers hold %d entries' % len(got))
    fresh = ctx.node(url, writer=False)
    r = fresh.start(KERNELS, ctx).wait()
    e.check_outputs([r], ctx.ref, what + ': a fresh read-only node')
    check(r.misses == 0 and r.remote is not None and r.remote['hits'] == 2 * K,
          what + ': a fresh read-only node is served every signed entry (%d compiles, %s)'
          % (r.misses, r.remote))
    return runs


def shards(ctx):
    """Two TLS shards (rediss:// URLs), 4 nodes x 4 processes: the 4-node
    trial over TLS."""
    over_tls(ctx)
    a, b = ctx.redis(), ctx.redis()
    url = a.url + ' ' + b.url
    nodes = [ctx.node(url) for _ in range(4)]
    serve_all(ctx, nodes, url, lambda: a.entries() + b.entries(), 'TLS shards')
    print('entries per shard (rendezvous): %d, %d' % (len(a.entries()), len(b.entries())))


def cluster(ctx):
    """A 3+3 Redis Cluster over TLS (rediss-cluster://): every node the
    slot map names reached over TLS with the same CA and user."""
    over_tls(ctx)
    srv, url = e.make_cluster(ctx, 1)
    nodes = [ctx.node(url) for _ in range(4)]
    serve_all(ctx, nodes, url, lambda: sorted(k for s in e.primaries(srv) for k in s.entries()),
              'TLS 3+3 Redis Cluster')
    used = [s for s in e.primaries(srv) if s.entries()]
    check(len(used) >= 2, 'TLS cluster: entries on %d primaries (nodes learned from the slot '
          'map reached over TLS)' % len(used))
    # The operator's commands reach it the same way.
    for cmd in (['remote', 'ping'], ['remote', 'stats']):
        out = subprocess.run([e.TOOL] + cmd, env=nodes[0].environ(), capture_output=True,
                             text=True, timeout=120)
        check(out.returncode == 0 and PASSWORD not in out.stdout + out.stderr,
              'TLS cluster: `kcache %s` succeeds, the password unshown (%s)'
              % (' '.join(cmd), (out.stdout + out.stderr)[-300:]))


def trial(ctx):
    """test_remote_e2e.py's 4-node trial, every server over TLS."""
    over_tls(ctx)
    e.trial(ctx)


def cluster_down(ctx):
    """test_remote_e2e.py's cluster-down over TLS: unchanged."""
    over_tls(ctx)
    e.cluster_down(ctx)


def main():
    if shutil.which('redis-server') is None or shutil.which('openssl') is None:
        print('redis-server or openssl is not installed (scripts/setup installs them)')
        return 77
    if subprocess.run(['sh', '-c', 'ldd "$(command -v redis-server)" | grep -q libssl'],
                      timeout=30).returncode != 0:
        print('this redis-server has no TLS built in')
        return 77
    tls = os.path.join(os.environ['KCACHE_BUILD'], 'store', 'remote', 'libkcache-remote-tls.so')
    if not os.path.exists(tls):
        print('kcache was built without TLS (scripts/build-hiredis-tls, -Dhiredis_tls)')
        return 77
    import tempfile
    root = tempfile.mkdtemp(prefix='kc-remote-tls-')
    ctx = None
    try:
        ctx = e.Ctx(root)
        {'serve': serve, 'refuse': refuse, 'shards': shards, 'cluster': cluster, 'trial': trial,
         'cluster-down': cluster_down}[MODE](ctx)
    finally:
        if ctx is not None:
            ctx.close()
        else:
            shutil.rmtree(root, ignore_errors=True)
    print('%d failure(s)' % len(e.failures))
    return 1 if e.failures else 0


if __name__ == '__main__':
    sys.exit(main())
