"""GET /v1/models: the first healthy engine's answer passed through unchanged (decode ranks first, `root`
and every field kept), HEAD answered without a body; 502 in OpenAI's shape when no engine answers."""
import json

import xpyd_testlib as t


class Models(t.TestCase):
    def test_pass_through(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        st, h, body = t.request(r.port, "GET", "/v1/models")
        direct = t.request(d.port, "GET", "/v1/models")[2]
        self.assertEqual((st, h["content-type"]), (200, "application/json"))
        self.assertEqual(json.loads(body), json.loads(direct))
        self.assertEqual(json.loads(body)["data"][0]["root"], json.loads(direct)["data"][0]["root"])

    def test_no_engine_answers_502(self):
        r = self.start(t.router(["127.0.0.1:%d" % t.free_port()], ["127.0.0.1:%d" % t.free_port()],
                                "--health-interval-ms", "0"))
        st, _, body = t.request(r.port, "GET", "/v1/models")
        self.assertOpenAIError(st, json.loads(body), 502, "/v1/models")


if __name__ == "__main__":
    t.main()
