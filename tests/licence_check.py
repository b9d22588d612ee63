#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The project is Apache-2.0 and says so: LICENSE is the Apache License 2.0, the README names it, and every
source file (C, headers, Python, shell, CMake, units, Markdown) carries an SPDX line in its first lines.
Data (JSON configurations and dashboards, fuzz corpora, benchmark samples, charts) is exempt: JSON has no
comments. Exit status: 0 when all hold, 1 with the files that do not."""
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SPDX = "SPDX-License-Identifier: Apache-2.0"
EXEMPT_EXT = (".json", ".png", ".tsv", ".svg", ".gz")
EXEMPT = {"LICENSE", "conf/debian/copyright", "conf/debian/conffiles"}


def files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout.split()
    if out:
        return out
    return [os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, fs in os.walk(ROOT)  # not a git checkout
            for f in fs if not any(p in d for p in ("/build", "/.git", "/node_modules"))]


def main():
    bad = []
    for f in files():
        if f in EXEMPT or f.endswith(EXEMPT_EXT) or "/corpus/" in f or not os.path.isfile(os.path.join(ROOT, f)):
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            head = "".join(fh.readline() for _ in range(3))
        if SPDX not in head:
            bad.append(f)
    with open(os.path.join(ROOT, "LICENSE")) as fh:
        lic = fh.read()
    if "Apache License" not in lic or "Version 2.0, January 2004" not in lic:
        bad.append("LICENSE (not the Apache License 2.0)")
    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = fh.read()
        if "## Licence" not in readme or "Apache-2.0" not in readme.split("## Licence", 1)[1]:
            bad.append("README.md (no '## Licence' section naming Apache-2.0)")
    for b in bad:
        print("no licence statement:", b)
    print("licence check: %d files without an SPDX line" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
