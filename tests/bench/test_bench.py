#!/usr/bin/env python3
"""bench-quick (suite bench): `scripts/bench --quick` runs to the end and its
results.json holds every field of every section. Asserts nothing about a
timing: values may be anything, and a section that could not run says why.
Exits 77 (skip) without the project venv, as the client tests do.
"""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("KCACHE_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.environ.get("KCACHE_BUILD") or os.path.join(SRC, "build")

GOAL = ("value", "goal", "met")
# section -> (top-level fields, per-row fields of its list, the list's name, goals)
SCHEMA = {
    "nvrtc": (("kernels", "kcache_over_core_unchecked_median",
               "kcache_over_core_with_load_median", "goals"),
              ("kernel", "headers_from_disk", "cold_ms", "kcache_hit_fresh_ms",
               "kcache_hit_inproc_p50_us", "kcache_hit_inproc_p99_us", "core_hit_fresh_ms",
               "core_hit_inproc_p50_us", "core_cache", "kcache_over_core_fresh",
               "core_unchecked_cache", "core_unchecked_hit_fresh_ms",
               "kcache_over_core_unchecked_fresh", "kcache_hit_fresh_with_load_ms",
               "core_hit_fresh_with_load_ms", "kcache_over_core_fresh_with_load",
               "hit_over_compile"), "kernels",
              ("cudastd_hit_over_compile", "headerfree_hit_p50_us", "kcache_hit_vs_core")),
    "store": (("sizes", "skipped", "free_disk_bytes", "corpus", "goals"),
              ("entries", "get_p50_us", "get_p99_us", "raw_bytes", "disk_bytes",
               "disk_over_raw", "db_bytes", "hot_bytes", "fill_s", "cached_before_pct"), "sizes",
              ("p50_largest_over_smallest", "disk_over_raw")),
    "ranks": (("available", "reason", "ranks", "distinct_kernels", "single", "single_flight_on",
               "single_flight_off", "goals"), (), None,
              ("compiles_equal_distinct", "wall_over_single")),
    "preload": (("commands", "resolve", "goals"), ("command", "plain_ms", "preload_ms", "ratio"),
                "commands", ("median_ratio",)),
    "driver": (("kernels", "memo", "goals"),
               ("kernel", "passthrough_ms", "cold_ms", "hit_ms", "hit_over_cold"), "kernels",
               ("get_function_hit_ns", "mem_alloc_hit_ns")),
    "miss": (("kernels", "plain_ms", "miss_ms", "ratio", "process_ratio", "goals"),
             ("kernel", "plain_ms", "miss_ms", "ratio"), "kernels", ("ratio",)),
    "remote": (("available", "reason", "nodes", "ranks_per_node", "distinct_kernels", "single",
                "cluster_local", "cluster_remote", "fresh_node", "miss", "down", "goals"),
               ("kernel", "headers_from_disk", "compile_ms", "remote_hit_ms", "local_hit_ms",
                "remote_hit_over_compile", "remote_hit_over_local_hit"), "fresh_node",
               ("compiles_equal_distinct", "wall_over_single", "remote_hit_over_compile_cccl",
                "miss_over_plain", "down_delay_bounded")),
    "link": (("available", "reason", "scenarios", "reps", "goals"),
             ("scenario", "inputs", "cubin_bytes", "cold_ms", "miss_ms", "hit_fresh_ms",
              "hit_inproc_p50_us", "hit_over_cold", "miss_over_cold", "process_hit_over_cold",
              "identical", "warnings"), "scenarios", ("demo_set_hit_over_cold",)),
    "clients": (("runs", "numba", "cccl", "pycuda", "triton", "goals"),
                ("client", "state", "phase_s", "nvvm_link_hooks_s", "stats"), "runs",
                ("numba_nvvm_link", "cccl_reduce_into", "pycuda_jit_load", "triton_jit_load")),
    "versions": (("available", "reason", "reps", "nvrtc", "nvmath", "link", "nvrtc_own_cache",
                  "goals"),
                 ("release", "available", "cold_ms", "hit_fresh_ms", "hit_over_cold",
                  "identical", "warnings"), "nvrtc",
                 ("nvrtc_13.0_hit_over_cold", "nvmath_fft_warm_over_cold",
                  "hit_vs_nvrtc_own_cache")),
}
RUN_FIELDS = ("wall_s", "cpu_s", "compiles")
MEMO_FIELDS = ("get_function_hit_ns", "get_function_passthrough_ns", "mem_alloc_hit_ns",
               "mem_alloc_passthrough_ns", "mem_free_hit_ns", "mem_free_passthrough_ns")


def main():
    problems = []
    if not os.access(os.path.join(SRC, ".venv", "bin", "python"), os.X_OK):
        print("SKIP: no project venv (scripts/setup-venv); scripts/bench needs cuda.core")
        return 77
    with tempfile.TemporaryDirectory(prefix="kc-bench-test-") as out:
        cmd = [sys.executable, os.path.join(SRC, "scripts", "bench"), "--quick",
               "--build", BUILD, "--out", out]
        print("running:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd)
        if r.returncode != 0:
            print(f"FAIL: scripts/bench --quick exited {r.returncode}")
            return 1
        path = os.path.join(out, "results.json")
        with open(path) as f:
            res = json.load(f)
        pngs = [n for n in os.listdir(out) if n.endswith(".png")]
        if not pngs:
            problems.append("no PNG plot beside results.json")
    for key in ("meta",) + tuple(SCHEMA):
        if key not in res:
            problems.append(f"missing section {key}")
    for sec, (top, row, listname, goals) in SCHEMA.items():
        s = res.get(sec, {})
        for k in top:
            if k not in s:
                problems.append(f"{sec}.{k} missing")
        if listname:
            rows = s.get(listname) or []
            if not rows:
                problems.append(f"{sec}.{listname} is empty")
            for i, rw in enumerate(rows):
                for k in row:
                    if k not in rw:
                        problems.append(f"{sec}.{listname}[{i}].{k} missing")
        for g in goals:
            gv = s.get("goals", {}).get(g)
            if not isinstance(gv, dict) or any(k not in gv for k in GOAL):
                problems.append(f"{sec}.goals.{g} missing or incomplete")
    ranks = res.get("ranks", {})
    for run in ("single", "single_flight_on", "single_flight_off"):
        for k in RUN_FIELDS:
            if k not in (ranks.get(run) or {}):
                problems.append(f"ranks.{run}.{k} missing")
    if not ranks.get("available") and not ranks.get("reason"):
        problems.append("ranks unavailable without a reason")
    remote = res.get("remote", {})
    if remote.get("available"):
        for run in ("single", "cluster_local", "cluster_remote"):
            for k in RUN_FIELDS:
                if k not in (remote.get(run) or {}):
                    problems.append(f"remote.{run}.{k} missing")
        for k in ("refused_delay_ms", "hung_delay_ms"):
            if not isinstance(remote.get("down", {}).get(k), (int, float)):
                problems.append(f"remote.down.{k} not a number")
        # 7e: the fault rows, each beside its run without the fault (the
        # cluster row only where the cluster formed).
        faults = remote.get("faults") or {}
        for name in ("restart", "full", "full_oom", "full_room", "loaded") + tuple(
                n for n in ("failover", "hang") if n in faults):
            for k in ("base_compiles", "fault_compiles", "base_wall_s", "fault_wall_s",
                      "wall_ratio", "base_cpu_s", "fault_cpu_s", "cpu_ratio"):
                if not isinstance((faults.get(name) or {}).get(k), (int, float)):
                    problems.append(f"remote.faults.{name}.{k} not a number")
            for k in ("timeouts", "refusals", "errors", "off"):
                if not isinstance(((faults.get(name) or {}).get("fault_remote") or {}).get(k),
                                  int):
                    problems.append(f"remote.faults.{name}.fault_remote.{k} not a number")
            if not isinstance((faults.get(name) or {}).get("compiles_goal"), int):
                problems.append(f"remote.faults.{name}.compiles_goal not a number")
        # 7f: the TLS costs through kcache's TLS object, where it was built.
        tls = remote.get("tls") or {}
        if not tls.get("reason"):
            for k in ("load_ms", "ctx_ms", "system_ctx_ms", "full_ms", "resumed_ms",
                      "plain_connect_ms", "tls_get_us", "plain_get_us"):
                if not isinstance((tls.get("costs") or {}).get(k), (int, float)):
                    problems.append(f"remote.tls.costs.{k} not a number")
            if not tls.get("kernels"):
                problems.append("remote.tls.kernels missing")
            # The emulated network link: its GETs measured, or the reason
            # it could not be made (no figure in its place).
            link = tls.get("link") or {}
            if not link.get("reason"):
                for g in link.get("gets") or [{}]:
                    for k in ("tls_get_us", "plain_get_us", "tls_over_plain"):
                        if not isinstance(g.get(k), (int, float)):
                            problems.append(f"remote.tls.link.gets.{k} not a number")
                for k in ("rtt_ms", "full_ms", "resumed_ms"):
                    if not isinstance(link.get(k), (int, float)):
                        problems.append(f"remote.tls.link.{k} not a number")
        # The failover row, where the cluster formed: a failover only when
        # each run's replica was promoted (it says how many were, and when).
        fo = faults.get("failover")
        if fo is not None:
            if not isinstance(fo.get("promoted"), int):
                problems.append("remote.faults.failover.promoted not a number")
            if not isinstance(fo.get("promotion_s"), list) or not fo.get("promotion_s"):
                problems.append("remote.faults.failover.promotion_s missing")
    elif not remote.get("reason"):
        problems.append("remote unavailable without a reason")
    link = res.get("link", {})
    if link.get("available"):
        names = [rw.get("scenario") for rw in link.get("scenarios") or []]
        if names != ["two_units", "demo_set_devrt", "devrt"]:
            problems.append(f"link.scenarios are {names}")
        for rw in link.get("scenarios") or []:
            # Not a timing: the cubin a hit returns is the one nvJitLink made.
            if rw.get("identical") is not True:
                problems.append(f"link: {rw.get('scenario')}: cubins differ between runs")
            if rw.get("warnings"):
                problems.append(f"link: {rw.get('scenario')}: {rw['warnings']}")
    elif not link.get("reason"):
        problems.append("link unavailable without a reason")
    # Section 11's links through the versioned names of nvJitLink 12.9 and
    # 13.5: each release there, or named missing with a reason.
    vlinks = res.get("versions", {}).get("link") or []
    if not vlinks:
        problems.append("versions.link is empty")
    for rw in vlinks:
        if not rw.get("available"):
            if not rw.get("reason"):
                problems.append("versions.link: a release unavailable without a reason")
            continue
        rel = rw.get("release")
        if rw.get("calls") != "__nvJitLinkComplete_" + str(rel).replace(".", "_"):
            problems.append(f"versions.link {rel}: calls {rw.get('calls')}")
        if rw.get("identical") is not True:
            problems.append(f"versions.link {rel}: cubins differ between runs")
        if rw.get("warnings"):
            problems.append(f"versions.link {rel}: {rw['warnings']}")
        for k in ("cold_ms", "hit_fresh_ms", "hit_over_cold"):
            if not isinstance(rw.get(k), (int, float)):
                problems.append(f"versions.link {rel}: {k} not a number")
        gv = res["versions"].get("goals", {}).get(f"link_{rel}_hit_over_cold")
        if not isinstance(gv, dict) or any(k not in gv for k in GOAL):
            problems.append(f"versions.goals.link_{rel}_hit_over_cold missing or incomplete")
    for k in MEMO_FIELDS:
        if k not in res.get("driver", {}).get("memo", {}):
            problems.append(f"driver.memo.{k} missing")
    # Sections that ran must have measured something.
    for sec, listname, field in (("nvrtc", "kernels", "kcache_hit_fresh_ms"),
                                 ("miss", "kernels", "miss_ms"),
                                 ("driver", "kernels", "hit_ms"),
                                 ("store", "sizes", "get_p50_us"),
                                 ("remote", "fresh_node", "remote_hit_ms"),
                                 ("link", "scenarios", "hit_fresh_ms"),
                                 ("clients", "runs", "phase_s"),
                                 ("preload", "commands", "ratio")):
        if res.get(sec, {}).get("reason"):
            continue  # could not run here (say, no hyperfine), and says why
        for rw in res.get(sec, {}).get(listname) or []:
            if not isinstance(rw.get(field), (int, float)):
                problems.append(f"{sec}: {rw.get('kernel', rw.get('entries'))}: {field} not a number")
    for p in problems:
        print("FAIL:", p)
    print(f"bench-quick: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
