# SPDX-License-Identifier: Apache-2.0
"""Least outstanding tokens, end to end: with one long decode in flight on one rank the next request goes
to an idle rank; with every rank busy it goes to the least loaded one; /status ends at zero everywhere."""
import xpyd_testlib as t


def decode_of(r_port, d_ports):
    inst = t.status(r_port)["pools"]["decode"]["instances"]
    return {d: i["outstanding_tokens"] for d, i in zip(d_ports, inst)}


class LeastOutstandingTokens(t.TestCase):
    def test_placement(self):
        p = self.start(t.sim("--role", "prefill"))
        ds = [self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000")) for _ in range(2)]
        ports = [d.port for d in ds]
        r = self.start(t.router([p.port], ports))
        long_ = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 400, "stream": True})
        next(long_.events())
        loads = decode_of(r.port, ports)
        busy = max(loads, key=loads.get)
        idle = min(loads, key=loads.get)
        self.assertEqual(loads[idle], 0)
        short = t.Stream(r.port, "/v1/completions", {"prompt": "b", "max_tokens": 50, "stream": True})
        next(short.events())
        self.assertEqual(t.metric(idle, "xpyd_sim:requests_total"), 1)  # the idle rank took it
        # both busy now (400-ish vs 50-ish outstanding): the next one goes to the least loaded
        third = t.Stream(r.port, "/v1/completions", {"prompt": "c", "max_tokens": 5, "stream": True})
        next(third.events())
        self.assertEqual(t.metric(idle, "xpyd_sim:requests_total"), 2)
        self.assertEqual(t.metric(busy, "xpyd_sim:requests_total"), 1)
        for s in (third, short):
            self.assertEqual(s.read_all()[-1], "[DONE]")
        long_.close()
        t.wait_until(lambda: t.router_idle(r.port), what="zero outstanding everywhere")


if __name__ == "__main__":
    t.main()
