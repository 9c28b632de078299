#!/usr/bin/env python3
"""Provenance, upload configuration and revocation end to end (issue 22,
items 1-3), on the nodes and private redis-servers of test_remote_e2e.py.

    test_remote_trust.py MODE NVRTC_BENCH KC_REMOTE_FORGE

MODE:
  push     `kcache push` signs only what this node compiled: entries it was
           served unsigned (KCACHE_REMOTE_TRUST=any) are not uploaded, and a
           valid value the remote holds is never replaced by a different one
  owner    the owner uploads with each compile's own configuration: a job
           without KCACHE_REMOTE publishes nothing although a remote job
           started the owner, and a remote job's compiles are uploaded (its
           locks released) by an owner a job without a remote started
  revoke   entries served from the remote under a key later removed from
           the trusted file are no longer served, from the local store too
  persist  a redis-server run with docs/sharing.md's redis.conf keeps what it
           was given across a restart: a fresh node after it compiles
           nothing
  why      a node that does not trust the writer's key compiles what the
           remote holds, and `kcache why` says the remote offered entries
           the lookup refused (KCACHE_REMOTE_TRUSTED_KEYS)
"""
import os
import subprocess
import sys
import tempfile
import shutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
MODE = sys.argv[1]
sys.argv = [sys.argv[0], 'trust'] + sys.argv[2:]
import test_remote_e2e as e  # noqa: E402

check, KERNELS, K = e.check, e.KERNELS, e.K


def push_cmd(node, extra=None):
    node.settle()
    return subprocess.run([e.TOOL, '--dir', node.dir, 'push'], env=node.environ(extra),
                          capture_output=True, text=True, timeout=120)


def push(ctx):
    rs = ctx.redis()
    writer = ctx.node(rs.url)
    r = writer.start(KERNELS, ctx).wait()
    check(r.rc == 0 and r.misses == K, 'the writer compiled and uploaded')
    writer.settle()
    good = {k: rs.cmd('GET', k) for k in rs.entries()}
    check(len(good) == 2 * K, 'the remote holds %d entries' % len(good))

    # Another node compiled the same kernels without a remote: its push
    # finds valid values of its own entries there and leaves them.
    local = ctx.node(rs.url)
    r = local.start(KERNELS, ctx, extra={'KCACHE_REMOTE': None}).wait()
    check(r.rc == 0 and r.misses == K, 'a node without a remote compiles')
    p = push_cmd(local)
    print(p.stdout + p.stderr)
    check(p.returncode == 0, 'push of a node\'s own compiles')
    same = [k for k in good if rs.cmd('GET', k) == good[k]]
    check(len(same) == len(good),
          'push replaces no valid value the remote holds (%d of %d kept)' % (len(same), len(good)))

    # An attacker replaces the values by unsigned ones holding other
    # entries' bodies; a node trusting any entry is served them.
    values = dict(good)
    records = [k for k in values if e.value_kind(values[k]) != 3]
    for k in values:
        other = records[(records.index(k) + 1) % len(records)] if k in records else k
        e.forge(ctx, rs, k, values[k], e.value_body(values[other]), None)
    planted = {k: rs.cmd('GET', k) for k in values}
    lax = ctx.node(rs.url, extra={'KCACHE_REMOTE_TRUST': 'any'})
    r = lax.start(KERNELS, ctx).wait()
    check(r.remote['hits'] > 0, 'a node trusting any entry is served the planted ones (%s)'
          % r.remote)
    # Its push must not sign them with its key.
    p = push_cmd(lax)
    print(p.stdout + p.stderr)
    check(p.returncode == 0, 'push of a node served unsigned entries')
    check(all(rs.cmd('GET', k) == planted[k] for k in planted),
          'push uploads none of the entries it was served unsigned')
    # Entries imported from an unsigned bundle (--trust-unsigned) are not
    # this node's compiles either.
    bundle = os.path.join(ctx.root, 'b.kcb')
    x = subprocess.run([e.TOOL, '--dir', local.dir, 'export', '-o', bundle],
                       env=local.environ(), capture_output=True, text=True, timeout=120)
    check(x.returncode == 0, 'export: ' + x.stderr)
    imp = ctx.node(rs.url)
    os.makedirs(imp.dir, mode=0o700)
    x = subprocess.run([e.TOOL, '--dir', imp.dir, 'import', '--trust-unsigned', bundle],
                       env=imp.environ(), capture_output=True, text=True, timeout=120)
    check(x.returncode == 0, 'import --trust-unsigned: ' + x.stdout + x.stderr)
    p = push_cmd(imp)
    print(p.stdout + p.stderr)
    check(p.returncode == 0 and 'not compiled here (imported)' in p.stdout,
          'push of imported entries says why it leaves them')
    check(all(rs.cmd('GET', k) == planted[k] for k in planted),
          'push uploads none of the entries it imported')
    victim = ctx.node(rs.url, writer=False)
    r = victim.start(KERNELS, ctx).wait()
    e.check_outputs([r], ctx.ref, 'a signed-only node after the push')
    check(r.remote['hits'] == 0, 'a signed-only node is served nothing the push laundered (%s)'
          % r.remote)
    launder_manifest(ctx)


