#!/usr/bin/env python3
"""The man pages render cleanly and say what the help says.

Usage: test_man.py BUILD-DIR   (KCACHE_SRC, KCACHE_TOOL set)

  1. `man -l` renders build/docs/man/kcache.1 and kcache-run.1 (made by
     scdoc from docs/man/*.scd) with no warning on stderr (groff's
     warnings on); skipped when scdoc or man is missing.
  2. kcache(1)'s COMMANDS lists exactly the synopses `kcache help COMMAND`
     prints, for every command `kcache --help` lists, and `kcache COMMAND
     --help` prints the same as `kcache help COMMAND`; its OPTIONS are
     `kcache --help`'s; its ENVIRONMENT names every setting of
     common/config.c's table (`kcache config --markdown`) and no other.
  3. kcache-run(1)'s SYNOPSIS is `kcache-run --help`'s usage line and its
     OPTIONS are the options `kcache-run --help` lists.
  4. docs/configure.md's table names every setting and no other.
  5. The manual kcache(1)'s SEE ALSO points to is installed: each page it
     names is under share/doc/kcache of `meson install`'s tree (what the
     tarball and the wheel carry), and no installed page tells its reader
     to run the source tree's scripts/kcache-run.
Exit status 0 on success, 1 on a failed check.
"""
import os
import re
import json
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print('FAIL: ' + msg, flush=True)
    return cond


SRC = os.environ['KCACHE_SRC']
TOOL = os.environ['KCACHE_TOOL']
BUILD = sys.argv[1]
ENV = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'LANG': 'C.UTF-8'}


def sections(path):
    """{SECTION: [lines]} of an scdoc source."""
    out, cur = {}, None
    for line in open(path, encoding='utf-8').read().splitlines():
        if line.startswith(';'):
            continue
        m = re.match(r'^# (.+)$', line)
        if m:
            cur = m.group(1).strip()
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out


def plain(s):
    """scdoc markup removed: *bold*, _underline_, \\-escapes, ++ breaks."""
    s = re.sub(r'\+\+$', '', s.rstrip())
    s = s.replace('\\*', '\0').replace('*', '').replace('\0', '*')
    s = re.sub(r'(?<![A-Za-z0-9])_([^_\s][^_]*?)_(?![A-Za-z0-9])', r'\1', s)
    s = s.replace('\\_', '_')
    return ' '.join(s.split())


def heads(lines):
    """The item heads of a section: lines that are not indented text."""
    return [plain(l) for l in lines if l.strip() and not l.startswith('\t')]


def run(args):
    return subprocess.run(args, capture_output=True, text=True, env=ENV)


def help_synopses(text):
    """The synopses of a `kcache help COMMAND`: the Usage line, and the
    lines under it (a line that starts "kcache " starts another synopsis,
    any other continues the one before)."""
    out = []
    lines = text.splitlines()
    for i, l in enumerate(lines):
        if l.startswith('Usage: '):
            out.append(l[7:].strip())
            for m in lines[i + 1:]:
                if not m.startswith('       ') or not m.strip():
                    break
                if m.strip().startswith('kcache '):
                    out.append(m.strip())
                else:
                    out[-1] += ' ' + m.strip()
            break
    return [' '.join(s.split()) for s in out]


def option_specs(text):
    """Options as a --help lists them: '  --dir DIR      text' -> '--dir DIR'."""
    return {m.group(1) for m in re.finditer(r'^  (-[-\w]*(?:, --[-\w]+)?(?: [A-Z]+)?)(?:  |$)', text, re.M)}


def test_render():
    man = shutil.which('man')
    pages = [os.path.join(BUILD, 'docs', 'man', p) for p in ('kcache.1', 'kcache-run.1')]
    if not all(os.path.isfile(p) for p in pages):
        print('skip: render: the build made no man pages (scdoc not found: scripts/setup installs it)')
        return
    if man is None:
        print('skip: render: no man (scripts/setup --test installs man-db)')
        return
    for p in pages:
        env = dict(ENV, MANWIDTH='80', MANPAGER='cat', PAGER='cat')
        r = subprocess.run([man, '--warnings', '-l', p], capture_output=True, text=True, env=env)
        name = os.path.basename(p)
        check(r.returncode == 0 and r.stderr == '',
              'man --warnings -l %s: exit 0, no warnings (%d, %r)' % (name, r.returncode, r.stderr[-600:]))
        check('NAME' in r.stdout and 'SYNOPSIS' in r.stdout and len(r.stdout) > 1000,
              'man -l %s renders the page (%d bytes)' % (name, len(r.stdout)))


