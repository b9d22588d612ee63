# SPDX-License-Identifier: Apache-2.0
"""Precise cache-aware placement from the engines' KV events (issue 40), end to end: publishers written here with
pyzmq and msgpack (Debian's python3-zmq, python3-msgpack: independent of the router's code), framed as vLLM frames
them (topic, 8-byte big-endian sequence number, a msgpack KVEventBatch), batches built by hand in both encodings.
 - placement follows what ranks report: a prompt goes to the rank whose events say it holds the prompt's leading
   blocks, and leaves it when the rank reports them evicted (where the router's own guess would still send it);
 - an engine restart (sequence numbers going back) and AllBlocksCleared forget a rank's blocks;
 - a gap asks the replay endpoint (a ROUTER socket here) for what was missed, or without one forgets the rank;
 - hostile messages (bad framing, garbage, random bytes) are refused by cause and change nothing;
 - a rank sent a prompt that publishes nothing is stale (approximate placement for it) until it publishes;
 - two routers on the same events place alike; the index's metrics."""
import json
import os
import random
import shutil
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

B = 16  # tokens per block: the router's --prefix-block-tokens default, vLLM's default block size


def prompt(k, n=160):
    return [1000 * k + i for i in range(n)]


def stored_map(hashes, tokens, parent=None, lora=None):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": B, "lora_id": None, "medium": "GPU", "lora_name": lora, "extra_keys": None,
            "group_idx": 0, "kv_cache_spec_kind": "full_attention", "a_field_from_the_future": [1, 2]}


def stored_array(hashes, tokens, parent=None):
    # vLLM before mid-2026: positional, tagged by the class name, trailing defaults omitted
    return ["BlockStored", hashes, parent, tokens, B, None, "GPU"]


def batch_map(events, dp=0):
    return msgpack.packb({"ts": time.time(), "events": events, "data_parallel_rank": dp})


def batch_array(events):
    return msgpack.packb([time.time(), events])


class Pub:
    """A rank's KV-event publisher: a PUB socket as vLLM's ZmqEventPublisher binds it, and optionally its replay
    ROUTER socket (answers a start sequence number with (seq, payload) pairs, then seq -1 and an empty frame)."""

    def __init__(self, ctx, replay=False):
        self.s = ctx.socket(zmq.PUB)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.bind("tcp://127.0.0.1:0")
        self.ep = self.s.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(self.ep.rsplit(":", 1)[1])
        self.seq = 0
        self.sent = {}  # seq -> payload, what a replay can give
        self.replay_offset = None
        if replay:
            self.r = ctx.socket(zmq.ROUTER)
            self.r.setsockopt(zmq.LINGER, 0)
            for off in range(1000, 1100):  # the router reaches it at the event port + a fixed offset
                try:
                    self.r.bind("tcp://127.0.0.1:%d" % (self.port + off))
                    self.replay_offset = off
                    break
                except zmq.ZMQError:
                    continue
            assert self.replay_offset, "no free port for the replay socket"
            self.asked = []
            self.stop = False
            self.mute = False  # asked, and never answers
            self.th = threading.Thread(target=self._serve, daemon=True)
            self.th.start()

    def _serve(self):
        while not self.stop:
            if not self.r.poll(50):
                continue
            ident, start = self.r.recv_multipart()
            first = int.from_bytes(start, "big")
            self.asked.append(first)
            if self.mute:
                continue
            for seq in sorted(s for s in self.sent if s >= first):
                self.r.send_multipart([ident, seq.to_bytes(8, "big"), self.sent[seq]])
            self.r.send_multipart([ident, (-1).to_bytes(8, "big", signed=True), b""])

    def send(self, payload, seq=None, publish=True):
        seq = self.seq if seq is None else seq
        self.sent[seq] = payload
        if publish:
            self.s.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        self.seq = seq + 1

    def close(self):
        if self.replay_offset:
            self.stop = True
            self.th.join()
            self.r.close()
        self.s.close()


def kv(port, name, role="prefill", **labels):
    lab = ",".join(['role="%s"' % role] + ['%s="%s"' % kv for kv in labels.items()])
    return t.metric(port, "%s{%s}" % (name, lab), default=0)


def completion(port, ids, headers=None):
    st, _, out = t.post_json(port, "/v1/completions", {"prompt": ids, "max_tokens": 1}, headers=headers)
    assert st == 200, out
    return out


def selected(port, sim):
    return t.metric(port, 'xpyd_instance_selected_total{role="prefill",engine="127.0.0.1:%d",dp_rank="0"}'
                    % sim.port, default=0)