MANIFEST_MAGIC = 0x334b434d46  # shim/codec.c's "KCMF" 3
MARKER = b'/kc-planted-marker.h'


def planted_manifest():
    """A well-formed manifest whose one set names a header nobody has."""
    import struct
    return (struct.pack('<QQ', MANIFEST_MAGIC, 1) + struct.pack('<QQQ', 0x1111, 0x2222, 1) +
            struct.pack('<iQ', 0, len(MARKER)) + MARKER + struct.pack('<QQ', 0, 0) +
            struct.pack('<5Q', 0, 0, 0, 0, 0))


def launder_manifest(ctx):
    """A manifest served unverified (KCACHE_REMOTE_TRUST=any) is not merged
    into the one this node signs and uploads."""
    rs = ctx.redis()
    writer = ctx.node(rs.url)
    writer.start(['ka'], ctx).wait()
    writer.settle()
    mkey = next(k for k in rs.entries() if e.value_kind(rs.cmd('GET', k)) == 3)
    e.forge(ctx, rs, mkey, rs.cmd('GET', mkey), planted_manifest(), None)
    lax = ctx.node(rs.url, extra={'KCACHE_REMOTE_TRUST': 'any'})
    r = lax.start(['ka'], ctx).wait()
    e.check_outputs([r], {'ka': ctx.ref['ka']}, 'a node served a planted manifest')
    check(r.misses == 1, 'it compiles (the planted set does not hold: %d compiles)' % r.misses)
    lax.settle()
    v = rs.cmd('GET', mkey)
    signed = int.from_bytes(v[6:8], 'little') & 1
    check(signed == 1 and MARKER not in v,
          'the manifest it uploads (signed %d) keeps none of the planted sets' % signed)


def owner(ctx):
    rs = ctx.redis()
    idle = {'KCACHE_OWNER_IDLE_MS': '20000'}

    # (a) An owner a remote job started; a job without KCACHE_REMOTE
    # then compiles on the same node: nothing of it is published.
    n = ctx.node(rs.url, extra=idle)
    r = n.start(['ka'], ctx).wait()
    check(r.rc == 0 and r.misses == 1, 'a remote job compiles ka')
    r = n.start(['kb'], ctx, extra={'KCACHE_REMOTE': None}).wait()
    check(r.rc == 0 and r.misses == 1, 'a job without a remote compiles kb')
    n.settle(timeout=90)
    got = len(rs.entries())
    check(got == 2, 'only the remote job\'s compile is published (%d entries, want 2)' % got)

    # (b) An owner a job without a remote started; a remote job then
    # compiles on that node: its compile is published and its lock gone.
    rs.cmd('FLUSHALL')
    m = ctx.node(rs.url, extra=idle)
    r = m.start(['kc'], ctx, extra={'KCACHE_REMOTE': None}).wait()
    check(r.rc == 0 and r.misses == 1, 'a job without a remote compiles kc')
    r = m.start(['kh'], ctx).wait()
    check(r.rc == 0 and r.misses == 1, 'a remote job compiles kh')
    m.settle(timeout=90)
    got = len(rs.entries())
    check(got == 2, 'the remote job\'s compile is published (%d entries, want 2)' % got)
    locks = rs.cmd('KEYS', 'kcache:lock:*')
    check(locks == [], 'its cluster lock is released (%s)' % locks)

    # The upload configuration stays in the spool: the hot files the put
    # files became do not carry it.
    hot = [os.path.join(d, f) for nd in (n, m) for d in [os.path.join(nd.dir, 'hot')]
           if os.path.isdir(d) for f in os.listdir(d)]
    check(hot != [] and not any(b'KCACHE_REMOTE=' in open(f, 'rb').read() for f in hot),
          'no hot file carries the upload configuration (%d hot files)' % len(hot))


def revoke(ctx):
    rs = ctx.redis()
    writer = ctx.node(rs.url)
    writer.start(KERNELS, ctx).wait()
    writer.settle()
    check(len(rs.entries()) == 2 * K, 'the writer filled the remote')
    reader = ctx.node(rs.url, writer=False)
    r = reader.start(KERNELS, ctx).wait()
    check(r.misses == 0 and r.remote['hits'] == 2 * K, 'a reader is served by the remote')
    reader.settle()
    r = reader.start(KERNELS, ctx).wait()
    check(r.misses == 0 and r.hits == K, 'then from its own store')

    # The writer's key is revoked: the trusted file now names another.
    other = os.path.join(ctx.root, 'other.key')
    ctx.tool('keygen', other)
    shutil.copy(other + '.pub', ctx.trusted)
    r = reader.start(KERNELS, ctx).wait()
    e.check_outputs([r], ctx.ref, 'after the revocation')
    check(r.misses == K, 'nothing the revoked key signed is served, locally either (%d '
          'compiles)' % r.misses)
    reader.settle()
    r = reader.start(KERNELS, ctx).wait()
    check(r.misses == 0 and r.hits == K, 'what the node compiled since is served (%d hits)'
          % r.hits)


