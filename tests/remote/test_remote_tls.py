#!/usr/bin/env python3
"""The remote over TLS and with ACL users (issue 48, one server), on the
nodes of test_remote_e2e.py against private redis-servers with a TLS port
and certificates this script makes with openssl.

    test_remote_tls.py MODE NVRTC_BENCH KC_REMOTE_FORGE

MODE:
  serve    rediss:// with KCACHE_REMOTE_CA_FILE and an ACL user
           (rediss://USER@host, the password from KCACHE_REMOTE_PASSWORD_FILE):
           a node compiles and its owner uploads over TLS; a fresh node is
           served everything, NVRTC's own bytes; the password never crosses
           the wire in the clear (a relay records the bytes; the same relay
           sees it over redis://), nor shows in `kcache config`
  refuse   each failure costs the run nothing (NVRTC's own bytes), is
           counted, and says why in one warning: an untrusted CA, a wrong
           host name, an expired certificate, a plain server on rediss://,
           a TLS server on redis://, mutual TLS required without a client
           certificate (and with one: served), a wrong password, an ACL user
           denied writes (the node reads only: one warning, counted);
           KCACHE_REMOTE_TLS_VERIFY=0 connects to an unverifiable server,
           warns once, and `kcache config` says so
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
                    % (san, 'clientAuth' if client else 'serverAuth'))
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


class Relay:
    """A loopback TCP relay to a server's port that keeps every byte."""

    def __init__(self, port):
        self.to, self.seen, self.lock = port, bytearray(), threading.Lock()
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
            b = socket.create_connection(('127.0.0.1', self.to))
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self.pump, args=(x, y), daemon=True).start()

    def pump(self, x, y):
        try:
            while True:
                d = x.recv(65536)
                if not d:
                    break
                with self.lock:
                    self.seen += d
                y.sendall(d)
        except OSError:
            pass
        for s in (x, y):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


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
    url = 'rediss://alice@localhost:%d' % relay.port
    writer = ctx.node(url, extra=tls_env(pki, pw))
    r = writer.start(KERNELS, ctx).wait()
    e.check_outputs([r], ctx.ref, 'rediss:// writer')
    check(r.misses == K and not warnings(r), 'the writer compiled, no warning (%s)'
          % warnings(r))
    writer.settle()
    check(len(rs.entries()) == 2 * K, 'its owner uploaded over TLS (%d entries)'
          % len(rs.entries()))
    reader = ctx.node(url, writer=False, extra=tls_env(pki, pw))
    r = reader.start(KERNELS, ctx).wait()
    e.check_outputs([r], ctx.ref, 'rediss:// fresh node')
    check(r.misses == 0 and r.remote is not None and r.remote['hits'] >= K,
          'a fresh node is served everything over TLS (misses %d, %s)' % (r.misses, r.remote))
    time.sleep(0.2)
    with relay.lock:
        seen = bytes(relay.seen)
    check(len(seen) > 1000 and PASSWORD.encode() not in seen and b'AUTH' not in seen,
          'the password never crossed the wire in the clear (%d bytes relayed)' % len(seen))
    # The relay would see it over redis:// (the check can fail).
    plain = TlsRedis(ctx, pki, tls=False)
    relay2 = Relay(plain.port)
    n = ctx.node('redis://alice@127.0.0.1:%d' % relay2.port, writer=False,
                 extra=tls_env(pki, pw))
    n.start(KERNELS[:1], ctx).wait()
    time.sleep(0.2)
    check(PASSWORD.encode() in bytes(relay2.seen),
          'over redis:// the relay sees the password (the capture works)')
    out = subprocess.run([e.TOOL, 'config'], env=reader.environ(), capture_output=True,
                         text=True, timeout=60).stdout
    check(PASSWORD not in out and 'KCACHE_REMOTE_CA_FILE' in out,
          '`kcache config` shows the TLS settings, never the password')


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
        {'serve': serve, 'refuse': refuse}[MODE](ctx)
    finally:
        if ctx is not None:
            ctx.close()
        else:
            shutil.rmtree(root, ignore_errors=True)
    print('%d failure(s)' % len(e.failures))
    return 1 if e.failures else 0


if __name__ == '__main__':
    sys.exit(main())
