#!/usr/bin/env python3
"""patchkit pipeline benchmark: prints figures, asserts nothing (tests stay deterministic).

    python bench/bench.py [--quick]

Cold figures use a fresh PATCHKIT_CACHE (sdists copied over, so downloads are excluded) and
a fresh ccache. --quick skips the two cold builds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sh(*args, env=None, cwd=None, check=True) -> float:
    t = time.monotonic()
    subprocess.run(list(args), check=check, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t


def pk(*args, env) -> float:
    """Wall time of a patchkit command; verdicts are not this script's business (exit 1 is fine).
    Always this checkout's toolkit (and its patches/), whatever `pip install -e` points at."""
    return sh(sys.executable, "-m", "toolkit", *args, env=env, cwd=ROOT, check=False)


def starts(report: Path) -> str:
    """Server starts per workload run (starts made again for their shape), from a report.json."""
    runs = [r for w in json.loads(report.read_text())["workloads"].values()
            for r in (w["base"] + w["candidate"] + ([w["control"]] if w.get("control") else []))]
    return f"{sum(r['attempts'] for r in runs)} server starts for {len(runs)} runs"


def machine() -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) // 1024 // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB, {platform.system()} {platform.release()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the cold builds")
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    home = Path(os.environ.get("PATCHKIT_CACHE", Path.home() / ".cache" / "patchkit"))
    work = Path(tempfile.mkdtemp(prefix="patchkit-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    sys.path.insert(0, str(ROOT))
    from toolkit import source

    if not args.quick:
        cold = dict(env, PATCHKIT_CACHE=str(work / "cache"), CCACHE_DIR=str(work / "ccache"))
        (work / "cache" / "sdists").mkdir(parents=True)
        for f in (home / "sdists").glob("llama_cpp_python-0.3.35*"):
            shutil.copy(f, work / "cache" / "sdists")
        tree = Path(subprocess.run([sys.executable, "-m", "toolkit", "source", "fetch"], env=cold, check=True, cwd=ROOT,
                                   capture_output=True, text=True).stdout.strip().splitlines()[-1])
        # the floor: one plain cold build of the same tree, no patchkit, no ccache
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DBUILD_SHARED_LIBS=OFF"]
        t_plain = sh("cmake", "-S", str(tree), "-B", str(work / "plain"), "-G", "Ninja", *flags)
        t_plain += sh("ninja", "-C", str(work / "plain"), "llama-server")
        rows.append(("one cold llama-server build (cmake+ninja, no ccache)", f"{t_plain:.0f} s", "the floor"))
        t_cold = pk("demo", "--report-dir", str(work / "r1"), env=cold)
        rows.append(("cold demo (downloads cached)", f"{t_cold:.0f} s",
                     f"{t_cold / t_plain:.2f} x the cold build (goal <= 1.15)"))
        t_warm = pk("demo", "--report-dir", str(work / "r2"), env=cold)
        rows.append(("second demo, warm caches", f"{t_warm:.1f} s",
                     f"{t_warm / t_cold:.1%} of cold (goal <= 10%); {starts(work / 'r2' / 'report.json')}"))
        t = json.loads((work / "r1" / "report.json").read_text())["timings_s"]
        rows.append(("  cold demo split", "", ", ".join(f"{k} {v:.1f} s" for k, v in t.items())))

    tree = source.fetch()
    repo = work / "repo"
    sh("git", "clone", "-q", str(tree.path), str(repo))
    # the parse is what apply costs: forget the layout facts (a cache) so this apply parses
    shutil.rmtree(home / "facts", ignore_errors=True)
    t_apply = pk("apply", "--repo", str(repo), env=env)
    t_apply2 = pk("apply", "--repo", str(repo), env=env)
    sh("git", "clone", "-q", str(tree.path), str(work / "repo2"))
    t_apply3 = pk("apply", "--repo", str(work / "repo2"), env=env)
    rows.append(("apply (configure on first use + parse + render + commit)", f"{t_apply:.1f} s",
                 f"goal <= 8 s; again (no-op) {t_apply2:.1f} s; another clone (facts cached) {t_apply3:.1f} s"))
    t_check = pk("check", "--repo", str(repo), env=env)
    # one compile of that TU with its own command line, for the ratio
    from toolkit import build as b
    import git
    ws = b.checkout(git.Repo(repo), "HEAD")
    cmd = ws.compile_command("tools/server/server-context.cpp")
    argv = [a for a in cmd.argv if a != "ccache"]
    argv[argv.index("-o") + 1] = str(work / "tu.o")
    t_tu = sh(*argv, cwd=cmd.directory)
    rows.append(("check (TU compile + libclang static checks)", f"{t_check:.1f} s",
                 f"{t_check / t_tu:.2f} x one TU compile of {t_tu:.1f} s (goal <= 1.5)"))

    # re-verify after editing the patch: a new comment in the template changes the rendered TU
    tpl = ROOT / "patches" / "evict-largest-slot" / "helper.cpp.j2"
    original = tpl.read_text()
    try:
        edited = original.replace("// {{ marker }} begin\n", f"// {{{{ marker }}}} begin\n// bench {time.time()}\n", 1)
        if edited == original:
            sys.exit("bench: helper.cpp.j2 has no '// {{ marker }} begin' line to edit; update bench.py")
        tpl.write_text(edited)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "toolkit", "verify", "--json", "--report-dir", str(work / "r3")],
                             env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - t0
        t = json.loads(out.stdout)["timings_s"]
        rows.append(("re-verify after editing the patch (default suite)", f"{wall:.1f} s",
                     "goal <= 45 s; split: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items())
                     + f", start-up {wall - sum(t.values()):.1f} s"))
    finally:
        tpl.write_text(original)

    # suite wall time vs slots and repeats (warm binaries)
    for name in ("overflow-4", "overflow-8"):
        t = pk("verify", "--workload", name, "--report-dir", str(work / f"s-{name}"), env=env)
        rows.append((f"verify {name} (repeat 1)", f"{t:.1f} s", ""))
    w16 = work / "overflow-16.toml"
    reqs = "".join(f"[[requests]]\nslot = {i}\nprompt_len = {40 + 10 * i}\nn_predict = 240\n" for i in range(16))
    w16.write_text('name = "overflow-16"\nsizing = "prompts 40..190 = 1840 + 16 x 240 = 5680 > 4608 -> evictions"\n'
                   '[server]\nctx = 4608\nparallel = 16\n[expect]\nbase = "all-error"\ncandidate = "one-victim"\n'
                   'integrity = false\n' + reqs)
    t = pk("verify", "--workload", str(w16), "--report-dir", str(work / "s16"), env=env)
    rows.append(("verify overflow-16 (repeat 1)", f"{t:.1f} s", "verdicts not asserted here"))
    for k in (1, 3, 5):
        t = pk("verify", "--workload", "overflow-4", "--repeat", str(k), "--report-dir", str(work / f"k{k}"), env=env)
        rows.append((f"verify overflow-4 --repeat {k}", f"{t:.1f} s", ""))

    print(f"machine: {machine()}")
    w = max(len(r[0]) for r in rows)
    for name, val, note in rows:
        print(f"{name:<{w}}  {val:>8}  {note}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
