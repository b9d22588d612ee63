#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Scale-out on etcd, against a real etcd (Debian's etcd-server) started by the tests on loopback ports:
engines that register themselves (xpyd_sim --register, xpyd_register), routers that follow membership
(--discovery) through registration, deregistration, engine and router deaths, etcd outages, member loss in a
3-member cluster, compaction and malformed values, and router replicas that share their load."""
import json
import os
import signal
import threading
import time
import unittest

from xpyd_testlib import Proc, TestCase, main, metric, post_json, request, sim, wait_until
import etcdlib
from etcdlib import b64

KEY = "adminkey"
AUTH = {"Authorization": "Bearer " + KEY}
BODY = {"model": "sim-model", "prompt": "hello", "max_tokens": 3}


def discovery_router(etcd_url, *args, handoff="none"):
    return Proc("xpyd_router", ["--port", "0", "--log-level", "info", "--threads", "2", "--handoff", handoff,
                                "--discovery", etcd_url, "--admin-key", KEY, "--discovery-ttl-s", "2"] + list(args),
                ready_path="/metrics")  # /health is 503 until a decode is known


def reg_sim(etcd_url, *args, role="decode"):
    return Proc("xpyd_sim", ["--port", "0", "--log-level", "info", "--role", role, "--register", etcd_url,
                             "--register-ttl-s", "2", "--decode-us-per-token", "0"] + list(args))


def active(r, role="decode"):
    """host:port of the active (not removed) ranks of role in router r."""
    st, _, body = request(r.port, "GET", "/admin/instances", headers=AUTH)
    assert st == 200, (st, body)
    return sorted("%s:%d" % (i["host"], i["port"]) for i in json.loads(body)[role] if not i["removed"])


def hp(p):
    return "127.0.0.1:%d" % p.port


def post(port, body, timeout=10):
    st, _, data = post_json(port, "/v1/completions", body, timeout=timeout)
    return st, data


def ok(r, n=1):
    for _ in range(n):
        st, body = post(r.port, BODY)
        if st != 200:
            return st, body
    return 200, None


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh installs it)")
class EtcdSingle(TestCase):
    def setUp(self):
        super().setUp()
        self.etcd = self.start(etcdlib.Member())
        self.url = etcdlib.url([self.etcd], "xpyd-%d" % os.getpid())

    def test_register_and_deregister_propagate(self):
        r = self.start(discovery_router(self.url))
        # the first range runs after the listener is up: wait for it rather than race it
        wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 1, what="discovery in sync")
        self.assertEqual(active(r), [])
        # no decode yet: a clear 503, not a hang
        st, body = post(r.port, BODY)
        self.assertOpenAIError(st, body, 503)
        d = self.start(reg_sim(self.url))
        wait_until(lambda: active(r) == [hp(d)], what="the registered sim in the pool")
        self.assertEqual(ok(r, 5), (200, None))
        inst = json.loads(request(r.port, "GET", "/admin/instances", headers=AUTH)[2])["decode"][0]
        self.assertEqual(inst["source"], "etcd")
        self.assertEqual(inst["max_inflight"], 256)  # from the sim's value (its --max-batch)
        self.assertEqual(inst["max_model_len"], 8192)
        # SIGTERM: the sim revokes its lease before exiting, the router drops it at once (well inside the TTL)
        t0 = time.monotonic()
        d.stop()
        wait_until(lambda: active(r) == [], timeout=1.5, what="the stopped sim removed")
        self.assertLess(time.monotonic() - t0, 1.5)
        self.idle(r)
        self.assertGreaterEqual(metric(r.port, "xpyd_discovery_events_total"), 2)

    def test_engine_sigkill_removed_after_lease_ttl(self):
        r = self.start(discovery_router(self.url))
        d = reg_sim(self.url)
        wait_until(lambda: active(r) == [hp(d)], what="registered")
        t0 = time.monotonic()
        d.p.kill()
        d.stop(check=False)
        wait_until(lambda: active(r) == [], timeout=6, what="the killed sim removed after its lease TTL (2 s)")
        took = time.monotonic() - t0
        self.assertGreater(took, 0.5, "removed before the lease could have expired: not the lease doing it")
        self.assertLess(took, 2 + 1 + 1.5)  # TTL + etcd's expiry granularity + a watch hop

    def test_engine_frozen_past_its_ttl_registers_again(self):
        """A registrar that could not keep its lease alive (frozen longer than the TTL) finds it gone and
        registers again with a new one."""
        r = self.start(discovery_router(self.url))
        d = self.start(reg_sim(self.url))
        wait_until(lambda: active(r) == [hp(d)], what="registered")
        # frozen only once the registrar has its put's answer: a put answered during the pause times out after
        # it, is put again with the dead lease and is refused, and that is a second way to learn the lease is gone
        wait_until(lambda: "event=registered" in d.output(), what="the registrar saw its put answered")
        d.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: active(r) == [], timeout=8, what="the lease expired while frozen")
        finally:
            d.signal(signal.SIGCONT)
        wait_until(lambda: active(r) == [hp(d)], timeout=8, what="registered again with a new lease")
        self.assertIn("event=etcd_lease_lost", d.output())
        self.assertEqual(ok(r, 3), (200, None))

    def test_streams_finish_on_a_deregistered_engine(self):
        r = self.start(discovery_router(self.url))
        d = self.start(reg_sim(self.url, "--decode-us-per-token", "20000"))
        wait_until(lambda: active(r) == [hp(d)], what="registered")
        res = {}
        def run():
            res["r"] = post(r.port, dict(BODY, max_tokens=40), timeout=30)
        th = threading.Thread(target=run)
        th.start()
        wait_until(lambda: metric(r.port, "xpyd_active_requests") == 1, what="request in flight")
        self.etcd.delete("%s/instances/decode/%s" % (self.url.split("/", 3)[3], hp(d)))
        wait_until(lambda: active(r) == [], what="removed from etcd")
        th.join(30)
        self.assertEqual(res["r"][0], 200, res)
        self.assertEqual(res["r"][1]["usage"]["completion_tokens"], 40)
        self.idle(r)

    def test_xpyd_register_follows_engine_health(self):
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        reg = self.start(Proc("xpyd_register", ["--etcd", self.url, "--role", "decode", "--engine", hp(d),
                                                "--dp", "1", "--max-inflight", "7", "--ttl-s", "2",
                                                "--health-interval-ms", "100", "--health-timeout-ms", "200",
                                                "--health-fall", "2"], port_flag=False))
        r = self.start(discovery_router(self.url))
        wait_until(lambda: active(r) == [hp(d)], what="registered by xpyd_register")
        inst = json.loads(request(r.port, "GET", "/admin/instances", headers=AUTH)[2])["decode"][0]
        self.assertEqual(inst["max_inflight"], 7)
        self.assertEqual(ok(r, 3), (200, None))
        # the engine stops answering: deregistered after --health-fall failed checks, back when it answers
        d.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: active(r) == [], timeout=5, what="deregistered while the engine hangs")
        finally:
            d.signal(signal.SIGCONT)
        wait_until(lambda: active(r) == [hp(d)], timeout=5, what="registered again once healthy")
        self.assertEqual(ok(r, 3), (200, None))
        # SIGTERM to xpyd_register: the registration goes at once
        reg.stop()
        wait_until(lambda: active(r) == [], timeout=1.5, what="deregistered on SIGTERM")
        self.assertIn("event=deregistered", reg.output())

    def test_etcd_down_keeps_routing_then_resyncs(self):
        r = self.start(discovery_router(self.url, "--discovery-retry-max-ms", "200"))
        d1 = self.start(reg_sim(self.url))
        wait_until(lambda: active(r) == [hp(d1)], what="registered")
        self.etcd.kill()
        wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 0, what="discovery down")
        # routing goes on with the last membership: not one failed request
        self.assertEqual(ok(r, 50), (200, None))
        self.assertEqual(active(r), [hp(d1)])
        age = metric(r.port, "xpyd_discovery_last_sync_age_seconds")
        self.etcd.start()
        wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 1, timeout=15, what="discovery back")
        self.assertGreater(age, 0)
        self.assertGreaterEqual(metric(r.port, "xpyd_discovery_resyncs_total"), 2)
        # registrations resume: a new engine joins, the first one is still there (its lease renewed or re-granted)
        d2 = self.start(reg_sim(self.url))
        wait_until(lambda: active(r) == sorted([hp(d1), hp(d2)]), timeout=10, what="both after etcd came back")
        self.assertEqual(ok(r, 10), (200, None))
        self.idle(r)

    def test_etcd_that_hangs_is_not_up(self):
        """An etcd that stops answering (stopped, its connections left open) is down within a lease TTL, though the
        watch's connection is still open; back when it answers again. Routing goes on meanwhile."""
        r = self.start(discovery_router(self.url))
        d1 = self.start(reg_sim(self.url))
        wait_until(lambda: active(r) == [hp(d1)], what="registered")
        self.assertEqual(metric(r.port, "xpyd_discovery_up"), 1)
        self.etcd.p.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 0, timeout=8, what="discovery seen down")
            self.assertGreaterEqual(metric(r.port, "xpyd_discovery_last_sync_age_seconds"), 2)
            self.assertEqual(ok(r, 5), (200, None))
        finally:
            self.etcd.p.send_signal(signal.SIGCONT)
        wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 1, timeout=15, what="discovery back")
        self.idle(r)

    def test_changes_missed_while_away_are_applied_on_resync(self):
        """The router is frozen while etcd restarts, d1 leaves, d2 joins and the history is compacted: when
        it runs again its watch is gone, and the range it reads again brings it up to date."""
        r = self.start(discovery_router(self.url, "--discovery-retry-max-ms", "200"))
        prefix = self.url.split("/", 3)[3]
        d1 = self.start(sim("--role", "decode"))
        d2 = self.start(sim("--role", "decode"))
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(d1)), "{}")
        wait_until(lambda: active(r) == [hp(d1)], what="d1 in")
        r.signal(signal.SIGSTOP)
        try:
            self.etcd.kill()
            self.etcd.start()
            self.etcd.delete("%s/instances/decode/%s" % (prefix, hp(d1)))
            self.etcd.put("%s/instances/decode/%s" % (prefix, hp(d2)), '{"max_inflight": 3}')
            self.etcd.compact(self.etcd.revision())
        finally:
            r.signal(signal.SIGCONT)
        wait_until(lambda: active(r) == [hp(d2)], timeout=10, what="the range after the outage applied")
        wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 1, what="in sync again")
        self.assertGreaterEqual(metric(r.port, "xpyd_discovery_resyncs_total"), 2)
        self.assertEqual(ok(r, 3), (200, None))

    def test_malformed_values_are_logged_and_ignored(self):
        r = self.start(discovery_router(self.url))
        prefix = self.url.split("/", 3)[3]
        d = self.start(sim("--role", "decode"))
        bad = [
            ("instances/decode/%s" % hp(d), "not json"),
            ("instances/decode/%s" % hp(d), "[1,2]"),
            ("instances/decode/%s" % hp(d), '{"dp": -4}'),
            ("instances/decode/%s" % hp(d), '{"tp": "x"}'),
            ("instances/decode/%s" % hp(d), '{"max_inflight": 1e300}'),
            ("instances/middle/127.0.0.1:1", "{}"),
            ("instances/decode/127.0.0.1", "{}"),
            ("instances/decode/127.0.0.1:99999", "{}"),
            ("instances/decode/:80", "{}"),
            ("instances/decode/no-such-host.invalid:80", "{}"),
            ("instances/decode/%s" % hp(d), "{" * 5000),
            ("instances/decode/%s" % hp(d), ""),
            ("instances/decode/%s" % hp(d), '{"weight": 2} x'),
            ("instances/decode/%s" % hp(d), '{"wieght": 2}'),
            ("instances/decode/%s" % hp(d), '{"host": "10.9.9.9", "port": 1}'),
            ("load/other-router", "nope"),
            ("load/other-router", '{"decode": {}, "prefil": {}}'),
            ("load/other-router", '{"decode": {"%s/-1": [1, "x"]}}' % hp(d)),
            ("load/other-router", '{"decode": {"%s/-1": [-5, 1]}}' % hp(d)),
            ("routers/x", "\x00\xff garbage"),
            ("something/else", "{}"),
        ]
        for k, v in bad:
            self.etcd.put("%s/%s" % (prefix, k), v)
        wait_until(lambda: metric(r.port, "xpyd_discovery_invalid_total") >= 18, what="invalid values counted")
        self.assertEqual(active(r), [])
        out = r.output()
        self.assertIn("event=discovery_invalid", out)
        for why in ("the value is empty", "unexpected data after the JSON value", "unknown field 'wieght'",
                    "unknown field 'host'", "unknown field 'prefil'"):
            self.assertIn(why, out)
        # a good value for the same key afterwards works (a repeated key: the last one, as everywhere); the
        # router is alive and well
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(d)), '{"weight": 5, "weight": 2}')
        wait_until(lambda: active(r) == [hp(d)], what="the good value applied")
        listed = json.loads(request(r.port, "GET", "/admin/instances", headers=AUTH)[2])["decode"]
        self.assertEqual([i["weight"] for i in listed], [2])
        self.assertEqual(ok(r, 3), (200, None))
        # the same garbage read by a range (a second router starting) is ignored the same way
        r2 = self.start(discovery_router(self.url))
        wait_until(lambda: active(r2) == [hp(d)], what="second router: only the good entry")
        self.assertGreaterEqual(metric(r2.port, "xpyd_discovery_invalid_total"), 1)

    def test_static_endpoint_wins_and_reload_keeps_discovered(self):
        prefix = self.url.split("/", 3)[3]
        s = self.start(sim("--role", "decode"))
        d = self.start(sim("--role", "decode"))
        r = self.start(discovery_router(self.url, "-d", hp(s)))
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(s)), '{"max_inflight": 5}')
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(d)), '{"max_inflight": 6}')
        wait_until(lambda: active(r) == sorted([hp(s), hp(d)]), what="static + discovered")
        insts = {"%s:%d" % (i["host"], i["port"]): i
                 for i in json.loads(request(r.port, "GET", "/admin/instances", headers=AUTH)[2])["decode"]}
        self.assertEqual(insts[hp(s)]["source"], "config")
        self.assertEqual(insts[hp(s)]["max_inflight"], 0)  # etcd's 5 ignored: the configuration wins
        self.assertEqual(insts[hp(d)]["max_inflight"], 6)
        self.assertIn("event=discovery_ignored", r.output())
        # deleting the static one's etcd entry leaves it; SIGHUP keeps the discovered one
        self.etcd.delete("%s/instances/decode/%s" % (prefix, hp(s)))
        r.signal(signal.SIGHUP)
        wait_until(lambda: "event=reloaded" in r.output(), what="reloaded")
        self.assertEqual(active(r), sorted([hp(s), hp(d)]))

    def test_dp_ranks_follow_the_value(self):
        prefix = self.url.split("/", 3)[3]
        base = __import__("xpyd_testlib").free_port_range(2)
        d = self.start(Proc("xpyd_sim", ["--port", str(base), "--dp-size", "2", "--log-level", "warn",
                                         "--role", "decode"]))
        r = self.start(discovery_router(self.url))
        key = "%s/instances/decode/127.0.0.1:%d" % (prefix, base)
        self.etcd.put(key, '{"dp": 2}')
        wait_until(lambda: active(r) == ["127.0.0.1:%d" % base, "127.0.0.1:%d" % (base + 1)], what="2 ranks")
        # the value names its rank 0's KV-event publisher: rank r subscribes at that port + r
        self.etcd.put(key, '{"dp": 2, "kv_events": "tcp://127.0.0.1:%d"}' % (base + 100))

        def kv_of():
            st, _, body = request(r.port, "GET", "/admin/instances", headers=AUTH)
            return sorted(i.get("kv_events", "") for i in json.loads(body)["decode"] if not i["removed"])
        wait_until(lambda: kv_of() == ["tcp://127.0.0.1:%d" % (base + 100), "tcp://127.0.0.1:%d" % (base + 101)],
                   what="kv_events per rank")
        self.etcd.put(key, '{"dp": 1}')
        wait_until(lambda: active(r) == ["127.0.0.1:%d" % base], what="back to 1 rank")
        self.assertEqual(kv_of(), [""])  # the value no longer names one
        self.assertEqual(ok(r, 4), (200, None))

    def test_pool_full_adds_nothing(self):
        """An entry with more ranks than the pool has room for is refused whole (not the ranks that fitted,
        which discovery would then never take out); a smaller one afterwards fits."""
        prefix = self.url.split("/", 3)[3]
        base = __import__("xpyd_testlib").free_port_range(3)
        d = self.start(Proc("xpyd_sim", ["--port", str(base), "--dp-size", "3", "--log-level", "warn",
                                         "--role", "decode"]))
        r = self.start(discovery_router(self.url, "--max-instances", "2"))
        key = "%s/instances/decode/127.0.0.1:%d" % (prefix, base)
        self.etcd.put(key, '{"dp": 3}')
        wait_until(lambda: metric(r.port, "xpyd_discovery_invalid_total") == 1, what="refused")
        self.assertIn("pool is full", r.output())
        self.assertEqual(active(r), [])
        self.etcd.put(key, '{"dp": 2}')
        wait_until(lambda: active(r) == ["127.0.0.1:%d" % base, "127.0.0.1:%d" % (base + 1)], what="2 ranks fit")
        self.assertEqual(ok(r, 4), (200, None))
        self.etcd.delete(key)
        wait_until(lambda: active(r) == [], what="deleted")

    def test_router_registers_and_leaves(self):
        prefix = self.url.split("/", 3)[3]
        r = self.start(discovery_router(self.url, "--router-id", "r-one"))
        wait_until(lambda: "%s/routers/r-one" % prefix in self.etcd.get_prefix(prefix + "/"), what="registered")
        me = json.loads(self.etcd.get_prefix(prefix + "/")["%s/routers/r-one" % prefix])
        self.assertEqual(me["address"], "http://127.0.0.1:%d" % r.port)
        wait_until(lambda: metric(r.port, "xpyd_discovery_routers") == 1, what="r counts itself")
        r2 = self.start(discovery_router(self.url, "--router-id", "r-two"))
        wait_until(lambda: metric(r.port, "xpyd_discovery_routers") == 2, what="r sees r2")
        # SIGKILL: its entries vanish with its lease
        r2.p.kill()
        r2.stop(check=False)
        wait_until(lambda: not any("r-two" in k for k in self.etcd.get_prefix(prefix + "/")), timeout=6,
                   what="the killed router's routers/ and load/ entries gone after the TTL")
        wait_until(lambda: metric(r.port, "xpyd_discovery_routers") == 1, what="r sees r2 gone")
        # SIGTERM: it leaves at once (revoked while draining)
        r.stop()
        self.assertEqual({k: v for k, v in self.etcd.get_prefix(prefix + "/").items() if "r-one" in k}, {})

    def test_two_routers_share_load(self):
        """Router A holds streams on decode X; router B sees A's load on X and places on Y; the share goes
        when the streams end, and with A when A dies."""
        prefix = self.url.split("/", 3)[3]
        x = self.start(sim("--role", "decode", "--decode-us-per-token", "50000"))
        y = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        a = self.start(discovery_router(self.url, "--router-id", "a", "--load-sync-ms", "50"))
        b = self.start(discovery_router(self.url, "--router-id", "b", "--load-sync-ms", "50"))
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(x)), "{}")
        wait_until(lambda: active(a) == [hp(x)] and active(b) == [hp(x)], what="x in both")
        results, threads = [], []
        for _ in range(4):  # only x exists: a's 4 long requests go there
            th = threading.Thread(target=lambda: results.append(
                post(a.port, dict(BODY, max_tokens=60), timeout=60)[0]))
            th.start()
            threads.append(th)
        wait_until(lambda: metric(a.port, "xpyd_active_requests") == 4, what="a's 4 streams")
        remote = lambda: metric(b.port, 'xpyd_instance_remote_tokens{role="decode",engine="%s",dp_rank="0"}' % hp(x))
        wait_until(lambda: remote() > 0, what="b sees a's load on x")
        self.assertEqual(metric(a.port, 'xpyd_instance_remote_tokens{role="decode",engine="%s",dp_rank="0"}' % hp(x)),
                         0, "a counts its own published load as another router's")
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(y)), "{}")
        wait_until(lambda: active(b) == sorted([hp(x), hp(y)]), what="y in b")
        # b's own load is zero on both: only the shared load can send its requests to y
        for _ in range(6):
            self.assertEqual(ok(b), (200, None))
        sel = lambda inst: metric(b.port, 'xpyd_instance_selected_total{role="decode",engine="%s",dp_rank="0"}'
                                  % inst, 0)
        self.assertEqual(sel(hp(x)), 0, "b placed on the decode a loads")
        self.assertEqual(sel(hp(y)), 6)
        for th in threads:
            th.join(60)
        self.assertEqual(results, [200] * 4)
        wait_until(lambda: remote() == 0, what="a's share back to zero when its streams ended")
        self.idle(a)
        self.idle(b)
        # a dies with load published: its share vanishes with its lease
        def doomed():
            try:
                post(a.port, dict(BODY, max_tokens=200), timeout=60)
            except OSError:
                pass  # a is killed under this request
        th = threading.Thread(target=doomed)
        th.start()
        wait_until(lambda: remote() > 0, what="a's new load seen by b")
        a.p.kill()
        a.stop(check=False)
        th.join(60)
        wait_until(lambda: remote() == 0, timeout=6, what="a's share gone with its lease")

    def test_load_sync_off_ignores_others(self):
        prefix = self.url.split("/", 3)[3]
        x = self.start(sim("--role", "decode"))
        b = self.start(discovery_router(self.url, "--load-sync-ms", "0"))
        self.etcd.put("%s/instances/decode/%s" % (prefix, hp(x)), "{}")
        self.etcd.put("%s/load/other" % prefix, '{"decode": {"%s/-1": [5000, 3]}}' % hp(x))
        wait_until(lambda: active(b) == [hp(x)], what="x in")
        self.assertEqual(metric(b.port, 'xpyd_instance_remote_tokens{role="decode",engine="%s",dp_rank="0"}' % hp(x)), 0)
        self.assertEqual([k for k in self.etcd.get_prefix(prefix + "/") if "/load/" in k], ["%s/load/other" % prefix],
                         "a router with --load-sync-ms 0 publishes nothing")


    def test_metadata_backend_etcd(self):
        """/metadata served from etcd under Mooncake's own keys: what an engine writes to etcd is read through
        any router, what a client PUTs through one router is in etcd and read through another."""
        W = {"Authorization": "Bearer wkey"}
        args = ("--metadata-backend", "etcd", "--metadata-write-key", "wkey", "--metadata-max-value-bytes", "4096")
        r1 = self.start(discovery_router(self.url, *args))
        r2 = self.start(discovery_router(self.url, *args))
        seg = json.dumps({"name": "seg-a", "buffers": [{"addr": 4096, "length": 65536}]})
        st, _, body = request(r1.port, "PUT", "/metadata?key=mooncake/ram/seg-a", seg, headers=W)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.etcd.get_prefix("mooncake/ram/"), {"mooncake/ram/seg-a": seg})
        st, h, body = request(r2.port, "GET", "/metadata?key=mooncake%2Fram%2Fseg-a")
        self.assertEqual((st, body.decode()), (200, seg))
        # what a Mooncake engine writes to etcd itself (JSON and a newline) reads back byte for byte
        self.etcd.put("mooncake/rpc_meta/node1", '{"ip_or_host_name":"10.0.0.1","rpc_port":12345}\n')
        st, _, body = request(r1.port, "GET", "/metadata?key=mooncake/rpc_meta/node1")
        self.assertEqual((st, body), (200, b'{"ip_or_host_name":"10.0.0.1","rpc_port":12345}\n'))
        st, _, body = request(r1.port, "GET", "/metadata?key=mooncake/ram/none")
        self.assertOpenAIError(st, json.loads(body), 404)
        st, _, body = request(r1.port, "PUT", "/metadata?key=k", "x" * 5000, headers=W)
        self.assertOpenAIError(st, json.loads(body), 413)
        st, _, body = request(r1.port, "PUT", "/metadata?key=k", "x")
        self.assertEqual(st, 401, body)  # writes need the key
        st, _, body = request(r2.port, "DELETE", "/metadata?key=mooncake/ram/seg-a", headers=W)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.etcd.get_prefix("mooncake/ram/"), {})
        st, _, body = request(r2.port, "DELETE", "/metadata?key=mooncake/ram/seg-a", headers=W)
        self.assertOpenAIError(st, json.loads(body), 404)
        # etcd gone: a clear 503, on a fresh connection and on the same keep-alive one after other requests
        self.etcd.kill()
        st, _, body = request(r1.port, "GET", "/metadata?key=mooncake/rpc_meta/node1")
        self.assertOpenAIError(st, json.loads(body), 503, "etcd")
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", r1.port, timeout=10)
        for method in ("GET", "PUT", "DELETE", "GET"):
            c.request(method, "/metadata?key=a", body="{}" if method == "PUT" else None, headers=W)
            resp = c.getresponse()
            self.assertEqual(resp.status, 503)
            self.assertIn(b"etcd", resp.read())
        c.close()

    def test_metadata_backend_etcd_needs_discovery(self):
        p = Proc("xpyd_router", ["--port", "0", "-d", "127.0.0.1:1", "--metadata-backend", "etcd"], port_flag=False)
        self.assertNotEqual(p.p.wait(10), 0)
        p.stop(check=False)
        self.assertIn("--metadata-backend etcd needs --discovery", p.output())


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh installs it)")
class EtcdCluster(TestCase):
    def test_member_killed_under_load(self):
        members = [self.start(m) for m in etcdlib.cluster(3)]
        url = etcdlib.url(members, "xpyd-c%d" % os.getpid())
        r = self.start(discovery_router(url, "--discovery-retry-max-ms", "200", "--discovery-timeout-ms", "500"))
        d1 = self.start(reg_sim(url))
        wait_until(lambda: active(r) == [hp(d1)], what="registered through the cluster")
        results = []
        stop = threading.Event()
        deadline = time.monotonic() + 60  # bounded in count and time

        def load():
            while not stop.is_set() and len(results) < 50000 and time.monotonic() < deadline:
                results.append(post(r.port, BODY)[0])
        th = threading.Thread(target=load)
        th.start()
        try:
            wait_until(lambda: len(results) > 20, what="load running")
            members[0].kill()  # the router's (and the sims') first endpoint
            d2 = self.start(reg_sim(url))
            wait_until(lambda: active(r) == sorted([hp(d1), hp(d2)]), timeout=15,
                       what="membership still updates with 2 of 3 members")
            d1.stop()
            wait_until(lambda: active(r) == [hp(d2)], timeout=10, what="deregistration too")
            n = len(results)
            wait_until(lambda: len(results) > n + 20, what="load still running")
        finally:
            stop.set()
            th.join(60)
        self.assertTrue(results)
        self.assertEqual([s for s in results if s != 200], [], "requests lost while a member died")
        self.assertIn("event=etcd_failover", r.output())  # it moved to another member
        self.idle(r)


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh installs it)")
class EtcdTls(TestCase):
    def test_etcds_with_client_certificates(self):
        """etcd requiring client certificates: routers and registrars reach it over https with theirs (the
        engines' TLS code: --upstream-ca/-cert/-key); without a certificate the router is refused and says so."""
        from test_tls import Certs
        certs = Certs()
        self.addCleanup(certs.cleanup)
        scert, skey = certs.issue("etcd", sans="DNS:localhost,IP:127.0.0.1")
        # etcd's certificate serves both ways: server for clients, client for its own health check here
        with open(certs.path("both.ext"), "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        certs.run("x509", "-req", "-in", certs.path("etcd.csr"), "-CA", certs.ca, "-CAkey", certs.ca_key,
                  "-CAcreateserial", "-out", scert, "-days", "2", "-extfile", certs.path("both.ext"))
        ccert, ckey = certs.issue("router", sans=None, client=True)
        etcd = self.start(etcdlib.Member(tls=(certs.ca, scert, skey)))
        url = "etcds://127.0.0.1:%d/tls%d" % (etcd.client_port, os.getpid())
        tls_args = ("--upstream-ca", certs.ca, "--upstream-cert", ccert, "--upstream-key", ckey)
        r = self.start(discovery_router(url, *tls_args))
        d = self.start(reg_sim(url, *tls_args))
        wait_until(lambda: active(r) == [hp(d)], what="registered and discovered over https")
        self.assertEqual(metric(r.port, "xpyd_discovery_up"), 1)
        self.assertEqual(ok(r, 3), (200, None))
        # no client certificate: refused in the handshake, the router stays out of sync and logs why
        bare = self.start(discovery_router(url, "--upstream-ca", certs.ca))
        wait_until(lambda: "event=discovery_down" in bare.output(), what="the refusal logged")
        self.assertEqual(metric(bare.port, "xpyd_discovery_up"), 0)
        self.assertEqual(active(bare), [])
        self.assertIn('event=discovery_down reason="range: TLS failed', bare.output())
        # the endpoint the router names is the one it checked the certificate against (it was empty once)
        wait_until(lambda: "etcd=127.0.0.1:%d" % etcd.client_port in r.output(), what="the etcd endpoint named")

    def test_etcds_refuses_a_certificate_for_another_name(self):
        """An etcd whose certificate (signed by the trusted CA) names another host is refused, as etcdctl
        refuses it: by the router's discovery, by its etcd-backed /metadata store, and by xpyd_register. Anyone
        with any certificate of the internal CA could otherwise pose as etcd and inject engines."""
        from test_tls import Certs
        certs = Certs()
        self.addCleanup(certs.cleanup)
        scert, skey = certs.issue("etcd", sans="DNS:etcd.other.example")
        with open(certs.path("both.ext"), "w") as f:
            f.write("subjectAltName=DNS:etcd.other.example\nextendedKeyUsage=serverAuth,clientAuth\n")
        certs.run("x509", "-req", "-in", certs.path("etcd.csr"), "-CA", certs.ca, "-CAkey", certs.ca_key,
                  "-CAcreateserial", "-out", scert, "-days", "2", "-extfile", certs.path("both.ext"))
        etcd = self.start(etcdlib.Member(tls=(certs.ca, scert, skey), verify_host=False))
        ccert, ckey = certs.issue("router", sans=None, client=True)
        tls_args = ("--upstream-ca", certs.ca, "--upstream-cert", ccert, "--upstream-key", ckey)
        # what an impostor would write: an engine for every router that trusts this etcd
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        etcd.put("xname/instances/decode/127.0.0.1:%d" % d.port, "{}")
        url = "etcds://127.0.0.1:%d/xname" % etcd.client_port
        r = self.start(discovery_router(url, *tls_args, "--metadata-backend", "etcd", "--discovery-retry-max-ms", "200"))
        wait_until(lambda: 'event=discovery_down reason="range: TLS failed' in r.output(), what="the refusal")
        # the /metadata store's own refusal names the etcd it tried: its first attempt runs on its own schedule
        wait_until(lambda: "etcd=127.0.0.1:%d" % etcd.client_port in r.output(), what="the metadata store's refusal")
        self.assertIn("certificate verify failed", r.output())
        self.assertEqual(metric(r.port, "xpyd_discovery_up"), 0)
        self.assertEqual(active(r), [])
        st, _, body = request(r.port, "GET", "/metadata?key=mooncake/ram/x")
        self.assertEqual(st, 503, body)
        self.assertEqual(post(r.port, BODY)[0], 503)  # nothing was injected
        # xpyd_register refuses it too: it never registers, and says why
        reg = self.start(Proc("xpyd_register", ["--etcd", url, "--role", "decode", "--engine", hp(d), "--ttl-s", "2",
                                                "--ca", certs.ca, "--cert", ccert, "--key", ckey], port_flag=False))
        wait_until(lambda: "TLS failed" in reg.output(), what="xpyd_register's refusal")
        self.assertEqual(etcd.get_prefix("xname/instances/decode/"), {"xname/instances/decode/127.0.0.1:%d" % d.port: "{}"})


