#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every Markdown link in the repository's own docs resolves to a file inside the repository (no link points
outside it: a user who clones the repository has nothing else), and every `docs/` page is linked from the
README, as is bench/RESULTS.md, a page of at most 150 lines with charts. Exit status: 0 when all hold, 1
with the broken links listed."""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def main():
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "*.md"], stdout=subprocess.PIPE, text=True).stdout.split()
    if not files:  # not a git checkout
        files = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT)
                 if "/build" not in d and "/.git" not in d for f in fs if f.endswith(".md")]
    bad = []
    for f in files:
        text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+://", target) or target.startswith("#") or target.startswith("mailto:"):
                continue
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(f), target.split("#")[0]))
            if not path.startswith(ROOT + os.sep) or not os.path.exists(path):
                bad.append("%s: %s" % (f, target))
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    for d in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if d.endswith(".md") and "(docs/%s)" % d not in readme:
            bad.append("README.md does not link docs/%s" % d)
    # the results page stays a page (its history is bench/journal/), shows charts, and the README links it
    results = open(os.path.join(ROOT, "bench", "RESULTS.md"), encoding="utf-8").read()
    if results.count("\n") > 150:
        bad.append("bench/RESULTS.md has %d lines (at most 150; history goes to bench/journal/)" % results.count("\n"))
    if "](charts/" not in results:
        bad.append("bench/RESULTS.md shows no chart")
    if "(bench/RESULTS.md)" not in readme:
        bad.append("README.md does not link bench/RESULTS.md")
    for b in bad:
        print("broken: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