class KvEvents(t.TestCase):
    def setUp(self):
        super().setUp()
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, linger=0)

    def cluster(self, n=2, replay=False, args=(), routers=1, sim_args=(), before=None):
        ps = [self.start(t.sim("--role", "prefill", *sim_args)) for _ in range(n)]
        d = self.start(t.sim("--role", "decode", *sim_args))
        pubs = [Pub(self.ctx, replay) for _ in ps]
        for p in pubs:
            self.addCleanup(p.close)
        topo = {"prefill": {"hosts": [{"host": "127.0.0.1", "port": s.port, "kv_events": p.ep}
                                      for s, p in zip(ps, pubs)]},
                "decode": {"hosts": ["127.0.0.1:%d" % d.port]}}
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump(topo, f)
        if before:  # what the engines published before any router listened
            before(pubs)
        extra = ["--kv-events-replay-offset", str(pubs[0].replay_offset)] if replay else []
        # these publishers answer no request with events: a long stale time unless a test sets its own (a flag
        # given twice: the last wins), so a slow machine does not turn a rank approximate mid-test
        rs = [self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--threads", "2", "--config",
                                                path, "--prefill-policy", "cache", "--kv-events-stale-ms", "600000"]
                                + extra + list(args)))
              for _ in range(routers)]
        for p in pubs:
            self.handshake(rs, p)
        return ps, pubs, rs

    def handshake(self, rs, pub):
        # a SUB socket hears nothing sent before it connected: empty batches until every router counts one
        def heard():
            before = [kv(r.port, "xpyd_kv_events_batches_total") for r in rs]
            pub.send(batch_map([]))
            time.sleep(0.02)
            return all(kv(r.port, "xpyd_kv_events_batches_total") > b for r, b in zip(rs, before))
        t.wait_until(heard, what="the router subscribed")

    def wait_blocks(self, r, n):
        t.wait_until(lambda: kv(r.port, "xpyd_kv_index_blocks") == n, what="%d blocks in the index" % n)

    def test_placement_follows_what_ranks_report(self):
        ps, pubs, (r,) = self.cluster()
        p1, p2 = prompt(1), prompt(2)
        pubs[1].send(batch_map([stored_map([101, 102, 103, 104], p1[:64]),
                                stored_map([105, 106, 107, 108], p1[64:128], parent=104)]))
        pubs[0].send(batch_map([stored_map([201, 202, 203, 204, 205, 206, 207, 208], p2[:128])]))
        self.wait_blocks(r, 16)
        src = lambda name, sim: t.metric(r.port, '%s{role="prefill",engine="127.0.0.1:%d",dp_rank="0"}' % (name, sim.port))
        self.assertEqual((src("xpyd_kv_source_blocks", ps[0]), src("xpyd_kv_source_blocks", ps[1])), (8, 8))
        self.assertEqual(src("xpyd_kv_source_events_total", ps[1]), 2)  # its two BlockStored
        for k in range(4):
            completion(r.port, p1)
            completion(r.port, p2)
        self.assertEqual((selected(r.port, ps[0]), selected(r.port, ps[1])), (4, 4))
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 8)
        # rank 1 evicts p1's first block and rank 0 stores its first four: p1 goes to rank 0, though rank 1 was
        # sent p1 four times (the router's own guess would keep sending it there)
        pubs[1].send(batch_map([{"type": "BlockRemoved", "block_hashes": [101], "medium": "GPU"}]))
        pubs[0].send(batch_map([stored_map([301, 302, 303, 304], p1[:64])]))
        self.wait_blocks(r, 19)
        predicted = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        completion(r.port, p1)
        self.assertEqual(selected(r.port, ps[0]), 5)
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - predicted, 64)
        self.assertEqual(kv(r.port, "xpyd_kv_events_total", type="stored"), 4)
        self.assertEqual(kv(r.port, "xpyd_kv_events_total", type="removed"), 1)
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 2)
        self.assertGreater(kv(r.port, "xpyd_kv_index_bytes"), 0)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")
        if shutil.which("promtool"):  # the exposition a real Prometheus reads (each family in one group)
            _, _, text = t.request(r.port, "GET", "/metrics")
            p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_restart_clear_and_the_array_encoding(self):
        ps, pubs, (r,) = self.cluster()
        p3 = prompt(3)
        pubs[0].send(batch_array([stored_array([1, 2, 3, 4], p3[:64])]))
        self.wait_blocks(r, 4)
        completion(r.port, p3)
        self.assertEqual(selected(r.port, ps[0]), 1)
        # rank 0's engine restarts: its sequence numbers start again at 0, its cache is empty
        pubs[0].send(batch_map([]), seq=0)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_resets_total") == 1, what="the reset")
        self.wait_blocks(r, 0)
        pubs[1].send(batch_array([stored_array([7, 8], p3[:32])]))
        self.wait_blocks(r, 2)
        completion(r.port, p3)
        self.assertEqual(selected(r.port, ps[1]), 1)  # not rank 0, where the router sent p3 before
        pubs[1].send(batch_array([["AllBlocksCleared"]]))
        self.wait_blocks(r, 0)
        self.assertEqual(kv(r.port, "xpyd_kv_events_total", type="cleared"), 1)

    def test_a_gap_is_replayed(self):
        ps, pubs, (r,) = self.cluster(replay=True)
        p4 = prompt(4)
        pubs[0].send(batch_map([stored_map([41, 42], p4[:32])]))
        pubs[0].send(batch_map([stored_map([43, 44], p4[32:64], parent=42)]), publish=False)  # lost
        pubs[0].send(batch_map([stored_map([45], p4[64:80], parent=44)]))
        self.wait_blocks(r, 5)
        self.assertEqual(kv(r.port, "xpyd_kv_events_gaps_total"), 1)
        self.assertEqual(kv(r.port, "xpyd_kv_events_replays_total", result="ok"), 1)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="orphan"), 0)
        completion(r.port, p4)
        self.assertEqual(selected(r.port, ps[0]), 1)
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total"), 80)

    def test_a_slow_replay_holds_up_only_its_rank(self):
        ps, pubs, (r,) = self.cluster(replay=True, args=("--kv-events-replay-timeout-ms", "4000"))
        p0, p1 = prompt(30), prompt(31)
        pubs[0].send(batch_map([stored_map([71, 72], p0[:32])]))
        self.wait_blocks(r, 2)
        pubs[0].mute = True
        pubs[0].send(batch_map([stored_map([73], p0[32:48], parent=72)]), publish=False)  # lost: a gap
        pubs[0].send(batch_map([stored_map([74], p0[48:64], parent=73)]))  # shows the gap: a replay nobody answers
        t.wait_until(lambda: pubs[0].asked, what="the replay asked for")
        pubs[1].send(batch_map([stored_map([81, 82, 83, 84], p1[:64])]))  # meanwhile the other rank is heard
        self.wait_blocks(r, 6)
        self.assertEqual((kv(r.port, "xpyd_kv_events_replays_total", result="ok"),
                          kv(r.port, "xpyd_kv_events_replays_total", result="failed")), (0, 0))  # still under way
        orphans = kv(r.port, "xpyd_kv_events_skipped_total", cause="orphan")
        # out of time: rank 0 forgotten, then the message that showed the gap (its parent, 73, never came)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_replays_total", result="failed") == 1, timeout=30,
                     what="the replay out of time")
        self.wait_blocks(r, 4)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="orphan"), orphans + 1)
        pubs[0].send(batch_map([stored_map([91], p0[:16])]))  # and rank 0 goes on from there
        self.wait_blocks(r, 5)

    def test_a_router_that_starts_late_replays_what_it_missed(self):
        p13 = prompt(13)

        def before(pubs):
            pubs[0].send(batch_map([stored_map([1301, 1302], p13[:32])]))  # seq 0: lost with the buffer below
            pubs[0].send(batch_map([stored_map([1303, 1304], p13[32:64], parent=1302)]))
            pubs[0].send(batch_map([stored_map([1401], prompt(14)[:16])]))
            del pubs[0].sent[0]  # the engine's buffer keeps only the last batches
        ps, pubs, (r,) = self.cluster(n=1, replay=True, before=before)
        # the first message heard starts a replay from 0: the buffer answers from 1 on, and that is kept
        self.wait_blocks(r, 1)  # seq 1 chains on a block never seen (an orphan); seq 2 stands alone
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="orphan"), 1)
        self.assertGreaterEqual(kv(r.port, "xpyd_kv_events_replays_total", result="ok"), 1)
        self.assertIn(0, pubs[0].asked)

    def test_a_gap_without_replay_forgets_the_rank(self):
        ps, pubs, (r,) = self.cluster()
        p5 = prompt(5)
        pubs[0].send(batch_map([stored_map([51, 52, 53], p5[:48])]))
        self.wait_blocks(r, 3)
        pubs[0].send(batch_map([{"type": "BlockRemoved", "block_hashes": [51]}]), publish=False)  # lost
        pubs[0].send(batch_map([stored_map([61], prompt(6)[:16])]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_gaps_total") == 1, what="the gap")
        self.wait_blocks(r, 1)  # what it held before the gap may be stale: gone; what came after, kept

    def test_hostile_messages_change_nothing(self):
        ps, pubs, (r,) = self.cluster()
        pubs[0].send(batch_map([stored_map([71, 72], prompt(7)[:32])]))
        self.wait_blocks(r, 2)
        s = pubs[0].s
        s.send_multipart([b"", b"\x00\x00\x00\x00\x00\x00\x00\x0a"])  # two frames
        s.send_multipart([b"", b"\x01\x02", b"\x90"])  # a 2-byte sequence number
        pubs[0].send(b"\xc1 not msgpack")
        pubs[0].send(msgpack.packb({"ts": 1, "events": [{"type": "BlockStored", "block_hashes": "x"}]}))
        pubs[0].send(msgpack.packb([1, [["NoSuchEvent", 1]]]))
        rnd = random.Random(40)
        for _ in range(200):
            pubs[0].send(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64))))
        pubs[0].send(batch_map([stored_map([73], prompt(7)[32:48], parent=72)]))
        self.wait_blocks(r, 3)
        errors = sum(kv(r.port, "xpyd_kv_events_decode_errors_total", cause=c)
                     for c in ("msgpack", "shape", "type", "hash", "limit", "nomem"))
        self.assertGreaterEqual(errors, 5)
        self.assertGreaterEqual(kv(r.port, "xpyd_kv_events_decode_errors_total", cause="shape"), 2)
        completion(r.port, prompt(7))
        self.assertEqual(selected(r.port, ps[0]), 1)

    def test_a_silent_rank_goes_stale_until_it_publishes(self):
        ps, pubs, (r,) = self.cluster(n=1, args=("--kv-events-stale-ms", "300"))
        completion(r.port, prompt(8))  # sent a prompt of 10 blocks; the "engine" publishes nothing
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="stale") == 1, what="stale")
        completion(r.port, prompt(8))
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="approximate"), 1)
        pubs[0].send(batch_map([stored_map([81], prompt(8)[:16])]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="precise") == 1, what="precise again")
        completion(r.port, prompt(8))
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 2)

    def test_a_publisher_that_vanishes_and_comes_back(self):
        ps, pubs, (r,) = self.cluster(n=1)
        p12 = prompt(12)
        pubs[0].send(batch_map([stored_map([121, 122], p12[:32])]))
        self.wait_blocks(r, 2)
        port = pubs[0].port
        pubs[0].close()  # the engine's publisher is gone (a restart, a crash): what it held is unknown
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="down") == 1, what="down")
        self.wait_blocks(r, 0)
        self.assertEqual(kv(r.port, "xpyd_kv_events_disconnects_total"), 1)
        before = kv(r.port, "xpyd_kv_placements_total", mode="approximate")
        completion(r.port, p12)  # placed by the router's own guess meanwhile
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="approximate"), before + 1)
        # back on the same port (the router reconnects by itself), numbering from 0 with an empty cache
        back = Pub.__new__(Pub)
        back.s = self.ctx.socket(zmq.PUB)
        back.s.setsockopt(zmq.LINGER, 0)
        back.s.bind("tcp://127.0.0.1:%d" % port)
        back.seq, back.sent, back.replay_offset = 0, {}, None
        self.addCleanup(back.close)
        self.handshake([r], back)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="precise") == 1, what="precise again")
        back.send(batch_map([stored_map([131], p12[:16])]))
        self.wait_blocks(r, 1)

    def test_two_routers_on_the_same_events(self):
        ps, pubs, rs = self.cluster(routers=2)
        p9 = prompt(9)
        pubs[1].send(batch_map([stored_map([91, 92, 93], p9[:48])]))
        for r in rs:
            self.wait_blocks(r, 3)
            completion(r.port, p9)
            self.assertEqual((selected(r.port, ps[0]), selected(r.port, ps[1])), (0, 1))

    def test_local_prefill_decides_by_what_the_decode_reports(self):
        # conditional disaggregation asks the decode pool what it holds: a decode reporting 9 of a 10-block
        # prompt's blocks computes it itself (16 tokens to compute, under --local-prefill-max-tokens 64); the same
        # prompt without that report goes through a prefill (the router's own guess of a fresh decode is empty)
        p = self.start(t.sim("--role", "prefill"))
        d = self.start(t.sim("--role", "decode"))
        pub = Pub(self.ctx)
        self.addCleanup(pub.close)
        topo = {"prefill": {"hosts": ["127.0.0.1:%d" % p.port]},
                "decode": {"hosts": [{"host": "127.0.0.1", "port": d.port, "kv_events": pub.ep}]}}
        path = os.path.join(t.tmpdir(prefix="xpyd-kv-"), "topology.json")
        with open(path, "w") as f:
            json.dump(topo, f)
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path,
                                              "--local-prefill-max-tokens", "64", "--kv-events-stale-ms", "600000"]))
        t.wait_until(lambda: (pub.send(batch_map([])) or True) and kv(r.port, "xpyd_kv_events_batches_total",
                                                                      role="decode") > 0, what="subscribed")
        decision = lambda k: t.metric(r.port, 'xpyd_pd_decisions_total{decision="%s"}' % k)
        completion(r.port, prompt(15))
        self.assertEqual((decision("local_prefill"), decision("remote_prefill")), (0, 1))
        pub.send(batch_map([stored_map(list(range(1501, 1510)), prompt(16)[:144])]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_index_blocks", role="decode") == 9, what="9 blocks")
        completion(r.port, prompt(16))
        self.assertEqual((decision("local_prefill"), decision("remote_prefill")), (1, 1))

    def test_lora_blocks_are_not_the_base_models(self):
        # the sims answer to the adapter's name (a vLLM with --lora-modules answers to both; the sims to one, and a
        # request naming no model is served)
        ps, pubs, (r,) = self.cluster(sim_args=("--model", "sql-adapter"))
        p = prompt(10)
        pubs[1].send(batch_map([stored_map([11, 12, 13], p[:48], lora="sql-adapter")]))
        pubs[0].send(batch_map([stored_map([21], p[:16])]))
        self.wait_blocks(r, 4)
        completion(r.port, p)  # the base model: rank 0 holds one block of it, rank 1 none
        self.assertEqual(selected(r.port, ps[0]), 1)
        st, _, out = t.post_json(r.port, "/v1/completions", {"model": "sql-adapter", "prompt": p, "max_tokens": 1})
        self.assertEqual(st, 200, out)
        self.assertEqual(selected(r.port, ps[1]), 1)

    def test_extra_keys_as_vllm_sends_them(self):
        # vLLM's BlockStored carries each block's extra keys: the adapter's name on every block of a LoRA request,
        # the request's cache_salt on its first block (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys)
        ps, pubs, (r,) = self.cluster(sim_args=("--model", "ad1"))
        p, q = prompt(12), prompt(13)

        def stored(hashes, toks, extra, lora=None):
            e = stored_map(hashes, toks, lora=lora)
            e["extra_keys"] = extra
            return e
        pubs[0].send(batch_map([stored([31, 32, 33, 34], p[:64], [["ad1"]] * 4, lora="ad1"),
                                stored([41, 42, 43, 44], q[:64], None)]))
        pubs[1].send(batch_map([stored([51, 52, 53, 54], p[:64], [["s1"], None, None, None]),
                                stored([61, 62, 63, 64], q[:64], [["ad1", "s2"], ["ad1"], ["ad1"], ["ad1"]],
                                       lora="ad1")]))
        self.wait_blocks(r, 16)

        def placed(body, sim, tokens):
            before = (selected(r.port, sim), kv(r.port, "xpyd_prefix_predicted_tokens_total"))
            st, _, out = t.post_json(r.port, "/v1/completions", dict(body, max_tokens=1))
            self.assertEqual(st, 200, out)
            self.assertEqual((selected(r.port, sim) - before[0],
                              kv(r.port, "xpyd_prefix_predicted_tokens_total") - before[1]), (1, tokens), body)
        placed({"model": "ad1", "prompt": p}, ps[0], 64)  # the adapter's blocks: its name left out of the key
        placed({"prompt": p, "cache_salt": "s1"}, ps[1], 64)  # salted as it was stored
        placed({"model": "ad1", "prompt": q, "cache_salt": "s2"}, ps[1], 64)  # both
        placed({"prompt": q}, ps[0], 64)
        for body in ({"prompt": p}, {"prompt": p, "cache_salt": "s9"}, {"prompt": q, "cache_salt": "s2"}):
            before = kv(r.port, "xpyd_prefix_predicted_tokens_total")
            st, _, out = t.post_json(r.port, "/v1/completions", dict(body, max_tokens=1))
            self.assertEqual(st, 200, out)
            # unsalted p, another salt, q's salt without its adapter: no rank holds these blocks
            self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - before, 0, body)

    def test_ranks_added_and_removed_at_run_time(self):
        ps, pubs, (r,) = self.cluster(n=1, args=("--admin-key", "adm"))
        extra = self.start(t.sim("--role", "prefill"))
        pub = Pub(self.ctx)
        self.addCleanup(pub.close)
        adm = {"Authorization": "Bearer adm", "Content-Type": "application/json"}

        def admin(method, path, body=None):
            st, _, raw = t.request(r.port, method, path, body=json.dumps(body).encode() if body else None,
                                   headers=adm)
            return st, json.loads(raw)
        st, out = admin("POST", "/admin/instances", {"role": "prefill", "host": "127.0.0.1", "port": extra.port,
                                                      "kv_events": "udp://nowhere"})
        self.assertOpenAIError(st, out, 400, "kv_events")
        st, out = admin("POST", "/admin/instances", {"role": "prefill", "host": "127.0.0.1", "port": extra.port,
                                                      "kv_events": pub.ep})
        self.assertEqual(st, 201, out)
        self.assertEqual(out["instances"][0]["kv_events"], pub.ep)
        self.handshake([r], pub)
        p11 = prompt(11)
        pub.send(batch_map([stored_map([111, 112], p11[:32])]))
        self.wait_blocks(r, 2)
        completion(r.port, p11)
        self.assertEqual(selected(r.port, extra), 1)
        # removed: its blocks are forgotten, its source closed
        st, out = admin("DELETE", "/admin/instances/prefill/127.0.0.1:%d" % extra.port)
        self.assertEqual(st, 200, out)
        self.wait_blocks(r, 0)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="precise") == 1, what="one source left")



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
        d.send((0).to_bytes(8, "big"))
        seqs = []
        while True:
            self.assertTrue(d.poll(5000))
            seq, payload = d.recv_multipart()
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


