# SPDX-License-Identifier: Apache-2.0
"""Bad client input gets a clear 4xx in OpenAI's error shape and is never dispatched; what only the engine
can judge is passed through with the engine's status and error."""
import json

import xpyd_testlib as t

CMPL, stream_body = t.CMPL, t.stream_body


class BadInput(t.TestCase):
    def test_rejected_with_openai_errors(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--max-body-bytes", "4096", "--max-body-keys", "100"))
        cases = [('{"prompt": "a",', 400, "malformed JSON"), ('[1]', 400, "JSON object"),
                 ('{"max_tokens": 3}', 400, "'prompt' is required"),
                 ('{"prompt": "a", "stream": "yes"}', 400, "'stream' must be a boolean"),
                 ('{"prompt": "a", "max_tokens": "x"}', 400, "'max_tokens' must be an integer from 1 to 1000000000000"),
                 ('{"prompt": "a", "max_tokens": 0}', 400, "'max_tokens' must be an integer from 1 to"),
                 ('{"prompt": "a", "max_tokens": -1}', 400, "'max_tokens' must be an integer from 1 to"),
                 ('{"prompt": "a", "max_tokens": 1.5}', 400, "'max_tokens' must be an integer from 1 to"),
                 ('{"prompt": "a", "max_tokens": 1000000000001}', 400, "from 1 to 1000000000000"),
                 ('{"prompt": "a", "max_completion_tokens": 0}', 400, "'max_completion_tokens' must be"),
                 ('{"prompt": "a", %s}' % ", ".join('"k%d": 0' % i for i in range(150)), 400,
                  "too many top-level members (--max-body-keys)")]
        for raw, status, needle in cases:
            st, h, out = t.request(r.port, "POST", "/v1/completions", raw)
            self.assertOpenAIError(st, json.loads(out), status, needle)
            self.assertEqual(h["content-type"], "application/json")
        st, _, out = t.request(r.port, "POST", "/v1/chat/completions", '{"messages": []}')
        self.assertOpenAIError(st, json.loads(out), 400, "'messages'")
        st, _, out = t.request(r.port, "GET", "/v1/completions")
        self.assertEqual(st, 405)
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                                 headers={"Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(st, 200, out)
        # nothing was dispatched for the rejected ones
        self.assertEqual(t.metric(p.port, "xpyd_sim:requests_total"), 1)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="bad_request"}'), 12)
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="method_not_allowed"}'), 1)
        self.idle(r)

    def test_duplicate_keys_read_as_the_engine_reads_them(self):
        # Python's json (the engines) keeps the last of a duplicated key; the router must act on the same
        # value, and must not leave a second max_tokens/stream in the prefill's body
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        raw = '{"prompt": "a b", "max_tokens": 50, "stream": true, "max_tokens": 3, "stream": false}'
        st, _, out = t.request(r.port, "POST", "/v1/completions", raw)
        self.assertEqual(st, 200, out)
        out = json.loads(out)  # not streamed: the last "stream" won
        self.assertEqual(out["usage"]["completion_tokens"], 3)
        self.assertEqual(t.metric(p.port, "vllm:generation_tokens_total"), 1)

    def test_engine_rejection_passed_through(self):
        p = self.start(t.sim("--role", "prefill", "--max-model-len", "16"))
        d = self.start(t.sim("--role", "decode", "--max-model-len", "16"))
        r = self.start(t.router([p.port], [d.port]))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b c", "min_tokens": 5, "max_tokens": 2})
        # the prefill leg gets max_tokens 1 without min_tokens; the decode judges the original body
        self.assertOpenAIError(st, out, 400, "min_tokens must be less than or equal")
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b c", "model": "other"})
        self.assertOpenAIError(st, out, 404, "does not exist")
        self.idle(r)
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 1)  # min_tokens case: prefill ran

    def test_number_arrays_read_as_python_reads_them(self):
        # the router reads arrays of plain integers (token ids) in a fast loop: what it accepts must stay what
        # Python's json (the engines' parser) accepts, element by element, on fresh and keep-alive connections
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        arrays = ["[0]", "[01]", "[00]", "[0,1]", "[0 ,1]", "[1\t,\n2 ]", "[1,]", "[,1]", "[1 2]", "[1,,2]",
                  "[-0]", "[-1, 2]", "[0.5]", "[1.]", "[.5]", "[1e5]", "[1E+5, 2]", "[1e]", "[+1]", "[0x1]",
                  "[1, 2, \"a\"]", "[1, 2, [3]]", "[[1, 2], [03]]", "[99999999999999999999999]", "[1, 2",
                  "[1, 2]]", "[ ]", "[1, -]", "[1,\u00a02]", "[01, 2]", "[1, 007, 2]", "[0.5, 1]", "[1 2, 3]",
                  "[1,\t\r\n 2]", "[" + "7, " * 300 + "7]", "[" + "7, " * 300 + "07, 7]"]
        c = t.RawConn(r.port)
        for a in arrays:
            raw = '{"prompt": %s, "max_tokens": 1}' % a
            try:
                json.loads(raw)
                python_accepts = True
            except ValueError:
                python_accepts = False
            for keep_alive in (False, True):
                if keep_alive:
                    body = raw.encode()
                    c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    st, _, _, out = c.response()
                else:
                    st, _, out = t.request(r.port, "POST", "/v1/completions", raw)
                with self.subTest(array=a[:40], keep_alive=keep_alive):
                    self.assertEqual(st == 400 and b"malformed JSON" in out, not python_accepts, out)
        c.close()
        self.idle(r)


if __name__ == "__main__":
    t.main()