def test_kcache():
    sec = sections(os.path.join(SRC, 'docs', 'man', 'kcache.1.scd'))
    for s in ('NAME', 'SYNOPSIS', 'DESCRIPTION', 'COMMANDS', 'OPTIONS', 'ENVIRONMENT', 'EXIT STATUS'):
        check(s in sec, 'kcache.1.scd has a %s section' % s)
    man_syn = [h for h in heads(sec.get('COMMANDS', [])) if h.startswith('kcache ')]
    overview = run([TOOL, '--help'])
    check(overview.returncode == 0, 'kcache --help: exit 0')
    body = overview.stdout.split('Commands:', 1)[-1].split('Options:', 1)[0]
    commands = []
    for m in re.finditer(r'^  ([a-z]+)\b', body, re.M):
        if m.group(1) not in commands:
            commands.append(m.group(1))
    check(len(commands) >= 14, 'kcache --help lists the commands (%s)' % commands)
    all_help = []
    for c in commands:
        h = run([TOOL, 'help', c])
        check(h.returncode == 0 and h.stderr == '', 'kcache help %s: exit 0 (%d, %r)' % (c, h.returncode, h.stderr))
        h2 = run([TOOL, c, '--help'])
        check(h2.returncode == 0 and h2.stdout == h.stdout,
              'kcache %s --help prints what kcache help %s does' % (c, c))
        syn = help_synopses(h.stdout)
        check(bool(syn), 'kcache help %s prints a Usage line' % c)
        mine = [s for s in man_syn if s == 'kcache ' + c or s.startswith('kcache %s ' % c)]
        check(syn == mine, 'kcache help %s and kcache(1) agree on its synopsis:\n  help: %s\n  man:  %s'
              % (c, syn, mine))
        all_help += syn
    for s in man_syn:
        check(s in all_help, 'kcache(1) lists "%s", which no kcache help prints' % s)
    # OPTIONS: the overview's.
    want = option_specs(overview.stdout.split('Options:', 1)[-1])
    got = set(heads(sec.get('OPTIONS', []))) - {h for h in heads(sec.get('OPTIONS', [])) if not h.startswith('-')}
    check(want == got, 'kcache(1) OPTIONS are kcache --help\'s: %s vs %s' % (sorted(got), sorted(want)))
    # ENVIRONMENT: every setting, no other.
    md = run([TOOL, 'config', '--markdown']).stdout
    settings = set(re.findall(r'^\| `(KCACHE_[A-Z0-9_]+)` \|', md, re.M))
    env_names = set()
    for h in heads(sec.get('ENVIRONMENT', [])):
        if h.startswith('KCACHE_'):
            env_names |= {n.strip() for n in h.split(',')}
    check(len(settings) >= 20 and env_names == settings,
          'kcache(1) ENVIRONMENT names every setting and no other: missing %s, extra %s'
          % (sorted(settings - env_names), sorted(env_names - settings)))


def test_configure_md():
    """docs/configure.md's table of every variable names each setting, and
    no other variable."""
    md = run([TOOL, 'config', '--markdown']).stdout
    settings = set(re.findall(r'^\| `(KCACHE_[A-Z0-9_]+)` \|', md, re.M))
    text = open(os.path.join(SRC, 'docs', 'configure.md'), encoding='utf-8').read()
    rows = set()
    for line in text.splitlines():
        if line.startswith('| `KCACHE_'):
            rows |= set(re.findall(r'`(KCACHE_[A-Z0-9_]+)`', line.split(' | ')[0]))
    check(rows == settings, 'docs/configure.md\'s table names every setting and no other: missing %s, '
          'extra %s' % (sorted(settings - rows), sorted(rows - settings)))


def test_kcache_run():
    sec = sections(os.path.join(SRC, 'docs', 'man', 'kcache-run.1.scd'))
    h = run(['sh', os.path.join(SRC, 'scripts', 'kcache-run'), '--help'])
    check(h.returncode == 0, 'kcache-run --help: exit 0')
    usage = [l[7:].strip() for l in h.stdout.splitlines() if l.startswith('Usage: ')]
    syn = heads(sec.get('SYNOPSIS', []))
    check(usage == syn, 'kcache-run(1) SYNOPSIS is kcache-run --help\'s usage: %s vs %s' % (syn, usage))
    want = option_specs(h.stdout.split('Options:', 1)[-1].split('\n\n', 1)[0])
    got = {x for x in heads(sec.get('OPTIONS', [])) if x.startswith('-')}
    check(len(want) >= 12 and want == got,
          'kcache-run(1) OPTIONS are kcache-run --help\'s: missing %s, extra %s'
          % (sorted(want - got), sorted(got - want)))


def test_installed_manual():
    sec = sections(os.path.join(SRC, 'docs', 'man', 'kcache.1.scd'))
    see = ' '.join(sec.get('SEE ALSO', []))
    pages = re.findall(r'\b([a-z]+\.md)\b', see)
    check('share/doc/kcache' in see and len(pages) >= 3,
          'kcache(1) SEE ALSO points to the installed manual, share/doc/kcache (%r)' % see)
    check(not re.search(r'\bdocs/', see), 'kcache(1) SEE ALSO names no source tree path (%r)' % see)
    work = tempfile.mkdtemp(prefix='docs-man.')
    try:
        r = subprocess.run(['meson', 'install', '-C', BUILD, '--no-rebuild', '--quiet',
                            '--destdir', work], capture_output=True, text=True)
        if not check(r.returncode == 0, 'meson install into a staging directory (%s)'
                     % r.stderr[-500:]):
            return
        opts = json.loads(subprocess.run(['meson', 'introspect', BUILD, '--buildoptions'],
                                         capture_output=True, text=True).stdout)
        get = {o['name']: o['value'] for o in opts}
        doc = os.path.join(work + get['prefix'], get['datadir'], 'doc', 'kcache')
        for p in pages:
            check(os.path.isfile(os.path.join(doc, p)),
                  'kcache(1) SEE ALSO names %s: installed in share/doc/kcache' % p)
        for p in sorted(os.listdir(doc)) if os.path.isdir(doc) else []:
            text = open(os.path.join(doc, p), encoding='utf-8').read()
            check('scripts/kcache-run' not in text,
                  'the installed %s names no scripts/kcache-run (the installed command is '
                  'kcache-run)' % p)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    test_installed_manual()
    test_render()
    test_kcache()
    test_kcache_run()
    test_configure_md()
    if failures:
        print('%d failed' % len(failures))
        return 1
    print('ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
