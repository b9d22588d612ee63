# SPDX-License-Identifier: Apache-2.0
"""1,000 concurrent streams through one router without an error; a burst of connections opened faster than the
workers take them is served whole (none reset); every load returns to zero."""
import asyncio
import collections
import json
import resource
import socket

import xpyd_testlib as t

N = 1000
TOKENS = 16


async def one(port, i, results):
    body = json.dumps({"prompt": "w%d x y" % i, "max_tokens": TOKENS, "stream": True, "ignore_eos": True})
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        await w.drain()
        data = await asyncio.wait_for(r.read(), timeout=120)
        w.close()
    except (OSError, asyncio.TimeoutError) as e:  # counted as a wrong stream, with its reason
        results[i] = (type(e).__name__, str(e)[:80], False)
        return
    head, _, rest = data.partition(b"\r\n\r\n")
    results[i] = ((head.split(b" ") + [b""])[1], rest.count(b'"text":" '), b"data: [DONE]" in rest)


async def run(port):
    results = {}
    await asyncio.gather(*(one(port, i, results) for i in range(N)))
    return results


class Concurrency(t.TestCase):
    def test_thousand_streams(self):
        p = self.start(t.sim("--role", "prefill", "--prefill-us-per-token", "0"))
        d = self.start(t.sim("--role", "decode", "--max-batch", "2000", "--decode-us-per-token", "20000"))
        r = self.start(t.router([p.port], [d.port]))
        results = asyncio.run(run(r.port))
        bad = {i: v for i, v in results.items() if v != (b"200", TOKENS, True)}
        self.assertEqual(len(results), N)
        # on a failure: how many went wrong and how, a few examples, and what the router said (compact: a
        # thousand-entry dict diff hides the cause)
        self.assertEqual(len(bad), 0, "%d of %d streams wrong: %s; e.g. %s\nrouter log:\n%s" % (
            len(bad), N, collections.Counter(bad.values()).most_common(5), list(bad.items())[:3], r.output()[-3000:]))
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_active"), 0)
        self.assertEqual(t.metric(r.port, 'xpyd_requests_total{endpoint="/v1/completions",status="200"}'), N)

    def test_a_burst_of_connections_is_served_not_reset(self):
        # BURST connections opened and their requests written before the router answers any: they wait in the
        # listen queue while the one worker is busy. libevhtp's accept thread handed each to the worker through a
        # socket pair holding a few hundred and reset the rest (here 1,125 of 3,000 when this test was written).
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < BURST + 100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, BURST + 100), hard))
        n = min(BURST, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 100)
        self.assertGreaterEqual(n, 1000, "too few descriptors for the test")
        p = self.start(t.sim("--role", "prefill", "--prefill-us-per-token", "0"))
        d = self.start(t.sim("--role", "decode", "--decode-us-per-token", "0"))
        r = self.start(t.router([p.port], [d.port], "--threads", "1"))
        body = json.dumps({"prompt": "a b", "max_tokens": 2}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        socks, outcomes = [], collections.Counter()
        try:
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", r.port), timeout=60)
                socks.append(s)
                s.sendall(req)
            for s in socks:
                data, e = t.read_to_close(s)
                outcomes[type(e).__name__ if e else
                         data.split(b" ", 2)[1] if data.startswith(b"HTTP/1.1 ") else b"no answer"] += 1
        finally:
            for s in socks:
                s.close()
        self.assertEqual(outcomes, {b"200": n}, "router log:\n%s" % r.output()[-2000:])
        t.wait_until(lambda: t.router_idle(r.port), what="router idle")
        self.assertEqual(t.metric(r.port, 'xpyd_requests_total{endpoint="/v1/completions",status="200"}'), n)
        t.wait_until(lambda: t.metric(r.port, "xpyd_client_connections") <= 1, what="connections closed")  # the scrape's own


BURST = 3000

if __name__ == "__main__":
    t.main()
