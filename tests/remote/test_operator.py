#!/usr/bin/env python3
"""What a writer to the shared Redis, or a file where a configured path
points, can do to a host and to the operator's commands (issue 45,
findings 6, 7, 8 and 10), on test_remote_e2e.py's nodes and private
redis-servers.

    test_operator.py MODE NVRTC_BENCH KC_REMOTE_FORGE

MODE:
  files    a FIFO as KCACHE_REMOTE_PASSWORD_FILE, _TRUSTED_KEYS,
           _SIGNING_KEY or the signing key's .pub: a host compiling under
           the shim and `kcache remote ping` each end within seconds (the
           open never blocks), the host's output NVRTC's own, one warning
  escape   namespaces holding escape sequences, C1 bytes and newlines
           (any writer names one through the key kcache:<ns>:<hex>):
           `kcache remote stats` prints them escaped, no line forged
  scan     a fake server whose SCAN cursor never returns to 0 (the same
           cursor again, or a new one each time): `remote stats` and
           `remote prune` end, and say the scan was cut short
  tally    200,000 namespaces: `remote stats` counts them all within a
           generous bound (a linear search per key took minutes)
"""
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
MODE = sys.argv[1]
sys.argv = [sys.argv[0], 'trust'] + sys.argv[2:]
import test_remote_e2e as e  # noqa: E402

check, KERNELS = e.check, e.KERNELS


