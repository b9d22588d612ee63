# SPDX-License-Identifier: Apache-2.0
"""KV events from engines (issue 40): the sims as publishers, checked independently of the router's code.
 - SimPublisher: what xpyd_sim --kv-events publishes, decoded here with Debian's python3-zmq and python3-msgpack
   (vLLM's framing, both encodings, DP ranks, replay, cache_salt);
 - BindMode: engines that connect to the router (--kv-events-bind) and name themselves by the topic;
 - PreciseEndToEnd: the router's predicted cached tokens against the sims' own block pools (sim_blocks.c)."""
import json
import os
import random
import subprocess
import sys
import threading
import time

try:
    import msgpack
    import zmq
except ImportError:  # Debian's modules: re-run under Debian's interpreter when another one started us
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

import xpyd_testlib as t
from test_kv_events import Pub, batch_map, completion, kv, prompt, stored_map


class Sub:
    """A subscriber of a sim's events (vLLM's example subscriber, in short): frames, sequence numbers, batches."""

    def __init__(self, ctx, ep):
        self.s = ctx.socket(zmq.SUB)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.s.connect(ep)

    def until(self, pred, timeout=10):
        """Batches received until pred(batch) holds: [(seq, batch), ...]."""
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.s.poll(50):
                continue
            topic, seq, payload = self.s.recv_multipart()
            got.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
            if pred(got[-1][1]):
                return got
        raise AssertionError("no such batch; got %r" % got)


def events_of(batch):
    return batch["events"] if isinstance(batch, dict) else batch[1]


def typ(e):
    return e["type"] if isinstance(e, dict) else e[0]


