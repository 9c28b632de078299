#!/usr/bin/env python3
"""Works in a CUDA user's usual environment (suite env): the version
matrix's NVRTC and nvJitLink clients (each built for one release and meant
to load that release's library), scripts/demo (its hits and misses),
scripts/bench --quick (every section, the same goals; clean and the
toolkit's LD_LIBRARY_PATH and PATH only: two minutes a run) and `kcache
config`, run under the environments NVIDIA's installation
guide and pip give users -- LD_LIBRARY_PATH naming the toolkit's lib64 and
PATH its bin, CUDA_HOME/CUDA_PATH naming another toolkit, LD_LIBRARY_PATH
naming the pip wheels' nvidia/*/lib directories, LD_LIBRARY_PATH empty --
must give what they give in a clean environment.

Usage: test_env.py
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ["KCACHE_SRC"]
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def environments():
    base = {k: v for k, v in os.environ.items()
            if k not in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "LD_PRELOAD")}
    wheels = sorted(glob.glob(os.path.join(SRC, ".venv-wheels", "*", "nvidia", "*", "lib")))
    other = sorted(glob.glob(os.path.join(SRC, ".venv-wheels", "nvrtc-12.9", "nvidia", "cuda_nvrtc")))
    envs = {
        "clean": dict(base),
        "toolkit LD_LIBRARY_PATH and PATH": dict(
            base, LD_LIBRARY_PATH="/usr/local/cuda/lib64",
            PATH="/usr/local/cuda/bin:" + base.get("PATH", "/usr/bin:/bin")),
        "CUDA_HOME/CUDA_PATH another toolkit": dict(
            base, CUDA_HOME=other[0] if other else "/nonexistent",
            CUDA_PATH=other[0] if other else "/nonexistent"),
        "LD_LIBRARY_PATH the wheels' lib directories": dict(
            base, LD_LIBRARY_PATH=":".join(wheels)),
        "LD_LIBRARY_PATH empty": dict(base, LD_LIBRARY_PATH=""),
    }
    check(len(wheels) >= 4, "the wheels are installed (scripts/setup-wheels): %d lib dirs"
          % len(wheels))
    return envs


def verdict(out):
    """What a run says, without its timings: ok/FAIL lines and PASS."""
    keep = []
    for line in out.splitlines():
        if line.startswith(("ok:", "FAIL:", "PASS")):
            keep.append(line.split(" (")[0])
    return keep


def demo_counts(out):
    """The demo's two stats lines: each backend's hits, misses, stores."""
    runs = []
    for line in out.splitlines():
        if "kcache: stats:" in line:
            runs.append(re.findall(r"(\w+) hits=(\d+) misses=(\d+) passthrough=(\d+) stores=(\d+)",
                                   line))
    return runs


def bench_goals(env, out):
    """scripts/bench --quick's sections and goal names (not its timings)."""
    build = os.environ.get("KCACHE_BUILD", os.path.join(SRC, "build"))
    p = subprocess.run([os.path.join(SRC, "scripts", "bench"), "--quick", "--build", build,
                        "--out", out], capture_output=True, text=True, timeout=1200, env=env)
    res = {}
    try:
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
    except (OSError, ValueError):
        pass
    goals = []
    for sec, body in sorted(res.items()):
        if isinstance(body, dict):
            goals += ["%s.%s" % (sec, g) for g in sorted((body.get("goals") or {}))]
    return p, goals


def main():
    envs = environments()
    # The demo in each environment: the same hits and misses as a clean run.
    demo = {}
    for name, env in envs.items():
        p = subprocess.run([os.path.join(SRC, "scripts", "demo")], capture_output=True, text=True,
                           timeout=900, env=env)
        demo[name] = demo_counts(p.stdout + p.stderr)
        check(p.returncode == 0 and len(demo[name]) == 2,
              "%s: scripts/demo runs, cold then warm (%s)"
              % (name, (p.stdout + p.stderr)[-300:].replace("\n", " | ")))
        if name != "clean":
            check(demo[name] == demo["clean"], "%s: the demo counts what it counts in a clean "
                  "environment (%s)" % (name, demo[name]))
    # scripts/bench --quick in the toolkit's environment: every section
    # completes and states the goals a clean run states.
    tmp = tempfile.mkdtemp(prefix="kc-env-bench-")
    try:
        goals = {}
        for name in ("clean", "toolkit LD_LIBRARY_PATH and PATH"):
            p, goals[name] = bench_goals(envs[name], os.path.join(tmp, str(len(goals))))
            check(p.returncode == 0 and "Traceback" not in p.stderr and goals[name],
                  "%s: scripts/bench --quick completes (%d goals; %s)"
                  % (name, len(goals[name]), p.stderr[-300:].replace("\n", " | ")))
        check(goals["toolkit LD_LIBRARY_PATH and PATH"] == goals["clean"],
              "toolkit LD_LIBRARY_PATH and PATH: scripts/bench --quick states the clean run's goals "
              "(%s)" % sorted(set(goals["clean"]) ^ set(goals["toolkit LD_LIBRARY_PATH and PATH"])))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ver = os.path.join(SRC, "tests", "versions", "test_versions.py")
    results = {}
    for name, env in envs.items():
        for t in ("nvrtc", "link"):
            p = subprocess.run([sys.executable, ver, t], capture_output=True, text=True,
                               timeout=900, env=env)
            results[(name, t)] = (p.returncode, verdict(p.stdout))
            check(p.returncode == 0, "%s: versions-%s passes (%s)" % (
                name, t, (p.stdout + p.stderr)[-400:].replace("\n", " | ")))
            if name != "clean":
                check(results[(name, t)] == results[("clean", t)],
                      "%s: versions-%s says what it says in a clean environment" % (name, t))
        tool = os.environ["KCACHE_TOOL"]
        p = subprocess.run([tool, "config"], capture_output=True, text=True, timeout=60, env=env)
        check(p.returncode == 0 and "KCACHE_DIR" in p.stdout,
              "%s: kcache config runs (%s)" % (name, p.stderr[-200:]))
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
