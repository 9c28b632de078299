#!/usr/bin/env python3
"""README.md, the front page, says what the code does.

Usage: test_readme.py BUILD-DIR CUDA-LIB-DIR   (KCACHE_SRC, KCACHE_TOOL set)

  1. It is 200 lines or fewer, names no issue and no path of one machine,
     and every page it links to exists.
  2. Its configuration table (between the config-table markers) is what
     `kcache config --markdown` prints, and names every variable of
     common/config.c's table and no other; every KCACHE_* name anywhere in
     the README is one of them; every kcache-run option is in it.
  3. Every command of its ```sh blocks runs, as a new user runs it: in a
     fresh HOME and working directory, on a tarball made from this build
     (meson install, laid out as scripts/package lays it out), with a
     train.py that compiles two kernels with the real NVRTC (through
     ctypes). The quick start's second run is served: its stats line shows
     NVRTC hits. A block preceded by `<!-- docs-test: skip (WHY) -->` is not
     run (the reason is required, and printed).
  4. Its client table and docs/performance.md are what scripts/bench
     writes from docs/performance/results.json (`scripts/bench
     --check-docs`): no figure edited by hand; every client has one, with
     its run's date.
Exit status 0 on success, 1 on a failed check.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print('FAIL: ' + msg, flush=True)
    return cond


SRC = os.environ['KCACHE_SRC']
TOOL = os.environ['KCACHE_TOOL']
BUILD = sys.argv[1]
CUDA_LIB = sys.argv[2]
README = open(os.path.join(SRC, 'README.md'), encoding='utf-8').read()
BEGIN = '<!-- config-table: begin'
END = '<!-- config-table: end -->'


def config_c_names():
    """Every name in common/config.c's kc_config_vars initializer."""
    text = open(os.path.join(SRC, 'common', 'config.c'), encoding='utf-8').read()
    start = text.index('const struct kc_config_var kc_config_vars[] = {')
    end = text.index('\n};', start)
    return re.findall(r'\{\s*"(KCACHE_[A-Z0-9_]*)"', text[start:end])


def table_block():
    b = README.find(BEGIN)
    e = README.find(END)
    if not check(b >= 0 and e > b, 'README.md has the config-table markers'):
        return ''
    return README[README.index('\n', b) + 1:e]


def test_page():
    n = len(README.splitlines())
    check(n <= 200, 'README.md is 200 lines or fewer (%d)' % n)
    for m in re.finditer(r'(?i)\bissues? #?\d+|(?<![\w/])#\d+\b', README):
        check(False, 'README.md names an issue: %r' % m.group(0))
    for m in re.finditer(r'(?<![\w.~$])/(?:root|home|work|mnt|scratch)/[^\s)`]*', README):
        check(False, 'README.md names a path of one machine: %r' % m.group(0))
    for m in re.finditer(r'\]\(([^)#]+)(?:#[^)]*)?\)', README):
        target = m.group(1)
        if re.match(r'[a-z]+:', target):
            continue
        check(os.path.exists(os.path.join(SRC, target)), 'README.md links to %s, which exists' % target)


def test_table():
    block = table_block()
    md = subprocess.run([TOOL, 'config', '--markdown'], capture_output=True, text=True,
                        env={'PATH': os.environ.get('PATH', '/usr/bin:/bin')})
    check(md.returncode == 0 and md.stderr == '',
          'kcache config --markdown: exit 0, nothing on stderr (%d, %r)' % (md.returncode, md.stderr))
    check(block == md.stdout,
          'the README\'s configuration table is `kcache config --markdown` (run scripts/update-readme)')
    names = config_c_names()
    check(len(names) >= 30, 'common/config.c\'s table parsed (%d names)' % len(names))
    # Prefix entries ("KCACHE_TEST_") are written KCACHE_TEST_* in the table.
    in_block = set(re.findall(r'`(KCACHE_[A-Z0-9_]*)\*?`', block))
    for n in names:
        check(n in in_block, 'the configuration table lists %s (common/config.c)' % n)
    for n in sorted(in_block - set(names)):
        check(False, 'the configuration table lists %s, which common/config.c does not' % n)
    known = set(names)
    prefixes = [n for n in names if n.endswith('_')]
    for n in sorted(set(re.findall(r'\bKCACHE_[A-Z0-9_]*', README)) - {'KCACHE_'}):
        check(n in known or any(n.startswith(p) for p in prefixes),
              'README.md names %s, which common/config.c does not' % n)
    # Every kcache-run option.
    run = os.path.join(SRC, 'scripts', 'kcache-run')
    h = subprocess.run(['sh', run, '--help'], capture_output=True, text=True)
    opts = set(re.findall(r'^  (--[a-z-]+)', h.stdout, re.M))
    check(len(opts) >= 12, 'kcache-run --help lists its options (%d)' % len(opts))
    for o in sorted(opts - {'--help', '--version'}):
        check('`' + o in README, 'README.md names kcache-run %s' % o)