class SimPublisher(t.TestCase):
    """xpyd_sim --kv-events: what it publishes, checked here by decoding it (not by the router)."""

    def setUp(self):
        super().setUp()
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, linger=0)

    def sim(self, *args, dp=1):
        kvp = t.free_port_range(2 * dp)
        sim = self.start(t.sim("--role", "both", "--prefix-caching", "on", "--kv-events", "tcp://*:%d" % kvp,
                               "--dp-size", str(dp), *args))
        subs = [Sub(self.ctx, "tcp://127.0.0.1:%d" % (kvp + r)) for r in range(dp)]
        for sub in subs:
            self.addCleanup(sub.s.close)
        return sim, subs, kvp

    def connected(self, port, sub, ids, headers=None):
        # a SUB socket hears nothing sent before it connected: requests until one is heard (each a new block: a
        # cached one publishes nothing)
        n = [0]

        def heard():
            n[0] += 1
            completion(port, ids[:-1] + [100000 + n[0]], headers)
            return sub.s.poll(100)
        t.wait_until(heard, what="the subscriber connected")
        sub.until(lambda b: True)
        return n[0]  # blocks stored meanwhile

    def test_stored_removed_and_the_chain(self):
        sim, (sub,), _ = self.sim("--num-gpu-blocks", "14")
        h = self.connected(sim.port, sub, [7] * 16)
        self.assertLessEqual(h, 2, "the test's arithmetic below assumes at most 2 handshake blocks")
        a, b = prompt(1, 165), prompt(2, 165)  # 10 full blocks each, and a tail
        completion(sim.port, a)
        (seq, batch), = sub.until(lambda b: True)
        self.assertIsInstance(batch, dict)
        self.assertEqual(batch["data_parallel_rank"], 0)
        ev, = events_of(batch)
        self.assertEqual((ev["type"], ev["block_size"], ev["parent_block_hash"], ev["medium"]),
                         ("BlockStored", 16, None, "GPU"))
        self.assertEqual(ev["token_ids"], a[:160])
        self.assertEqual(len(ev["block_hashes"]), 10)
        self.assertTrue(all(isinstance(h, bytes) and len(h) == 32 for h in ev["block_hashes"]))
        chain = ev["block_hashes"]
        # the same prefix and more: only the new blocks, chained on the last cached one
        completion(sim.port, a[:160] + prompt(3, 40))
        (seq2, batch), = sub.until(lambda b: True)
        self.assertEqual(seq2, seq + 1)
        ev, = events_of(batch)
        self.assertEqual((ev["parent_block_hash"], ev["token_ids"]), (chain[-1], prompt(3, 32)))
        # 14 blocks, h + 12 cached (the handshake's, a's 10, the 2 new): b's 10 take the free ones, then evict the
        # least recently used: the handshake's, the 2 new, then a's from its end (a request's blocks are freed in
        # reverse, so its last block is evicted first)
        completion(sim.port, b)
        (_, batch), = sub.until(lambda b: True)
        removed = [e["block_hashes"][0] for e in events_of(batch) if typ(e) == "BlockRemoved"]
        self.assertEqual(len(removed), 8 + h)
        self.assertEqual(set(removed) & set(chain), set(chain[4:]))
        self.assertEqual(typ(events_of(batch)[-1]), "BlockStored")
        # usage agrees: a's first 4 blocks are still there
        out = completion(sim.port, a)
        self.assertEqual(out["usage"]["prompt_tokens_details"]["cached_tokens"], 64)
        st, _, _ = t.request(sim.port, "POST", "/reset_prefix_cache")
        self.assertEqual(st, 200)
        sub.until(lambda b: any(typ(e) == "AllBlocksCleared" for e in events_of(b)))
        self.assertEqual(completion(sim.port, a)["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_cache_salt(self):
        # vLLM: the salt is part of the first block's hash, and its BlockStored says so in extra_keys
        sim, (sub,), _ = self.sim()
        self.connected(sim.port, sub, [7] * 16)
        a = prompt(4, 48)

        def salted(salt):
            st, _, out = t.post_json(sim.port, "/v1/completions", {"prompt": a, "max_tokens": 1, "cache_salt": salt})
            self.assertEqual(st, 200, out)
            return out["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.assertEqual(salted("t1"), 0)
        (_, batch), = sub.until(lambda b: True)
        ev, = events_of(batch)
        self.assertEqual((ev["extra_keys"], ev["token_ids"]), ([["t1"], None, None], a))
        self.assertEqual(salted("t1"), 32)  # its own blocks again (all but the last, as vLLM counts)
        self.assertEqual(salted("t2"), 0)  # another tenant's salt: none of them
        self.assertEqual(completion(sim.port, a)["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        st, _, out = t.post_json(sim.port, "/v1/completions", {"prompt": a, "max_tokens": 1, "cache_salt": ""})
        self.assertEqual(st, 400, out)
        self.assertIn("cache_salt", out["error"]["message"])

    def test_sglang_format(self):
        # as SGLang's radix cache publishes: an event a block (page), positional, integer hashes each the next one's
        # parent, the salt after the medium, a BlockRemoved a block
        sim, (sub,), _ = self.sim("--kv-events-format", "sglang", "--block-size", "4", "--num-gpu-blocks", "8")
        self.connected(sim.port, sub, [7] * 4)
        a = prompt(5, 14)  # 3 full pages and a tail
        st, _, out = t.post_json(sim.port, "/v1/completions", {"prompt": a, "max_tokens": 1, "cache_salt": "s1"})
        self.assertEqual(st, 200, out)
        (_, batch), = sub.until(lambda b: True)
        self.assertIsInstance(batch, list)
        evs = events_of(batch)
        self.assertEqual([len(e) for e in evs], [8, 8, 8])
        parent = None
        for i, e in enumerate(evs):
            self.assertEqual((e[0], len(e[1]), e[2], e[3], e[4], e[5], e[6], e[7]),
                             ("BlockStored", 1, parent, a[4 * i:4 * i + 4], 4, None, "GPU", {"cache_salt": "s1"}))
            self.assertIsInstance(e[1][0], int)
            self.assertTrue(-(1 << 63) <= e[1][0] < (1 << 63))
            parent = e[1][0]
        stored = [e[1][0] for e in evs]
        completion(sim.port, prompt(6, 28))  # 7 pages: 8 in all, so some of a's go, one event each
        (_, batch), = sub.until(lambda b: True)
        removed = [e for e in events_of(batch) if typ(e) == "BlockRemoved"]
        self.assertGreater(len(removed), 0)
        self.assertTrue(all(len(e[1]) == 1 and e[2] == "GPU" for e in removed), removed)
        self.assertTrue(set(e[1][0] for e in removed) & set(stored))

    def test_array_format_dp_ranks_and_replay(self):
        rp = t.free_port_range(2)
        sim, subs, _ = self.sim("--kv-events-format", "array", "--kv-events-replay", "tcp://*:%d" % rp,
                                "--kv-events-topic", "kv", "--dp-mode", "internal", dp=2)
        for r, sub in enumerate(subs):
            rank = {"X-data-parallel-rank": str(r)}  # internal DP: one server, ranks by header
            self.connected(sim.port, sub, [9 + r] * 16, rank)
            completion(sim.port, prompt(20 + r, 40), rank)
            (_, batch), = sub.until(lambda b: True)
            self.assertIsInstance(batch, list)
            self.assertEqual(batch[2], r)  # data_parallel_rank
            ev, = batch[1]
            self.assertEqual(ev[:2], ["BlockStored", ev[1]])
            self.assertEqual((ev[3], ev[4], ev[5], ev[6]), (prompt(20 + r, 32), 16, None, "GPU"))
        # replay: everything rank 1 sent from 0, then seq -1 and an empty payload
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect("tcp://127.0.0.1:%d" % (rp + 1))
        d.send_multipart([b"", (0).to_bytes(8, "big")])  # REQ's envelope, as vLLM's example subscriber sends it
        seqs = []
        while True:
            self.assertTrue(d.poll(5000))
            delim, seq, payload = d.recv_multipart()
            self.assertEqual(delim, b"")
            if not payload:
                self.assertEqual(int.from_bytes(seq, "big", signed=True), -1)
                break
            seqs.append(int.from_bytes(seq, "big"))
            msgpack.unpackb(payload)
        self.assertEqual(seqs, list(range(len(seqs))))
        self.assertGreaterEqual(len(seqs), 2)
        d.close()


class BindMode(t.TestCase):
    """--kv-events-bind: engines connect to the router (the sims as vLLM with a connecting endpoint, DP rank r to
    the bound port + r) and name themselves by the topic (HOST:PORT as the router lists them). Prompts the router
    never sent - each engine's own traffic - then draw requests to the rank that holds them."""

    def setUp(self):
        super().setUp()
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, linger=0)

    def test_engines_that_connect_name_themselves(self):
        bind = t.free_port_range(2)
        ep = "tcp://127.0.0.1:%d" % bind
        hp = [t.free_port_range(1) for _ in range(2)]  # the sims' HTTP ports: their topics name them
        ps = [self.start(t.sim("--role", "prefill", "--prefix-caching", "on", "--port", str(hp[0]), "--kv-events", ep,
                               "--kv-events-topic", "127.0.0.1:%d" % hp[0])),
              self.start(t.sim("--role", "prefill", "--prefix-caching", "on", "--port", str(hp[1]), "--kv-events", ep,
                               "--kv-events-topic", "127.0.0.1:%d" % hp[1], "--dp-mode", "internal", "--dp-size", "2"))]
        d = self.start(t.sim("--role", "decode"))
        topo = {"dp-mode": "internal",
                "prefill": {"hosts": [{"host": "127.0.0.1", "port": hp[0]}, {"host": "127.0.0.1", "port": hp[1], "dp": 2}]},
                "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump(topo, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path, "--prefill-policy",
                                              "cache", "--kv-events-bind", ep, "--kv-events-bind-ranks", "2",
                                              "--kv-events-stale-ms", "600000"]))
        ranks = [(ps[0], None), (ps[1], 0), (ps[1], 1)]

        def source(sim, dp):
            return t.metric(r.port, 'xpyd_kv_source_events_total{role="prefill",engine="127.0.0.1:%d",dp_rank="%d"}'
                            % (sim.port, dp or 0), default=0)
        n = [0]
        for sim, dp in ranks[::-1]:  # each rank's own requests (a new block each) until the router hears it (DP
            # rank 1 first: heard first, it is still not taken for rank 0 of its engine)
            hdr = {"X-data-parallel-rank": str(dp)} if dp is not None else None

            def heard():
                n[0] += 1
                completion(sim.port, [7, 7, n[0]] + [0] * 13, hdr)
                return source(sim, dp) > 0
            t.wait_until(heard, what="the router hearing 127.0.0.1:%d rank %s" % (sim.port, dp))
        # each rank computes a prompt of its own, sent to it directly (the router never saw it)
        for k, (sim, dp) in enumerate(ranks):
            hdr = {"X-data-parallel-rank": str(dp)} if dp is not None else None
            before = kv(r.port, "xpyd_kv_index_blocks")
            completion(sim.port, prompt(60 + k, 64), hdr)
            t.wait_until(lambda: kv(r.port, "xpyd_kv_index_blocks") >= before + 4, what="its 4 blocks")
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 3)
        for k in (2, 1, 0, 2, 1, 0):  # through the router: each goes to the rank that holds it (not in rank order)
            sim, dp = ranks[k]
            sel = 'xpyd_instance_selected_total{role="prefill",engine="127.0.0.1:%d",dp_rank="%d"}' % (sim.port, dp or 0)
            was = t.metric(r.port, sel, default=0)
            completion(r.port, prompt(60 + k, 64))
            self.assertEqual(t.metric(r.port, sel, default=0), was + 1, "prompt %d to 127.0.0.1:%d rank %s"
                             % (k, sim.port, dp))
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 6)
        # a publisher that names no engine the router lists: counted, nothing changes
        blocks = kv(r.port, "xpyd_kv_index_blocks")
        pub = self.ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(ep)
        self.addCleanup(pub.close)
        seq = [0]

        def unmatched():
            pub.send_multipart([b"10.9.9.9:1", seq[0].to_bytes(8, "big"),
                                batch_map([stored_map([1, 2], prompt(70, 32))])])
            seq[0] += 1
            return t.metric(r.port, "xpyd_kv_events_unmatched_total", default=0) > 0
        t.wait_until(unmatched, what="an unknown topic counted")
        # a known engine's name on messages of the wrong shape (frames missing, a short sequence number, a fourth
        # frame; random bytes): refused by cause, the rank's blocks kept
        rnd = random.Random(11)
        name = b"127.0.0.1:%d" % ps[0].port
        shape = kv(r.port, "xpyd_kv_events_decode_errors_total", cause="shape")
        for k in range(60):
            junk = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 40)))
            pub.send_multipart([[name], [name, junk], [name, b"\x00" * 7, junk], [name, b"\x00" * 8, junk, junk]][k % 4])
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_decode_errors_total", cause="shape") >= shape + 60,
                     what="60 messages refused")
        self.assertEqual(kv(r.port, "xpyd_kv_index_blocks"), blocks)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

    def test_a_gap_is_replayed_from_the_engines_host(self):
        # an engine that connects still binds its replay socket (vLLM's replay_endpoint "tcp://*:P"): the router
        # asks the engine's host (the topic's) at --kv-events-bind-replay-port + its DP rank for what it missed
        ep, rp = "tcp://127.0.0.1:%d" % t.free_port_range(1), t.free_port_range(1)
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "-p", "127.0.0.1:%d" % p.port,
                                              "-d", "127.0.0.1:%d" % d.port, "--prefill-policy", "cache",
                                              "--kv-events-bind", ep, "--kv-events-bind-replay-port", str(rp),
                                              "--kv-events-stale-ms", "600000"]))
        pub = Pub(self.ctx, replay=True, connect=ep, topic=b"127.0.0.1:%d" % p.port, replay_port=rp)
        self.addCleanup(pub.close)
        t.wait_until(lambda: (pub.send(batch_map([])) or True) and kv(r.port, "xpyd_kv_events_batches_total") > 0,
                     what="the router hearing the engine")
        # (the first messages may have been missed as the connection came up: then it asked for them already)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_replays_total", result="ok") == len(pub.asked),
                     what="any first replay done")
        asked, a = len(pub.asked), prompt(75, 48)
        gaps = kv(r.port, "xpyd_kv_events_gaps_total")
        pub.send(batch_map([stored_map([1, 2], a[:32])]))
        pub.send(batch_map([stored_map([3], a[32:48], parent=2)]), publish=False)  # lost on the way
        pub.send(batch_map([stored_map([4, 5], prompt(76, 32))]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_replays_total", result="ok") == asked + 1, what="the replay")
        # the missed block too (a forgotten rank would hold only the last message's 2)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_index_blocks") == 5, what="5 blocks")
        self.assertEqual((len(pub.asked), pub.invalid, kv(r.port, "xpyd_kv_events_gaps_total")),
                         (asked + 1, [], gaps + 1))
        self.assertEqual(kv(r.port, "xpyd_kv_events_replays_total", result="failed"), 0)
        before = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        completion(r.port, a)
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - before, 48)
        # what the engine sends while its replay is under way is kept and taken after it, in order (the bound
        # socket serves every engine: it cannot hold a rank's messages back); dropping them would look like the
        # engine's next gap, and ask again
        pub.gate = threading.Event()
        self.addCleanup(pub.gate.set)
        pub.send(batch_map([stored_map([6], prompt(77, 16))]), publish=False)  # lost
        pub.send(batch_map([stored_map([7], prompt(78, 16))]))  # shows the gap: its replay waits for the gate
        t.wait_until(lambda: len(pub.asked) == asked + 2, what="the second gap's replay asked")
        pub.send(batch_map([stored_map([8], prompt(79, 16))]))
        pub.send(batch_map([{"type": "BlockRemoved", "block_hashes": [8], "medium": "GPU"},
                            stored_map([9], prompt(80, 16))]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_waiting") == 2, what="both kept during the replay")
        self.assertEqual(kv(r.port, "xpyd_kv_index_blocks"), 5)
        pub.gate.set()
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_replays_total", result="ok") == asked + 2,
                     what="the second replay")
        t.wait_until(lambda: kv(r.port, "xpyd_kv_index_blocks") == 8, what="6, 7, 8, 9 in, 8 out again")
        self.assertEqual((len(pub.asked), kv(r.port, "xpyd_kv_events_gaps_total"), kv(r.port, "xpyd_kv_events_waiting")),
                         (asked + 2, gaps + 2, 0))
        pub.gate = None
        # an engine that stops answering: its replay is under way as the router stops (which must end cleanly)
        pub.mute = True
        pub.send(batch_map([]), publish=False)
        pub.send(batch_map([]))
        t.wait_until(lambda: len(pub.asked) == asked + 3, what="the third replay asked")

    def test_a_bind_address_in_use_stops_the_router(self):
        s = self.ctx.socket(zmq.PUB)
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://127.0.0.1:0")
        self.addCleanup(s.close)
        ep = s.getsockopt_string(zmq.LAST_ENDPOINT)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "-p", "127.0.0.1:1", "-d", "127.0.0.1:2",
                            "--prefill-policy", "cache", "--kv-events-bind", ep], capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--kv-events-bind: cannot bind %s" % ep, p.stderr)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "-p", "127.0.0.1:1", "-d", "127.0.0.1:2",
                            "--kv-events-bind", "udp://x"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--kv-events-bind needs tcp://ADDR:PORT", p.stderr)
        p = subprocess.run([os.path.join(t.BIN, "xpyd_router"), "-p", "127.0.0.1:1", "-d", "127.0.0.1:2",
                            "--kv-events-bind-replay-port", "65535", "--kv-events-bind-ranks", "2"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--kv-events-bind-replay-port 65535 + --kv-events-bind-ranks 2 passes port 65535", p.stderr)


class PreciseEndToEnd(t.TestCase):
    """The router's prediction against the sims' own caches (sim_blocks.c, not the router's code): with events,
    the cached tokens the router predicts for the rank it picks are the ones the engine then reports, evictions
    included; the router's own guess drifts from them."""

    def run_workload(self, events, block=16, fmt="map"):
        """40 requests of 6 tenants over two prefills of 640 tokens of cache each, in engine blocks of `block`
        tokens (the router's are 16); returns, for each, the cached tokens the router predicted and those the
        engine then reported, and the router."""
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, linger=0)
        kvp = [t.free_port_range(1) for _ in range(2)]
        ps = [self.start(t.sim("--role", "prefill", "--prefix-caching", "on", "--num-gpu-blocks", str(640 // block),
                               "--block-size", str(block), "--kv-events-format", fmt,
                               *(("--kv-events", "tcp://*:%d" % k) if events else ()))) for k in kvp]
        own = 21 if block == 16 else 2 * block + 5  # each request's own tokens: a full engine block of its own
        d = self.start(t.sim("--role", "decode"))
        hosts = [dict({"host": "127.0.0.1", "port": s.port}, **({"kv_events": "tcp://127.0.0.1:%d" % k}
                                                                  if events else {})) for s, k in zip(ps, kvp)]
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": hosts}, "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path,
                                              "--prefill-policy", "cache"]))
        rnd = random.Random(7)
        tenants = [prompt(40 + k, 240) for k in range(6)]  # 15 blocks each; 6 tenants over 2 x 40 blocks: evictions
        if events:  # warm the subscriptions: requests until both ranks' batches arrive
            t.wait_until(lambda: (completion(r.port, prompt(99, own)) and
                                  kv(r.port, "xpyd_kv_events_batches_total") >= 1), what="events flowing")
            for k in range(2):
                completion(r.port, prompt(90 + k, 2 * block + 5))
        seen = []
        for i in range(40):
            ten = rnd.randrange(len(tenants))
            # a tenant's context, then a block of its own (every request stores one: a batch to wait for)
            ids = tenants[ten][:rnd.choice([160, 200, 240])] + [5000 + 100 * i + k for k in range(own)]
            before = (kv(r.port, "xpyd_prefix_predicted_tokens_total"), kv(r.port, "xpyd_prefix_cached_tokens_total"))
            batches = kv(r.port, "xpyd_kv_events_batches_total") if events else 0
            completion(r.port, ids)
            if events:  # the engine's events of this request reach the router before the next one is placed
                t.wait_until(lambda: kv(r.port, "xpyd_kv_events_batches_total") > batches, what="its events")
            after = (kv(r.port, "xpyd_prefix_predicted_tokens_total"), kv(r.port, "xpyd_prefix_cached_tokens_total"))
            seen.append((after[0] - before[0], after[1] - before[1]))
        return seen, r

    def test_salted_tenants_are_predicted_apart(self):
        # the same prompt under three tenants' cache_salt and none, over two prefills publishing events (the sims'
        # block pools, not the router's code): what the router predicts for its pick is what the engine reports
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, linger=0)
        kvp = [t.free_port_range(1) for _ in range(2)]
        ps = [self.start(t.sim("--role", "prefill", "--prefix-caching", "on", "--kv-events", "tcp://*:%d" % k))
              for k in kvp]
        d = self.start(t.sim("--role", "decode"))
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": [{"host": "127.0.0.1", "port": s.port, "kv_events": "tcp://127.0.0.1:%d" % k}
                                             for s, k in zip(ps, kvp)]},
                       "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path,
                                              "--prefill-policy", "cache"]))
        n = [0]
        for sim in ps:  # each rank's own requests (a new block each) until the router hears it
            def heard():
                n[0] += 1
                completion(sim.port, [5, 5, n[0]] + [0] * 13)
                return t.metric(r.port, 'xpyd_kv_source_events_total{role="prefill",engine="127.0.0.1:%d",'
                                        'dp_rank="0"}' % sim.port, default=0) > 0
            t.wait_until(heard, what="the router hearing 127.0.0.1:%d" % sim.port)
        a, cached = prompt(80, 100), 0
        for i, salt in enumerate(["t1", "t2", None, "t1", "t3", "t2", None, "t1"]):
            body = {"prompt": a + [9000 + i] * 20, "max_tokens": 1}  # a block of its own: a batch to wait for
            if salt:
                body["cache_salt"] = salt
            before = (kv(r.port, "xpyd_prefix_predicted_tokens_total"), kv(r.port, "xpyd_prefix_cached_tokens_total"),
                      kv(r.port, "xpyd_kv_events_batches_total"))
            st, _, out = t.post_json(r.port, "/v1/completions", body)
            self.assertEqual(st, 200, out)
            t.wait_until(lambda: kv(r.port, "xpyd_kv_events_batches_total") > before[2], what="its events")
            got = (kv(r.port, "xpyd_prefix_predicted_tokens_total") - before[0],
                   kv(r.port, "xpyd_prefix_cached_tokens_total") - before[1])
            self.assertEqual(got[0], got[1], "request %d (salt %s)" % (i, salt))
            cached += got[1]
        self.assertEqual(cached, 4 * 96)  # the second t1, t2, unsalted and third t1: a's 6 blocks each

    def test_predicted_is_what_engines_report(self):
        seen, r = self.run_workload(events=True)
        self.assertEqual([p for p, c in seen], [c for p, c in seen])
        self.assertGreater(kv(r.port, "xpyd_kv_events_total", type="removed"), 0)  # evictions happened
        self.assertGreater(kv(r.port, "xpyd_prefix_cached_tokens_total"), 0)
        guess, _ = self.run_workload(events=False)
        self.assertGreater(sum(p != c for p, c in guess), 0)  # the guess misses what evictions did

    def test_engine_blocks_of_two_of_the_routers(self):
        # vLLM --block-size 32 under --prefix-block-tokens 16: each engine block kept as two, a rank's match in
        # whole engine blocks (contexts of 200 tokens end inside one: 192 of them cached, not 200 or 208)
        seen, r = self.run_workload(events=True, block=32)
        self.assertEqual([p for p, c in seen], [c for p, c in seen])
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 2)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size"), 0)
        self.assertGreater(kv(r.port, "xpyd_kv_events_total", type="removed"), 0)
        self.assertGreater(kv(r.port, "xpyd_prefix_cached_tokens_total"), 0)
        self.assertEqual(kv(r.port, "xpyd_prefix_cached_tokens_total") % 32, 0)
        # the 40 requests placed by the events (a warm-up request may go before the subscription)
        self.assertGreaterEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 40)

    def test_sglang_pages_of_one_token(self):
        # the sims publishing as SGLang with its default --page-size 1 (an event a token, integer hashes): a router
        # block is held once its sixteen tokens are; the engine hits up to 15 tokens more than predicted, never less
        seen, r = self.run_workload(events=True, block=1, fmt="sglang")
        self.assertTrue(all(0 <= c - p < 16 for p, c in seen), seen)
        self.assertTrue(any(c - p == 8 for p, c in seen), seen)  # contexts of 200 tokens: 192 predicted
        self.assertGreater(sum(p for p, c in seen), 0)
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 2)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size"), 0)
        self.assertGreater(kv(r.port, "xpyd_kv_events_total", type="removed"), 0)
        self.assertGreaterEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 40)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

    def test_engine_blocks_of_half_the_routers(self):
        # vLLM --block-size 8 (SGLang --page-size 8) under --prefix-block-tokens 16: a router block is held when
        # both its engine blocks are; the engine hits half a router block more where a context ends in one (200
        # tokens: 200 cached, 192 predicted), never less
        seen, r = self.run_workload(events=True, block=8)
        self.assertTrue(all(c - p in (0, 8) for p, c in seen), seen)
        self.assertTrue(any(c - p == 8 for p, c in seen), seen)  # contexts of 200 tokens were hit
        self.assertGreater(sum(p for p, c in seen), 0)
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 2)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size"), 0)
        self.assertGreater(kv(r.port, "xpyd_kv_events_total", type="removed"), 0)
        self.assertGreaterEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 40)


