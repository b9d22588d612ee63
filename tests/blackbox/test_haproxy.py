# SPDX-License-Identifier: Apache-2.0
"""Behind a real HAProxy (Debian's package): its HTTP health check "OPTIONS *" keeps the router's server UP (the
router used to close such a request unanswered: every check failed, and clients got 503), and completions,
streamed and not, pass through it with their bytes intact."""
import os
import shutil
import socket
import subprocess
import unittest

import xpyd_testlib as t

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def stat_rows(sock_path):
    """HAProxy's "show stat" over its stats socket, as dicts by CSV column."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(sock_path)
        s.sendall(b"show stat\n")
        out = t.recv_until_close(s)
    lines = out.decode().strip().splitlines()
    cols = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(cols, l.split(","))) for l in lines[1:]]
    for r in rows:
        # HAProxy's management guide: check_status is prefixed with "* " while a check is in progress; the last
        # check's result is the rest (a check running at 100 ms intervals is often in flight when we look)
        if r.get("check_status", "").startswith("* "):
            r["check_status"] = r["check_status"][2:]
    return rows


@unittest.skipUnless(os.path.exists(HAPROXY), "haproxy is not installed (XPYD_TEST_DEPS=1 scripts/deps.sh does)")
class BehindHaproxy(t.TestCase):
    def setUp(self):
        super().setUp()
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        self.r = self.start(t.router([p.port], [d.port]))
        self.tmp = t.tmpdir(prefix="xpyd-haproxy-")
        self.sock = os.path.join(self.tmp, "stats.sock")
        self.port = t.free_port()
        cfg = os.path.join(self.tmp, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write("""global
    stats socket %s level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:%d
    default_backend routers
backend routers
    option httpchk
    http-check send meth OPTIONS uri * ver HTTP/1.1 hdr Host xpyd
    http-check expect status 200
    http-reuse always
    server r1 127.0.0.1:%d check inter 100ms rise 2 fall 1
""" % (self.sock, self.port, self.r.port))
        self.hap = subprocess.Popen([HAPROXY, "-f", cfg, "-db"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(self.stop_haproxy)
        t.wait_until(lambda: os.path.exists(self.sock) and stat_rows(self.sock), what="haproxy's stats socket")

    def stop_haproxy(self):
        if self.hap.poll() is None:
            self.hap.terminate()
            self.hap.wait(5)
        self.hap.stdout.close()

    def server(self):
        return [r for r in stat_rows(self.sock) if r["svname"] == "r1"][0]

    def test_health_check_and_traffic(self):
        # several checks in a row passed (rise 2, fall 1: one unanswered check takes the server down)
        t.wait_until(lambda: int(self.server()["chkfail"] or 0) == 0 and self.server()["status"] == "UP" and
                     self.server()["check_status"] == "L7OK",
                     what="the router UP in haproxy with L7OK checks")
        before = t.metric(self.r.port, 'xpyd_requests_total{endpoint="/v1/completions",status="200"}', default=0)
        for _ in range(3):
            st, _, out = t.post_json(self.port, "/v1/completions", {"prompt": "a b c", "max_tokens": 3})
            self.assertEqual(st, 200, out)
            self.assertEqual(out["usage"]["completion_tokens"], 3)
        payloads = t.Stream(self.port, "/v1/completions",
                            {"prompt": "a b", "max_tokens": 4, "stream": True}).read_all()
        self.assertEqual(payloads[-1], "[DONE]")
        self.assertEqual(len(t.content_events(payloads)), 4)
        self.assertEqual(t.metric(self.r.port, 'xpyd_requests_total{endpoint="/v1/completions",status="200"}'),
                         before + 4)
        srv = self.server()
        self.assertEqual((srv["status"], srv["chkfail"], srv["check_status"]), ("UP", "0", "L7OK"))
        self.assertEqual(t.metric_sum(self.r.port, "xpyd_client_rejected_total"), 0)
        self.idle(self.r)


if __name__ == "__main__":
    t.main()
