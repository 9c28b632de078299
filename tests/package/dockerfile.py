"""The Dockerfile of docs/install.md ("In a container"), built and run without a container engine
(test_package.py step 5; there is no Docker engine on the machines that run
this suite, and no Ubuntu mirror to make the CUDA image's base from).

The Dockerfile is read from docs/install.md as a user copies it, and each
instruction is carried out as an image builder would: FROM is a cached
Debian trixie minbase root (base_root), standing in for
nvidia/cuda's runtime image (the same role: a glibc >= 2.31 system with
NVRTC, here the toolkit's libnvrtc bind-mounted read-only where the CUDA
image keeps it, /usr/local/cuda/lib64); the layers are an overlay's upper
directory over it, so the cached root is never changed. ADD of a local
tar unpacks it; ENV sets variables (expanding $VAR as Docker does); RUN
runs /bin/sh -c as the current USER; USER, WORKDIR; COPY --chown copies
from the build context (the user's train.py: here a real NVRTC client).
Then two "containers" run ENTRYPOINT + CMD as the image's user, with
KCACHE_STATS=1 added (docker run -e): the first compiles and stores, the
second is served from the store the Dockerfile made, and both print what
NVRTC prints without kcache.

Anything in that Dockerfile this interpreter does not know fails
the test by name, so the page cannot grow an instruction no one ran.
"""
import json
import os
import re
import shlex
import shutil

# The CUDA runtime image's environment (nvidia/cuda 13.0 runtime).
IMAGE_ENV = {
    'PATH': '/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:'
            '/usr/sbin:/usr/bin:/sbin:/bin',
    'LD_LIBRARY_PATH': '/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64',
    'LANG': 'C.UTF-8',
}
KNOWN = ('FROM', 'ADD', 'ENV', 'RUN', 'USER', 'WORKDIR', 'COPY', 'ENTRYPOINT', 'CMD')


def readme_dockerfile(readme):
    """The indented block of docs/install.md that starts with FROM, as
    instructions (continuation lines joined, comments dropped)."""
    lines = readme.splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(r'^    FROM ', l))
    block = []
    for l in lines[start:]:
        if not l.startswith('    '):
            break
        block.append(l[4:])
    out, cur = [], ''
    for l in block:
        if not cur and (l.startswith('#') or not l.strip()):
            continue
        cur += l.rstrip()
        if cur.endswith('\\'):
            cur = cur[:-1] + ' '
            continue
        out.append(cur.strip())
        cur = ''
    return out


def expand(s, env):
    return re.sub(r'\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?', lambda m: env.get(m.group(1), ''), s)


def parse_env(arg, env):
    new = {}
    for item in shlex.split(arg):
        k, _, v = item.partition('=')
        new[k] = expand(v, env)
    env.update(new)


