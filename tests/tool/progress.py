#!/usr/bin/env python3
"""The progress bar of kcache's long commands (suite tool): export, import
(into an empty store, into one with entries, a dry run), verify, gc, push
and remote prune, each run three ways on the same state:

  - stderr a pseudo-terminal (os.openpty, raw: the bytes as written): a bar
    on stderr, redrawn with \\r, each stage's line ending with a newline;
    every frame is "WHAT[ STAGE]: DONE/TOTAL [###---] P%  RATE  T left"
    (RATE entries/s, bodies/s or bytes/s; T M:SS, or --:-- before a rate
    is known), or, for a stage whose total is unknown (prune's scan),
    "WHAT STAGE: N entries  RATE"; the last frame of each stage says 100%
    with a rate and 0:00 left, and its count is the work done (what the
    command's summary on stdout reports); at most about 10 frames a second;
  - stderr a pipe: no bar (no \\r, no frame);
  - stderr the terminal with --quiet: no bar;

and the exit code and stdout are the same all three ways. On a narrow
terminal (40 and 30 columns) every frame fits and ends at a word's end
(the parts that matter least left out: never a word cut); an export to a
slow reader (a FIFO read in small pieces) says 100% and 0:00 left only
once its writing ended, never while bytes are still going, and its count
advances as the reader reads; an import from a slow FIFO writer draws a
count of bytes from its first bytes on (issue 47, finding 10). push and remote
prune run against a private redis-server on a unix socket in the test's
temporary directory (skipped when redis-server, or libsodium for a key, is
missing).

Usage: progress.py KC_POPULATE   (KCACHE_TOOL set). Exit 0 pass, 1 fail,
77 skip.
"""
import fcntl
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import tty

TOOL = os.environ['KCACHE_TOOL']
POP = sys.argv[1]
N = 2000   # entries in the store: enough for the bars to be redrawn
COLS = 100  # the pseudo-terminal's width

failures = []


def check(cond, what):
    print(('ok: ' if cond else 'FAIL: ') + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


T = tempfile.mkdtemp(prefix='kc-progress-')
os.chmod(T, 0o700)
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith('KCACHE_') and k not in ('HOME', 'XDG_CACHE_HOME')}
ENV.update(HOME=os.path.join(T, 'home'), XDG_CACHE_HOME=os.path.join(T, 'xdg'),
           # No background owner: the tool's operations become the owner
           # themselves, and one that lingered would outlive the test.
           KCACHE_TOOL='/nonexistent/kcache', LANG='C')
os.makedirs(ENV['HOME'])


# ---- running a command three ways -------------------------------------------

def _read_all(fd, out):
    while True:
        try:
            d = os.read(fd, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not d:
            break
        out.append(d)


def run(args, how, env=None):
    """Runs `kcache ARGS` with stderr a pseudo-terminal ('tty'), a pipe
    ('pipe'), or the terminal and --quiet ('quiet', added after the
    command's words). Returns (rc, stdout, stderr, seconds)."""
    argv = [TOOL] + list(args) + (['--quiet'] if how == 'quiet' else [])
    e = dict(ENV, **(env or {}))
    t0 = time.monotonic()
    if how == 'pipe':
        p = subprocess.run(argv, env=e, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=300)
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    m, s = os.openpty()
    tty.setraw(s)  # no \n -> \r\n: stderr's bytes as the tool wrote them
    fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack('HHHH', 30, COLS, 0, 0))
    p = subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=s)
    os.close(s)
    err, out = [], []
    te = threading.Thread(target=_read_all, args=(m, err))
    to = threading.Thread(target=lambda: out.append(p.stdout.read()))
    te.start()
    to.start()
    try:
        p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    to.join()
    te.join()
    os.close(m)
    return p.returncode, b''.join(out), b''.join(err), time.monotonic() - t0


RATE = r'(?:-- (?:entries|bodies|B)/s|[0-9.]+ (?:entries|bodies)/s|[0-9.]+ [KMGTP]?i?B/s)'
COUNT = r'[0-9]+(?:\.[0-9]+ [KMGTP]iB| B)?'
BAR = re.compile(r'^(?P<head>[a-z][a-z ]*): +(?P<done>%s)/(?P<total>%s) \[[#-]+\] +'
                 r'(?P<pct>[0-9]+)%%  (?P<rate>%s)  (?P<left>--:--|[0-9]+:[0-9]{2}(?::[0-9]{2})?) left *$'
                 % (COUNT, COUNT, RATE))
