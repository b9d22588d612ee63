# SPDX-License-Identifier: Apache-2.0
"""The command lines the README and docs/ show, run as written, so examples cannot rot. A fenced block whose
info string is `sh runnable` runs here as one bash script (set -e, the build's binaries first on PATH, from
the repository root); `sh runnable cluster` also gets a running xpyd_sim prefill + decode and a router.
Documented ports (8000 router, 8100/8101 prefills, 8200/8201 decodes, 8998 bootstrap) are mapped to free
ones, so a block runs beside anything else; background jobs a block starts are stopped when it ends. Every
block must exit 0; blocks that need real engines or root are simply not marked."""
import glob
import os
import re
import subprocess

import xpyd_testlib as t

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DOC_PORTS = (8000, 8100, 8101, 8200, 8201, 8998)


def runnable_blocks():
    """[(file, line, tags, text)] for every ```sh runnable ...``` block."""
    out = []
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
        [os.path.join(ROOT, "transfer", "README.md")]
    for path in files:
        with open(path) as f:
            lines = f.read().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```sh runnable\s*(.*)$", lines[i])
            if m:
                j = i + 1
                while not lines[j].startswith("```"):
                    j += 1
                out.append((os.path.relpath(path, ROOT), i + 1, m.group(1).split(), "\n".join(lines[i + 1:j])))
                i = j
            i += 1
    return out


class DocsCommands(t.TestCase):
    def test_there_are_runnable_examples(self):
        blocks = runnable_blocks()
        self.assertGreaterEqual(len(blocks), 4, blocks)
        self.assertIn("docs/OPERATIONS.md", {b[0] for b in blocks})

    def test_every_runnable_block(self):
        for path, line, tags, text in runnable_blocks():
            with self.subTest(block="%s:%d" % (path, line)):
                ports = {p: t.free_port() for p in DOC_PORTS}
                if "cluster" in tags:
                    p = self.start(t.sim("--role", "prefill"))
                    d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "200"))
                    r = self.start(t.router([p.port], [d.port]))
                    ports[8000] = r.port
                script = re.sub(r"\b(%s)\b" % "|".join(map(str, DOC_PORTS)), lambda m: str(ports[int(m.group(1))]),
                                text)
                wrapped = ("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n" + script + "\n")
                env = dict(os.environ, PATH=t.BIN + ":" + os.path.join(ROOT, "scripts") + ":" + os.environ["PATH"],
                           XPYD_BIN=t.BIN)
                res = subprocess.run(["bash", "-c", wrapped], cwd=ROOT, env=env, capture_output=True, text=True,
                                     timeout=240)
                self.assertEqual(res.returncode, 0, "%s:%d\n%s\n--- stdout\n%s\n--- stderr\n%s" %
                                 (path, line, script, res.stdout[-3000:], res.stderr[-3000:]))


if __name__ == "__main__":
    t.main()
