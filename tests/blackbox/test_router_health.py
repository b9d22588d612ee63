# SPDX-License-Identifier: Apache-2.0
"""Active health checks and engine feedback: a dead instance is taken out after --health-fall failed
checks and brought back after --health-rise passes (each transition logged once as a structured line);
/health turns 503 when a pool has nothing usable; scraped engine load steers new requests away."""
import xpyd_testlib as t


def decode_states(port):
    return [i["healthy"] for i in t.status(port)["pools"]["decode"]["instances"]]


class UpstreamDown(t.TestCase):
    def test_dead_decode_ejected_and_readmitted(self):
        p = self.start(t.sim("--role", "prefill"))
        good = self.start(t.sim("--role", "decode"))
        port = t.free_port()
        bad = self.start(t.Proc("xpyd_sim", ["--role", "decode", "--port", str(port), "--log-level", "warn"],
                                port_flag=False))
        t.wait_until(lambda: t.request(port, "GET", "/health")[0] == 200, what="bad up")
        r = self.start(t.router([p.port], [good.port, port], "--health-interval-ms", "100"))
        self.assertEqual(decode_states(r.port), [True, True])
        bad.stop()
        t.wait_until(lambda: decode_states(r.port) == [True, False], what="ejected")
        m = t.metrics(r.port)
        self.assertEqual(m['xpyd_instance_healthy{role="decode",engine="127.0.0.1:%d",dp_rank="0"}' % port], 0)
        for _ in range(6):  # every request lands on the healthy one, without a retry
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="decode"}'), 0)
        back = self.start(t.Proc("xpyd_sim", ["--role", "decode", "--port", str(port), "--log-level", "warn"],
                                 port_flag=False))
        t.wait_until(lambda: decode_states(r.port) == [True, True], what="readmitted")
        self.assertEqual(t.metric(r.port, "xpyd_health_transitions_total"), 2)
        r.stop()
        lines = [l for l in r.output().splitlines() if "event=health_transition" in l]
        self.assertEqual(len(lines), 2)
        self.assertIn("endpoint=127.0.0.1:%d state=down" % port, lines[0])
        self.assertIn("state=up", lines[1])

    def test_health_503_when_pool_down(self):
        p = self.start(t.sim("--role", "prefill"))
        port = t.free_port()
        d = self.start(t.Proc("xpyd_sim", ["--role", "decode", "--port", str(port), "--log-level", "warn"],
                              port_flag=False))
        t.wait_until(lambda: t.request(port, "GET", "/health")[0] == 200, what="decode up")
        r = self.start(t.router([p.port], [port], "--health-interval-ms", "100", "--health-fall", "2"))
        self.assertEqual(t.request(r.port, "GET", "/health")[0], 200)
        d.stop()
        t.wait_until(lambda: t.request(r.port, "GET", "/health")[0] == 503, what="503")
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a"})
        self.assertOpenAIError(st, out, 503, "no healthy decode instance")
        self.assertEqual(t.metric(r.port, 'xpyd_request_errors_total{reason="no_decode_available"}'), 1)


class Feedback(t.TestCase):
    def test_scraped_queue_steers_away(self):
        p = self.start(t.sim("--role", "prefill"))
        busy = self.start(t.sim("--role", "decode", "--max-batch", "1", "--decode-us-per-token", "20000"))
        idle = self.start(t.sim("--role", "decode"))
        # load the first decode behind the router's back: 1 running, 3 waiting
        direct = [t.Stream(busy.port, "/v1/completions", {"prompt": "x", "max_tokens": 200, "stream": True},
                           lazy=True) for _ in range(4)]
        t.wait_until(lambda: t.metric(busy.port, "vllm:num_requests_waiting") == 3, what="queue")
        r = self.start(t.router([p.port], [busy.port, idle.port], "--scrape-interval-ms", "50"))
        t.wait_until(lambda: t.status(r.port)["pools"]["decode"]["instances"][0]["feedback_tokens"] > 0,
                     what="feedback read")
        for _ in range(6):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(idle.port, "xpyd_sim:requests_total"), 6)
        self.assertEqual(t.metric(busy.port, "xpyd_sim:requests_total"), 4)
        for s in direct:
            s.close()

    def test_running_requests_blend_when_weighted(self):
        p = self.start(t.sim("--role", "prefill"))
        busy = self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000"))
        idle = self.start(t.sim("--role", "decode"))
        direct = [t.Stream(busy.port, "/v1/completions", {"prompt": "x", "max_tokens": 200, "stream": True},
                           lazy=True) for _ in range(3)]  # running, nothing waiting
        t.wait_until(lambda: t.metric(busy.port, "vllm:num_requests_running") == 3, what="running")
        r = self.start(t.router([p.port], [busy.port, idle.port], "--scrape-interval-ms", "50",
                                "--feedback-waiting-tokens", "0", "--feedback-kv-tokens", "0",
                                "--feedback-running-tokens", "1000"))
        t.wait_until(lambda: t.status(r.port)["pools"]["decode"]["instances"][0]["feedback_tokens"] == 3000,
                     what="running requests read")
        for _ in range(4):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})
            self.assertEqual(st, 200, out)
        self.assertEqual(t.metric(idle.port, "xpyd_sim:requests_total"), 4)
        for s in direct:
            s.close()

    def test_without_feedback_load_is_only_the_routers(self):
        p = self.start(t.sim("--role", "prefill"))
        busy = self.start(t.sim("--role", "decode", "--max-batch", "1", "--decode-us-per-token", "20000"))
        idle = self.start(t.sim("--role", "decode"))
        direct = [t.Stream(busy.port, "/v1/completions", {"prompt": "x", "max_tokens": 200, "stream": True},
                           lazy=True) for _ in range(2)]
        t.wait_until(lambda: t.metric(busy.port, "vllm:num_requests_waiting") == 1, what="queue")
        r = self.start(t.router([p.port], [busy.port, idle.port], "--max-retries", "0"))
        sent = [t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2, "stream": True}, lazy=True)
                for _ in range(2)]
        # ties rotate: one of the two went to the busy engine (the router cannot know it is busy)
        t.wait_until(lambda: t.metric(busy.port, "xpyd_sim:requests_total") == 3, what="rotated onto busy")
        for s in direct + sent:
            s.close()


if __name__ == "__main__":
    t.main()