TALLY = re.compile(r'^(?P<head>[a-z][a-z ]*): (?P<done>[0-9]+ entries|%s)  (?P<rate>%s) *$'
                   % (COUNT, RATE))


def split_err(err):
    """stderr's lines: (the bar's, those of the messages)."""
    text = err.decode('utf-8', 'replace')
    lines = text[:-1].split('\n') if text else []
    return [l for l in lines if '\r' in l], [l for l in lines if '\r' not in l]


def stages(err):
    """The bar's lines on a terminal: [(head, [frames])] with each frame a
    match of BAR or TALLY; None with a failure when a line holds something
    that is not a bar frame."""
    text = err.decode('utf-8', 'replace')
    if not check(text.endswith('\n'), 'stderr ends with a newline (%r)' % text[-120:]):
        return None
    out = []
    for line in split_err(err)[0]:
        if not check(line.startswith('\r'), 'a bar line starts with \\r (%r)' % line[:120]):
            return None
        frames = []
        for f in line.split('\r')[1:]:
            check(len(f) <= COLS - 1, 'a frame fits the terminal (%d columns): %r' % (COLS, f))
            m = BAR.match(f) or TALLY.match(f)
            if not check(m is not None, 'a frame is a bar or a tally: %r' % f):
                return None
            frames.append(m)
        heads = {fr.group('head') for fr in frames}
        if not check(len(heads) == 1, 'one stage per line (%s)' % sorted(heads)):
            return None
        out.append((heads.pop(), frames))
    return out


def count_value(s):
    """A count as drawn: entries, or bytes in kc_tool_human_size's units."""
    m = re.match(r'^([0-9.]+)(?: ([KMGTP]?i?B))?$', s)
    units = {None: 1, 'B': 1, 'KiB': 1024, 'MiB': 1024 ** 2, 'GiB': 1024 ** 3,
             'TiB': 1024 ** 4, 'PiB': 1024 ** 5}
    return float(m.group(1)) * units[m.group(2)]


def check_bar(what, rc_out_err, want_heads, want_last):
    """A terminal run's bar: the stages named in want_heads, in order, each
    whose last frame is 100%, 0:00 left, with a rate, and counts
    want_last[head] (a number, or None: done == total only)."""
    rc, out, err, secs = rc_out_err
    st = stages(err)
    if st is None:
        return None
    heads = [h for h, _ in st]
    if not check(heads == want_heads, '%s: the bar\'s stages %s (%s)' % (what, want_heads, heads)):
        return st
    frames = sum(len(f) for _, f in st)
    check(frames <= 12 * secs + 3 * len(st) + 1,
          '%s: at most about 10 frames a second (%d in %.2f s)' % (what, frames, secs))
    for head, fr in st:
        last = fr[-1]
        if BAR.match(last.group(0)):
            check(last.group('pct') == '100' and last.group('left') == '0:00' and
                  not last.group('rate').startswith('--'),
                  '%s: %s ends at 100%%, 0:00 left, with a rate: %r' % (what, head, last.group(0)))
            check(last.group('done').strip() == last.group('total'),
                  '%s: %s ends with done == total: %r' % (what, head, last.group(0)))
            done = count_value(last.group('done').strip())
        else:
            check(not last.group('rate').startswith('--'),
                  '%s: %s ends with a rate: %r' % (what, head, last.group(0)))
            done = count_value(last.group('done').replace(' entries', ''))
        want = want_last.get(head)
        if want is not None:
            check(abs(done - want) <= max(1, want * 0.002),
                  '%s: %s counts the work done (%s, want %s)' % (what, head, done, want))
        for f in fr:
            if BAR.match(f.group(0)):
                check(count_value(f.group('done').strip()) <= count_value(f.group('total')),
                      '%s: %s never passes its total: %r' % (what, head, f.group(0)))
    return st


def no_bar(what, rc_out_err):
    rc, out, err, _ = rc_out_err
    text = err.decode('utf-8', 'replace')
    check('\r' not in text and not any(BAR.match(l) or TALLY.match(l)
                                       for l in text.splitlines()),
          '%s: no bar on stderr (%r)' % (what, text[:200]))


