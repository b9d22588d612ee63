# SPDX-License-Identifier: Apache-2.0
"""Runtime membership through the admin API: a separate admin key guards it (the client API key does not
open it; no admin key configured: 403); POST /admin/instances adds (then revives) instances that take
traffic at once; DELETE /admin/instances/<role>/<host>:<port> stops new requests to one while its streams in
flight finish; bad input gets 400 in OpenAI's shape; load returns to zero."""
import json
import threading

import xpyd_testlib as t

ADMIN = {"Authorization": "Bearer adm-secret"}
CLIENT = {"Authorization": "Bearer cli-secret"}


def admin(port, method, path, body=None, headers=ADMIN):
    st, h, out = t.request(port, method, path, body, headers)
    return st, json.loads(out) if out else None


class AdminApi(t.TestCase):
    def setUp(self):
        super().setUp()
        self.p = self.start(t.sim("--role", "prefill"))
        self.d1 = self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000"))
        self.d2 = self.start(t.sim("--role", "decode"))
        self.r = self.start(t.router([self.p.port], [self.d1.port], "--admin-key", "adm-secret", "--api-key",
                                     "cli-secret", "--decode-policy", "rr"))

    def gen(self, n=1):
        for _ in range(n):
            st, _, out = t.post_json(self.r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2}, headers=CLIENT)
            self.assertEqual(st, 200, out)

    def decodes_listed(self):
        return sorted(i["port"] for i in t.request_json_status(self.r.port, CLIENT)["pools"]["decode"]["instances"])

    def test_pool_full_507(self):
        r = self.start(t.router([self.p.port], [self.d1.port], "--admin-key", "adm-secret", "--max-instances", "2"))
        st, out = admin(r.port, "POST", "/admin/instances", {"role": "decode", "host": "127.0.0.1",
                                                               "port": self.d2.port})
        self.assertIn(st, (200, 201), out)
        st, out = admin(r.port, "POST", "/admin/instances", {"role": "decode", "host": "127.0.0.1",
                                                               "port": t.free_port()})
        self.assertOpenAIError(st, out, 507, "max-instances")
        self.assertEqual(len(t.status(r.port)["pools"]["decode"]["instances"]), 2)

    def test_keys(self):
        st, out = admin(self.r.port, "GET", "/admin/instances", headers={})
        self.assertOpenAIError(st, out, 401, "admin key")
        st, out = admin(self.r.port, "GET", "/admin/instances", headers=CLIENT)
        self.assertOpenAIError(st, out, 401, "admin key")
        st, out = admin(self.r.port, "GET", "/admin/instances")
        self.assertEqual(st, 200, out)
        self.assertEqual([i["port"] for i in out["decode"]], [self.d1.port])
        self.assertNotIn("adm-secret", self.r.output())

    def test_off_without_admin_key(self):
        r = self.start(t.router([self.p.port], [self.d1.port]))
        st, out = admin(r.port, "GET", "/admin/instances")
        self.assertOpenAIError(st, out, 403, "--admin-key")

    def test_add_remove_revive(self):
        # a stream in flight on d1 survives d1's removal; with no decode left, new requests get 503
        results = {}
        stream = t.Stream(self.r.port, "/v1/completions", {"prompt": "a", "max_tokens": 30, "stream": True},
                          headers=CLIENT)
        th = threading.Thread(target=lambda: results.setdefault("p", stream.read_all()))
        th.start()
        t.wait_until(lambda: t.metric(self.d1.port, "vllm:num_requests_running") == 1, what="stream running")
        st, out = admin(self.r.port, "DELETE", "/admin/instances/decode/127.0.0.1:%d" % self.d1.port)
        self.assertEqual(st, 200, out)
        self.assertEqual(len(out["removed"]), 1)
        st, _, out = t.post_json(self.r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2}, headers=CLIENT)
        self.assertOpenAIError(st, out, 503, "no healthy decode")
        th.join()
        self.assertEqual(results["p"][-1], "[DONE]")
        self.assertEqual(len(t.content_events(results["p"])), 30)
        self.assertEqual(self.decodes_listed(), [])
        st, out = admin(self.r.port, "DELETE", "/admin/instances/decode/127.0.0.1:%d" % self.d1.port)
        self.assertOpenAIError(st, out, 404, "no such")

        body = {"role": "decode", "host": "127.0.0.1", "port": self.d2.port}
        st, out = admin(self.r.port, "POST", "/admin/instances", body)
        self.assertEqual(st, 201, out)
        self.assertEqual(out["instances"][0]["result"], "added")
        st, out = admin(self.r.port, "POST", "/admin/instances", dict(body, weight=2))
        self.assertEqual((st, out["instances"][0]["result"], out["instances"][0]["weight"]), (200, "updated", 2))
        before = t.metric(self.d1.port, "xpyd_sim:requests_total")
        self.gen(4)
        self.assertEqual(t.metric(self.d2.port, "xpyd_sim:requests_total"), 4)  # traffic at once, none to d1
        self.assertEqual(t.metric(self.d1.port, "xpyd_sim:requests_total"), before)
        self.assertEqual(self.decodes_listed(), [self.d2.port])

        st, out = admin(self.r.port, "POST", "/admin/instances", {"role": "decode", "host": "127.0.0.1",
                                                                  "port": self.d1.port})
        self.assertEqual((st, out["instances"][0]["result"]), (201, "revived"))
        self.gen(4)
        self.assertGreater(t.metric(self.d1.port, "xpyd_sim:requests_total"), before)
        self.assertEqual(self.decodes_listed(), sorted([self.d1.port, self.d2.port]))
        t.wait_until(lambda: t.router_idle(self.r.port, CLIENT), what="router load back to zero")

    def test_bad_input(self):
        good = '{"role": "decode", "host": "127.0.0.1", "port": %d}' % self.d2.port
        cases = [("not json", "not valid JSON: invalid JSON value at byte 0"), ("[1]", "must be a JSON object"),
                 ("", "the body is empty"),
                 (good + " x", "not valid JSON: unexpected data after the JSON value at byte %d" % (len(good) + 1)),
                 (good + "{}", "unexpected data after the JSON value"),
                 (good[:-1] + ', "wieght": 2}', "unknown field 'wieght' (known:"),
                 (good[:-1] + ', "weight": NaN}', "not valid JSON"),
                 ({"role": "x", "host": "h", "port": 1}, "'role'"),
                 ({"role": "decode", "port": 1}, "'host'"), ({"role": "decode", "host": "h"}, "'port'"),
                 ({"role": "decode", "host": "h", "port": 70000}, "'port'"),
                 ({"role": "decode", "host": "127.0.0.1", "port": 1, "dp": 0}, "'dp'"),
                 ({"role": "decode", "host": "no-such-host.invalid", "port": 1}, "resolve"),
                 # what cannot name an engine and would land in Host headers, logs and JSON as something else
                 ({"role": "decode", "host": "127.0.0.1\r\nX-Evil: 1", "port": 1}, "'host' must be a host name"),
                 ({"role": "decode", "host": "a\"b", "port": 1}, "'host' must be a host name"),
                 ('{"role": "decode", "host": "a\\ud800", "port": 1}', "'host' must be a host name"),
                 ({"role": "decode", "host": "[::1]", "port": 1}, "'host' must be a host name")]
        for body, needle in cases:
            st, out = admin(self.r.port, "POST", "/admin/instances", body)
            self.assertOpenAIError(st, out, 400, needle)
        self.assertEqual(self.decodes_listed(), [self.d1.port])  # nothing was added by any of them
        # a repeated key reads as its last occurrence, as in client bodies (Python's json)
        st, out = admin(self.r.port, "POST", "/admin/instances",
                        '{"role": "prefill", "host": "127.0.0.1", "port": 1, "role": "decode", "port": %d}'
                        % self.d2.port)
        self.assertEqual((st, out["instances"][0]["result"]), (201, "added"), out)
        self.assertEqual(self.decodes_listed(), sorted([self.d1.port, self.d2.port]))
        st, out = admin(self.r.port, "DELETE", "/admin/instances/decode/nonsense")
        self.assertOpenAIError(st, out, 400, "DELETE")
        st, out = admin(self.r.port, "PUT", "/admin/instances")
        self.assertOpenAIError(st, out, 405, "")


if __name__ == "__main__":
    t.main()
