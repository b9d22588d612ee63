#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The router never becomes its own engine. An engine address that is one of its own listeners is refused
wherever engines come from (the command line, a topology file, SIGHUP, the admin API, etcd), an engine address
needs a port (a default would be the router's own 8000), and a loop through other routers (two routers listing
each other) ends at its first return with 508 in OpenAI's error shape: one client request costs a handful of
requests, not thousands, and every counter returns to zero."""
import json
import os
import signal
import socket
import unittest

from xpyd_testlib import (Proc, TestCase, free_port, main, metric, post_json, request, router, sim, stream_body,
                          tmpdir, wait_until)
import etcdlib

KEY = "adminkey"
AUTH = {"Authorization": "Bearer " + KEY}
BODY = {"model": "sim-model", "prompt": "hello", "max_tokens": 3}


def failed_start(args):
    p = Proc("xpyd_router", args, port_flag=False)
    rc = p.p.wait(20)
    p.stop(check=False)
    return rc, p.output()


def requests_total(port):
    return sum(metric(port, 'xpyd_requests_total{endpoint="/v1/completions",status="%d"}' % s, default=0)
               for s in (200, 502, 503, 508))


class Configuration(TestCase):
    def test_engine_address_needs_a_port(self):
        for args in (["-p", "127.0.0.1", "-d", "127.0.0.1:8200"], ["-p", "127.0.0.1:8100", "-d", "http://127.0.0.1/"],
                     ["--prefiller-hosts", "127.0.0.1", "--decoder-hosts", "127.0.0.1", "--decoder-ports", "8200"],
                     ["--prefiller-ports", "8100", "-d", "127.0.0.1:8200"]):
            rc, out = failed_start(args + ["--dry-run"])
            self.assertEqual(rc, 2, (args, out))
            self.assertTrue("has no port" in out or "needs --prefiller" in out, (args, out))
        path = os.path.join(tmpdir(), "t.json")
        with open(path, "w") as f:
            json.dump({"decode": {"hosts": [{"host": "127.0.0.1"}]}}, f)
        rc, out = failed_start(["--config", path, "--dry-run"])
        self.assertEqual(rc, 2, out)
        self.assertIn('"decode.hosts[0]" needs a "port"', out)

    def test_own_listener_refused_at_start(self):
        port = free_port()
        for engine in ("127.0.0.1:%d" % port, "localhost:%d" % port, "0.0.0.0:%d" % port):
            for extra in ([], ["--dry-run"]):
                rc, out = failed_start(["--port", str(port), "--handoff", "none", "-d", engine] + extra)
                self.assertEqual(rc, 2, (engine, extra, out))
                self.assertIn("is this router's own listener", out)
        # a wildcard listener: any local address on its port is the router itself
        rc, out = failed_start(["--host", "0.0.0.0", "--port", str(port), "--handoff", "none",
                                "-d", "127.0.0.2:%d" % port])
        self.assertEqual(rc, 2, out)
        self.assertIn("own listener", out)
        # the plain listener too
        plain = free_port()
        rc, out = failed_start(["--port", "0", "--plain-port", str(plain), "--handoff", "none",
                                "-d", "127.0.0.1:%d" % plain])
        self.assertEqual(rc, 2, out)
        self.assertIn("own listener", out)


class Runtime(TestCase):
    def test_admin_api_refuses_the_router_itself(self):
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(router([], [d], "--handoff", "none", "--admin-key", KEY))
        for host in ("127.0.0.1", "localhost"):
            st, _, body = request(r.port, "POST", "/admin/instances",
                                  json.dumps({"role": "decode", "host": host, "port": r.port}), headers=AUTH)
            self.assertEqual(st, 400, body)
            err = json.loads(body)["error"]
            self.assertIn("own listener", err["message"])
        st, _, body = request(r.port, "GET", "/admin/instances", headers=AUTH)
        self.assertEqual([i["port"] for i in json.loads(body)["decode"]], [d.port])
        self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 200)

    def test_reload_refuses_the_router_itself(self):
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        path = os.path.join(tmpdir(), "t.json")
        port = free_port()
        with open(path, "w") as f:
            json.dump({"handoff": "none", "port": port, "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}, f)
        r = self.start(Proc("xpyd_router", ["--config", path, "--log-level", "info"], port_flag=False))
        r.port = port
        wait_until(lambda: request(port, "GET", "/health")[0] == 200, what="router up")
        with open(path, "w") as f:
            json.dump({"handoff": "none", "port": port,
                       "decode": {"hosts": ["127.0.0.1:%d" % d.port, "127.0.0.1:%d" % port]}}, f)
        r.signal(signal.SIGHUP)
        wait_until(lambda: "event=reload_failed" in r.output(), what="the reload refused")
        self.assertIn("own listener", r.output())
        self.assertEqual(post_json(port, "/v1/completions", BODY)[0], 200)

    def test_two_routers_listing_each_other_end_with_508(self):
        """A lists B as its decode, B lists A: one request goes A -> B -> A, where A sees its own hop id and
        answers 508; B passes it back, and the client gets 508 in OpenAI's error shape. Nothing fans out."""
        a = self.start(router([], ["127.0.0.1:1"], "--handoff", "none", "--admin-key", KEY, "--max-retries", "0",
                              ready_path="/metrics"))
        b = self.start(router([], ["127.0.0.1:%d" % a.port], "--handoff", "none", "--max-retries", "0"))
        st, _, body = request(a.port, "POST", "/admin/instances",
                              json.dumps({"role": "decode", "host": "127.0.0.1", "port": b.port}), headers=AUTH)
        self.assertEqual(st, 201, body)
        request(a.port, "DELETE", "/admin/instances/decode/127.0.0.1:1", headers=AUTH)
        for stream in (False, True):
            body = dict(BODY, stream=stream)
            st, _, data = post_json(a.port, "/v1/completions", body)
            self.assertEqual(st, 508, data)
            err = data["error"] if isinstance(data, dict) else json.loads(data)["error"]
            self.assertEqual(err["code"], 508)
            self.assertIn("loop detected", err["message"])
        self.assertEqual(metric(a.port, "xpyd_loops_refused_total"), 2)
        self.assertEqual(metric(a.port, 'xpyd_request_errors_total{reason="loop_detected"}'), 2)
        # two client requests: A saw its own 2 and the 2 that came back; B saw 2
        self.assertEqual(requests_total(a.port), 4)
        self.assertEqual(requests_total(b.port), 2)
        self.idle(a)
        self.idle(b)
        # /v1/models goes round the same way and ends the same
        st, _, body = request(a.port, "GET", "/v1/models")
        self.assertEqual(st, 502, body)
        self.assertEqual(metric(a.port, "xpyd_loops_refused_total"), 3)

    def test_hop_header_sent_and_hop_limit(self):
        """Engines see X-Xpyd-Via with the routers a request passed; a request that passed --max-hops routers is
        refused with 508 before any engine is touched."""
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0", "--log-level", "info"))
        r = self.start(router([], [d], "--handoff", "none", "--max-hops", "3"))
        st, _, body = post_json(r.port, "/v1/completions", BODY, headers={"X-Xpyd-Via": "xpyd-aaaa, xpyd-bbbb"})
        self.assertEqual(st, 200, body)
        st, _, body = post_json(r.port, "/v1/completions", BODY,
                                headers={"X-Xpyd-Via": "xpyd-aaaa, xpyd-bbbb, xpyd-cccc"})
        self.assertEqual(st, 508, body)
        self.assertIn("--max-hops 3", body["error"]["message"])


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh installs it)")
class Etcd(TestCase):
    def test_etcd_entry_naming_the_router_is_invalid(self):
        etcd = self.start(etcdlib.Member())
        prefix = "loop%d" % os.getpid()
        url = etcdlib.url([etcd], prefix)
        r = self.start(Proc("xpyd_router", ["--port", "0", "--log-level", "info", "--handoff", "none",
                                            "--discovery", url, "--admin-key", KEY], ready_path="/metrics"))
        etcd.put("%s/instances/decode/127.0.0.1:%d" % (prefix, r.port), "{}")
        wait_until(lambda: metric(r.port, "xpyd_discovery_invalid_total") == 1, what="the entry refused")
        self.assertIn("own listener", r.output())
        st, _, body = request(r.port, "GET", "/admin/instances", headers=AUTH)
        self.assertEqual(json.loads(body)["decode"], [])
        self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 503)
        self.assertEqual(metric(r.port, "xpyd_active_requests"), 0)


if __name__ == "__main__":
    main()