def readme_conf():
    """docs/sharing.md's redis.conf lines (its block after "A minimal
    `redis.conf`"), comments dropped."""
    text = open(os.path.join(os.environ['KCACHE_SRC'], 'docs', 'sharing.md')).read()
    i = text.index('A minimal `redis.conf`')
    # Its first fenced block (docs-test: redis.conf; docs-configs loads it).
    i = text.index('```conf\n', i) + len('```conf\n')
    block = text[i:text.index('```', i)]
    lines = [ln.strip() for ln in block.split('\n')]
    return [ln for ln in lines if ln and not ln.startswith('#')]


def persist(ctx):
    d = os.path.join(ctx.root, 'persist')
    os.makedirs(d)
    port = e.free_port()
    conf = os.path.join(d, 'redis.conf')
    password = None
    with open(conf, 'w') as f:
        for line in readme_conf():
            name = line.split()[0]
            if name == 'requirepass':
                password = line.split()[1]
            if name in ('bind', 'port', 'dir', 'logfile', 'maxmemory'):
                continue
            f.write(line + '\n')
        f.write('bind 127.0.0.1\nport %d\ndir %s\nlogfile %s\n' % (port, d, os.path.join(d, 'log')))

    def start():
        p = subprocess.Popen(['redis-server', conf], preexec_fn=e._die_with_us,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            try:
                if e.resp(('127.0.0.1', port), 'AUTH', password) == 'OK':
                    return p
            except (OSError, e.RedisError):
                pass
            import time
            time.sleep(0.025)
        raise RuntimeError('redis-server did not start with docs/sharing.md\'s redis.conf')

    p = start()
    try:
        url = 'redis://:%s@127.0.0.1:%d' % (password, port)
        writer = ctx.node(url)
        r = writer.start(KERNELS, ctx).wait()
        check(r.rc == 0 and r.misses == K, 'the writer compiled')
        writer.settle()
        p.terminate()  # a restart: SIGTERM, as systemd stops it
        p.wait()
        p = start()
        fresh = ctx.node(url)
        r = fresh.start(KERNELS, ctx).wait()
        e.check_outputs([r], ctx.ref, 'after Redis restarted')
        check(r.misses == 0 and r.remote['hits'] == 2 * K,
              'Redis restarted with docs/sharing.md\'s redis.conf: a fresh node is served all (%d '
              'compiles, %s)' % (r.misses, r.remote))
    finally:
        p.kill()
        p.wait()


def why(ctx):
    rs = ctx.redis()
    writer = ctx.node(rs.url)
    r = writer.start(KERNELS, ctx).wait()
    check(r.rc == 0 and r.misses == K, 'the writer compiled and uploaded')
    writer.settle()
    other = os.path.join(ctx.root, 'other.key')
    ctx.tool('keygen', other)
    reader = ctx.node(rs.url, writer=False,
                      extra={'KCACHE_REMOTE_TRUSTED_KEYS': other + '.pub'})
    r = reader.start(KERNELS, ctx).wait()
    check(r.rc == 0 and r.misses == K, 'a node trusting another key compiles every kernel')
    env = reader.environ()
    p = subprocess.run([e.TOOL, '--dir', reader.dir, 'why', '--json', '--last', '100'],
                       env=env, capture_output=True, text=True, timeout=60)
    import json
    js = json.loads(p.stdout) if p.returncode == 0 else []
    check(len(js) == K and all(j['remote_refused'] > 0 for j in js),
          'kcache why: every miss records entries the remote offered and the lookup refused '
          '(%r)' % [(j['name'], j['remote_refused']) for j in js])
    p = subprocess.run([e.TOOL, '--dir', reader.dir, 'why'], env=env, capture_output=True,
                       text=True, timeout=60)
    check('KCACHE_REMOTE_TRUSTED_KEYS' in p.stdout and 'refused' in p.stdout,
          'kcache why names the remote\'s trust (%r)' % p.stdout)
    p = subprocess.run([e.TOOL, '--dir', writer.dir, 'why', '--json', '--last', '100'],
                       env=writer.environ(), capture_output=True, text=True, timeout=60)
    js = json.loads(p.stdout) if p.returncode == 0 else []
    check(js and all(j['remote_refused'] == 0 for j in js),
          'the writer\'s misses refused nothing')


def main():
    if shutil.which('redis-server') is None:
        print('redis-server is not installed (scripts/setup installs it)')
        return 77
    root = tempfile.mkdtemp(prefix='kc-remote-trust-')
    ctx = None
    try:
        ctx = e.Ctx(root)
        {'push': push, 'owner': owner, 'revoke': revoke, 'persist': persist,
         'why': why}[MODE](ctx)
    finally:
        if ctx is not None:
            ctx.close()
        else:
            shutil.rmtree(root, ignore_errors=True)
    print('%d failure(s)' % len(e.failures))
    return 1 if e.failures else 0


if __name__ == '__main__':
    sys.exit(main())
