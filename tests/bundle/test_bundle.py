#!/usr/bin/env python3
"""Bundles (kcache export / import / bundle show) through the real binaries.

Usage: test_bundle.py TEST NVRTC_CLIENT FORGE POPULATE

TEST is one of:
  roundtrip  a store filled by real NVRTC compiles (tests/nvrtc's client),
             exported signed, imported into an empty store elsewhere: the
             client's warm run there compiles nothing (KCACHE_STATS: hits
             only) and its outputs are byte-identical to a run without the
             shim; bundle show says this machine can use the namespace; a
             second import finds everything present; --dry-run writes
             nothing; -o - and an import from a pipe.
  hostile    bundles each refused with one line on stderr, exit status 1,
             and nothing imported: truncated at 100 random offsets, a byte
             flipped at 160 positions spread over the whole file, signed by
             an untrusted key, unsigned without --trust-unsigned, and forged
             ones whose checksums and signature are right (bundle_forge):
             a huge declared size, an entry filed under another key, a body
             that is not its digest's, zip bombs (zstd and LZ4), an entry of
             a namespace the header lacks, bytes after the trailer.
  upgrade    a bundle exported by this build, imported into an empty store,
             then served to a shim of another build (the same library with
             another GNU build-id: what a rebuild gives): every compile hits
             through take_by_source and the entries move to the new build,
             keeping the compile time they save (KCACHE_STATS saved > 0).
  select     --namespace, --max-size (the most recently used entries that
             fit, the file within the size), --hit-since, --only-usable,
             bundle show of damaged and foreign files.
  run        scripts/kcache-run --import FILE imports before the command,
             and still runs the command when the import is refused.
  special    export -o onto what is not a regular file: a FIFO is written
             in place (its reader gets the bundle, the FIFO stays), a
             character device node (made here as root: /dev/full's numbers)
             is written in place and its ENOSPC reported (exit 1; the node
             stays), a symbolic link's target is replaced and the link
             stays, a dangling link and a directory are refused; standard
             output on /dev/full is an error. import and bundle show of
             /dev/zero, /dev/urandom and an endless pipe stop at the header
             with nothing copied, and of a FIFO with no writer return
             (bounded) with one error line.
  names      a bundle whose namespace holds a line break and terminal
             escapes: bundle show, import, ls, show, stats (text and JSON)
             print it escaped, never a forged "signed by key" line or a
             control byte. A header of 65,536 namespaces sharing a 119-byte
             prefix (one entry each): bundle show, import and stats stay
             within generous CPU-time bounds (each check was quadratic).
  killed     kill -9 of imports into an empty store (the tables path, hot
             files written beside it) at spread-out moments: the store never
             holds a hot file of an entry its database lacks (a reader would
             serve it), and verify, after, finds no bad hot file.
  usable     JIT entries of two devices (the stand-in driver at 9.0 and
             8.0): bundle show says which one this device can use, as the
             shim names them; import --only-usable skips the other.

Environment (tests/meson.build): KCACHE_SHIM, KCACHE_TOOL, KCACHE_SRC,
KCACHE_BUILD. Exit status 0 on success, 1 on a failed check, 77 to skip.
"""
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "nvrtc"))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from kctest import rm_settled  # noqa: E402
from test_nvrtc import (Env, Failure, check, expect_cold, expect_warm,  # noqa: E402
                        same_dump, same_streams)

TOOL = os.environ.get("KCACHE_TOOL", "")
ERR_RE = re.compile(rb"^kcache: error: import of .* refused: .+\n\Z")