def tool(node, *args, extra=None, timeout=60):
    """`kcache ARGS` with node's environment: (rc, stdout, stderr) as
    bytes, rc None when it did not end within timeout."""
    p = subprocess.Popen([e.TOOL, '--dir', node.dir] + list(args), env=node.environ(extra),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        o, err = p.communicate(timeout=timeout)
        return p.returncode, o, err
    except subprocess.TimeoutExpired:
        p.kill()
        o, err = p.communicate()
        return None, o, err


def raw_control(b):
    """Bytes a terminal acts on, newline aside: C0, DEL, C1 raw or as UTF-8."""
    if any((c < 0x20 and c != 10) or c == 0x7f or 0x80 <= c < 0xa0 for c in b):
        return True
    return any(0x80 <= ord(c) < 0xa0 for c in b.decode('utf-8', 'replace'))


# ---- finding 6 ---------------------------------------------------------------

def files(ctx):
    rs = ctx.redis()
    fifos = os.path.join(ctx.root, 'fifos')
    os.makedirs(fifos)
    fifo = os.path.join(fifos, 'fifo')
    os.mkfifo(fifo, 0o600)
    # A signing key whose public half is a FIFO.
    keydir = os.path.join(ctx.root, 'k2')
    ctx.tool('keygen', os.path.join(keydir, 'key'))
    os.unlink(os.path.join(keydir, 'key.pub'))
    os.mkfifo(os.path.join(keydir, 'key.pub'), 0o600)
    cases = [('KCACHE_REMOTE_PASSWORD_FILE', {'KCACHE_REMOTE_PASSWORD_FILE': fifo}, fifo),
             ('KCACHE_REMOTE_TRUSTED_KEYS', {'KCACHE_REMOTE_TRUSTED_KEYS': fifo}, fifo),
             ('KCACHE_REMOTE_SIGNING_KEY', {'KCACHE_REMOTE_SIGNING_KEY': fifo}, fifo),
             ('the signing key\'s .pub',
              {'KCACHE_REMOTE_SIGNING_KEY': os.path.join(keydir, 'key')}, None)]
    for what, env, path in cases:
        node = ctx.node(rs.url, extra=env)
        run = node.start(KERNELS, ctx)
        try:
            o, err = run.p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            run.p.kill()
            run.p.communicate()
            check(False, 'a FIFO as %s: the host ends within 30 s' % what)
            continue
        run.rc, run.stderr = run.p.returncode, err.decode(errors='replace')
        check(run.rc == 0, 'a FIFO as %s: the host exits 0 (%s)' % (what, run.stderr[-500:]))
        check(run.outputs() == ctx.ref, 'a FIFO as %s: NVRTC\'s own output' % what)
        if path is not None:
            said = [ln for ln in run.stderr.splitlines() if path in ln]
            check(len(said) == 1, 'a FIFO as %s: one warning names it (%r)' % (what, said))
        rc, out, err = tool(node, 'remote', 'ping', timeout=30)
        check(rc is not None, 'a FIFO as %s: `kcache remote ping` ends within 30 s' % what)
        if path is not None and rc is not None:
            said = [ln for ln in (out + err).decode(errors='replace').splitlines() if path in ln]
            check(len(said) == 1, 'a FIFO as %s: ping warns once (%r)' % (what, said))
        node.settle()


# ---- finding 7 ---------------------------------------------------------------

EVIL = [b'nvrtc:\x1b]0;pwned\x07x', b'jit:\x1b[2J\x1b[H', b'nvrtc:\xc2\x9b31mc1',
        b'nvrtc:\x9b31mraw', b'x\nRemote entries:       0 (0 B)', b'a\\x41', b'\x7fdel']


def escape(ctx):
    rs = ctx.redis()
    for i, ns in enumerate(EVIL):
        rs.cmd(b'SET', b'kcache:' + ns + b':' + b'%048x' % (i + 1), b'v' * 10)
    rs.cmd(b'SET', b'kcache:nvrtc:13.0-0123456789abcdef-f3:' + b'%048x' % 99, b'v' * 10)
    node = ctx.node(rs.url, writer=False, extra={'KCACHE_REMOTE_TRUST': 'any'})
    rc, out, err = tool(node, 'remote', 'stats')
    check(rc == 0, 'remote stats over hostile namespaces: exit 0 (%r)' % err)
    check(not raw_control(out), 'remote stats prints no control byte: %r' % out)
    lines = out.split(b'\n')
    check(sum(1 for ln in lines if ln.startswith(b'Remote entries:')) == 1,
          'no "Remote entries" line is forged: %r' % out)
    check(out.startswith(b'Remote entries:       %d ' % (len(EVIL) + 1)),
          'the count is every entry: %r' % out[:60])
    check(b'\\x1b]0;pwned\\x07x' in out and b'a\\\\x41' in out,
          'the bytes are shown escaped, a backslash doubled: %r' % out)
    check(b'nvrtc:13.0-0123456789abcdef-f3' in out, 'a plain namespace is shown as it is')
    rc, out, err = tool(node, 'remote', 'stats', '--json')
    try:
        d = json.loads(out)
        check(len(d['namespaces']) == len(EVIL) + 1 and d['complete'] is True,
              'remote stats --json: every namespace, complete')
    except (ValueError, KeyError) as x:
        check(False, 'remote stats --json is JSON with every namespace: %s %r' % (x, out))


# ---- finding 8 ---------------------------------------------------------------

class FakeRedis:
    """A RESP server on a unix socket answering SCAN with a cursor that
    never returns to 0 (the same one, or a new one each time), one entry
    key each time."""

    def __init__(self, path, moving):
        self.path, self.moving, self.n = path, moving, 0
        self.s = socket.socket(socket.AF_UNIX)
        self.s.bind(path)
        self.s.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            threading.Thread(target=self.conn, args=(c,), daemon=True).start()

    def conn(self, c):
        f = c.makefile('rb')
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                n = int(line[1:])
                args = []
                for _ in range(n):
                    ln = int(f.readline()[1:])
                    args.append(f.read(ln + 2)[:-2])
                c.sendall(self.answer([a.upper() if i == 0 else a for i, a in enumerate(args)]))
        except (OSError, ValueError):
            pass
        finally:
            c.close()

    def answer(self, a):
        cmd = a[0]
        if cmd == b'PING':
            return b'+PONG\r\n'
        if cmd == b'SCAN':
            self.n += 1
            cur = b'%d' % (self.n + 1) if self.moving else b'7'
            key = b'kcache:nvrtc:fake:%048x' % self.n
            return b'*2\r\n$%d\r\n%s\r\n*1\r\n$%d\r\n%s\r\n' % (len(cur), cur, len(key), key)
        if cmd == b'STRLEN':
            return b':10\r\n'
        if cmd == b'DBSIZE':
            return b':1\r\n'
        if cmd == b'DEL' or cmd == b'UNLINK':
            return b':1\r\n'
        if cmd in (b'AUTH', b'SELECT', b'CLIENT', b'HELLO'):
            return b'+OK\r\n'
        return b'-ERR unknown command\r\n'

    def close(self):
        self.s.close()


def scan(ctx):
    for moving in (False, True):
        what = 'a new cursor each time' if moving else 'the same cursor again'
        path = os.path.join(ctx.root, 'fake%d.sock' % moving)
        fake = FakeRedis(path, moving)
        node = ctx.node('redis+unix:' + path)
        try:
            rc, out, err = tool(node, 'remote', 'stats', timeout=60)
            check(rc is not None, 'remote stats against a SCAN of %s ends' % what)
            check(rc == 1 and b'cut short' in err,
                  'remote stats says the scan was cut short (%r %r)' % (rc, err))
            check(out.startswith(b'Remote entries:'), 'what was counted is printed (%r)' % out[:200])
            rc, out, err = tool(node, 'remote', 'stats', '--json', timeout=60)
            check(rc == 1 and b'"complete": false' in out,
                  'remote stats --json says it is not complete (%r %r)' % (rc, out[-200:]))
            rc, out, err = tool(node, 'remote', 'prune', '--namespace', 'x', '--quiet', timeout=60)
            check(rc is not None, 'remote prune against a SCAN of %s ends' % what)
            check(rc == 1 and b'cut short' in err,
                  'remote prune says the scan was cut short (%r %r)' % (rc, err))
        finally:
            fake.close()


# ---- finding 10 --------------------------------------------------------------

def tally(ctx):
    rs = ctx.redis()
    n = 200000
    # Namespaces as long as the shim's and alike up to their end, as
    # another writer may make them.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(rs.addr)
        batch = []
        for i in range(n):
            k = b'kcache:nvrtc:13.0-0123456789abcdef-f3-%08d:%048x' % (i, i)
            batch.append(b'*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$4\r\nvvvv\r\n' % (len(k), k))
        s.sendall(b''.join(batch))
        want, got = len(b'+OK\r\n') * n, 0
        while got < want:
            b = s.recv(1 << 20)
            if not b:
                break
            got += len(b)
    check(rs.cmd('DBSIZE') == n, 'the server holds %d entries' % n)
    node = ctx.node(rs.url, writer=False, extra={'KCACHE_REMOTE_TRUST': 'any'})
    t0 = time.monotonic()
    rc, out, err = tool(node, 'remote', 'stats', '--json', timeout=60)
    dt = time.monotonic() - t0
    check(rc == 0, 'remote stats over %d namespaces ends within 60 s, exit 0 (%r, %r)'
          % (n, rc, err[-300:]))
    print('remote stats over %d namespaces: %.1f s' % (n, dt))
    if rc == 0:
        d = json.loads(out)
        check(d['entries'] == n and d['bytes'] == 4 * n, 'every entry counted')
        check(len(d['namespaces']) == n and all(x['entries'] == 1 for x in d['namespaces']),
              'every namespace its own row')


def main():
    if e.shutil.which('redis-server') is None:
        print('redis-server is not installed (scripts/setup installs it)')
        return 77
    root = e.tempfile.mkdtemp(prefix='kc-remote-op-')
    ctx = None
    try:
        ctx = e.Ctx(root)
        {'files': files, 'escape': escape, 'scan': scan, 'tally': tally}[MODE](ctx)
    finally:
        if ctx is not None:
            ctx.close()
        else:
            e.shutil.rmtree(root, ignore_errors=True)
    print('%d failure(s)' % len(e.failures))
    return 1 if e.failures else 0


if __name__ == '__main__':
    sys.exit(main())