class FakeGateway:
    """An etcd JSON gateway stand-in on a loopback port: unary answers from answer(path, body), and a watch
    that streams the messages watch_lines() gives, then stays open (as etcd's does) until stop()."""

    def __init__(self, answer, watch_lines):
        import http.server
        outer = self
        self.closing = threading.Event()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.path == "/v3/watch":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for line in watch_lines():
                        data = (json.dumps(line) + "\n").encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    outer.closing.wait(30)
                    self.close_connection = True
                    return
                data = json.dumps(answer(self.path, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Srv(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        self.srv = Srv(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.closing.set()
        self.srv.shutdown()
        self.srv.server_close()


class FakeEtcd(TestCase):
    """Protocol cases a real etcd does not produce on demand: a watch canceled by compaction."""

    def test_compaction_cancel_resyncs(self):
        d1 = self.start(sim("--role", "decode"))
        d2 = self.start(sim("--role", "decode"))
        state = {"ranges": 0}
        hdr = {"header": {"revision": "10"}}
        kv = lambda k, v, rev: {"key": b64(k), "value": b64(v), "mod_revision": str(rev), "version": "1"}

        def answer(path, body):
            if path == "/v3/kv/range":
                state["ranges"] += 1
                who = d1 if state["ranges"] == 1 else d2
                return dict(hdr, kvs=[kv("p/instances/decode/%s" % hp(who), "{}", 5)])
            if path == "/v3/lease/grant":
                return dict(hdr, ID="77", TTL="5")
            return hdr

        def watch_lines():  # the first watch is canceled by a compaction; later ones stay quiet
            yield {"result": dict(hdr, created=True)}
            if state["ranges"] == 1:
                yield {"result": dict(hdr, canceled=True, compact_revision="9")}

        fake = FakeGateway(answer, watch_lines)
        try:
            r = self.start(discovery_router("etcd://127.0.0.1:%d/p" % fake.port))
            wait_until(lambda: active(r) == [hp(d2)], what="the second range's membership after the cancel")
            self.assertIn("event=discovery_watch_canceled", r.output())
            self.assertEqual(metric(r.port, "xpyd_discovery_resyncs_total"), 2)
            wait_until(lambda: metric(r.port, "xpyd_discovery_up") == 1, what="watching again")
            self.assertEqual(ok(r, 2), (200, None))
        finally:
            fake.stop()


class DiscoveryConfig(TestCase):
    def test_bad_urls_are_refused(self):
        for u in ["http://127.0.0.1:2379/p", "etcd://127.0.0.1:2379", "etcd://127.0.0.1:2379/", "etcd:///p",
                  "etcd://127.0.0.1:99999/p", "etcd://no-such-host.invalid:2379/p"]:
            p = Proc("xpyd_router", ["--port", "0", "--handoff", "none", "--discovery", u], port_flag=False)
            rc = p.p.wait(10)
            p.stop(check=False)
            self.assertIn(rc, (1, 2), u)
            self.assertIn("--discovery", p.output(), u)


if __name__ == "__main__":
    main()
