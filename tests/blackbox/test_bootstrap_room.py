# SPDX-License-Identifier: Apache-2.0
"""SGLang bootstrap with internal DP on the prefill: the room the router writes satisfies room % dp == the
rank it pinned with X-data-parallel-rank (SGLang picks the rank from the room), exactly as a 63-bit integer,
fresh per request, and the same room, host and port go to both legs."""
import json

import xpyd_testlib as t


def engine(prefill=None):
    """A fake SGLang engine; a decode (prefill given) answers only once the prefill has the request's room, as
    SGLang's decode waits for the prefill's KV (so the router never has the answer before the prefill its leg)."""
    def handler(method, path, body):
        if path == "/health":
            return 200, "application/json", b"{}"
        if prefill is not None:
            room = json.loads(body)["bootstrap_room"]
            t.wait_until(lambda: any(p != "/health" and json.loads(b)["bootstrap_room"] == room
                                     for _, p, b in list(prefill.requests)), what="the prefill's leg")
        return 200, "application/json", json.dumps({"id": "x", "object": "text_completion", "model": "m",
                                                    "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
                                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                              "total_tokens": 2}}).encode()
    return t.FakeEngine(handler)


class BootstrapRoom(t.TestCase):
    def test_room_mod_dp_is_the_rank(self):
        pe = engine()
        de = engine(prefill=pe)
        self.addCleanup(pe.stop)
        self.addCleanup(de.stop)
        r = self.start(t.router(["127.0.0.1:%d" % pe.port], ["127.0.0.1:%d" % de.port], "--handoff", "bootstrap",
                                "--prefill-dp", "4", "--dp-mode", "internal", "--prefill-bootstrap-port", "8998"))
        for _ in range(12):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            self.assertEqual(st, 200, out)
        legs = [(rq, h) for rq, h in zip(pe.requests, pe.headers) if rq[1] != "/health"]
        self.assertEqual(len(legs), 12)
        rooms, ranks = set(), set()
        for (method, path, body), h in legs:
            hl = {k.lower(): v for k, v in h.items()}
            rank = int(hl["x-data-parallel-rank"])
            room_text = body.split(b'"bootstrap_room":', 1)[1].split(b",", 1)[0].split(b"}", 1)[0]
            room = int(room_text)  # written as an exact integer, not a double
            self.assertLess(room, 2 ** 63)
            self.assertEqual(room % 4, rank, (room, rank))
            rooms.add(room)
            ranks.add(rank)
        self.assertEqual(len(rooms), 12)   # fresh per request
        self.assertGreater(len(ranks), 1)  # the prefill's ranks share the load
        decode_rooms = {json.loads(b)["bootstrap_room"] for (m, p, b) in de.requests if p != "/health"}
        self.assertEqual(len(decode_rooms), 12)

    def test_external_dp_ranks_each_have_their_bootstrap_port(self):
        """SGLang with external DP: each prefill rank is a server of its own with its own bootstrap server on the
        base port + rank (as scripts/launch_engine.sh starts them). The decode of a request served by rank 1 must
        be sent to rank 1's bootstrap port: rank 0's does not know that room (xpyd_sim's ranks hold their own
        rooms, as SGLang's do), so a router giving every rank the same port fails half the requests."""
        port, boot = t.free_port_range(2), t.free_port_range(2)
        p = self.start(t.Proc("xpyd_sim", ["--port", str(port), "--role", "prefill", "--handoff", "bootstrap",
                                           "--dp-size", "2", "--bootstrap-port", str(boot), "--log-level", "warn"],
                              port_flag=False))
        t.wait_until(lambda: t.request(port + 1, "GET", "/health")[0] == 200, what="both prefill ranks up")
        d = self.start(t.sim("--role", "decode", "--handoff", "bootstrap", "--decode-us-per-token", "0"))
        r = self.start(t.router(["127.0.0.1:%d" % port], [d], "--handoff", "bootstrap", "--prefill-dp", "2",
                                "--prefill-bootstrap-port", str(boot), "--max-retries", "0", "--health-interval-ms", "0"))
        s = t.status(r.port)
        self.assertEqual([(i["port"], i["dp_rank"]) for i in s["pools"]["prefill"]["instances"]],
                         [(port, -1), (port + 1, -1)])
        for _ in range(8):
            st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b c", "max_tokens": 3})
            self.assertEqual(st, 200, out)
        served = [t.metric(port + k, "xpyd_sim:requests_total") for k in (0, 1)]
        self.assertTrue(all(n > 0 for n in served), served)  # both ranks took requests
        self.idle(r)


if __name__ == "__main__":
    t.main()