def three_ways(what, args, heads, last, env=None, before=None, norm=None):
    """Runs args three ways (before(how) first, when given, to set the
    state up; norm(how, stdout) makes the outputs comparable); checks the
    bar, its absence, and the same exit code and stdout. Returns the
    terminal run."""
    res = {}
    for how in ('tty', 'pipe', 'quiet'):
        if before is not None:
            before(how)
        res[how] = run(args(how) if callable(args) else args, how, env)
    t = res['tty']
    check(t[0] == 0, '%s: exit 0 (%d; stderr %r)' % (what, t[0], t[2][-300:]))
    check_bar(what, t, heads, last(t[1]) if callable(last) else last)
    no_bar(what + ', stderr a pipe', res['pipe'])
    no_bar(what + ', --quiet', res['quiet'])
    outs = {h: (norm(h, r[1]) if norm else r[1]) for h, r in res.items()}
    check(res['pipe'][0] == t[0] and res['quiet'][0] == t[0],
          '%s: the same exit code all three ways (%s)' % (what, [r[0] for r in res.values()]))
    msgs = {h: split_err(r[2])[1] for h, r in res.items()}
    check(msgs['pipe'] == msgs['tty'] and msgs['quiet'] == msgs['tty'],
          '%s: stderr\'s other lines are the same all three ways: %s' % (what, msgs))
    check(outs['pipe'] == outs['tty'] and outs['quiet'] == outs['tty'],
          '%s: the same stdout all three ways:\n%s' % (what, '\n'.join(
              '  %s: %r' % (h, o[:300]) for h, o in outs.items())))
    return t


def run_timed(args, cols, before=None):
    """Runs `kcache ARGS` with stderr a pseudo-terminal of `cols` columns:
    (rc, [(seconds since the start, frame)]) with each frame as drawn."""
    m, s = os.openpty()
    tty.setraw(s)
    fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack('HHHH', 30, cols, 0, 0))
    t0 = time.monotonic()
    p = subprocess.Popen([TOOL] + list(args), env=ENV, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=s)
    os.close(s)
    chunks = []

    def reader():
        while True:
            try:
                d = os.read(m, 65536)
            except OSError:
                break
            if not d:
                break
            chunks.append((time.monotonic() - t0, d))
    th = threading.Thread(target=reader)
    th.start()
    if before is not None:
        before(t0)
    p.wait(timeout=300)
    th.join()
    os.close(m)
    frames, buf = [], ''
    for t, d in chunks:
        for c in re.split(r'([\r\n])', d.decode('utf-8', 'replace')):
            if c in ('\r', '\n'):
                if buf:
                    frames.append((t, buf))
                buf = ''
            else:
                buf += c
    if buf:
        frames.append((t, buf))
    return p.returncode, frames


