#!/usr/bin/env python3
"""kcache stats --openmetrics, as Prometheus reads it.

Usage: metrics.py PATH-OF-kc-populate   (KCACHE_TOOL set)

On a populated store, with and without a remote configured:
  1. `promtool check metrics` (Debian's prometheus package) passes: every
     family has HELP and TYPE, no abbreviated unit (`_ns`).
  2. Every sample belongs to a family with HELP and TYPE (a counter's
     family named as its samples, `_total`), and times are in seconds.
  3. Written into a textfile collector's directory as docs/sharing.md says
     (a temp file, then mv), node_exporter (--collector.textfile only)
     serves the families typed, with their HELP, and no scrape error; and a
     Prometheus scraping that node_exporter records each family's type
     (its metadata API).
Exit 0 on success, 1 on a failed check, 77 (skip) without promtool.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

KC = os.environ['KCACHE_TOOL']
POP = sys.argv[1]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print('FAIL: ' + msg, flush=True)
    return cond


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url, timeout=2):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


def families(text):
    """{family: {'help': str, 'type': str}} and the samples' names."""
    fam, samples = {}, []
    for l in text.splitlines():
        m = re.match(r'# (HELP|TYPE) (\S+) ?(.*)', l)
        if m:
            fam.setdefault(m.group(2), {})[m.group(1).lower()] = m.group(3)
        elif l and not l.startswith('#'):
            samples.append(re.match(r'[^{ ]+', l).group(0))
    return fam, samples


def stats(env):
    r = subprocess.run([KC, 'stats', '--openmetrics'], capture_output=True, text=True, env=env)
    check(r.returncode == 0 and r.stderr == '',
          'stats --openmetrics: exit 0, nothing on stderr (%d, %r)' % (r.returncode, r.stderr))
    return r.stdout


def check_text(text, what):
    r = subprocess.run(['promtool', 'check', 'metrics'], input=text, capture_output=True,
                       text=True)
    check(r.returncode == 0 and r.stdout.strip() == '' and r.stderr.strip() == '',
          '%s: promtool check metrics passes (%d: %s)' % (what, r.returncode,
                                                          (r.stdout + r.stderr).strip()[:800]))
    fam, samples = families(text)
    check(len(samples) >= 20, '%s: samples written (%d)' % (what, len(samples)))
    for s in sorted(set(samples)):
        f = fam.get(s)
        check(f is not None and f.get('help') and f.get('type') in ('counter', 'gauge'),
              '%s: %s has HELP and TYPE (%r)' % (what, s, f))
        check(f is None or f.get('type') != 'counter' or s.endswith('_total'),
              '%s: counter %s ends in _total' % (what, s))
        check('_ns' not in s, '%s: %s in base units (no _ns)' % (what, s))
    check('kcache_compile_seconds_total' in fam and 'kcache_saved_seconds_total' in fam,
          '%s: compile and saved time in seconds' % what)
    check(text.endswith('# EOF\n'), '%s: ends with # EOF' % what)
    return fam


def scrape(text, work):
    """node_exporter's textfile collector, and Prometheus scraping it."""
    ne = shutil.which('prometheus-node-exporter') or shutil.which('node_exporter')
    if ne is None:
        print('skip: scrape: no prometheus-node-exporter')
        return
    tdir = os.path.join(work, 'textfile')
    os.makedirs(tdir)
    # As docs/sharing.md writes it: a temp file in the directory, then mv.
    tmp = os.path.join(tdir, 'kcache.prom.tmp')
    with open(tmp, 'w') as f:
        f.write(text)
    os.rename(tmp, os.path.join(tdir, 'kcache.prom'))
    port = free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [ne, '--collector.disable-defaults', '--collector.textfile',
             '--collector.textfile.directory=' + tdir, '--web.listen-address=127.0.0.1:%d' % port],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, 'ne.log'), 'w')))
        body = None
        deadline = time.time() + 15
        while time.time() < deadline and body is None:
            time.sleep(0.1)
            body = get('http://127.0.0.1:%d/metrics' % port)
        if not check(body is not None, 'node_exporter serves /metrics (%s)'
                     % open(os.path.join(work, 'ne.log')).read()[-500:]):
            return
        check(re.search(r'^node_textfile_scrape_error 0$', body, re.M) is not None,
              'node_exporter: no textfile scrape error (%s)'
              % re.findall(r'.*textfile.*', body)[:6])
        fam, _ = families(body)
        for name in ('kcache_hits_total', 'kcache_entries', 'kcache_compile_seconds_total',
                     'kcache_passthrough_reason_total'):
            f = fam.get(name, {})
            check(f.get('type') in ('counter', 'gauge') and f.get('help') and
                  'Metric read from' not in f.get('help', ''),
                  'node_exporter: %s typed, with its HELP (%r)' % (name, f))
        prom = shutil.which('prometheus')
        if prom is None:
            print('skip: scrape: no prometheus')
            return
        pport = free_port()
        cfg = os.path.join(work, 'prometheus.yml')
        with open(cfg, 'w') as f:
            f.write('global:\n  scrape_interval: 1s\nscrape_configs:\n'
                    '  - job_name: node\n    static_configs:\n'
                    '      - targets: ["127.0.0.1:%d"]\n' % port)
        procs.append(subprocess.Popen(
            [prom, '--config.file=' + cfg, '--storage.tsdb.path=' + os.path.join(work, 'tsdb'),
             '--web.listen-address=127.0.0.1:%d' % pport],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, 'prom.log'), 'w'),
            cwd=work))
        meta = {}
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.5)
            r = get('http://127.0.0.1:%d/api/v1/metadata' % pport)
            if r is not None:
                meta = json.loads(r).get('data', {})
                if 'kcache_hits_total' in meta:
                    break
        if not check('kcache_hits_total' in meta, 'Prometheus scraped node_exporter (%s)'
                     % open(os.path.join(work, 'prom.log')).read()[-800:]):
            return
        for name, typ in (('kcache_hits_total', 'counter'), ('kcache_entries', 'gauge'),
                          ('kcache_saved_seconds_total', 'counter')):
            m = meta.get(name, [{}])[0]
            check(m.get('type') == typ and m.get('help'),
                  'Prometheus: %s is a %s with its HELP (%r)' % (name, typ, m))
        print('scraped: %d kcache families typed in Prometheus'
              % len([n for n in meta if n.startswith('kcache_')]))
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main():
    if shutil.which('promtool') is None:
        print('skip: no promtool (Debian package prometheus; scripts/setup --test)')
        return 77
    work = tempfile.mkdtemp(prefix='kcache-metrics.')
    try:
        d = os.path.join(work, 'cache')
        env = dict(os.environ, KCACHE_DIR=d, HOME=os.path.join(work, 'home'))
        for k in ('KCACHE_SHIM', 'KCACHE_SRC', 'KCACHE_BUILD', 'KCACHE_REMOTE'):
            env.pop(k, None)
        r = subprocess.run([POP, d, '6', '--drain'],
                           capture_output=True, text=True, env=env)
        check(r.returncode == 0, 'kc-populate (%s)' % r.stderr)
        text = stats(env)
        check_text(text, 'store')
        check(re.search(r'^kcache_hits_total\{dir="[^"]*",backend="nvrtc"\} [1-9]', text, re.M)
              is not None, 'store: the populated counters are written')
        renv = dict(env, KCACHE_REMOTE='redis://127.0.0.1:1')
        rtext = stats(renv)
        fam = check_text(rtext, 'with a remote')
        check('kcache_remote_saved_seconds_total' in fam and 'kcache_remote_hits_total' in fam,
              'with a remote: the remote counters')
        scrape(rtext, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
