# SPDX-License-Identifier: Apache-2.0
"""--api-key / XPYD_API_KEY: every client endpoint but /health and /metrics needs Authorization: Bearer <key>
(401 in OpenAI's shape otherwise); the key never shows up in the router's output."""
import json

import xpyd_testlib as t

KEY = "sk-xpyd-test-4f1c9e"


class ApiKey(t.TestCase):
    def check(self, r):
        for method, path, body in [("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}),
                                   ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}),
                                   ("GET", "/v1/models", None), ("GET", "/status", None)]:
            for auth in (None, "Bearer wrong", "Bearer " + KEY[:-1], "Basic " + KEY):
                h = {"Authorization": auth} if auth else {}
                st, hdr, out = t.request(r.port, method, path, body, headers=h)
                self.assertOpenAIError(st, json.loads(out), 401, "API key")
                self.assertEqual(hdr.get("www-authenticate"), "Bearer")
            st, _, out = t.request(r.port, method, path, body, headers={"Authorization": "Bearer " + KEY})
            self.assertEqual(st, 200, out)
        self.assertEqual(t.request(r.port, "GET", "/health")[0], 200)
        self.assertEqual(t.request(r.port, "GET", "/metrics")[0], 200)
        r.stop()
        self.assertNotIn(KEY, r.output())

    def test_flag(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        self.check(self.start(t.router([p.port], [d.port], "--api-key", KEY, "--access-log", "json",
                                       "--log-level", "debug")))

    def test_environment(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        fmt = lambda q: "127.0.0.1:%d" % q
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "debug", "--access-log", "logfmt",
                                              "-p", fmt(p.port), "-d", fmt(d.port)], env={"XPYD_API_KEY": KEY}))
        self.check(r)


if __name__ == "__main__":
    t.main()
