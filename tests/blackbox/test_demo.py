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


if __name__ == "__main__":
    t.main()