def shell_blocks():
    """(commands, skip reason or None) of each ```sh block, in order."""
    out = []
    lines = README.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == '```sh':
            skip = None
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            m = re.match(r'<!-- docs-test: skip \((.+)\) -->$', lines[j].strip()) if j >= 0 else None
            if m:
                skip = m.group(1)
            elif j >= 0 and 'docs-test' in lines[j]:
                check(False, 'README.md line %d: a docs-test marker without a reason: %r'
                      % (j + 1, lines[j]))
            k = i + 1
            body = []
            while k < len(lines) and lines[k].strip() != '```':
                body.append(lines[k])
                k += 1
            out.append((body, skip, i + 1))
            i = k
        i += 1
    return out


TRAIN = '''import os, sys
sys.argv = [sys.argv[0], %r, 'compute_80', 'readme_k1', 'readme_k2']
exec(compile(open(%r).read(), 'nvrtc_ctypes.py', 'exec'))  # runs its main()
'''


def make_tarball(work, version):
    """The tree scripts/package lays out (bin/, lib/, share/man/man1), made
    from this build by meson install, as kcache-VERSION-linux-x86_64.tar.gz."""
    dest = os.path.join(work, 'dest')
    r = subprocess.run(['meson', 'install', '-C', BUILD, '--no-rebuild', '--quiet', '--destdir', dest],
                       capture_output=True, text=True)
    if not check(r.returncode == 0, 'meson install into a staging directory (%s)' % r.stderr[-500:]):
        return None
    opts = json.loads(subprocess.run(['meson', 'introspect', BUILD, '--buildoptions'],
                                     capture_output=True, text=True).stdout)
    prefix = next(o['value'] for o in opts if o['name'] == 'prefix')
    tree = os.path.join(work, 'kcache-' + version)
    os.rename(dest + prefix, tree)
    name = 'kcache-%s-linux-x86_64.tar.gz' % version
    r = subprocess.run(['tar', '-C', work, '-czf', os.path.join(work, 'cwd', name), 'kcache-' + version],
                       capture_output=True, text=True)
    check(r.returncode == 0, 'tar of the staged tree (%s)' % r.stderr)
    shutil.rmtree(tree)
    shutil.rmtree(dest, ignore_errors=True)
    return name


