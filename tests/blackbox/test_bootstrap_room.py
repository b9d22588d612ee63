"""SGLang bootstrap with internal DP on the prefill: the room the router writes satisfies room % dp == the
rank it pinned with X-data-parallel-rank (SGLang picks the rank from the room), exactly as a 63-bit integer,
fresh per request, and the same room, host and port go to both legs."""
import json

import xpyd_testlib as t


def engine():
    def handler(method, path, body):
        if path == "/health":
            return 200, "application/json", b"{}"
        return 200, "application/json", json.dumps({"id": "x", "object": "text_completion", "model": "m",
                                                    "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
                                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                              "total_tokens": 2}}).encode()
    return t.FakeEngine(handler)


class BootstrapRoom(t.TestCase):
    def test_room_mod_dp_is_the_rank(self):
        pe, de = engine(), engine()
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


if __name__ == "__main__":
    t.main()