class EngineRestart(t.TestCase):
    """A rank's KV-event connection as a hint for the health checks (--kv-events-recheck-ms): an engine that
    crashes is taken down at once, one that starts again is back at once with its passive ejection ended, where
    the checks alone (one every ten minutes, --health-fall 100) and the ejection (ten minutes) would not."""

    def complete(self, r):
        """A completion of a new prompt through router r (200 asserted: a failure there was retried elsewhere)."""
        self.n = getattr(self, "n", 0) + 1
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": prompt(self.n, 20), "max_tokens": 1})
        self.assertEqual(st, 200, out)

    def test_a_crash_and_a_restart_seen_by_the_events(self):
        kvp = [t.free_port_range(1) for _ in range(2)]
        port0 = t.free_port()

        def prefill0(*extra):  # on the same ports each time, as an engine restarted by its supervisor
            p = self.start(t.Proc("xpyd_sim", ["--role", "prefill", "--port", str(port0), "--log-level", "warn",
                                               "--prefix-caching", "on", "--kv-events", "tcp://*:%d" % kvp[0]]
                                  + list(extra), port_flag=False))
            t.wait_until(lambda: t.request(port0, "GET", "/health")[0] == 200, what="prefill 0 up")
            return p
        p0 = prefill0("--fail-rate", "1")  # every generate request answered 500
        p1 = self.start(t.sim("--role", "prefill", "--prefix-caching", "on", "--kv-events", "tcp://*:%d" % kvp[1]))
        d = self.start(t.sim("--role", "decode"))
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": [{"host": "127.0.0.1", "port": port, "kv_events": "tcp://127.0.0.1:%d" % k}
                                             for port, k in zip((port0, p1.port), kvp)]},
                       "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "info", "--config", path,
                                              "--prefill-policy", "cache", "--eject-after-failures", "1",
                                              "--eject-base-ms", "600000", "--health-interval-ms", "600000",
                                              "--health-fall", "100", "--health-rise", "100"]))
        engine0 = 'role="prefill",engine="127.0.0.1:%d",dp_rank="0"' % port0
        healthy = lambda: t.metric(r.port, "xpyd_instance_healthy{%s}" % engine0)
        transitions = lambda: t.metric(r.port, "xpyd_health_transitions_total")
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="down") == 0, what="both subscribed")
        complete = lambda: self.complete(r)
        # requests until one was tried on prefill 0 (500, retried on prefill 1): ejected for ten minutes
        t.wait_until(lambda: complete() or t.metric(r.port, "xpyd_instance_ejections_total{%s}" % engine0) == 1,
                     what="prefill 0 ejected")
        self.assertEqual((healthy(), transitions()), (0, 0))
        p0.p.kill()  # a crash: its publisher's connection drops with it
        p0.stop(check=False)
        t.wait_until(lambda: transitions() == 1, what="prefill 0 down")
        # started again: its events come up half a second before its HTTP server (checked again until it answers)
        p0 = prefill0("--startup-delay-ms", "500")
        t.wait_until(lambda: healthy() == 1, what="prefill 0 back")
        self.assertEqual(transitions(), 2)
        picked = lambda: t.metric(r.port, "xpyd_instance_selected_total{%s}" % engine0, default=0)
        before, retries = picked(), t.metric(r.port, 'xpyd_retries_total{role="prefill"}', default=0)
        t.wait_until(lambda: complete() or picked() > before, what="prefill 0 picked again")
        self.assertEqual(t.metric(r.port, 'xpyd_retries_total{role="prefill"}', default=0), retries)  # and answering
        r.stop()
        lines = [l for l in r.output().splitlines() if "event=health_transition" in l or "event=unejected" in l]
        self.assertEqual(len(lines), 3, lines)
        self.assertIn('endpoint=127.0.0.1:%d state=down reason="KV events stopped; GET /health:' % port0, lines[0])
        self.assertIn('endpoint=127.0.0.1:%d state=up reason="KV events back; GET /health answered 200"' % port0,
                      lines[1])
        self.assertIn("event=unejected instance=127.0.0.1:%d role=prefill rank=0 reason=kv_events_back" % port0,
                      lines[2])

    def test_a_publisher_back_alone_ends_no_ejection(self):
        # the connection drops and returns while the engine keeps answering its checks (the network, a publisher
        # restarted alone): checked both times, and nothing changes - the ejection its failures earned stands
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, linger=0)
        eng = t.FakeEngine(lambda m, path, b: (200, "application/json", b"{}") if path == "/health" else
                           (500, "application/json", b'{"error":{"message":"boom","type":"server_error","code":500}}'))
        self.addCleanup(eng.stop)
        good = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        pub = Pub(ctx)
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": [{"host": "127.0.0.1", "port": eng.port, "kv_events": pub.ep},
                                             "127.0.0.1:%d" % good.port]},
                       "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path,
                                              "--prefill-policy", "cache", "--eject-after-failures", "1",
                                              "--eject-base-ms", "600000", "--health-interval-ms", "600000"]))
        engine = 'role="prefill",engine="127.0.0.1:%d",dp_rank="0"' % eng.port
        ejections = lambda: t.metric(r.port, "xpyd_instance_ejections_total{%s}" % engine)
        checks = lambda: sum(1 for _, p, _ in eng.requests if p == "/health")
        generates = lambda: sum(1 for _, p, _ in eng.requests if p != "/health")
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="down") == 0, what="subscribed")
        complete = lambda: self.complete(r)
        t.wait_until(lambda: complete() or ejections() == 1, what="ejected")
        port, before = pub.port, checks()
        pub.close()
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="down") == 1 and checks() > before,
                     what="checked at the drop")
        back = Pub.__new__(Pub)
        back.s = ctx.socket(zmq.PUB)
        back.s.setsockopt(zmq.LINGER, 0)
        back.replay_offset = None
        self.addCleanup(back.close)

        def bound():  # (libzmq closes the old socket in its own thread: the port may still be held a moment)
            try:
                back.s.bind("tcp://127.0.0.1:%d" % port)
                return True
            except zmq.ZMQError:
                return False
        t.wait_until(bound, what="the publisher bound again")
        t.wait_until(lambda: checks() >= before + 2, what="a check at the drop and one at the return")
        tried = generates()
        for _ in range(10):
            complete()
        self.assertEqual((ejections(), generates(), t.metric(r.port, "xpyd_health_transitions_total")), (1, tried, 0))
        self.assertEqual(t.metric(r.port, "xpyd_instance_healthy{%s}" % engine), 0)


if __name__ == "__main__":
    t.main()
