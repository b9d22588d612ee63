# SPDX-License-Identifier: Apache-2.0
"""libxpyd_transfer between two processes over loopback tcp: xpyd_transfer_bench target and initiator move
and verify data both ways (reads checked against the target's pattern, writes read back), and the
initiator reports a throughput and latency percentiles; asking for rdma on a machine without a device
fails with a clear message rather than falling back silently."""
import os
import re
import subprocess

import xpyd_testlib as t

BENCH = os.path.join(t.BIN, "xpyd_transfer_bench")


class TransferBench(t.TestCase):
    def test_two_processes_read_and_write(self):
        target = subprocess.Popen([BENCH, "--mode", "target", "--port", "0", "--buffer-size", "32M"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            port = None
            for line in target.stdout:
                m = re.search(r"ready port (\d+)", line)
                if m:
                    port = int(m.group(1))
                    break
            self.assertIsNotNone(port)
            for op in ("read", "write"):
                out = subprocess.run([BENCH, "--mode", "initiator", "--target", "127.0.0.1:%d" % port,
                                      "--operation", op, "--block-size", "1M", "--batch-size", "4", "--threads", "2",
                                      "--duration", "1"], capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
                line = out.stdout.strip().splitlines()[-1]
                self.assertNotIn("FAILED", line)
                self.assertGreater(int(re.search(r"verified_bytes=(\d+)", line).group(1)), 0, line)
                self.assertGreater(float(re.search(r"throughput=([0-9.]+) GB/s", line).group(1)), 0, line)
                self.assertRegex(line, r"batch_latency_p50_us=\d+ batch_latency_p99_us=\d+")
        finally:
            target.terminate()
            target.wait(timeout=10)
        self.assertEqual(target.returncode, 0)

    def test_rdma_without_device_is_refused(self):
        out = subprocess.run([BENCH, "--mode", "target", "--protocol", "rdma", "--port", "0"], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn("no usable RDMA device", out.stderr)

    def test_help_on_stdout_with_defaults_and_documented_protocols_only(self):
        out = subprocess.run([os.path.join(t.BIN, "xpyd_transfer_bench"), "--help"], capture_output=True, text=True)
        self.assertEqual((out.returncode, out.stderr), (0, ""))
        for line in ("--protocol tcp|rdma          transport (tcp)", "--block-size BYTES", "(1M; K/M/G suffixes)",
                     "--threads N                  initiator threads, 1-64 (4)"):
            self.assertIn(line, out.stdout)
        bad = subprocess.run([os.path.join(t.BIN, "xpyd_transfer_bench"), "--protocol", "auto"], capture_output=True,
                             text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--protocol must be tcp or rdma", bad.stderr)
        readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "transfer",
                                   "README.md")).read()
        self.assertNotIn("`auto`", readme)  # what the README documents, the bench takes


if __name__ == "__main__":
    t.main()