def narrow_and_slow():
    S = os.path.join(T, 's')
    # A narrow terminal: each frame fits, and ends at a word's end.
    whole = re.compile(r'(%|left|/s|entries|bodies|B|\]|[0-9]+/[0-9]+|[0-9]+)$')
    for cols in (40, 30):
        out = os.path.join(T, 'narrow-%d.kcb' % cols)
        rc, frames = run_timed(['--dir', S, 'export', '-o', out], cols)
        check(rc == 0 and len(frames) >= 2, 'export on %d columns: exit 0, frames drawn (%d)'
              % (cols, len(frames)))
        for _, f in frames:
            g = f.rstrip()
            check(len(f) <= cols - 1 and whole.search(g) is not None,
                  'a frame on %d columns fits and ends at a word\'s end: %r' % (cols, f))
        os.unlink(out)
    # A slow reader: the export's last line says 0:00 left once it ended.
    fifo = os.path.join(T, 'slow.fifo')
    os.mkfifo(fifo, 0o600)
    got = {}

    def slow_reader(t0):
        def read():
            n = 0
            with open(fifo, 'rb') as f:
                while True:
                    d = f.read(4096)
                    if not d:
                        break
                    n += len(d)
                    time.sleep(0.008)
            got['eof'] = time.monotonic() - t0
            got['bytes'] = n
        th = threading.Thread(target=read)
        th.start()
        got['thread'] = th
    rc, frames = run_timed(['--dir', S, 'export', '-o', fifo], COLS, before=slow_reader)
    got['thread'].join()
    check(rc == 0 and got.get('bytes', 0) > 0, 'export to a slow reader: exit 0 (%d bytes)'
          % got.get('bytes', 0))
    done = [t for t, f in frames if f.startswith('export entries') and ' 0:00 left' in f]
    # (less what the pipe holds: 64 KiB, 0.13 s of this reader)
    check(done and done[0] >= got['eof'] - 0.3,
          'export to a slow reader: 0:00 left only once the writing ended (at %.2f s; the '
          'reader had its last byte at %.2f s)' % (done[0] if done else -1, got['eof']))
    # ... and 100% only then: the count is of what was written, not of what
    # was handed to the writer (a frame 100% while bytes are still going
    # was "100% --:-- left" for the whole write).
    full = [t for t, f in frames if f.startswith('export entries') and ' 100%' in f]
    check(full and full[0] >= got['eof'] - 0.3,
          'export to a slow reader: 100%% only once the writing ended (first at %.2f s; the '
          'reader had its last byte at %.2f s)' % (full[0] if full else -1, got['eof']))
    # ... and the count advances while the reader reads (not one jump).
    moving = {f.split('%')[0][-3:] for t, f in frames
              if f.startswith('export ') and '%' in f and t < got['eof'] - 0.3}
    check(len(moving) >= 3, 'export to a slow reader: the percentage advances while the '
          'reader reads (%s before its last byte)' % sorted(moving))
    os.unlink(fifo)

    # A slow FIFO writer: import draws a count that grows with the bytes
    # read, from the first bytes on (the bodies come first in a bundle:
    # counting entries showed nothing until they were all read).
    bundle = os.path.join(T, 'slow-src.kcb')
    r = subprocess.run([TOOL, '--dir', S, 'export', '-o', bundle], env=ENV,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = open(bundle, 'rb').read()
    check(r.returncode == 0 and len(data) > 0, 'export for the slow import (%d bytes)' % len(data))
    os.mkfifo(fifo, 0o600)
    CHUNK = max(4096, len(data) // 80)
    fed = {}

    def slow_writer(t0):
        def write():
            marks = []
            with open(fifo, 'wb') as f:
                for i in range(0, len(data), CHUNK):
                    f.write(data[i:i + CHUNK])
                    f.flush()
                    marks.append((time.monotonic() - t0, i + CHUNK))
                    time.sleep(0.025)
            fed['marks'] = marks
            fed['end'] = time.monotonic() - t0
        th = threading.Thread(target=write)
        th.start()
        fed['thread'] = th
    dest = os.path.join(T, 'slow-import')
    rc, frames = run_timed(['--dir', dest, 'import', '--trust-unsigned', fifo], COLS,
                           before=slow_writer)
    fed['thread'].join()
    check(rc == 0, 'import from a slow FIFO: exit 0 (%d)' % rc)
    half = next((t for t, n in fed['marks'] if n >= len(data) // 2), fed['end'])
    checking = [(t, f) for t, f in frames if f.startswith('import check:')]
    early = [t for t, f in checking if t < half]
    check(early, 'import from a slow FIFO: the check\'s count drawn before half the bundle '
          'was written (first at %.2f s; half written at %.2f s, all at %.2f s)'
          % (checking[0][0] if checking else -1, half, fed['end']))
    counts = {f.split(':', 1)[1].split('  ')[0].strip() for t, f in checking
              if t < fed['end'] - 0.1}
    check(len(counts) >= 3, 'import from a slow FIFO: the count advances while the bundle '
          'arrives (%d counts before its last byte at %.2f s)' % (len(counts), fed['end']))
    os.unlink(fifo)


def populate(d, n, first=0):
    p = subprocess.run([POP, d, str(n), '--drain', '--first', str(first)], env=ENV,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return p.returncode, p.stderr


# ---- the local commands -------------------------------------------------------

def local_commands():
    S = os.path.join(T, 's')
    # verify: every entry checked.
    three_ways('verify', ['--dir', S, 'verify'], ['verify'], {'verify': N})

    # export: a whole store (bodies, then entries), and a selection.
    def export_args(name, extra=()):
        return lambda how: ['--dir', S, 'export', '-o', os.path.join(T, '%s-%s.kcb' % (name, how))] \
            + list(extra)

    def summary_n(out):
        m = re.search(rb'^exported ([0-9]+) entries', out, re.M)
        return int(m.group(1)) if m else -1

    def drop_paths(how, out):
        return re.sub(rb'/[^ ]*\.kcb', b'BUNDLE', out)
    t = three_ways('export', export_args('all'), ['export bodies', 'export entries'],
                   lambda out: {'export entries': summary_n(out)}, norm=drop_paths)
    check(summary_n(t[1]) == N, 'export: every entry (%r)' % t[1][:100])
    t = three_ways('export --namespace', export_args('jit', ['--namespace', 'jit-*']),
                   ['export entries'], lambda out: {'export entries': summary_n(out)},
                   norm=drop_paths)
    check(summary_n(t[1]) == N // 2, 'export --namespace: half the entries (%r)' % t[1][:100])
    bundle = os.path.join(T, 'all-tty.kcb')

    def imported(out):
        m = re.search(rb'^(?:would import|imported) ([0-9]+) of ([0-9]+) entries', out, re.M)
        return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)

    def into(name):
        return lambda how: ['--dir', os.path.join(T, '%s-%s' % (name, how)), 'import',
                            '--trust-unsigned', bundle]

    def norm_dirs(name):
        return lambda how, out: out.replace(os.path.join(T, '%s-%s' % (name, how)).encode(), b'DIR')

    # import into an empty store (the tables path): check, then write; in
    # bytes of the bundle read.
    B = os.path.getsize(bundle)
    t = three_ways('import', into('empty'), ['import check', 'import write'],
                   {'import check': B, 'import write': B}, norm=norm_dirs('empty'))
    check(imported(t[1]) == (N, N), 'import: every entry imported (%r)' % t[1][:200])

    # import into a store with entries (drained puts): every record counted.
    def seed(how):
        rc, err = populate(os.path.join(T, 'seeded-%s' % how), 10, first=100000)
        check(rc == 0, 'kc-populate a store with other entries (%r)' % err)
    t = three_ways('import into entries', into('seeded'), ['import check', 'import write'],
                   {'import check': B, 'import write': B}, before=seed, norm=norm_dirs('seeded'))
    check(imported(t[1]) == (N, N), 'import into entries: every entry imported (%r)' % t[1][:200])

    # import --dry-run: the check alone.
    t = three_ways('import --dry-run', lambda how: ['--dir', S, 'import', '--dry-run',
                                                    '--trust-unsigned', bundle],
                   ['import check'], {'import check': B})
    check(imported(t[1]) == (0, N), 'import --dry-run: all present (%r)' % t[1][:200])

    # gc: in bytes, what eviction frees; on three copies of the store.
    def copy(how):
        d = os.path.join(T, 'gc-%s' % how)
        shutil.copytree(S, d, symlinks=True)

    def freed(out):
        m = re.search(rb'^evicted ([0-9]+) entries: ([0-9.]+ [KMGT]?i?B) -> ([0-9.]+ [KMGT]?i?B)',
                      out, re.M)
        if not m:
            return {}
        return {'gc': count_value(m.group(2).decode()) - count_value(m.group(3).decode())}
    t = three_ways('gc', lambda how: ['--dir', os.path.join(T, 'gc-%s' % how), 'gc',
                                      '--max-size', '20K'],
                   ['gc'], {}, before=copy, norm=lambda how, out: out)
    m = re.search(rb'^evicted ([0-9]+) entries', t[1], re.M)
    check(m is not None and int(m.group(1)) > N // 2, 'gc evicted most entries (%r)' % t[1][:200])
    st = stages(t[2])
    if st and st[0][1] and freed(t[1]):
        done = count_value(st[0][1][-1].group('done').strip())
        want = freed(t[1])['gc']
        # each side of the summary is rounded to 0.1 of its unit
        check(abs(done - want) <= 0.11 * 1024 * 2,
              'gc: the bar\'s bytes are what the summary says were freed (%s vs %s)'
              % (done, want))

    # Nothing to do: no bar at all (nothing reported).
    r = run(['--dir', os.path.join(T, 'gc-tty'), 'gc', '--max-size', '1G'], 'tty')
    check(r[0] == 0 and r[2] == b'', 'gc with nothing to evict: no bar (%r)' % r[2][:200])


# ---- the remote commands --------------------------------------------------------

def redis_start(d):
    sock = os.path.join(d, 'redis.sock')
    p = subprocess.Popen(['redis-server', '--port', '0', '--bind', '127.0.0.1', '--unixsocket', sock,
                          '--unixsocketperm', '700', '--dir', d, '--save', '', '--appendonly', 'no',
                          '--logfile', os.path.join(d, 'redis.log')],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):
        if os.path.exists(sock) and redis_cmd(sock, 'PING') == b'+PONG':
            return p, sock
        time.sleep(0.025)
    p.kill()
    p.wait()
    return None, None


def redis_cmd(sock, *args):
    """One command; the first line of the reply (enough for PING, FLUSHALL,
    DBSIZE)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(sock)
            s.sendall(b'*%d\r\n' % len(args) + b''.join(
                b'$%d\r\n%s\r\n' % (len(a), a.encode()) for a in args))
            buf = b''
            while not buf.endswith(b'\r\n'):
                d = s.recv(4096)
                if not d:
                    break
                buf += d
            return buf.strip()
    except OSError:
        return None


def remote_commands():
    if shutil.which('redis-server') is None:
        print('skip: push, remote prune: no redis-server (scripts/setup --test installs it)')
        return False
    S = os.path.join(T, 's')
    key = os.path.join(T, 'keys', 'k')
    k = subprocess.run([TOOL, 'keygen', key], env=ENV, capture_output=True)
    if k.returncode != 0:
        print('skip: push, remote prune: kcache keygen failed (libsodium?): %r' % k.stderr)
        return False
    shutil.copy(key + '.pub', os.path.join(T, 'trusted'))
    rd = os.path.join(T, 'redis')
    os.makedirs(rd)
    p, sock = redis_start(rd)
    if not check(p is not None, 'redis-server starts'):
        return True
    try:
        env = {'KCACHE_REMOTE': 'redis+unix:' + sock, 'KCACHE_REMOTE_SIGNING_KEY': key,
               'KCACHE_REMOTE_TRUSTED_KEYS': os.path.join(T, 'trusted')}

        def flush(how):
            check(redis_cmd(sock, 'FLUSHALL') == b'+OK', 'FLUSHALL')

        def pushed(out):
            m = re.search(rb'^pushed ([0-9]+) entries', out, re.M)
            return int(m.group(1)) if m else -1

        # push: every entry of the store, counted once.
        t = three_ways('push', ['--dir', S, 'push'], ['push'], {'push': N}, env=env,
                       before=flush)
        check(pushed(t[1]) == N, 'push: every entry uploaded (%r)' % t[1][:200])
        check(redis_cmd(sock, 'DBSIZE') == b':%d' % N, 'push: the remote holds them')

        # remote prune: the scan (a tally of every key, then its total), the
        # deletes (of what matched).
        def refill(how):
            flush(how)
            r = run(['--dir', S, 'push'], 'pipe', env)
            check(r[0] == 0 and pushed(r[1]) == N, 'push before prune (%r)' % (r[1][:200],))

        def pruned(out):
            m = re.search(rb'^pruned ([0-9]+) entries', out, re.M)
            return int(m.group(1)) if m else -1
        t = three_ways('remote prune', ['remote', 'prune', '--namespace', 'jit-test'],
                       ['remote prune scan', 'remote prune delete'],
                       {'remote prune scan': N, 'remote prune delete': N // 2}, env=env,
                       before=refill)
        check(pruned(t[1]) == N // 2, 'remote prune: one namespace\'s entries (%r)' % t[1][:200])
        check(redis_cmd(sock, 'DBSIZE') == b':%d' % (N - N // 2), 'prune: the rest is left')
    finally:
        p.kill()
        p.wait()
    return True


def main():
    try:
        rc, err = populate(os.path.join(T, 's'), N)
        if rc == 77:
            print('skip: the store library is a stub')
            return 77
        if not check(rc == 0, 'kc-populate %d entries (%r)' % (N, err)):
            return 1
        local_commands()
        narrow_and_slow()
        remote_commands()
    finally:
        for _ in range(100):
            shutil.rmtree(T, ignore_errors=True)
            if not os.path.lexists(T):
                break
            time.sleep(0.1)
    if failures:
        print('%d failure(s):' % len(failures))
        for f in failures:
            print('  ' + f.splitlines()[0])
        return 1
    print('ok')
    return 0


if __name__ == '__main__':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