class Image:
    """The layers: an overlay of upper over the cached root, mounted anew
    in a private mount namespace for each step."""

    def __init__(self, tp, base, work, nvrtc):
        self.tp, self.base, self.work, self.nvrtc = tp, base, work, nvrtc
        self.upper = os.path.join(work, 'upper')
        self.ovl = os.path.join(work, 'ovl')
        self.root = os.path.join(work, 'rootfs')
        for d in (self.upper, self.ovl, self.root):
            os.makedirs(d)
        self.env = dict(IMAGE_ENV)
        self.user = 'root'
        self.workdir = '/'

    def sh(self, script, inner=None, timeout=900):
        """Runs `script` (host side, $r the mounted root) and then, given,
        `inner` in the root as the current user."""
        mounts = ('set -e; r=%s; mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s "$r";'
                  'mkdir -p "$r/proc" "$r/usr/local/cuda/lib64" "$r/tmp/ctx";'
                  'mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev";'
                  'mount --bind %s "$r/usr/local/cuda/lib64";'
                  'mount -o remount,bind,ro "$r/usr/local/cuda/lib64";'
                  'mount --bind %s "$r/tmp/ctx";'
                  % tuple(self.tp.sh_quote(x) for x in (self.root, self.base, self.upper, self.ovl,
                                                       self.nvrtc, os.path.join(self.work, 'ctx'))))
        cmd = mounts + (script + ';' if script else '')
        if inner is not None:
            envs = ' '.join(self.tp.sh_quote('%s=%s' % kv) for kv in sorted(self.env.items()))
            uid, gid = self.owner_of(self.user) if self.user != 'root' else (0, 0)
            cmd += ('cd "$r"; exec chroot --userspec=%d:%d "$r" env -i HOME=%s %s '
                    'sh -c %s' % (uid, gid, self.tp.sh_quote(self.home()), envs,
                                  self.tp.sh_quote('cd %s && %s' % (shlex.quote(self.workdir), inner))))
        r = self.tp.run(['unshare', '--mount', '--propagation', 'private', 'sh', '-c', cmd],
                        timeout=timeout)
        # What the step left running (kcache's owner) ends before the next
        # step mounts the layers again: one overlay of an upper at a time.
        self.tp.end_root_procs(self.root)
        return r

    def file(self, rel):
        """A file of the image: the top layer's, else the base's."""
        p = os.path.join(self.upper, rel)
        return open(p if os.path.exists(p) else os.path.join(self.base, rel)).read()

    def home(self):
        if self.user == 'root':
            return '/root'
        for l in self.file('etc/passwd').splitlines():
            f = l.split(':')
            if f[0] == self.user:
                return f[5]
        return '/'

    def owner_of(self, spec):
        """uid:gid of a user:group of the image's own passwd and group."""
        u, _, g = spec.partition(':')
        uid = gid = None
        for l in self.file('etc/passwd').splitlines():
            f = l.split(':')
            if f[0] == u:
                uid, gid = int(f[2]), int(f[3])
        for l in self.file('etc/group').splitlines():
            f = l.split(':')
            if g and f[0] == g:
                gid = int(f[2])
        return uid, gid