class PreciseEndToEnd(t.TestCase):
    """The router's prediction against the sims' own caches (sim_blocks.c, not the router's code): with events,
    the cached tokens the router predicts for the rank it picks are the ones the engine then reports, evictions
    included; the router's own guess drifts from them."""

    def run_workload(self, events):
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, linger=0)
        kvp = [t.free_port_range(1) for _ in range(2)]
        ps = [self.start(t.sim("--role", "prefill", "--prefix-caching", "on", "--num-gpu-blocks", "40",
                               *(("--kv-events", "tcp://*:%d" % k) if events else ()))) for k in kvp]
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
            t.wait_until(lambda: (completion(r.port, prompt(99, 20)) and
                                  kv(r.port, "xpyd_kv_events_batches_total") >= 1), what="events flowing")
            for k in range(2):
                completion(r.port, prompt(90 + k, 37))
        wrong = 0
        for i in range(40):
            ten = rnd.randrange(len(tenants))
            # a tenant's context, then a block of its own (every request stores one: a batch to wait for)
            ids = tenants[ten][:rnd.choice([160, 200, 240])] + [5000 + 20 * i + k for k in range(21)]
            before = (kv(r.port, "xpyd_prefix_predicted_tokens_total"), kv(r.port, "xpyd_prefix_cached_tokens_total"))
            batches = kv(r.port, "xpyd_kv_events_batches_total") if events else 0
            completion(r.port, ids)
            if events:  # the engine's events of this request reach the router before the next one is placed
                t.wait_until(lambda: kv(r.port, "xpyd_kv_events_batches_total") > batches, what="its events")
            after = (kv(r.port, "xpyd_prefix_predicted_tokens_total"), kv(r.port, "xpyd_prefix_cached_tokens_total"))
            wrong += (after[0] - before[0]) != (after[1] - before[1])
        return wrong, r

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
        wrong, r = self.run_workload(events=True)
        self.assertEqual(wrong, 0)
        self.assertGreater(kv(r.port, "xpyd_kv_events_total", type="removed"), 0)  # evictions happened
        self.assertGreater(kv(r.port, "xpyd_prefix_cached_tokens_total"), 0)
        guess_wrong, _ = self.run_workload(events=False)
        self.assertGreater(guess_wrong, 0)  # the guess misses what evictions did


if __name__ == "__main__":
    t.main()
