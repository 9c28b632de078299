#!/usr/bin/env python3
"""Every KCACHE_* variable in one table (common/config.c), read through one
function (kc_config_get), and none of them obeyed in a secure-execution
process.

Usage: test_config_table.py SRC_ROOT KCACHE_TOOL KC_CONFIG_VARS

  1. No source file of shim/, store/, tools/ or common/ but common/config.c
     calls getenv (or secure_getenv) on a KCACHE_* name.
  2. Every KCACHE_* name those files mention is in the table
     (kc-config-vars prints it), exactly or under a prefix entry.
  3. kc_config_get answers each setting and internal variable the
     environment sets; in a set-user-ID copy of kc-config-vars run as root
     (AT_SECURE) it answers none (skipped without root or user nobody).
  4. `kcache config`: internal variables that are set are listed apart from
     the settings, harness variables not at all, and neither draws an
     "unknown variable" warning; an unknown one still does.
Exit status 0 on success, 1 on a failed check.
"""
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)


def sources(root):
    for top in ("shim", "store", "tools", "common"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    yield os.path.join(d, f)


def scan_getenv(root):
    """(path:line, text) of each getenv of a KCACHE_ name outside config.c."""
    bad = []
    pat = re.compile(r'\b(?:secure_)?getenv\s*\(\s*"KCACHE_')
    for path in sources(root):
        rel = os.path.relpath(path, root)
        if rel == os.path.join("common", "config.c"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if pat.search(line):
                    bad.append(f"{rel}:{n}: {line.strip()}")
    return bad


def mentioned(root):
    """Every KCACHE_* name the sources mention (include guards aside)."""
    names = {}
    pat = re.compile(r"\bKCACHE_[A-Z0-9_]+")
    for path in sources(root):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in pat.finditer(text):
            name = m.group(0)
            if name.endswith("_H"):
                continue
            names.setdefault(name, rel)
    return names


def run_table(tool, env=None):
    """(AT_SECURE of the process, [(name, kind, value)])."""
    p = subprocess.run([tool], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env, timeout=30)
    check(p.returncode == 0, f"kc-config-vars exited {p.returncode}: {p.stderr!r}")
    lines = p.stdout.decode().splitlines()
    secure = lines[0] == "secure 1" if lines else False
    rows = []
    for line in lines[1:]:
        name, kind, value = line.split(" ", 2)
        rows.append((name, kind, value))
    return secure, rows


def table(tool, env=None):
    return run_table(tool, env)[1]


def known(rows, name):
    for n, _, _ in rows:
        if name == n or (n.endswith("_") and name.startswith(n)):
            return True
    return False


def clean_env(**kv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env.update(kv)
    return env


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    root, kcache, dump = sys.argv[1:]

    # 1. One reader.
    bad = scan_getenv(root)
    check(bad == [], "KCACHE_* variables read outside common/config.c "
                     "(read them with kc_config_get):\n  " + "\n  ".join(bad))

    # 2. One table.
    rows = table(dump, clean_env())
    kinds = {n: k for n, k, _ in rows}
    check(len(kinds) == len(rows), "a name appears twice in the table")
    for name, where in sorted(mentioned(root).items()):
        check(known(rows, name), f"{name} (mentioned in {where}) is not in "
                                 f"kc_config_vars")
    for name in ("KCACHE_TOOL", "KCACHE_STORE_LIB", "KCACHE_OWNER_DETACH",
                 "KCACHE_OWNER_IDLE_MS"):
        check(kinds.get(name) == "internal", f"{name}: kind {kinds.get(name)}, "
                                             f"expected internal")
    check(kinds.get("KCACHE_MAXSIZE") == "setting", "KCACHE_MAXSIZE is a setting")
    check(kinds.get("KCACHE_TEST_") == "harness", "KCACHE_TEST_ is a harness prefix")

    # 3. Read through kc_config_get, and never under AT_SECURE.
    readable = [n for n, k, _ in rows if k != "harness"]
    setting = {n: "v-" + n.lower() for n in readable}
    got = {n: v for n, _, v in table(dump, clean_env(**setting))}
    for n in readable:
        check(got.get(n) == setting[n], f"kc_config_get({n}) = {got.get(n)!r}, "
                                        f"expected {setting[n]!r}")
    if os.geteuid() != 0:
        print("skip (3, secure): needs root to make a set-user-ID copy")
    else:
        try:
            nobody = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            nobody = None
            print("skip (3, secure): no user nobody")
        if nobody is not None:
            # Under the build directory, not /tmp, in case /tmp is nosuid.
            sd = tempfile.mkdtemp(prefix="config-secure-",
                                  dir=os.path.dirname(os.path.abspath(dump)))
            try:
                os.chmod(sd, 0o755)
                prog = os.path.join(sd, "kc-config-vars-suid")
                shutil.copy(dump, prog)
                os.chown(prog, nobody, -1)
                os.chmod(prog, 0o4755)
                secure, rows_s = run_table(prog, clean_env(**setting))
                sec = {n: v for n, _, v in rows_s}
                if not secure:
                    print("skip (3, secure): the set-user-ID copy did not run "
                          "in secure-execution mode")
                else:
                    for n in readable:
                        check(sec.get(n) == "(unset)",
                              f"secure-execution: kc_config_get({n}) = "
                              f"{sec.get(n)!r}, expected nothing")
                    print(f"secure-execution: {len(readable)} variables set, "
                          f"{sum(sec.get(n) == '(unset)' for n in readable)} read as unset")
            finally:
                shutil.rmtree(sd, ignore_errors=True)

    # 4. kcache config.
    home = tempfile.mkdtemp(prefix="config-table-")
    try:
        base = dict(XDG_CACHE_HOME=home)
        p = subprocess.run([kcache, "config"], env=clean_env(**base),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        plain = p.stdout.decode()
        check(p.returncode == 0 and "internal" not in plain,
              f"kcache config, nothing internal set: {plain!r}")
        p = subprocess.run([kcache, "config"],
                           env=clean_env(KCACHE_OWNER_IDLE_MS="250",
                                         KCACHE_STORE_LIB="/x/libkcache-store.so",
                                         KCACHE_TEST_ANYTHING="1",
                                         KCACHE_GPU_BUILD="/x", **base),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        out = p.stdout.decode()
        check(p.returncode == 0, f"kcache config: exit {p.returncode}")
        check("warning" not in out, f"kcache config warned about a known variable: {out!r}")
        lines = out.splitlines()
        head = [i for i, l in enumerate(lines) if l.startswith("internal")]
        check(len(head) == 1, f"kcache config: one 'internal' heading expected: {out!r}")
        if head:
            after = lines[head[0]:]
            before = lines[:head[0]]
            check(any(re.match(r"^KCACHE_OWNER_IDLE_MS +environment +250$", l) for l in after),
                  f"KCACHE_OWNER_IDLE_MS listed under internal: {out!r}")
            check(any(re.match(r"^KCACHE_STORE_LIB +environment +/x/libkcache-store.so$", l)
                      for l in after), f"KCACHE_STORE_LIB listed under internal: {out!r}")
            check(not any(l.startswith("KCACHE_OWNER_IDLE_MS") for l in before),
                  "KCACHE_OWNER_IDLE_MS listed among the settings")
            check(not any(l.startswith("KCACHE_TOOL") for l in after),
                  "KCACHE_TOOL listed although not set")
        check("KCACHE_TEST_ANYTHING" not in out and "KCACHE_GPU_BUILD" not in out,
              f"harness variables listed: {out!r}")
        p = subprocess.run([kcache, "config"], env=clean_env(KCACHE_OWNR_IDLE_MS="1", **base),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        check(re.search(r"^warning: .*KCACHE_OWNR_IDLE_MS", p.stdout.decode(), re.M),
              f"a misspelt variable still warns: {p.stdout!r}")
    finally:
        shutil.rmtree(home, ignore_errors=True)

    if failures:
        print(f"FAIL config-table: {len(failures)} failed checks", file=sys.stderr)
        return 1
    print("PASS config-table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
