#!/usr/bin/env python3
"""Every Redis configuration the docs show loads in redis-server.

Usage: test_configs.py   (KCACHE_SRC set)

A fenced block preceded by `<!-- docs-test: redis.conf -->` in README.md or
docs/*.md is a Redis configuration: each is written to a file and
redis-server started on it (the address, port and directory overridden on
its command line, which Redis reads after the file), and it must answer
PING. A TLS configuration's certificate, key and CA files (named
relative to its directory) are made with openssl first, its tls-port
moved to a free port; an ACL user it enables pings when the default user
is off. A block anywhere in those pages (fenced or indented) that holds a
Redis directive without that marker fails the test too, so that a new
configuration cannot escape it. Exit 0 on success, 1 on a failed check,
77 (skip) without redis-server.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.environ['KCACHE_SRC']
MARK = '<!-- docs-test: redis.conf -->'
# Directives only a Redis configuration holds (the docs' and the common).
DIRECTIVE = re.compile(r'^\s*(maxmemory(-policy)?|appendonly|appendfsync|requirepass|'
                       r'cluster-[a-z-]+|save \d+ \d+|protected-mode|masterauth|tls-[a-z-]+|'
                       r'user \S+ (on|off))\b')

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print('FAIL: ' + msg, flush=True)
    return cond


def blocks(path):
    """(first line number, lines, marked) of each code block of a page:
    fenced, or indented by four spaces after a blank line."""
    lines = open(path, encoding='utf-8').read().splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith('```'):
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            marked = j >= 0 and lines[j].strip() == MARK
            k = i + 1
            while k < len(lines) and not lines[k].startswith('```'):
                k += 1
            out.append((i + 1, lines[i + 1:k], marked))
            i = k + 1
            continue
        if lines[i].startswith('    ') and (i == 0 or not lines[i - 1].strip()):
            k = i
            while k < len(lines) and (lines[k].startswith('    ') or not lines[k].strip()):
                k += 1
            out.append((i + 1, [l[4:] for l in lines[i:k]], False))
            i = k
            continue
        i += 1
    return out


def tls_files(conf, work):
    """The files a TLS configuration names, made in work (a CA, and a
    certificate and key it signed); the extra command line (a free
    tls-port)."""
    named = {k: v for k, v in (l.split(None, 1) for l in conf if l.strip() and
                               not l.lstrip().startswith('#') and len(l.split()) == 2)}
    if 'tls-port' not in named:
        return []

    def sh(*a):
        subprocess.run(list(a), check=True, capture_output=True, timeout=60, cwd=work)
    ca, crt, key = (named.get(k) for k in ('tls-ca-cert-file', 'tls-cert-file', 'tls-key-file'))
    ca = ca or 'ca.crt'
    sh('openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj',
       '/CN=docs-test-ca', '-keyout', 'ca.key', '-out', ca)
    if crt and key:
        sh('openssl', 'req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost',
           '-keyout', key, '-out', 'x.csr')
        sh('openssl', 'x509', '-req', '-in', 'x.csr', '-CA', ca, '-CAkey', 'ca.key',
           '-CAcreateserial', '-days', '2', '-out', crt)
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    return ['--tls-port', str(port)]


def load(conf, work, where):
    """Starts redis-server on conf; True when it answers PING."""
    path = os.path.join(work, 'redis.conf')
    with open(path, 'w') as f:
        f.write('\n'.join(conf) + '\n')
    sock = os.path.join(work, 'redis.sock')
    log = open(os.path.join(work, 'redis.log'), 'w+')
    extra = tls_files(conf, work)
    p = subprocess.Popen(['redis-server', path, '--bind', '127.0.0.1', '--port', '0',
                          '--unixsocket', sock, '--dir', work, '--daemonize', 'no',
                          '--logfile', ''] + extra, stdout=log, stderr=subprocess.STDOUT,
                         cwd=work)
    pw = [l.split(None, 1)[1] for l in conf if l.startswith('requirepass ')]
    env = dict(os.environ, REDISCLI_AUTH=pw[-1]) if pw else os.environ
    user = []
    if any(re.match(r'\s*user default\b.*\boff\b', l) for l in conf):
        # The default user off: ping as the first user the file enables.
        for l in conf:
            m = re.match(r'\s*user (\S+) on\b.*\s>(\S+)', l)
            if m:
                user = ['--user', m.group(1)]
                env = dict(os.environ, REDISCLI_AUTH=m.group(2))
                break
    ok = False
    try:
        deadline = time.time() + 10
        while time.time() < deadline and p.poll() is None:
            r = subprocess.run(['redis-cli', '-s', sock] + user + ['ping'],
                               capture_output=True, text=True, env=env)
            if r.stdout.strip() == 'PONG':
                ok = True
                break
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(10)
        log.seek(0)
        text = log.read()
        log.close()
    check(ok, '%s: redis-server loads the configuration and answers PING (%s)'
          % (where, text.strip()[-600:]))
    return ok


def main():
    if shutil.which('redis-server') is None or shutil.which('redis-cli') is None:
        print('skip: no redis-server')
        return 77
    pages = [os.path.join(SRC, 'README.md')] + sorted(glob.glob(os.path.join(SRC, 'docs', '*.md')))
    n = 0
    work = tempfile.mkdtemp(prefix='docs-configs.')
    try:
        for page in pages:
            rel = os.path.relpath(page, SRC)
            for line, body, marked in blocks(page):
                where = '%s line %d' % (rel, line)
                if not marked:
                    for l in body:
                        check(not DIRECTIVE.match(l),
                              '%s: a Redis directive in a block without %s: %r' % (where, MARK, l))
                    continue
                n += 1
                for l in body:
                    check(not re.search(r'\S\s+#', l) or l.lstrip().startswith('#'),
                          '%s: a comment after a value (Redis takes none): %r' % (where, l))
                load(body, work, where)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    check(n >= 2, 'the docs show Redis configurations marked %s (%d)' % (MARK, n))
    print('%d Redis configurations loaded' % n)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
