#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Engines that come and go under new addresses never fill the pools: a removed rank's slot is given to the next
engine that joins once nothing is in flight on it (never while a request still runs there), an endpoint slot no
rank refers to goes to the next new address, and a request to the new engine reaches the new engine (no pooled
connection to the old address is reused). Slots in use and free are exported."""
import json
import threading

from xpyd_testlib import Stream, TestCase, main, metric, post_json, request, router, sim, stream_body, wait_until

KEY = "adminkey"
AUTH = {"Authorization": "Bearer " + KEY}
BODY = {"model": "sim-model", "prompt": "hello", "max_tokens": 3}


def add(r, port, role="decode"):
    return request(r.port, "POST", "/admin/instances", json.dumps({"role": role, "host": "127.0.0.1", "port": port}),
                   headers=AUTH)


def remove(r, port, role="decode"):
    return request(r.port, "DELETE", "/admin/instances/%s/127.0.0.1:%d" % (role, port), headers=AUTH)


def slots(r, state, role="decode"):
    return metric(r.port, 'xpyd_rank_slots{role="%s",state="%s"}' % (role, state))


def served(s):
    return metric(s.port, "vllm:request_success_total", default=0)


class SlotReuse(TestCase):
    def test_engines_coming_and_going_never_fill_the_pool(self):
        """--max-instances 2: twenty engines (two at a time, each under a new address, as restarted pods) join
        and leave; without reuse the third would get 507."""
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(router([], [d], "--handoff", "none", "--admin-key", KEY, "--max-instances", "2",
                              "--health-interval-ms", "0"))
        self.assertEqual((slots(r, "active"), slots(r, "draining"), slots(r, "free")), (1, 0, 1))
        for k in range(20):
            port = 20000 + k
            st, _, body = add(r, port)
            self.assertEqual(st, 201, (k, body))
            self.assertEqual(remove(r, port)[0], 200)
        self.assertEqual((slots(r, "active"), slots(r, "draining"), slots(r, "free")), (1, 0, 1))
        self.assertEqual(metric(r.port, 'xpyd_rank_slot_reuses_total{role="decode"}'), 19)
        self.assertGreater(metric(r.port, "xpyd_endpoint_slot_reuses_total"), 0)
        self.assertEqual(metric(r.port, 'xpyd_endpoint_slots{state="used"}'), 2)  # d's and the last one's
        # the pool still serves, and a full pool of active ranks is still refused
        self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 200)
        self.assertEqual(add(r, 30001)[0], 201)
        st, _, body = add(r, 30002)
        self.assertEqual(st, 507, body)
        self.assertIn("--max-instances 2", json.loads(body)["error"]["message"])

    def test_a_slot_with_a_request_in_flight_is_not_reused(self):
        slow = self.start(sim("--role", "decode", "--decode-us-per-token", "20000"))
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(router([], [slow], "--handoff", "none", "--admin-key", KEY, "--max-instances", "2",
                              "--health-interval-ms", "0"))
        s = Stream(r.port, "/v1/completions", stream_body(60))  # ~1.2 s on the slow engine
        wait_until(lambda: slots(r, "active") == 1 and metric(r.port, "xpyd_active_requests") == 1,
                   what="the stream running")
        self.assertEqual(remove(r, slow.port)[0], 200)
        self.assertEqual(add(r, d.port)[0], 201)  # the second, never used slot
        self.assertEqual((slots(r, "active"), slots(r, "draining"), slots(r, "free")), (1, 1, 0))
        st, _, body = add(r, 20001)
        self.assertEqual(st, 507, body)  # the draining slot is not given away
        events = s.read_all()
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(s.status, 200)
        wait_until(lambda: slots(r, "draining") == 0, what="the slot drained")
        self.assertEqual(add(r, 20001)[0], 201)  # now it is
        self.idle(r)

    def test_a_reused_endpoint_reaches_the_new_engine(self):
        """An endpoint slot given to a new address: the router's pooled keep-alive connections to the old one are
        not used for it (they would send the new engine's requests to the old engine)."""
        a = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        b = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        c = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(router([], [a], "--handoff", "none", "--admin-key", KEY, "--max-instances", "1",
                              "--threads", "1", "--health-interval-ms", "0"))
        for _ in range(3):  # keep-alive connections to a, pooled
            self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 200)
        self.assertEqual(served(a), 3)
        self.assertEqual(remove(r, a.port)[0], 200)
        self.assertEqual(add(r, b.port)[0], 201)  # a's rank slot; a new endpoint slot (a's is still referred to)
        self.assertEqual(remove(r, b.port)[0], 200)
        self.assertEqual(add(r, c.port)[0], 201)  # the rank slot again, and a's endpoint slot, now free
        self.assertEqual(metric(r.port, "xpyd_endpoint_slot_reuses_total"), 1)
        for _ in range(3):
            self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 200)
        self.assertEqual((served(a), served(b), served(c)), (3, 0, 3))
        st, _, body = request(r.port, "GET", "/admin/instances", headers=AUTH)
        live = [(i["port"], i["removed"]) for i in json.loads(body)["decode"]]
        self.assertEqual(live, [(c.port, False)])
        self.idle(r)

    def test_per_rank_counters_start_from_zero(self):
        bad = self.start(sim("--role", "decode", "--status-code", "500"))
        d = self.start(sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(router([], [bad], "--handoff", "none", "--admin-key", KEY, "--max-instances", "1",
                              "--health-interval-ms", "0", "--max-retries", "0"))
        self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 500)  # the engine's own, passed through
        key = 'xpyd_instance_errors_total{role="decode",engine="127.0.0.1:%d",dp_rank="0",cause="status"}'
        self.assertEqual(metric(r.port, key % bad.port), 1)
        self.assertEqual(remove(r, bad.port)[0], 200)
        self.assertEqual(add(r, d.port)[0], 201)
        self.assertEqual(post_json(r.port, "/v1/completions", BODY)[0], 200)
        self.assertEqual(metric(r.port, key % d.port), 0)
        self.assertEqual(metric(r.port, 'xpyd_instance_selected_total{role="decode",engine="127.0.0.1:%d",dp_rank="0"}'
                                % d.port), 1)


if __name__ == "__main__":
    main()