def base_root(tp):
    """The base image: a Debian trixie minbase root as debootstrap makes
    it (unlike the other test roots, nothing removed from it, and no
    python3: the Dockerfile installs its program's own needs), made once
    and cached beside them."""
    root = os.path.join(tp.CACHE, 'trixie-docker')
    stamp = 'trixie minbase\n'
    sf = os.path.join(root, '.kcache-root')
    if os.path.isfile(sf) and open(sf).read() == stamp:
        return root
    shutil.rmtree(root + '.tmp', ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    r = tp.run(['debootstrap', '--variant=minbase', 'trixie', root + '.tmp', tp.MIRROR],
               timeout=1800)
    if r.returncode != 0:
        raise SystemExit('debootstrap trixie failed:\n%s' % (r.stdout + r.stderr)[-3000:])
    with open(os.path.join(root + '.tmp', '.kcache-root'), 'w') as f:
        f.write(stamp)
    os.rename(root + '.tmp', root)
    return root


def build_and_run(tp, check, tarball, version, work, nvrtc):
    readme = open(os.path.join(tp.SRC, 'docs', 'install.md')).read()
    steps = readme_dockerfile(readme)
    check(bool(steps) and steps[0].startswith('FROM '),
          'docker: docs/install.md has a Dockerfile (%d instructions)' % len(steps))
    ctx = os.path.join(work, 'ctx')
    os.makedirs(ctx)
    shutil.copy(tarball, ctx)
    # The user's program: a real NVRTC client, run as the CMD names it.
    shutil.copy(os.path.join(tp.HERE, 'nvrtc_ctypes.py'), ctx)
    with open(os.path.join(ctx, 'train.py'), 'w') as f:
        f.write('import sys\nsys.argv = ["nvrtc_ctypes.py", "libnvrtc.so.%s", "compute_80", '
                '"ka", "kb", "kc"]\nsys.path.insert(0, "/tmp/ctx")\nimport nvrtc_ctypes\n'
                'nvrtc_ctypes.main()\n' % tp.nvrtc_name(nvrtc).split('.so.')[1])
    img = Image(tp, base_root(tp), work, nvrtc)
    entry, cmd = None, None
    for st in steps:
        op, _, arg = st.partition(' ')
        arg = arg.strip()
        if op not in KNOWN:
            check(False, 'docker: the Dockerfile of docs/install.md has %s, which this test cannot carry out' % op)
            return
        if op == 'FROM':
            continue
        if op == 'ENV':
            parse_env(arg, img.env)
        elif op == 'USER':
            img.user = arg
        elif op == 'WORKDIR':
            img.workdir = expand(arg, img.env)
        elif op == 'ADD':
            src, dst = shlex.split(arg)
            check(src.endswith('.tar.gz') and os.path.basename(tarball) == src,
                  'docker: ADD names the tarball scripts/package makes (%s)' % src)
            r = img.sh('mkdir -p "$r%s"; tar xzf %s -C "$r%s"'
                       % (dst, tp.sh_quote(os.path.join(ctx, src)), dst))
            check(r.returncode == 0, 'docker: ADD %s (%s)' % (arg, r.stderr[-300:]))
        elif op == 'RUN':
            r = img.sh('', inner=arg)
            check(r.returncode == 0, 'docker: RUN %s%s' % (
                arg[:60], '' if r.returncode == 0 else ' (%s)' % (r.stdout + r.stderr)[-600:]))
        elif op == 'COPY':
            a = shlex.split(arg)
            chown = [x for x in a if x.startswith('--chown=')]
            a = [x for x in a if not x.startswith('--')]
            dst = a[-1] if a[-1].startswith('/') else os.path.join(img.workdir, a[-1])
            uid, gid = img.owner_of(chown[0][len('--chown='):]) if chown else (0, 0)
            if not check(uid is not None, 'docker: COPY --chown names a user the image has (%s)'
                         % chown):
                return
            for s in a[:-1]:
                r = img.sh('mkdir -p "$r%s"; cp %s "$r%s/"; chown %d:%d "$r%s/%s"'
                           % (dst, tp.sh_quote(os.path.join(ctx, s)), dst, uid, gid, dst, s))
                check(r.returncode == 0, 'docker: COPY %s (%s)' % (s, r.stderr[-300:]))
        elif op == 'ENTRYPOINT':
            entry = json.loads(arg)
        elif op == 'CMD':
            cmd = json.loads(arg)
    check(entry is not None and cmd is not None, 'docker: an ENTRYPOINT and a CMD')
    if entry is None or cmd is None:
        return
    argv = ' '.join(shlex.quote(x) for x in entry + cmd)
    plain = ' '.join(shlex.quote(x) for x in cmd)
    check(img.user != 'root', 'docker: the image runs as a user other than root (%s)' % img.user)
    ref = img.sh('', inner=plain)
    check(ref.returncode == 0 and len(ref.stdout.splitlines()) == 3,
          'docker: the CMD without kcache compiles 3 kernels (%s)' % (ref.stdout + ref.stderr)[-400:])
    # docker run -e: the stats line, and an owner that exits soon when idle.
    img.env['KCACHE_STATS'] = '1'
    img.env['KCACHE_OWNER_IDLE_MS'] = '500'
    for label, want in (('first', (0, 3)), ('second', (3, 0))):
        r = img.sh('', inner=argv)
        warn = [l for l in r.stderr.splitlines() if l.startswith('kcache:') and 'stats:' not in l]
        check(r.returncode == 0 and r.stdout == ref.stdout,
              'docker: %s container (%s as %s): NVRTC\'s own outputs (%s)'
              % (label, argv, img.user, r.stderr[-400:]))
        check(tp.stats_line(r.stderr) == want and not warn,
              'docker: %s container: nvrtc hits, misses %s, no warning (%s; %s)'
              % (label, want, tp.stats_line(r.stderr), warn))
    # The store directory the Dockerfile made: the user's, private.
    store = expand('$KCACHE_DIR', img.env)
    st = os.stat(os.path.join(img.upper, store.lstrip('/')))
    uid, _ = img.owner_of(img.user)
    check(st.st_uid == uid and (st.st_mode & 0o777) == 0o700,
          'docker: %s is owned by %s, mode 0700 (uid %d, mode %o)'
          % (store, img.user, st.st_uid, st.st_mode & 0o777))
