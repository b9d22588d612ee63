# SPDX-License-Identifier: Apache-2.0
"""GET /v1/models: the first healthy engine's answer passed through unchanged (decode ranks first, `root`
and every field kept), HEAD answered without a body; 502 in OpenAI's shape when no engine answers."""
import json
import time

import xpyd_testlib as t


class Models(t.TestCase):
    def test_pass_through(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        t0 = int(time.time())
        st, h, body = t.request(r.port, "GET", "/v1/models")
        direct = t.request(d.port, "GET", "/v1/models")[2]
        t1 = int(time.time())
        self.assertEqual((st, h["content-type"]), (200, "application/json"))
        got, want = json.loads(body), json.loads(direct)
        # "created" is the second the engine answered (as vLLM stamps it): the two reads may straddle a second
        for m in got["data"] + want["data"]:
            self.assertTrue(t0 <= m.pop("created") <= t1, m)
        self.assertEqual(got, want)
        self.assertEqual(got["data"][0]["root"], want["data"][0]["root"])

    def test_no_engine_answers_502(self):
        r = self.start(t.router(["127.0.0.1:%d" % t.free_port()], ["127.0.0.1:%d" % t.free_port()],
                                "--health-interval-ms", "0"))
        st, _, body = t.request(r.port, "GET", "/v1/models")
        self.assertOpenAIError(st, json.loads(body), 502, "/v1/models")


if __name__ == "__main__":
    t.main()
