#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tests/mutation/run.py - the mutation suite: one-line bugs planted in the router, balancer, simulator and
transfer engine, each of which some test must catch.

mutants.txt lists them, one block each (blank-line separated, '#' comments):
    id:      a name
    file:    the source file, relative to the repository
    find:    text that occurs exactly once in that file (the behaviour, not a line number)
    replace: what it becomes (the bug)
    target:  the CMake target(s) to rebuild, space-separated
    tests:   what must catch it, space-separated: blackbox FILE[.Class[.method]] (tests/blackbox), or
             unit:NAME (a cmocka binary), or fuzz:NAME:SECONDS (not used in CI)
    why:     what the bug would do to a user
For every mutant the runner copies the source tree once (build/mutation/src), applies the mutant to the copy,
rebuilds its targets (build/mutation/build; with those earlier mutants left built from their change, in the same
build: a restored file is recompiled with the next mutant's), runs its tests against the mutated binaries and
restores the file. A mutant is killed when one of its tests fails. The run fails (exit 1) when any mutant survives,
no longer applies (its 'find' text is gone or ambiguous: the suite must be kept current with the code), or
does not compile; it prints which. Before the mutants, every test named in the file is run once against the
unmutated build: a test that fails there would "kill" every mutant, so it fails the run too.

    tests/mutation/run.py [--only ID[,ID]] [--shard K/N] [--list] [--keep]
--shard K/N takes every N-th mutant from the K-th (0-based): ctest runs the suite as N shards at once, each in a
tree of its own (the tests are mostly waiting on the binaries, so shards overlap well on two cores).
Environment: XPYD_MUTATION_DIR (default build/mutation); XPYD_MUTATION_BASELINE=0 skips the baseline (ctest sets
it: the same ctest run runs every one of those tests against the unmutated build).
"""
import argparse
import fcntl
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KEYS = ("id", "file", "find", "replace", "target", "tests", "why")


def parse(path):
    mutants, cur, key = [], {}, None
    for raw in open(path, encoding="utf-8").read().split("\n"):
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if cur:
                mutants.append(cur)
            cur, key = {}, None
            continue
        if raw.startswith((" ", "\t")) and key:  # continuation line (multi-line find/replace)
            cur[key] += "\n" + raw[1:]
            continue
        k, _, v = raw.partition(":")
        k = k.strip()
        if k not in KEYS:
            raise SystemExit("mutants.txt: unknown key %r in %r" % (k, raw))
        cur[k] = v[1:] if v.startswith(" ") else v
        key = k
    if cur:
        mutants.append(cur)
    for m in mutants:
        missing = [k for k in KEYS if k not in m]
        if missing:
            raise SystemExit("mutant %s lacks %s" % (m.get("id"), missing))
    ids = [m["id"] for m in mutants]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate mutant ids")
    return mutants


def sh(cmd, cwd=None, env=None, timeout=None):
    return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")


def copy_tree(dst):
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    files = r.stdout.decode(errors="surrogateescape").split("\0") if r.returncode == 0 else []
    if not any(files):  # not a git checkout (an unpacked archive, a copy): copy the sources that are there
        skip = lambda d: any(part.startswith(("build", ".git")) for part in os.path.relpath(d, ROOT).split(os.sep))
        files = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT) if not skip(d) for f in fs]
    for f in files:
        if not f or not os.path.isfile(os.path.join(ROOT, f)):
            continue
        out = os.path.join(dst, f)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if not os.path.exists(out) or open(out, "rb").read() != open(os.path.join(ROOT, f), "rb").read():
            shutil.copy(os.path.join(ROOT, f), out)  # a new mtime: make must see it newer than old objects


def run_test(spec, src, bld, timeout=240):
    """Returns (ok, output)."""
    env = dict(os.environ, XPYD_BIN=os.path.join(bld, "bin"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("XPYD_SANITIZED", None)
    if spec.startswith("unit:"):
        cmd = [os.path.join(bld, "bin", spec[5:])]
    elif spec.startswith("fuzz:"):
        raise SystemExit("fuzz tests are not run by the mutation suite in CI")
    else:
        parts = spec.split(".")
        # -f (unittest's failfast): the first failing test kills the mutant; the file's other tests would only
        # add their own timeouts
        cmd = [sys.executable, os.path.join(src, "tests", "blackbox", parts[0] + ".py"), "-f"]
        if len(parts) > 1:
            cmd.append(".".join(parts[1:]))
    try:
        r = sh(cmd, cwd=os.path.join(src, "tests", "blackbox"), env=env, timeout=timeout)
        return r.returncode == 0, r.stdout
    except subprocess.TimeoutExpired as e:
        return False, "timeout after %ds\n%s" % (timeout, (e.stdout or b"")[-2000:])


def ccache_env(work):
    """ccache for the builds, where it is (scripts/deps.sh installs it for the tests): one cache beside the shards'
    trees, their paths made relative to it, so the same file compiled in another shard's tree is found; a restored
    file is found too, as the clean build compiled it. Sets the environment; False without ccache."""
    if not shutil.which("ccache"):
        return False
    root = os.path.dirname(work)
    os.environ.setdefault("CCACHE_DIR", os.path.join(root, "ccache"))
    os.environ["CCACHE_BASEDIR"] = root
    os.environ["CCACHE_NOHASHDIR"] = "1"  # (the debug info's directory: the tree's, not the cache's concern)
    return True


def cpu_s():
    """CPU seconds of the builds and tests run so far (children waited for)"""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(bld, targets):
    r = sh(["cmake", "--build", bld, "-j", str(os.cpu_count() or 2), "--target"] + targets)
    return r.returncode == 0, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--shard", help="K/N: the K-th of N interleaved parts of the list")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--keep", action="store_true", help="leave the last mutant applied (debugging)")
    a = ap.parse_args()
    mutants = parse(os.path.join(ROOT, "tests", "mutation", "mutants.txt"))
    if a.only:
        want = set(a.only.split(","))
        mutants = [m for m in mutants if m["id"] in want]
    if a.shard:
        k, n = (int(x) for x in a.shard.split("/"))
        if not 0 <= k < n:
            raise SystemExit("--shard K/N needs 0 <= K < N")
        mutants = mutants[k::n]
    if a.list:
        for m in mutants:
            print("%-40s %-28s %s" % (m["id"], m["file"], m["why"]))
        return 0
    work = os.path.abspath(os.environ.get("XPYD_MUTATION_DIR", os.path.join(ROOT, "build", "mutation")))
    src, bld = os.path.join(work, "src"), os.path.join(work, "build")
    t0 = time.monotonic()
    copy_tree(src)
    # Ninja where it is (scripts/deps.sh installs it for the tests): a mutant's build is one file and its links,
    # but make first walks every target built so far (4.3 CPU-s for ten of them, where Ninja takes 0.03)
    gen = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    cache = os.path.join(bld, "CMakeCache.txt")
    if os.path.exists(cache) and "CMAKE_GENERATOR:INTERNAL=%s\n" % gen not in open(cache).read():
        shutil.rmtree(bld)  # configured with the other generator before
    launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache"] if ccache_env(work) else []
    # optimized (-O1: every mutant is a compile of its own, CI's cache is cold, and -O2's cost a tenth more of the
    # suite's CPU for binaries the tests mostly wait on), without debug information (nothing here reads it: a
    # mutant's compile and links take a fifth less), linked by lld where it is (scripts/deps.sh installs it)
    lld = ["-fuse-ld=lld"] if shutil.which("ld.lld") else []
    flags = ["-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG"] + [
        "-DCMAKE_%s_LINKER_FLAGS=%s" % (k, " ".join(lld)) for k in ("EXE", "SHARED", "MODULE")]
    r = sh(["cmake", "-S", src, "-B", bld, "-G", gen, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DXPYD_TESTS=ON",
            "-DXPYD_SANITIZE=OFF", "-DXPYD_WERROR=OFF"] + flags + launcher)
    if r.returncode:
        print(r.stdout)
        return 1
    targets = sorted({t for m in mutants for t in m["target"].split()} | {"xpyd_router", "xpyd_sim"})
    with open(os.path.join(os.path.dirname(work), "clean-build.lock"), "w") as lock:
        if launcher:  # the shards' clean builds one at a time: the first compiles, the others find its objects
            fcntl.flock(lock, fcntl.LOCK_EX)
        ok, out = build(bld, targets)
    if not ok:
        print(out[-4000:])
        return 1
    print("mutation: %d mutants, clean build in %.0fs" % (len(mutants), time.monotonic() - t0))

    # every test the suite relies on must pass on the unmutated code (XPYD_MUTATION_BASELINE=0: not here, where ctest
    # runs each of those tests itself in the same run, as CI does: a failing one fails the run there)
    tests = sorted({t for m in mutants for t in m["tests"].split()})
    if os.environ.get("XPYD_MUTATION_BASELINE", "1") == "0":
        tests = []
    broken = []
    for spec in tests:
        ok, out = run_test(spec, src, bld)
        if not ok:
            broken.append(spec)
            print("BASELINE FAILED: %s\n%s" % (spec, out[-3000:]))
    if broken:
        print("mutation: %d tests fail without any mutant: %s" % (len(broken), " ".join(broken)))
        return 1
    print("mutation: baseline of %d tests passed in %.0fs" % (len(tests), time.monotonic() - t0))

    results = {"killed": [], "survived": [], "stale": [], "no_build": []}
    # Targets built from a tree with a mutant in it. A restored file is not rebuilt at once: the next mutant's one
    # build takes these targets too, and make recompiles the restored file beside the new mutant's (one build per
    # mutant, not two). A target never built with a mutant in the tree is the clean build's.
    dirty = set()
    for m in mutants:
        path = os.path.join(src, m["file"])
        orig = open(path, encoding="utf-8").read()
        n = orig.count(m["find"])
        if n != 1:
            results["stale"].append(m["id"])
            print("STALE   %-40s 'find' occurs %d times in %s" % (m["id"], n, m["file"]))
            continue
        t1, c1 = time.monotonic(), cpu_s()
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(orig.replace(m["find"], m["replace"]))
            dirty |= set(m["target"].split())
            ok, out = build(bld, sorted(dirty))
            if not ok:
                results["no_build"].append(m["id"])
                print("NOBUILD %-40s\n%s" % (m["id"], out[-2000:]))
                continue
            killer = None
            for spec in m["tests"].split():
                ok, _ = run_test(spec, src, bld)
                if not ok:
                    killer = spec
                    break
            if killer:
                results["killed"].append(m["id"])
                print("killed  %-40s by %s (%.0fs, %.1f CPU-s)" % (m["id"], killer, time.monotonic() - t1,
                                                                   cpu_s() - c1))
            else:
                results["survived"].append(m["id"])
                print("SURVIVED %-39s %s: %s" % (m["id"], m["tests"], m["why"]))
        finally:
            if not a.keep:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(orig)
    if dirty and not a.keep:
        build(bld, sorted(dirty))  # the binaries back to the code as it is
    bad = results["survived"] + results["stale"] + results["no_build"]
    print("mutation: %d killed, %d survived, %d stale, %d not building, in %.0fs" % (
        len(results["killed"]), len(results["survived"]), len(results["stale"]), len(results["no_build"]),
        time.monotonic() - t0))
    print("%d passed, %d failed" % (len(results["killed"]), len(bad)))
    if bad:
        print("mutation: FAILED: " + " ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
