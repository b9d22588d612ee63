# SPDX-License-Identifier: Apache-2.0
"""The README's demo command works: a short run of scripts/demo.sh completes, every request succeeds, the
router ends with zero load, no KV lease is left, and no process is left behind."""
import os
import subprocess

import xpyd_testlib as t

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Demo(t.TestCase):
    def test_demo_runs_clean(self):
        env = dict(os.environ, XPYD_SKIP_BUILD="1", XPYD_BUILD_DIR=os.path.dirname(t.BIN), DEMO_PROMPTS="40",
                   DEMO_CONCURRENCY="8")
        out = subprocess.run([os.path.join(ROOT, "scripts", "demo.sh")], capture_output=True, text=True, env=env,
                             timeout=240)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("Successful requests:                    40", out.stdout)
        self.assertIn("Failed requests:                        0", out.stdout)
        self.assertIn("data: [DONE]", out.stdout)
        view = out.stdout.split("router view after the run")[1]
        self.assertEqual(view.count("inflight=0 outstanding_tokens=0"), 4)
        self.assertIn("p0: 0\n  p1: 0", out.stdout)
        # every process the demo starts has its work dir (/tmp/xpyd-demo.*) on its command line
        ps = subprocess.run(["pgrep", "-f", "/tmp/xpyd-demo[.][A-Za-z0-9]+/"], capture_output=True, text=True)
        self.assertIn(ps.returncode, (0, 1), ps.stderr)  # 1: no match; anything else: pgrep itself failed
        self.assertEqual(ps.stdout.strip(), "", "processes left behind")


class DemoInstalls(t.TestCase):
    def test_demo_installs_only_what_it_needs(self):
        """scripts/demo.sh runs scripts/deps.sh without XPYD_TEST_DEPS: the test and benchmark packages come with
        scripts/test.sh only, and the demo builds without the tests (so without cmocka)."""
        env = {k: v for k, v in os.environ.items() if k != "XPYD_TEST_DEPS"}
        run = lambda **kw: subprocess.run([os.path.join(ROOT, "scripts", "deps.sh"), "--list"], capture_output=True,
                                          text=True, env=dict(env, **kw), check=True).stdout.split()
        demo, tests = run(), run(XPYD_TEST_DEPS="1")
        for pkg in ("prometheus", "clang", "etcd-server", "gnuplot-nox", "help2man", "libcmocka-dev", "haproxy"):
            self.assertNotIn(pkg, demo)
            self.assertIn(pkg, tests)
        for pkg in ("gcc", "cmake", "libevhtp-dev", "libcjson-dev", "libssl-dev", "curl"):
            self.assertIn(pkg, demo)
        with open(os.path.join(ROOT, "scripts", "demo.sh")) as f:
            text = f.read()
        self.assertIn("./scripts/deps.sh #", text)
        self.assertNotIn("XPYD_TEST_DEPS", text)
        self.assertIn("-DXPYD_TESTS=OFF", text)


if __name__ == "__main__":
    t.main()