def wait_gone(work, seconds=20):
    """Waits for every process running a program from under work (the
    owner the tarball's kcache started) to exit."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        left = []
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                try:
                    if os.readlink('/proc/%s/exe' % pid).startswith(work + '/'):
                        left.append(pid)
                except OSError:
                    pass
        if not left:
            return
        time.sleep(0.1)
    check(False, 'processes from the tarball still run after %d s' % seconds)


def test_commands():
    version = re.search(r"version: '([^']+)'", open(os.path.join(SRC, 'meson.build')).read()).group(1)
    nvrtc = os.path.join(CUDA_LIB, 'libnvrtc.so')
    if not os.path.exists(nvrtc):
        print('skip: commands: no libnvrtc.so in %s' % CUDA_LIB)
        return
    work = tempfile.mkdtemp(prefix='docs-readme.')
    try:
        home = os.path.join(work, 'home')
        cwd = os.path.join(work, 'cwd')
        pybin = os.path.join(work, 'pybin')
        for d in (home, cwd, pybin):
            os.makedirs(d)
        if make_tarball(work, version) is None:
            return
        # `python` as a new user's machine has it (Debian names it python3).
        with open(os.path.join(pybin, 'python'), 'w') as f:
            f.write('#!/bin/sh\nexec %s "$@"\n' % shutil.which('python3'))
        os.chmod(os.path.join(pybin, 'python'), 0o755)
        with open(os.path.join(cwd, 'train.py'), 'w') as f:
            f.write(TRAIN % (nvrtc, os.path.join(SRC, 'tests', 'package', 'nvrtc_ctypes.py')))
        script = ['set -e']
        ran = 0
        for body, skip, line in shell_blocks():
            if skip is not None:
                print('not run here: README.md line %d (%s): %s'
                      % (line, skip, '; '.join(l.split('#')[0].strip() for l in body if l.strip())))
                continue
            for l in body:
                if l.strip() and not l.strip().startswith('#'):
                    script.append('echo "+ README: %s" >&2' % l.replace('\\', '\\\\').replace('"', '\\"')
                                  .replace('$', '\\$').replace('`', '\\`'))
                    script.append(l)
                    ran += 1
        check(ran >= 5, 'README.md shows at least 5 commands that run here (%d)' % ran)
        # The owner the store starts exits soon after the last command.
        env = {'HOME': home, 'PATH': pybin + ':/usr/local/bin:/usr/bin:/bin',
               'TMPDIR': os.environ.get('TMPDIR', '/tmp'), 'LANG': 'C.UTF-8',
               'KCACHE_OWNER_IDLE_MS': '300'}
        r = subprocess.run(['bash', '-c', '\n'.join(script)], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=240)
        out = r.stdout + r.stderr
        if not check(r.returncode == 0, 'the README\'s commands run (exit %d):\n%s'
                     % (r.returncode, out[-3000:])):
            return
        stats = re.findall(r'^kcache: stats: nvrtc hits=(\d+) misses=(\d+)', out, re.M)
        check(len(stats) == 1 and int(stats[0][0]) == 2 and int(stats[0][1]) == 0,
              'the quick start\'s second run is served: one stats line, nvrtc hits=2 misses=0 (%s)'
              % stats)
        # Stored, or still in the spool under load (the owner drains it soon).
        m = re.search(r'^Entries: +(\d+)(?: \((\d+) pending in the spool\))?', r.stdout, re.M)
        check(m is not None and int(m.group(1)) + int(m.group(2) or 0) > 0,
              '`kcache stats` shows the entries stored (%s)' % r.stdout[-800:])
        check(os.path.isdir(os.path.join(home, '.cache', 'kcache')),
              'the store is the default one, ~/.cache/kcache')
    finally:
        wait_gone(work)
        subprocess.run(['chmod', '-R', 'u+rwX', work])
        shutil.rmtree(work, ignore_errors=True)


def test_clients():
    r = subprocess.run([sys.executable, os.path.join(SRC, 'scripts', 'bench'), '--check-docs'],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, 'scripts/bench --check-docs: the client table and '
          'docs/performance.md are the bench\'s (exit %d: %s)' % (r.returncode, r.stderr.strip()))
    b = README.find('<!-- clients-table: written by scripts/bench')
    e = README.find('<!-- clients-table: end -->')
    if not check(b >= 0 and e > b, 'README.md has the client table markers'):
        return
    rows = [ln for ln in README[b:e].splitlines()[3:] if ln.startswith('|')]
    check(len(rows) >= 6, 'the client table has a row per client (%d)' % len(rows))
    for ln in rows:
        cols = [c.strip() for c in ln.strip('|').split(' | ')]
        check(len(cols) == 4 and cols[2] != 'not measured yet'
              and re.match(r'\d{4}-\d\d-\d\d, ', cols[3]) is not None,
              'the client table gives a measured figure and its run for %s' % cols[0])


def main():
    test_page()
    test_table()
    test_clients()
    test_commands()
    if failures:
        print('%d failed' % len(failures))
        return 1
    print('ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