class Tools:
    def __init__(self, tmp, env):
        self.tmp = tmp
        self.base = dict(env.base)
        self.base["KCACHE_TOOL"] = TOOL
        check(TOOL and os.path.exists(TOOL), f"KCACHE_TOOL={TOOL!r} does not exist")

    def run(self, args, check_rc=0, stdin=None, **kv):
        e = dict(self.base)
        for k, v in kv.items():
            e[k] = str(v)
        p = subprocess.run([TOOL] + args, env=e, stdin=stdin or subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        if check_rc is not None:
            check(p.returncode == check_rc,
                  f"kcache {' '.join(args)}: exit {p.returncode}, expected {check_rc}:\n"
                  f"{p.stdout.decode(errors='replace')[-2000:]}"
                  f"{p.stderr.decode(errors='replace')[-2000:]}")
        return p

    def keygen(self, name):
        path = os.path.join(self.tmp, name)
        self.run(["keygen", path])
        return path

    def trusted(self, *keys):
        path = os.path.join(self.tmp, "trusted-" + "-".join(os.path.basename(k) for k in keys))
        with open(path, "w") as f:
            for k in keys:
                with open(k + ".pub") as p:
                    f.write(p.read())
        os.chmod(path, 0o644)
        return path

    def entries(self, store):
        """The lines of kcache ls (empty for an empty or missing store)."""
        p = self.run(["--dir", store, "ls"])
        return [l for l in p.stdout.decode().splitlines() if l.strip()]

    def builds(self, store, kind):
        """The builds of the entries of a kind ('nvrtc', 'manifest')."""
        out = []
        for line in self.entries(store):
            f = line.split()
            if f[2] != kind:
                continue
            s = self.run(["--dir", store, "show", f[0]]).stdout.decode()
            out += re.findall(r"^Build:\s+([0-9a-f]+)", s, re.M)
        return out


def fill(env, client, name):
    """A store filled by the client's compiles; returns (ref, store)."""
    ref = env.run("no shim", client, shim=False)
    store = env.store(name)
    cold = env.run("cold", client, store=store, KCACHE_STATS=1)
    same_dump(ref, cold)
    expect_cold(cold)
    return ref, store


def import_ok(t, store, bundle, *extra, **kv):
    p = t.run(["--dir", store, "import", bundle] + list(extra), **kv)
    return p.stdout.decode()


def test_roundtrip(env, t, client):
    ref, a = fill(env, client, "a")
    k1 = t.keygen("k1")
    trusted = t.trusted(k1)
    bundle = os.path.join(env.tmp, "a.kcb")
    out = t.run(["--dir", a, "export", "-o", bundle],
                KCACHE_REMOTE_SIGNING_KEY=k1).stdout.decode()
    check("signed by key" in out, f"export did not sign: {out!r}")
    n_a = len(t.entries(a))
    check(n_a > 0, "the filled store has no entries")

    # The header, readable, and this machine's namespace recognised (the
    # tool computes it as the shim does).
    show = t.run(["bundle", "show", bundle],
                 KCACHE_REMOTE_TRUSTED_KEYS=trusted).stdout.decode()
    check(f"{n_a} entries" in show, f"bundle show: {show!r}")
    check("a trusted key" in show, f"bundle show does not trust k1: {show!r}")
    nss = re.findall(r"^  (nvrtc:\S+)$", show, re.M)
    check(nss, f"bundle show lists no nvrtc namespace: {show!r}")
    check(show.count("; usable here") == len(nss),
          f"bundle show: not every nvrtc namespace usable here: {show!r}")
    with open(bundle, "rb") as f:
        head = f.read(600)
    check(b"kcache bundle, layout 3" in head and nss[0].encode() in head,
          f"the header is not readable text: {head[:300]!r}")

    # Dry run: counts, writes nothing.
    b = env.store("b")
    out = import_ok(t, b, bundle, "--dry-run", KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check(f"would import {n_a} of {n_a} entries" in out, f"dry run: {out!r}")
    check(t.entries(b) == [], "a dry run imported entries")

    # Import into the empty store, then the client's warm run there.
    out = import_ok(t, b, bundle, KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check(f"imported {n_a} of {n_a} entries" in out and "signature verified" in out,
          f"import: {out!r}")
    check(len(t.entries(b)) == n_a, f"{len(t.entries(b))} entries after the import, not {n_a}")
    # The most recently used entries get hot files, as drained puts do (the
    # demo-sized set fits DIR/hot's floor): first hits need no RocksDB.
    hot = os.listdir(os.path.join(b, "hot"))
    check(len(hot) == n_a, f"{len(hot)} hot files after the import of {n_a} entries")
    warm = env.run("warm from the bundle", client, store=b, KCACHE_STATS=1)
    same_dump(ref, warm)
    same_streams(ref, warm, strip_stats=True)
    expect_warm(warm)

    # Again: everything is present, nothing written.
    out = import_ok(t, b, bundle, KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check(f"imported 0 of {n_a} entries" in out and f"{n_a} already present" in out,
          f"second import: {out!r}")

    # -o - into a pipe, and an import from a pipe (a private copy is read).
    p = t.run(["--dir", a, "export", "-o", "-"], KCACHE_REMOTE_SIGNING_KEY=k1)
    check(p.stdout[:8] == b"KCBUNDLE", "export -o - wrote no bundle on stdout")
    check(b"exported" in p.stderr, f"export -o -: no summary on stderr: {p.stderr!r}")
    c = env.store("c")
    r = subprocess.run([TOOL, "--dir", c, "import", "-"], input=p.stdout,
                       env=dict(t.base, KCACHE_REMOTE_TRUSTED_KEYS=trusted),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    check(r.returncode == 0, f"import - : {r.stderr!r}")
    check(len(t.entries(c)) == n_a, "import from a pipe: entries missing")
    warm = env.run("warm from the piped bundle", client, store=c, KCACHE_STATS=1)
    same_dump(ref, warm)
    expect_warm(warm)


def refused(t, store, bundle, what, *extra, **kv):
    p = t.run(["--dir", store, "import", bundle] + list(extra), check_rc=None, **kv)
    check(p.returncode == 1, f"{what}: import exited {p.returncode}, expected 1: "
                             f"{p.stdout!r} {p.stderr!r}")
    check(ERR_RE.match(p.stderr), f"{what}: not one error line: {p.stderr!r}")
    check(p.stdout == b"", f"{what}: printed {p.stdout!r}")
    return p.stderr.decode()


def test_hostile(env, t, forge, populate):
    a = env.store("a")
    subprocess.run([populate, a, "300", "--drain"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(t.base))
    k1, k2 = t.keygen("k1"), t.keygen("k2")
    trusted = t.trusted(k1)
    good = os.path.join(env.tmp, "good.kcb")
    t.run(["--dir", a, "export", "-o", good], KCACHE_REMOTE_SIGNING_KEY=k1)
    with open(good, "rb") as f:
        data = f.read()
    check(len(data) > 2000, f"the bundle is only {len(data)} bytes")
    target = env.store("target")
    bad = os.path.join(env.tmp, "bad.kcb")
    rng = random.Random(16)
    seen = {}

    def attempt(what, blob, *extra):
        with open(bad, "wb") as f:
            f.write(blob)
        msg = refused(t, target, bad, what, *extra, KCACHE_REMOTE_TRUSTED_KEYS=trusted)
        key = re.sub(r"[0-9]+", "N", msg.split("refused: ", 1)[1])[:60]
        seen[key] = seen.get(key, 0) + 1

    offsets = sorted(rng.sample(range(len(data)), 100))
    for off in offsets:
        attempt(f"truncated at {off}", data[:off])
    flips = sorted(set(rng.sample(range(len(data)), 120) + list(range(0, 64, 4)) +
                       list(range(len(data) - 176, len(data), 8))))
    for pos in flips:
        b = bytearray(data)
        b[pos] ^= 1 << rng.randrange(8)
        attempt(f"byte {pos} flipped", bytes(b))
    # The same flips are refused with --trust-unsigned too (damage is not
    # a matter of trust).
    for pos in flips[::8]:
        b = bytearray(data)
        b[pos] ^= 0x40
        attempt(f"byte {pos} flipped (--trust-unsigned)", bytes(b), "--trust-unsigned")
    print(f"  {len(offsets)} truncations, {len(flips) + len(flips[::8])} flips refused; "
          f"reasons: {sorted(seen.items(), key=lambda kv: -kv[1])[:8]}", flush=True)

    # Signed by a key this machine does not trust; unsigned.
    other = os.path.join(env.tmp, "other.kcb")
    t.run(["--dir", a, "export", "-o", other, "--sign", k2])
    msg = refused(t, target, other, "untrusted key", KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check("not a trusted key" in msg, f"untrusted key: {msg!r}")
    unsigned = os.path.join(env.tmp, "unsigned.kcb")
    t.run(["--dir", a, "export", "-o", unsigned])
    msg = refused(t, target, unsigned, "unsigned", KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check("unsigned" in msg and "--trust-unsigned" in msg, f"unsigned: {msg!r}")
    # No trusted keys at all: the signed bundle is refused as well.
    refused(t, target, good, "signed, no trusted keys")

    # Forged: right checksums, and signed by the trusted key or imported
    # with --trust-unsigned; each still refused by the check it aims at.
    expect = {
        "key-mismatch": "does not match the name",
        "body-mismatch": "does not match its digest",
        "huge-block": "past the",
        "huge-header": "past the limits",
        "huge-entry": "declares",
        "zstd-bomb": "does not inflate to its declared 65536 bytes",
        "lz4-bomb": "does not inflate to its declared 1048576 bytes",
        "ns-missing": "which the header lacks",
        "extra-bytes": "bytes follow the trailer",
        "stored-size": "is not a stored body of the size its header declares",
        "stored-bomb": "is not a stored body of the size its header declares",
        "stored-nodict": "names a dictionary the header lacks",
        "layout3-nobody": "names a body the bundle does not hold",
        "layout3-baddigest": "is not the body its digest names",
    }
    for mode, words in expect.items():
        f = os.path.join(env.tmp, mode + ".kcb")
        subprocess.run([forge, mode, f, "--sign", k1], check=True)
        msg = refused(t, target, f, mode + " (signed)", KCACHE_REMOTE_TRUSTED_KEYS=trusted)
        check(words in msg, f"{mode} (signed): {msg!r} does not say {words!r}")
        subprocess.run([forge, mode, f], check=True)
        msg = refused(t, target, f, mode + " (unsigned)", "--trust-unsigned")
        check(words in msg, f"{mode} (unsigned): {msg!r} does not say {words!r}")
    check(t.entries(target) == [], f"entries were imported: {t.entries(target)[:3]}")
    spool = os.path.join(target, "spool")
    left = [n for n in os.listdir(spool) if n[:2] in ("p-", "d-")] if os.path.isdir(spool) else []
    check(not left, f"put files were written: {left[:3]}")

    # The controls: the forged valid bundle, the good one, the unsigned one
    # with --trust-unsigned, all import.
    f = os.path.join(env.tmp, "valid.kcb")
    subprocess.run([forge, "valid", f, "--sign", k1], check=True)
    ok = env.store("ok")
    out = import_ok(t, ok, f, KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check("imported 2 of 2 entries" in out, f"forged valid bundle: {out!r}")
    out = import_ok(t, ok, good, KCACHE_REMOTE_TRUSTED_KEYS=trusted)
    check("imported 300 of 300 entries" in out, f"good bundle: {out!r}")
    # Into a store with entries: as puts (not tables), the bundle's
    # dictionary with them; every body inflates (verify reads them all).
    v = t.run(["--dir", ok, "verify"]).stdout.decode()
    check("checked 302 records: 0 bad" in v, f"good bundle into a store with entries: {v!r}")
    ok2 = env.store("ok2")
    out = import_ok(t, ok2, unsigned, "--trust-unsigned")
    check("imported 300 of 300 entries" in out and "unsigned" in out, f"unsigned: {out!r}")
    check(len(t.entries(ok2)) == 300, "unsigned import: entries missing")

    # Bodies as the store keeps them ('S' entries): the forged control
    # imports; one whose frame does not inflate to its header is refused by
    # a dry run (which inflates every body), taken by an import (which
    # checks each against its digest and its frame's stated size only) and
    # never served: verify finds it bad and purges it, leaving the other.
    for mode in ("stored-valid", "layout3-valid"):
        f = os.path.join(env.tmp, mode + ".kcb")
        subprocess.run([forge, mode, f], check=True)
        sv = env.store(mode)
        out = import_ok(t, sv, f, "--trust-unsigned")
        check("imported 2 of 2 entries" in out, f"forged {mode} bundle: {out!r}")
        v = t.run(["--dir", sv, "verify"]).stdout.decode()
        check("checked 2 records: 0 bad" in v, f"{mode}: verify: {v!r}")
    f = os.path.join(env.tmp, "stored-garbage.kcb")
    subprocess.run([forge, "stored-garbage", f], check=True)
    sg = env.store("stored-garbage")
    msg = refused(t, sg, f, "stored-garbage (dry run)", "--trust-unsigned", "--dry-run")
    check("does not inflate to the one its header describes" in msg,
          f"stored-garbage (dry run): {msg!r}")
    out = import_ok(t, sg, f, "--trust-unsigned")
    check("imported 2 of 2 entries" in out, f"stored-garbage: {out!r}")
    v = t.run(["--dir", sg, "verify"]).stdout.decode()
    check("1 bad" in v and "1 purged" in v, f"stored-garbage: verify: {v!r}")
    check(len(t.entries(sg)) == 1, f"stored-garbage: entries left: {t.entries(sg)}")


def patched_shim(env):
    """A copy of the shim with another GNU build-id: to kcache, another build."""
    src = os.environ["KCACHE_SHIM"]
    notes = subprocess.run(["readelf", "-n", src], stdout=subprocess.PIPE, check=True).stdout
    m = re.search(rb"Build ID: ([0-9a-f]+)", notes)
    check(m, "the shim has no GNU build-id")
    old = bytes.fromhex(m.group(1).decode())
    with open(src, "rb") as f:
        data = f.read()
    check(data.count(old) == 1, "the build-id bytes are not unique in the shim")
    new = bytes(b ^ 0x5a for b in old)
    d = os.path.join(env.tmp, "rebuilt")
    os.makedirs(d)
    dst = os.path.join(d, "libkcache.so")
    with open(dst, "wb") as f:
        f.write(data.replace(old, new))
    os.chmod(dst, 0o755)
    notes = subprocess.run(["readelf", "-n", dst], stdout=subprocess.PIPE, check=True).stdout
    check(new.hex().encode() in notes, "the copy does not carry the new build-id")
    return dst


def test_upgrade(env, t, client):
    ref, a = fill(env, client, "a")
    bundle = os.path.join(env.tmp, "a.kcb")
    t.run(["--dir", a, "export", "-o", bundle])
    old_builds = set(t.builds(a, "nvrtc"))
    check(len(old_builds) == 1, f"builds in the filled store: {old_builds}")

    b = env.store("b")
    import_ok(t, b, bundle, "--trust-unsigned")
    shim2 = patched_shim(env)
    env.shim = shim2
    store_lib = os.path.join(os.environ["KCACHE_BUILD"], "store", "db", "libkcache-store.so")
    up = env.run("rebuilt shim on the imported store", client, store=b, KCACHE_STATS=1,
                 KCACHE_STORE_LIB=store_lib, KCACHE_TOOL=TOOL)
    same_dump(ref, up)
    same_streams(ref, up, strip_stats=True)
    hits, misses, passthrough, stores, errors = up.stats()
    check(hits == up.cacheable and misses <= up.uncached and errors == 0,
          f"rebuilt shim: hits={hits} misses={misses} errors={errors}, expected "
          f"{up.cacheable} hits (take_by_source)")
    # Hits on entries moved from the earlier build save their compile time
    # as hits of entries compiled here do (the bundle carries it).
    saved = float(re.search(rb"nvrtc hits=\d+ .*? saved=([0-9.]+)s", up.stderr).group(1))
    check(saved > 0, f"rebuilt shim: {hits} hits saved {saved} s")
    # The entries moved to the new build (drained by a tool session first).
    t.run(["--dir", b, "gc"])
    new_builds = set(t.builds(b, "nvrtc"))
    check(new_builds and not (new_builds & old_builds),
          f"builds after the rebuilt run: {new_builds}, before {old_builds}")
    # The moved entries serve the new build directly.
    again = env.run("rebuilt shim, second run", client, store=b, KCACHE_STATS=1,
                    KCACHE_STORE_LIB=store_lib, KCACHE_TOOL=TOOL)
    expect_warm(again)
    saved = float(re.search(rb"nvrtc hits=\d+ .*? saved=([0-9.]+)s", again.stderr).group(1))
    check(saved > 0, f"rebuilt shim, second run: the moved entries save {saved} s")


def test_select(env, t, populate):
    a = env.store("a")
    subprocess.run([populate, a, "400", "--drain"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(t.base))
    keys = {}
    for line in t.entries(a):
        f = line.split()
        keys[f[0]] = f
    check(len(keys) == 400, f"{len(keys)} entries")
    out = os.path.join(env.tmp, "ns.kcb")
    t.run(["--dir", a, "export", "-o", out, "--namespace", "jit-*"])
    b = env.store("b")
    import_ok(t, b, out, "--trust-unsigned")
    got = t.entries(b)
    check(len(got) == 200 and all(l.split()[1] == "jit-test" for l in got),
          f"--namespace jit-*: {len(got)} entries, namespaces "
          f"{sorted(set(l.split()[1] for l in got))}")
    # 400 bodies drained: the store trained a dictionary, its bundle carries
    # it, and every imported body inflates with it (verify reads them all).
    v = t.run(["--dir", b, "verify"]).stdout.decode()
    check("checked 200 records: 0 bad" in v, f"--namespace jit-*: verify: {v!r}")
    # Patterns are ORed.
    t.run(["--dir", a, "export", "-o", out, "--namespace", "nomatch", "--namespace", "nvrtc-t?st"])
    show = t.run(["bundle", "show", out]).stdout.decode()
    check("200 entries" in show and "nvrtc-test" in show and "jit-test" not in show,
          f"two patterns: {show!r}")

    # --max-size: at most the size, and the most recently used entries.
    # Entries created later are "used" later: kc-populate numbers them in
    # order, so the cut keeps the highest-numbered ones.
    full = os.path.join(env.tmp, "full.kcb")
    t.run(["--dir", a, "export", "-o", full, "--compress", "none"])
    full_size = os.path.getsize(full)
    for cap in (full_size // 2, full_size // 5, 5000, full_size + 1000):
        t.run(["--dir", a, "export", "-o", out, "--compress", "none", "--max-size", str(cap)])
        size = os.path.getsize(out)
        check(size <= cap, f"--max-size {cap}: the bundle is {size} bytes")
        c = env.store(f"cap{cap}")
        import_ok(t, c, out, "--trust-unsigned")
        kept = t.entries(c)
        if cap >= full_size:
            check(len(kept) == 400, f"--max-size {cap} (more than all): {len(kept)} entries")
            continue
        check(0 < len(kept) < 400 or cap == 5000, f"--max-size {cap}: {len(kept)} entries")
        # The kept ones are exactly the most recently used: order every entry
        # by (last use, key) and check the kept set is a prefix.
        kept_keys = set(l.split()[0] for l in kept)
        created = sorted(keys, key=lambda k: int(k[-4:], 16))  # kc-populate: id.lo = 0x1000 + i
        newest = created[::-1][:len(kept_keys)]
        check(set(newest) == kept_keys,
              f"--max-size {cap}: kept {len(kept_keys)} entries, not the newest ones")
        # Nearly full: the next entry would not have fitted.
        if kept_keys:
            check(size > cap - 2 * (1000 + 37 * 400 + 400), f"--max-size {cap}: only {size} bytes")
    p = t.run(["--dir", a, "export", "-o", out, "--max-size", "100"], check_rc=1)
    check(b"smaller than an empty bundle" in p.stderr, f"tiny --max-size: {p.stderr!r}")

    # --hit-since: every entry was used within 1000 days, none within the
    # last 0 s... (a time in the future of every entry: 1 s after a pause).
    t.run(["--dir", a, "export", "-o", out, "--hit-since", "1000d"])
    show = t.run(["bundle", "show", out]).stdout.decode()
    check("400 entries" in show, f"--hit-since 1000d: {show!r}")
    time.sleep(1.1)
    t.run(["--dir", a, "export", "-o", out, "--hit-since", "1s"])
    show = t.run(["bundle", "show", out]).stdout.decode()
    check("\n0 entries" in show, f"--hit-since 1s: {show!r}")
    p = t.run(["--dir", a, "export", "-o", out, "--hit-since", "soon"], check_rc=2)

    # --only-usable: the test namespaces are no shim's: usability unknown,
    # imported; a bundle of a foreign NVRTC namespace is skipped.
    b2 = env.store("b2")
    out2 = import_ok(t, b2, full, "--trust-unsigned", "--only-usable")
    check("imported 400 of 400" in out2, f"--only-usable, unknown namespaces: {out2!r}")

    # bundle show of things that are not bundles.
    junk = os.path.join(env.tmp, "junk")
    with open(junk, "wb") as f:
        f.write(b"#!/bin/sh\necho not a bundle\n")
    p = t.run(["bundle", "show", junk], check_rc=1)
    check(b"not a kcache bundle" in p.stderr, f"show junk: {p.stderr!r}")
    with open(full, "rb") as f:
        data = bytearray(f.read())
    layout = data[8]
    data[8] = 9  # layout version 9
    with open(junk, "wb") as f:
        f.write(bytes(data))
    p = t.run(["bundle", "show", junk], check_rc=1)
    check(b"layout version 9" in p.stderr, f"show foreign layout: {p.stderr!r}")
    data[8] = layout
    record_format = data[10]
    data[10] = 7  # record format 7
    with open(junk, "wb") as f:
        f.write(bytes(data))
    msg = refused(t, env.store("x"), junk, "foreign record format", "--trust-unsigned")
    check("format 7" in msg, f"foreign format: {msg!r}")
    with open(junk, "wb") as f:
        f.write(bytes(data[:len(data) // 2]))
    data[10] = record_format
    with open(junk, "wb") as f:
        f.write(bytes(data[:len(data) // 2]))
    show = t.run(["bundle", "show", junk]).stdout.decode()
    check("trailer: missing or damaged" in show, f"show truncated: {show!r}")


def test_special(env, t, populate):
    a = env.store("a")
    subprocess.run([populate, a, "20", "--drain"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(t.base))
    d = os.path.join(env.tmp, "special")
    os.makedirs(d)

    def one_error(p, what, words):
        lines = p.stderr.decode(errors="replace").splitlines()
        errs = [l for l in lines if l.startswith("kcache: error: ")]
        check(p.returncode == 1 and len(errs) == 1 and words in errs[0],
              f"{what}: exit {p.returncode}, stderr {p.stderr!r} (expected one error "
              f"line saying {words!r})")

    # A FIFO: written in place, its reader gets the bundle.
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    proc = subprocess.Popen([TOOL, "--dir", a, "export", "-o", fifo], env=t.base,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got, end = b"", time.monotonic() + 60
    while time.monotonic() < end:
        import select
        r, _, _ = select.select([rfd], [], [], 0.1)
        if r:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None and time.monotonic() > end - 58:
            break
    os.close(rfd)
    out, err = proc.communicate(timeout=60)
    check(proc.returncode == 0, f"export -o FIFO: exit {proc.returncode}: {err!r}")
    check(stat.S_ISFIFO(os.lstat(fifo).st_mode), "export -o FIFO replaced the FIFO")
    check(got[:8] == b"KCBUNDLE" and got[-8:] == b"KCBUNEND",
          f"export -o FIFO: the reader got {len(got)} bytes, not a bundle")
    # A character device: written in place. Our own node with /dev/full's
    # numbers (never /dev/full itself: code that replaces the target would
    # replace this copy), so the write fails with ENOSPC.
    if os.geteuid() == 0:
        node = os.path.join(d, "full")
        try:
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        except OSError as e:
            print(f"  (no device node: {e}; that case is not checked)", flush=True)
            node = None
        if node:
            p = t.run(["--dir", a, "export", "-o", node], check_rc=None)
            st = os.lstat(node)
            check(stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 7),
                  "export -o DEVICE replaced the device node")
            one_error(p, "export -o a full device", "No space left on device")
    else:
        print("  (not root: no device node made; that case is not checked)", flush=True)
    # Standard output on /dev/full: written in place, ENOSPC reported.
    with open("/dev/full", "wb") as full:
        p = subprocess.run([TOOL, "--dir", a, "export", "-o", "-"], env=t.base, stdout=full,
                           stderr=subprocess.PIPE, timeout=120)
    one_error(p, "export -o - onto /dev/full", "No space left on device")
    # The summary onto a full standard output: an error too.
    with open("/dev/full", "wb") as full:
        p = subprocess.run([TOOL, "--dir", a, "export", "-o", os.path.join(d, "x.kcb")],
                           env=t.base, stdout=full, stderr=subprocess.PIPE, timeout=120)
    one_error(p, "export's summary onto /dev/full", "No space left on device")

    # A symbolic link: its target replaced, the link kept.
    target = os.path.join(d, "target.kcb")
    with open(target, "w") as f:
        f.write("old\n")
    link = os.path.join(d, "link.kcb")
    os.symlink("target.kcb", link)
    t.run(["--dir", a, "export", "-o", link])
    check(os.path.islink(link) and os.readlink(link) == "target.kcb",
          "export -o LINK replaced the link")
    with open(target, "rb") as f:
        check(f.read(8) == b"KCBUNDLE", "export -o LINK did not write the link's target")
    dangling = os.path.join(d, "dangling")
    os.symlink("nowhere/at/all", dangling)
    p = t.run(["--dir", a, "export", "-o", dangling], check_rc=None)
    one_error(p, "export -o a dangling link", "symbolic link")
    check(os.path.islink(dangling), "export -o a dangling link replaced it")
    sub = os.path.join(d, "adir")
    os.mkdir(sub)
    p = t.run(["--dir", a, "export", "-o", sub], check_rc=None)
    one_error(p, "export -o DIR", "directory")
    check(os.path.isdir(sub) and os.listdir(sub) == [], "export -o DIR changed it")
    # A regular file: replaced whole, no temp file left.
    t.run(["--dir", a, "export", "-o", target])
    left = [n for n in os.listdir(d) if ".tmp-" in n]
    check(not left, f"temp files left: {left}")

    # Endless inputs: refused at the header, nothing copied past what was
    # read to check it. A file-size limit of 8 MiB (SIGXFSZ) keeps a tool
    # that copies without bound from filling the disk here.
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))

    b = env.store("endless")
    for src in ("/dev/zero", "/dev/urandom"):
        for args in (["--dir", b, "import", src, "--trust-unsigned"], ["bundle", "show", src]):
            p = subprocess.run([TOOL] + args, env=t.base, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=60, preexec_fn=limited)
            one_error(p, " ".join(args), "not a kcache bundle")
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        p = subprocess.run([TOOL, "--dir", b, "import", "-", "--trust-unsigned"], env=t.base,
                           stdin=yes.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60, preexec_fn=limited)
    finally:
        yes.kill()
        yes.wait()
    one_error(p, "import of an endless pipe", "not a kcache bundle")
    check(t.entries(b) == [], "an endless input imported entries")

    # A FIFO nothing writes to: import and bundle show return (bounded),
    # one line each; one whose writer comes later is read.
    lonely = os.path.join(d, "lonely")
    os.mkfifo(lonely)
    procs = [subprocess.Popen([TOOL] + args, env=t.base, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for args in (["--dir", b, "import", lonely], ["bundle", "show", lonely])]
    for pr, what in zip(procs, ("import", "bundle show")):
        try:
            out, err = pr.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise Failure(f"{what} of a FIFO with no writer hung")
        pr.stderr = err
        one_error(pr, f"{what} of a FIFO with no writer", "nothing writes to")
    later = subprocess.Popen(["sh", "-c", 'sleep 1; exec "$0" --dir "$1" export -o "$2"',
                              TOOL, a, lonely], env=t.base, stdout=subprocess.DEVNULL)
    out = import_ok(t, b, lonely, "--trust-unsigned")
    later.wait(timeout=60)
    check("imported 20 of 20 entries" in out, f"import of a FIFO written later: {out!r}")


EVIL = b"nvrtc-test\nsigned by key 0123456789abcdef (a trusted key)\x1b[2K\r\x9b1m"


def cpu_run(t, args, limit, what):
    """Runs the tool; checks it exits 0 within `limit` s of CPU time (user +
    system: a bound on its work, whatever else the machine runs)."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = t.run(args)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"  {what}: {cpu:.2f} s CPU", flush=True)
    check(cpu <= limit, f"{what}: {cpu:.2f} s of CPU time, the bound is {limit} s")
    return p


def test_names(env, t, forge):
    def clean(what, data):
        check(not re.search(rb"[\x00-\x09\x0b-\x1f\x7f-\x9f]", data),
              f"{what}: a control byte is printed: {data[:400]!r}")
        check(not re.search(rb"^signed by key 0123456789abcdef", data, re.M),
              f"{what}: the name forged a signer line: {data[:400]!r}")

    evil = os.path.join(env.tmp, "evil.kcb")
    subprocess.run([forge, "evil-name", evil], check=True)
    shown = br"nvrtc-test\x0asigned by key 0123456789abcdef (a trusted key)\x1b[2K\x0d\x9b1m"
    p = t.run(["bundle", "show", evil])
    clean("bundle show", p.stdout)
    check(shown in p.stdout, f"bundle show does not show the name escaped: {p.stdout!r}")
    b = env.store("evil")
    p = t.run(["--dir", b, "import", evil, "--trust-unsigned"])
    clean("import", p.stdout)
    check(shown in p.stdout, f"import does not show the name escaped: {p.stdout!r}")
    p = t.run(["--dir", b, "ls"])
    clean("ls", p.stdout)
    lines = p.stdout.splitlines()
    check(len(lines) == 2 and all(shown in l for l in lines), f"ls: {p.stdout!r}")
    p = t.run(["--dir", b, "show", lines[0].split()[0].decode()])
    clean("show", p.stdout)
    check(b"Namespace:    " + shown + b"\n" in p.stdout, f"show: {p.stdout!r}")
    p = t.run(["--dir", b, "stats"])
    clean("stats", p.stdout)
    check(shown in p.stdout, f"stats: {p.stdout!r}")
    p = t.run(["--dir", b, "stats", "--json"])
    clean("stats --json", p.stdout)
    import json
    d = json.loads(p.stdout)
    check([n["name"] for n in d["namespaces"]] == [EVIL.decode("latin-1")],
          f"stats --json: namespaces {d['namespaces']}")

    # 65,536 namespaces: every check of them linear (or n log n).
    many = os.path.join(env.tmp, "many.kcb")
    subprocess.run([forge, "many-ns", many], check=True)
    check(os.path.getsize(many) > 9_000_000, f"many-ns: {os.path.getsize(many)} bytes")
    p = cpu_run(t, ["bundle", "show", many], 3.0, "bundle show of 65,536 namespaces")
    check(p.stdout.count(b"\n  kcache-test-") == 65536, "bundle show: not every namespace listed")
    c = env.store("many")
    cpu_run(t, ["--dir", c, "import", many, "--trust-unsigned"], 10.0,
            "import of 65,536 namespaces")
    p = cpu_run(t, ["--dir", c, "stats"], 3.0, "stats of a store of 65,536 namespaces")
    check(re.search(rb"^Entries: +65536", p.stdout, re.M), f"stats: {p.stdout[:300]!r}")


def hot_names(store):
    d = os.path.join(store, "hot")
    if not os.path.isdir(d):
        return []
    return [n for n in os.listdir(d) if re.fullmatch(r"[0-9a-f]{32}", n)]


def test_killed(env, t, populate):
    a = env.store("a")
    subprocess.run([populate, a, "1500", "--drain"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(t.base))
    bundle = os.path.join(env.tmp, "a.kcb")
    t.run(["--dir", a, "export", "-o", bundle])
    # Killed as soon as the import's first hot file (under any name) is
    # there, and a few ms later: while the tables are being written.
    caught = 0
    for i, delay in enumerate((0, 0, 0.005, 0.01, 0.02, 0.04)):
        s = env.store(f"killed{i}")
        hot = os.path.join(s, "hot")
        p = subprocess.Popen([TOOL, "--dir", s, "import", bundle, "--trust-unsigned"],
                             env=t.base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < end:
            try:
                if any(not n.startswith("t-") for n in os.listdir(hot)):
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.0005)
        time.sleep(delay)
        p.kill()
        p.wait()
        n = len(t.entries(s))
        names = hot_names(s)
        caught += n == 0 and p.returncode == -9
        check(n > 0 or names == [],
              f"kill -9 {delay * 1000:.0f} ms after the import's first hot file: "
              f"{len(names)} hot files, no entry in the database")
        v = t.run(["--dir", s, "verify"]).stdout.decode()
        check(" 0 bad spool files removed" in v, f"verify after the kill: {v!r}")
    print(f"  {caught} of 6 kills before the tables were in", flush=True)
    check(caught > 0, "no kill landed before the tables were in: the check did not run")


def test_usable(env, t):
    """JIT namespaces on the stand-in driver: the tool tells this machine's
    devices (as the shim names them) from others, and --only-usable skips
    the others."""
    standin = os.environ.get("KCACHE_TEST_STANDIN_DIR")
    client = os.environ.get("KCACHE_TEST_DRVCLIENT")
    data = os.environ.get("KCACHE_TEST_DRIVER_DATA")
    check(standin and client and data, "the stand-in driver's paths are not set")
    ptx = os.path.join(data, "k.ptx")
    a = env.store("a")
    ld = standin + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH")
                    else "")
    for cc in ("9.0", "8.0"):
        e = dict(t.base, LD_PRELOAD=os.environ["KCACHE_SHIM"], LD_LIBRARY_PATH=ld,
                 KCACHE_DIR=a, KCACHE_STATS="1", KCACHE_TEST_STANDIN_CC=cc, KCACHE_TOOL=TOOL)
        p = subprocess.run([client, "load", ptx, "data", "0", "add1"], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        check(p.returncode == 0 and b"stores=1" in p.stderr,
              f"drvclient on a {cc} device: {p.returncode} {p.stderr[-500:]!r}")
    bundle = os.path.join(env.tmp, "jit.kcb")
    t.run(["--dir", a, "export", "-o", bundle])

    def usable(**kv):
        show = t.run(["bundle", "show", bundle], **kv).stdout.decode()
        return dict(re.findall(r"^  (jit:\S+)\n.*; (usable here|not usable here)$", show, re.M))

    here = usable(LD_LIBRARY_PATH=ld)
    check(len(here) == 2 and sorted(here.values()) == ["not usable here", "usable here"],
          f"two JIT namespaces, one usable on the 9.0 stand-in: {here}")
    there = usable(LD_LIBRARY_PATH=ld, KCACHE_TEST_STANDIN_CC="8.0")
    check(all(there[n] != here[n] for n in here), f"on an 8.0 device the other one: {there}")
    # No driver on this machine (the stand-in not on the path): none usable,
    # unless this machine has a real one.
    if subprocess.run(["sh", "-c", "ldconfig -p | grep -q libcuda.so.1"]).returncode != 0:
        rest = ":".join(d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
                        if d and os.path.realpath(d) != os.path.realpath(standin))
        none = usable(LD_LIBRARY_PATH=rest)
        check(set(none.values()) == {"not usable here"}, f"no driver: {none}")
    b = env.store("b")
    out = import_ok(t, b, bundle, "--trust-unsigned", "--only-usable", LD_LIBRARY_PATH=ld)
    check("imported 1 of 2 entries" in out and "1 skipped as not usable here" in out,
          f"--only-usable: {out!r}")
    kept = [l.split()[1] for l in t.entries(b)]
    mine = [n for n, u in here.items() if u == "usable here"]
    check(kept == mine, f"--only-usable kept {kept}, this device's is {mine}")
    # Without --only-usable both go in (harmless: another GPU's entries are
    # never served here).
    c = env.store("c")
    out = import_ok(t, c, bundle, "--trust-unsigned", LD_LIBRARY_PATH=ld)
    check("imported 2 of 2 entries" in out, f"import of both: {out!r}")


def test_run(env, t, populate):
    src = os.environ["KCACHE_SRC"]
    run = os.path.join(os.environ["KCACHE_BUILD"], "scripts", "kcache-run")
    a = env.store("a")
    subprocess.run([populate, a, "20", "--drain"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(t.base))
    bundle = os.path.join(env.tmp, "a.kcb")
    t.run(["--dir", a, "export", "-o", bundle])
    b = env.store("b")
    e = dict(t.base, KCACHE_DIR=b)
    p = subprocess.run([run, "--import", bundle, "--", "sh", "-c", "echo started"], env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    # Unsigned and no --trust-unsigned: refused with the tool's line, the
    # command runs all the same.
    check(p.returncode == 0 and p.stdout == b"started\n",
          f"kcache-run --import (refused): {p.returncode} {p.stdout!r} {p.stderr!r}")
    check(b"refused" in p.stderr and b"unsigned" in p.stderr,
          f"kcache-run --import (refused): {p.stderr!r}")
    check(t.entries(b) == [], "kcache-run --import imported a refused bundle")
    k1 = t.keygen("k1")
    t.run(["--dir", a, "export", "-o", bundle], KCACHE_REMOTE_SIGNING_KEY=k1)
    e["KCACHE_REMOTE_TRUSTED_KEYS"] = t.trusted(k1)
    p = subprocess.run([run, "--import", bundle, "--dir", b, "--", "sh", "-c", "echo started"],
                       env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(p.returncode == 0 and p.stdout == b"started\n",
          f"kcache-run --import: {p.returncode} {p.stdout!r} {p.stderr!r}")
    check(len(t.entries(b)) == 20, f"kcache-run --import: {len(t.entries(b))} entries")
    check(b"imported 20 of 20" in p.stderr, f"kcache-run --import: summary {p.stderr!r}")
    p = subprocess.run([run, "--import"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    check(p.returncode == 2, f"kcache-run --import without FILE: {p.returncode}")


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    test, client, forge, populate = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="kcache-bundle-")
    keep = os.environ.get("KCACHE_TEST_KEEP")
    try:
        env = Env(tmp)
        t = Tools(tmp, env)
        if test == "roundtrip":
            test_roundtrip(env, t, client)
        elif test == "hostile":
            test_hostile(env, t, forge, populate)
        elif test == "upgrade":
            test_upgrade(env, t, client)
        elif test == "select":
            test_select(env, t, populate)
        elif test == "run":
            test_run(env, t, populate)
        elif test == "usable":
            test_usable(env, t)
        elif test == "special":
            test_special(env, t, populate)
        elif test == "names":
            test_names(env, t, forge)
        elif test == "killed":
            test_killed(env, t, populate)
        else:
            print(f"unknown test {test}", file=sys.stderr)
            return 2
    except Failure as e:
        print(f"FAIL {test}: {e}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:
        print(f"FAIL {test}: timed out: {e}", file=sys.stderr)
        return 1
    finally:
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            rm_settled(tmp)
    print(f"PASS {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
