#!/usr/bin/env python3
"""`kcache why` over miss records written straight into DIR/why/ (issue 45,
findings 9 and 10), no compiler needed.

    why_records.py MODE [KC-POPULATE]

MODE:
  escape   backend, key, kind and every other field a record holds reach
           the terminal escaped (no control byte, no forged line): the
           text form prints nothing a record's writer chose raw
  many     `kcache why --last 3000 --json` over 3,000 records, each with
           dozens of inputs, finishes within a generous bound and names a
           cause for each (the comparison with every earlier record was
           quadratic in the inputs: minutes, or never)
  related  a miss is compared only with earlier records of its own program
           (name and library): a program with none is its first compile,
           never another program's inputs "added"; and an earlier compile
           of the same inputs whose entry is still in the store (kc-populate
           put it there) is said to be there, not evicted (issue 47,
           finding 9)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'pylib'))
from kctest import rm_settled  # noqa: E402

KC = os.environ['KCACHE_TOOL']
failures = []


def check(cond, what):
    print(('ok: ' if cond else 'FAIL: ') + what)
    if not cond:
        failures.append(what)
    return cond


def esc(s):
    """A field as common/why.c writes it."""
    out = []
    for c in s.encode('utf-8', 'surrogateescape'):
        if c == 0x5c:
            out.append(b'\\\\')
        elif c == 0x09:
            out.append(b'\\t')
        elif c == 0x0a:
            out.append(b'\\n')
        elif c < 0x20 or c == 0x7f:
            out.append(b'\\x%02x' % c)
        else:
            out.append(bytes([c]))
    return b''.join(out)


def record(backend, name, key, t, inputs, stored='1'):
    """A record's bytes; inputs: (kind, name, digest, shown)."""
    b = [b'kcache-why 1\n', b'backend ' + esc(backend) + b'\n', b'name ' + esc(name) + b'\n',
         b'base ' + b'0' * 32 + b'\n']
    for k, n, d, s in inputs:
        b.append(b'c ' + esc(k) + b'\t' + esc(n) + b'\t' + d.encode() + b'\t' + esc(s) + b'\n')
    b += [b'time %d\n' % t, b'pid 4242\n', b'key ' + esc(key) + b'\n',
          b'stored ' + esc(stored) + b'\n', b'compile_ms 1.000\n', b'remote_refused 0\n']
    return b''.join(b)


def write(d, t, data):
    wd = os.path.join(d, 'why')
    os.makedirs(wd, mode=0o700, exist_ok=True)
    with open(os.path.join(wd, '%016x-4242-%08x' % (t, t & 0xffffffff)), 'wb') as f:
        f.write(data)


def kc(d, *args, timeout=None):
    return subprocess.run([KC, '--dir', d] + list(args), capture_output=True,
                          timeout=timeout)


def raw_control(b):
    """Control bytes a terminal acts on (tab and newline aside), C1 as
    UTF-8 or as raw bytes, DEL."""
    if any((c < 0x20 and c not in (9, 10)) or c == 0x7f for c in b):
        return True
    s = b.decode('utf-8', 'replace')
    return any(0x80 <= ord(c) < 0xa0 for c in s) or any(0x80 <= c < 0xa0 for c in b)


def escape(tmp):
    d = os.path.join(tmp, 'kc')
    os.makedirs(d, mode=0o700)
    evil = '\x1b]0;pwned\x07\x1b[2J\u009b31m\nnvrtc miss: "forged"'
    ins = [('option', '', 'a' * 32, '-arch=sm_80'), ('file\x1b[2J', '/x\x1b[1m', 'b' * 32, 'x')]
    write(d, 1000, record('nvrtc' + evil, 'p', 'k' * 8 + evil, 1000, ins))
    ins2 = [('option', '', 'c' * 32, '-arch=sm_90'), ('file\x1b[2J', '/x\x1b[1m', 'd' * 32, 'y')]
    write(d, 2000, record('nvrtc' + evil, 'p', 'k' * 8 + evil, 2000, ins2, stored='no\x1b[5m'))
    r = kc(d, 'why', '--last', '5', timeout=60)
    check(r.returncode == 0, 'why over hostile records: exit 0 (%r)' % r.stderr)
    check(not raw_control(r.stdout), 'why prints no raw control byte: %r' % r.stdout)
    check(b'\nnvrtc miss: "forged"' not in r.stdout, 'no line is forged: %r' % r.stdout)
    check(b'\\x1b' in r.stdout, 'the escape bytes are shown escaped')
    r = kc(d, 'why', '--last', '5', '--json', timeout=60)
    try:
        doc = json.loads(r.stdout)
        check(doc[-1]['backend'].startswith('nvrtc\x1b]0;pwned\x07'),
              'JSON keeps the backend (its escapes decode to the bytes)')
    except ValueError as e:
        check(False, 'why --json is JSON: %s' % e)


def many(tmp):
    d = os.path.join(tmp, 'kc')
    os.makedirs(d, mode=0o700)
    n, k = 3000, 40
    for i in range(n):
        ins = [('option', '', '%032x' % (j + (i % 7)), '-Dopt%d' % (j + (i % 7)))
               for j in range(k // 2)]
        ins += [('file', '/inc/h%d.h' % j, '%032x' % (j * 1000 + (i % 5 if j == 3 else 0)),
                 'h%d' % j) for j in range(k // 2)]
        ins.append(('source', '', '%032x' % (i % 11), '%d bytes' % i))
        write(d, 1000 + i, record('nvrtc', 'prog%d' % (i % 7), '%032x-%016x' % (i, 0), 1000 + i,
                                  ins))
    t0 = time.monotonic()
    try:
        r = kc(d, 'why', '--last', str(n), '--json', timeout=120)
    except subprocess.TimeoutExpired:
        check(False, 'why --last %d --json over %d records finishes within 120 s' % (n, n))
        return
    dt = time.monotonic() - t0
    check(r.returncode == 0, 'why --last %d --json: exit 0 (%r)' % (n, r.stderr[-300:]))
    print('why --last %d --json: %.1f s' % (n, dt))
    try:
        doc = json.loads(r.stdout)
    except ValueError as e:
        check(False, 'why --json is JSON: %s' % e)
        return
    check(len(doc) == n, 'one report per record (%d)' % len(doc))
    check(all(x['cause'] == 'first' for x in doc[:7]),
          'the oldest of each of the 7 programs is a first compile')
    check(all(x['cause'] in ('differs', 'left-the-store') for x in doc[7:]),
          'every later one has a nearest earlier compile of its program')
    # A record with the same inputs and program as an earlier one (i and
    # i - 385, 385 a multiple of 5, 7 and 11) is nearest to a record of no
    # differences.
    check(doc[-1]['cause'] == 'left-the-store' and doc[-1]['differences'] == [],
          'the last one: an earlier compile with the same inputs (%s)' % doc[-1]['cause'])


def related(tmp):
    d = os.path.join(tmp, 'kc')
    os.makedirs(d, mode=0o700)
    src = lambda n, dg: ('source', '', dg * 32, '%d bytes' % n)  # noqa: E731
    write(d, 1000, record('nvrtc', 'axpy.cu', 'a' * 32, 1000,
                          [src(10, 'a'), ('file', 'axpy.cuh', 'b' * 32, 'axpy.cuh')]))
    write(d, 2000, record('nvrtc', 'scale.cu', 'c' * 32, 2000, [src(20, 'c')]))
    write(d, 3000, record('nvrtc', 'axpy.cu', 'e' * 32, 3000,
                          [src(11, 'e'), ('file', 'axpy.cuh', 'b' * 32, 'axpy.cuh')]))
    r = kc(d, 'why', '--last', '3', '--json', timeout=60)
    check(r.returncode == 0, 'why --last 3 --json: exit 0 (%r)' % r.stderr)
    try:
        doc = json.loads(r.stdout)
    except ValueError as e:
        check(False, 'why --json is JSON: %s' % e)
        return
    causes = [(x['name'], x['cause']) for x in doc]
    check(causes == [('axpy.cu', 'first'), ('scale.cu', 'first'), ('axpy.cu', 'differs')],
          'each program compared with its own records only: %s' % causes)
    check([x['kind'] for x in doc[2]['differences']] == ['source'],
          'axpy.cu: its source differs, and nothing of scale.cu (%s)' % doc[2]['differences'])
    r = kc(d, 'why', '--last', '3', timeout=60)
    out = r.stdout.decode()
    check('axpy.cuh' not in out.split('nvrtc miss: "scale.cu"')[-1].split('nvrtc miss:')[0],
          'scale.cu\'s report names no header of axpy.cu: %s' % out)
    check('no earlier nvrtc compile of "scale.cu"' in out,
          'scale.cu: no earlier compile of it is recorded: %s' % out)

    # The same inputs twice, the first's entry in the store (a verify of
    # libNVVM, say, whose entry was there but not served): not "evicted".
    d = os.path.join(tmp, 'kc2')
    p = subprocess.run([sys.argv[2], d, '1', '--drain'], capture_output=True, text=True)
    check(p.returncode == 0, 'kc-populate (%r)' % p.stderr)
    hexkey = p.stdout.split()[0]
    show = kc(d, 'show', hexkey).stdout.decode()
    build = re.search(r'^Build: +([0-9a-f]{16})$', show, re.M).group(1)
    ins = [('option', '', 'f' * 32, '-O3')]
    # (the later miss a few seconds after the entry was made: it was there)
    t1 = time.time_ns()
    t2 = t1 + 5 * 10 ** 9
    write(d, t1, record('nvvm', 'verify', hexkey + '-' + build, t1, ins))
    write(d, t2, record('nvvm', 'verify', '9' * 32 + '-' + build, t2, ins))
    r = kc(d, 'why', '--last', '1', timeout=60)
    out = r.stdout.decode()
    check(r.returncode == 0 and 'still in the store' in out and 'evicted' not in out,
          'an entry still in the store is said to be there, not evicted: %s' % out)
    r = kc(d, 'why', '--last', '1', '--json', timeout=60)
    check(json.loads(r.stdout)[0]['cause'] == 'in-the-store',
          'why --json: cause in-the-store (%s)' % r.stdout[:300])


def main():
    mode = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix='kcache-why-')
    try:
        {'escape': escape, 'many': many, 'related': related}[mode](tmp)
    finally:
        rm_settled(tmp)
    if failures:
        print('%d failure(s)' % len(failures))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
