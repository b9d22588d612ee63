# SPDX-License-Identifier: Apache-2.0
"""Precise cache-aware placement from the engines' KV events (issue 40), end to end: publishers written here with
pyzmq and msgpack (Debian's python3-zmq, python3-msgpack: independent of the router's code), framed as vLLM frames
them (topic, 8-byte big-endian sequence number, a msgpack KVEventBatch), batches built by hand in both encodings.
 - placement follows what ranks report: a prompt goes to the rank whose events say it holds the prompt's leading
   blocks, and leaves it when the rank reports them evicted (where the router's own guess would still send it);
   a prompt a rank is still computing (not reported yet) draws its next requests there;
 - an engine restart (sequence numbers going back) and AllBlocksCleared forget a rank's blocks;
 - a gap asks the replay endpoint (a ROUTER socket here) for what was missed, or without one forgets the rank;
 - hostile messages (bad framing, garbage, random bytes) are refused by cause and change nothing;
 - a rank sent a prompt that publishes nothing is stale (approximate placement for it) until it publishes;
 - two routers on the same events place alike; the index's metrics; vLLM's extra keys (LoRA, cache_salt).
The sims as publishers, bind mode and the prediction against the sims' own caches: test_kv_engines.py."""
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

    def __init__(self, ctx, replay=False, connect=None, topic=b"", replay_port=None):
        # connect: the router's bound endpoint (bind mode; the topic names the engine, the replay socket binds
        # replay_port), else the PUB socket binds (and the replay socket its port + an offset)
        self.s = ctx.socket(zmq.PUB)
        self.s.setsockopt(zmq.LINGER, 0)
        self.topic_name = topic
        if connect:
            self.s.connect(connect)
            self.ep, self.port = connect, None
        else:
            self.s.bind("tcp://127.0.0.1:0")
            self.ep = self.s.getsockopt_string(zmq.LAST_ENDPOINT)
            self.port = int(self.ep.rsplit(":", 1)[1])
        self.seq = 0
        self.sent = {}  # seq -> payload, what a replay can give
        self.replay_offset = None
        if replay:
            self.r = ctx.socket(zmq.ROUTER)
            self.r.setsockopt(zmq.LINGER, 0)
            if connect:  # where the router was told engines' replay sockets are
                self.r.bind("tcp://127.0.0.1:%d" % replay_port)
                self.replay_offset = replay_port  # (the port itself: no event port to offset from)
            for off in () if connect else range(1000, 1100):  # at the event port + a fixed offset
                try:
                    self.r.bind("tcp://127.0.0.1:%d" % (self.port + off))
                    self.replay_offset = off
                    break
                except zmq.ZMQError:
                    continue
            assert self.replay_offset, "no free port for the replay socket"
            self.asked = []
            self.invalid = []
            self.stop = False
            self.mute = False  # asked, and never answers
            self.gate = None  # a threading.Event: asked, and answers once it is set
            self.topic = []  # [b"topic"]: answers as newer vLLM sends them (the topic before the number)
            self.th = threading.Thread(target=self._serve, daemon=True)
            self.th.start()

    def _serve(self):
        while not self.stop:
            if not self.r.poll(50):
                continue
            frame = self.r.recv_multipart()
            if len(frame) != 3:  # as vLLM's ZmqEventPublisher._service_replay: "Invalid replay request"
                self.invalid.append(frame)
                continue
            ident, _, start = frame  # what a REQ socket sends: identity, an empty delimiter, the number
            first = int.from_bytes(start, "big")
            self.asked.append(first)
            if self.mute:
                continue
            while self.gate is not None and not self.gate.wait(0.05) and not self.stop:
                pass
            for seq in sorted(s for s in self.sent if s >= first):
                self.r.send_multipart([ident, b""] + self.topic + [seq.to_bytes(8, "big"), self.sent[seq]])
            self.r.send_multipart([ident, b""] + self.topic + [(-1).to_bytes(8, "big", signed=True), b""])

    def send(self, payload, seq=None, publish=True):
        seq = self.seq if seq is None else seq
        self.sent[seq] = payload
        if publish:
            self.s.send_multipart([self.topic_name, seq.to_bytes(8, "big"), payload])
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


def predicted(port, model, ids):
    """The tokens the router predicts cached for a completion naming model: what its placement credited."""
    before = kv(port, "xpyd_prefix_predicted_tokens_total")
    st, _, out = t.post_json(port, "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1})
    assert st in (200, 404), out  # (a sim serves one model name: what is checked is the placement)
    return kv(port, "xpyd_prefix_predicted_tokens_total") - before


def placed(r):
    """Placements the router made by the events or its guess: counted once the request is pending on its rank
    (xpyd_instance_selected_total is counted a moment before that)."""
    return sum(kv(r.port, "xpyd_kv_placements_total", mode=m) for m in ("precise", "approximate"))


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

    def test_a_prompt_still_computing_draws_its_next_requests(self):
        # a rank publishes a prompt's blocks once it has computed them: until then what the router sent it counts
        # as held (--kv-events-pending-ms), so a second request for a context still computing follows the first
        # instead of computing it again on the idle rank (where least outstanding tokens alone would send it)
        ps, pubs, (r,) = self.cluster(sim_args=("--prefill-us-per-token", "4000", "--model", "ad1"))  # 0.64 s
        p = prompt(17)

        def in_flight(ids, body=None):  # a request being computed: placed, not answered
            before = selected(r.port, ps[0]), placed(r)
            th = threading.Thread(target=t.post_json, args=(r.port, "/v1/completions",
                                                            dict(body or {}, prompt=ids, max_tokens=1)))
            th.start()
            self.addCleanup(th.join)
            t.wait_until(lambda: placed(r) > before[1], what="the request placed (and pending on its rank)")
            return th, 0 if selected(r.port, ps[0]) > before[0] else 1

        def second(ids, predicted_tokens):
            predicted = kv(r.port, "xpyd_prefix_predicted_tokens_total")
            self.assertTrue(first.is_alive(), "the first request ended before the second was sent: too slow a machine")
            completion(r.port, ids)
            self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - predicted, predicted_tokens)
            first.join()
        first, on = in_flight(p)
        second(p, 160)
        self.assertEqual(selected(r.port, ps[on]), 2)
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 2)
        # an engine restarts (its numbers go back) while it computes a prompt: that prompt is gone with its cache
        q = prompt(18)
        first, on = in_flight(q)
        pubs[on].send(batch_map([]), seq=0)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_resets_total") == 1, what="the reset")
        other = selected(r.port, ps[1 - on])
        second(q, 0)
        self.assertEqual(selected(r.port, ps[1 - on]), other + 1)  # the idle rank, as without a pending prompt
        # a prompt computing under a LoRA adapter (one the ranks publish blocks under) is not pending for the base
        # model: the router keeps an adapter's blocks apart in its own index too
        pubs[0].send(batch_map([stored_map([71, 72], prompt(19)[:32], lora="ad1")]))
        self.wait_blocks(r, 2)
        z = prompt(20)
        first, on = in_flight(z, {"model": "ad1"})
        other = selected(r.port, ps[1 - on])
        second(z, 0)
        self.assertEqual(selected(r.port, ps[1 - on]), other + 1)
        # while a rank computes a prompt, another reports holding its first 4 blocks: that report wins (the
        # computing rank's events show none of it: no credit for what it is computing)
        w = prompt(21)
        first, on = in_flight(w)
        blocks = kv(r.port, "xpyd_kv_index_blocks")
        pubs[1 - on].send(batch_map([stored_map([91, 92, 93, 94], w[:64])]))
        self.wait_blocks(r, blocks + 4)
        other = selected(r.port, ps[1 - on])
        second(w, 64)
        self.assertEqual(selected(r.port, ps[1 - on]), other + 1)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

    def test_a_prompt_computing_in_engine_blocks_of_several(self):
        # ranks whose engines have blocks of 4 of the router's: of a prompt still computing there, the engine will
        # hold whole blocks of its own, so a request sharing 150 of its tokens is credited 128, not 144
        ps, pubs, (r,) = self.cluster(sim_args=("--prefill-us-per-token", "8000"))  # 1.28 s a 160-token prompt
        for k, pub in enumerate(pubs):  # each rank's engine says its block size
            pub.send(batch_map([dict(stored_map([300 + k], prompt(30 + k)[:4 * B]), block_size=4 * B)]))
        self.wait_blocks(r, 8)
        ths = []
        for k, ids in enumerate((prompt(22), prompt(24))):  # one computing on each rank
            th = threading.Thread(target=t.post_json,
                                  args=(r.port, "/v1/completions", {"prompt": ids, "max_tokens": 1}))
            th.start()
            self.addCleanup(th.join)
            ths.append(th)
            t.wait_until(lambda: placed(r) == k + 1, what="request %d placed (and pending on its rank)" % k)
            if not k:
                on = 0 if selected(r.port, ps[0]) else 1
        self.assertEqual((selected(r.port, ps[0]), selected(r.port, ps[1])), (1, 1))
        predicted = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        self.assertTrue(all(th.is_alive() for th in ths),
                        "a request ended before the third was sent: too slow a machine")
        completion(r.port, prompt(22)[:150] + prompt(23, 10))
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - predicted, 8 * B)
        self.assertEqual(selected(r.port, ps[on]), 2)
        for th in ths:
            th.join()
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

    def test_a_gap_is_replayed(self):
        ps, pubs, (r,) = self.cluster(replay=True)
        # the handshake's first batches may have been missed as the subscription came up: then a replay was
        # asked for already
        gaps0, ok0, asked0 = (kv(r.port, "xpyd_kv_events_gaps_total"),
                              kv(r.port, "xpyd_kv_events_replays_total", result="ok"), len(pubs[0].asked))
        p4 = prompt(4)
        pubs[0].send(batch_map([stored_map([41, 42], p4[:32])]))
        pubs[0].send(batch_map([stored_map([43, 44], p4[32:64], parent=42)]), publish=False)  # lost
        pubs[0].send(batch_map([stored_map([45], p4[64:80], parent=44)]))
        self.wait_blocks(r, 5)
        self.assertEqual(kv(r.port, "xpyd_kv_events_gaps_total"), gaps0 + 1)
        self.assertEqual(kv(r.port, "xpyd_kv_events_replays_total", result="ok"), ok0 + 1)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="orphan"), 0)
        completion(r.port, p4)
        self.assertEqual(selected(r.port, ps[0]), 1)
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total"), 80)
        # the router asked as vLLM's publisher accepts it (identity, empty delimiter, number: vLLM drops anything
        # else as an invalid replay request)
        self.assertEqual((len(pubs[0].asked), pubs[0].invalid), (asked0 + 1, []))
        # newer vLLM answers with the topic before each number: taken the same
        pubs[0].topic = [b""]
        pubs[0].send(batch_map([stored_map([46], p4[80:96], parent=45)]), publish=False)  # lost
        pubs[0].send(batch_map([stored_map([47], p4[96:112], parent=46)]))
        self.wait_blocks(r, 7)
        self.assertEqual(kv(r.port, "xpyd_kv_events_replays_total", result="ok"), ok0 + 2)

    def test_a_slow_replay_holds_up_only_its_rank(self):
        ps, pubs, (r,) = self.cluster(replay=True, args=("--kv-events-replay-timeout-ms", "4000"))
        ok0 = kv(r.port, "xpyd_kv_events_replays_total", result="ok")  # the handshake's, if it missed a batch
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
                          kv(r.port, "xpyd_kv_events_replays_total", result="failed")), (ok0, 0))  # under way
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

    def test_blocks_of_another_size_leave_the_rank_approximate_and_say_so(self):
        ps, pubs, (r,) = self.cluster(n=1)
        p8 = prompt(8)
        # the engine's blocks one and a half of the router's: neither a whole number of them nor a part of one
        wrong = dict(stored_map([81], p8[:B * 3 // 2]), block_size=B * 3 // 2)
        pubs[0].send(batch_map([wrong]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="block_size") == 1, what="block_size")
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 0)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size"), 1)
        completion(r.port, p8)  # placed by the router's own guess, not by an index that can never match
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="approximate"), 1)
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 0)
        pubs[0].send(batch_map([dict(wrong, block_hashes=[82])]))  # said once, not once per event
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size") == 2, what="skipped")
        warn = [l for l in r.output().splitlines() if "--prefix-block-tokens %d" % (B * 3 // 2) in l]
        self.assertEqual(len(warn), 1, r.output())
        self.assertIn("block_size=%d" % (B * 3 // 2), warn[0])
        pubs[0].send(batch_map([stored_map([83], p8[:B])]))  # the router's size again: precise
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="precise") == 1, what="precise again")
        completion(r.port, p8)
        self.assertEqual(kv(r.port, "xpyd_kv_placements_total", mode="precise"), 1)
        pubs[0].send(batch_map([dict(wrong, block_hashes=[84])]))  # flapping: approximate again, not said again
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_sources", state="block_size") == 1, what="block_size")
        self.assertEqual(sum("--prefix-block-tokens %d" % (B * 3 // 2) in l for l in r.output().splitlines()), 1)

    def test_engine_blocks_of_several_of_the_routers(self):
        # vLLM --block-size 64 (FlashMLA's) under the router's 16: each engine block is four of the router's, and
        # a rank is credited whole engine blocks only
        ps, pubs, (r,) = self.cluster()
        p5 = prompt(5)
        pubs[1].send(batch_map([dict(stored_map([501, 502], p5[:8 * B]), block_size=4 * B)]))
        pubs[0].send(batch_map([stored_map([601, 602, 603, 604, 605], p5[:5 * B])]))
        self.wait_blocks(r, 13)
        src = lambda sim: t.metric(r.port, 'xpyd_kv_source_blocks{role="prefill",engine="127.0.0.1:%d",dp_rank="0"}'
                                   % sim.port)
        self.assertEqual((src(ps[0]), src(ps[1])), (5, 8))  # in the router's blocks
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 2)
        predicted = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        completion(r.port, p5)  # 8 blocks against 5
        self.assertEqual((selected(r.port, ps[0]), selected(r.port, ps[1])), (0, 1))
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - predicted, 8 * B)
        # sharing 6 of the router's blocks with rank 1: one engine block and half of the next, which the engine
        # never hits (4 blocks, 64 tokens) - rank 0's 5 blocks are more
        q = p5[:6 * B] + prompt(6, 4 * B)
        completion(r.port, q)
        self.assertEqual((selected(r.port, ps[0]), selected(r.port, ps[1])), (1, 1))
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - predicted, 8 * B + 5 * B)
        # the second engine block evicted: its four parts go with it
        pubs[1].send(batch_map([{"type": "BlockRemoved", "block_hashes": [502], "medium": "GPU"}]))
        self.wait_blocks(r, 9)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size"), 0)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

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
        back.seq, back.sent, back.replay_offset, back.topic_name = 0, {}, None, b""
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

    def test_adapters_past_their_bound_get_no_credit(self):
        # one adapter remembered (--kv-index-max-adapters 1): a second one's blocks are not kept, and a request
        # naming it is not matched as the base model (whose blocks rank 0 holds: an adapter's request never hits
        # them); the remembered adapter is matched in its own key space as before
        ps, pubs, (r,) = self.cluster(args=("--kv-index-max-adapters", "1"), sim_args=("--model", "ad2"))
        p = prompt(21)
        pubs[0].send(batch_map([stored_map([81, 82], p[:32])]))
        pubs[1].send(batch_map([stored_map([91, 92, 93], p[:48], lora="ad1")]))
        self.wait_blocks(r, 5)
        pubs[1].send(batch_map([stored_map([94, 95], p[:32], lora="ad2")]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_skipped_total", cause="adapters") == 1,
                     what="the second adapter refused")
        self.assertEqual(kv(r.port, "xpyd_kv_index_blocks"), 5)
        self.assertEqual(predicted(r.port, "ad2", p), 0)  # not rank 0's 32 base tokens
        self.assertEqual(predicted(r.port, "ad1", p), 48)
        t.router_idle(r.port)

    def test_adapters_the_engines_list_are_known_before_their_blocks(self):
        # vLLM's GET /v1/models lists each LoRA adapter with the base model as its parent: read (with
        # --learn-max-model-len), a request naming one is matched in its own key space before any rank stored a
        # block under it, never credited the base model's blocks (which it does not hit)
        ps, pubs, (r,) = self.cluster(args=("--learn-max-model-len", "on"),
                                      sim_args=("--lora-modules", "sql-lora=/loras/sql,chat-lora"))
        st, _, out = t.request(ps[0].port, "GET", "/v1/models")
        self.assertEqual([(c["id"], c["parent"]) for c in json.loads(out)["data"]],
                         [("sim-model", None), ("sql-lora", "sim-model"), ("chat-lora", "sim-model")])
        p = prompt(23)
        pubs[0].send(batch_map([stored_map([81, 82], p[:32])]))
        self.wait_blocks(r, 2)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_index_adapters") == 2, what="the listed adapters known")
        self.assertEqual(predicted(r.port, "sql-lora", p), 0)
        self.assertEqual(predicted(r.port, "sim-model", p), 32)
        t.router_idle(r.port)

    def test_long_adapter_names_are_told_apart(self):
        # two adapters whose names are alike in their first 63 bytes: each its own key space (the whole name is)
        a, b = ("org/support-adapter-" + "x" * 60 + "-v%d" % v for v in (1, 2))
        ps, pubs, (r,) = self.cluster(sim_args=("--model", a))
        p = prompt(22)
        pubs[1].send(batch_map([stored_map([91, 92, 93], p[:48], lora=a)]))
        pubs[0].send(batch_map([stored_map([81, 82], p[:32], lora=b)]))
        self.wait_blocks(r, 5)
        self.assertEqual(predicted(r.port, a, p), 48)
        self.assertEqual(predicted(r.port, b, p), 32)
        self.assertEqual(predicted(r.port, "the-base-model", p), 0)
        t.router_idle(r.port)

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

    def test_sglang_salted_blocks(self):
        # SGLang's BlockStoredWithMetadata: {"cache_salt": ...} after medium (arrays) or as "metadata" (maps); a run
        # with a parent carries the salt through it
        ps, pubs, (r,) = self.cluster()
        p = prompt(14)
        pubs[0].send(batch_array([["BlockStored", [71, 72], None, p[:32], B, None, "GPU", {"cache_salt": "s5"}],
                                  ["BlockStored", [73, 74], 72, p[32:64], B, None, "GPU", {"cache_salt": "s5"}]]))
        m = stored_map([81, 82, 83, 84], p[:64])
        m["metadata"] = {"cache_salt": "s6"}
        pubs[1].send(batch_map([m]))
        self.wait_blocks(r, 8)
        for body, sim, tokens in (({"prompt": p, "cache_salt": "s5"}, ps[0], 64),
                                  ({"prompt": p, "cache_salt": "s6"}, ps[1], 64)):
            before = (selected(r.port, sim), kv(r.port, "xpyd_prefix_predicted_tokens_total"))
            st, _, out = t.post_json(r.port, "/v1/completions", dict(body, max_tokens=1))
            self.assertEqual(st, 200, out)
            self.assertEqual((selected(r.port, sim) - before[0],
                              kv(r.port, "xpyd_prefix_predicted_tokens_total") - before[1]), (1, tokens), body)
        before = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        completion(r.port, p)  # unsalted: neither rank holds it
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - before, 0)

    def test_sglang_pages_of_one_token(self):
        # SGLang's default --page-size 1: one BlockStored per token (block_size 1, signed 64-bit hashes, each the
        # parent of the next), the salt on the first; a router block is keyed when its last token's event comes
        ps, pubs, (r,) = self.cluster()
        p = prompt(15)
        h = [-(1 << 62) - i for i in range(40)]
        pubs[0].send(batch_array([["BlockStored", [h[i]], h[i - 1] if i else None, [p[i]], 1, None, "GPU",
                                   {"cache_salt": "s7"} if i == 0 else None] for i in range(40)]))
        self.wait_blocks(r, 2)  # tokens 0-15 and 16-31; 32-39 wait for the rest of their block
        self.assertEqual(kv(r.port, "xpyd_kv_index_pieces"), 38)  # every page but the two that end a block
        self.assertEqual(kv(r.port, "xpyd_kv_events_sources", state="precise"), 2)
        self.assertEqual(kv(r.port, "xpyd_kv_events_skipped_total", cause="block_size"), 0)
        for body, tokens in (({"prompt": p, "cache_salt": "s7"}, 2 * B), ({"prompt": p}, 0)):
            before = (selected(r.port, ps[0]), kv(r.port, "xpyd_prefix_predicted_tokens_total"))
            st, _, out = t.post_json(r.port, "/v1/completions", dict(body, max_tokens=1))
            self.assertEqual(st, 200, out)
            self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - before[1], tokens, body)
            if tokens:
                self.assertEqual(selected(r.port, ps[0]) - before[0], 1)
        # the leaf evicted, its pages one event each, last first: the second block goes with its last token
        pubs[0].send(batch_map([{"type": "BlockRemoved", "block_hashes": [h[i]], "medium": "GPU"}
                                for i in range(39, 15, -1)]))
        self.wait_blocks(r, 1)
        self.assertEqual(kv(r.port, "xpyd_kv_index_pieces"), 15)  # the first block's
        before = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": p, "cache_salt": "s7", "max_tokens": 1})
        self.assertEqual(st, 200, out)
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - before, B)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

    def test_the_index_is_bounded(self):
        # --kv-index-max-blocks: (rank, block) pairs and pieces of blocks together, over all ranks of the pool;
        # beyond it stored blocks are counted and not kept, and what a rank forgets makes room again
        ps, pubs, (r,) = self.cluster(args=("--kv-index-max-blocks", "20"))
        p = prompt(40, 30 * B)
        pubs[0].send(batch_map([stored_map(list(range(4000, 4030)), p)]))  # 30 blocks: 20 kept
        self.wait_blocks(r, 20)
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_skipped_total", cause="full") == 1, what="counted")
        # SGLang's pages of one token on the other rank: nothing fits (the pieces count too)
        q = prompt(41, 3 * B)
        pubs[1].send(batch_map([["BlockStored", [5000 + i], 5000 + i - 1 if i else None, [q[i]], 1, None, "GPU"]
                                for i in range(3 * B)]))
        t.wait_until(lambda: kv(r.port, "xpyd_kv_events_skipped_total", cause="full") > 1, what="pages refused")
        self.assertEqual(kv(r.port, "xpyd_kv_index_blocks"), 20)
        self.assertEqual(kv(r.port, "xpyd_kv_index_pieces"), 0)
        before = kv(r.port, "xpyd_prefix_predicted_tokens_total")
        completion(r.port, p)  # what was kept still places
        self.assertEqual(kv(r.port, "xpyd_prefix_predicted_tokens_total") - before, 20 * B)
        # rank 0 cleared: room again, for rank 1's pages (a block of 16 is 15 pieces and the pair that ends it)
        pubs[0].send(batch_map([{"type": "AllBlocksCleared"}]))
        self.wait_blocks(r, 0)
        pubs[1].send(batch_map([["BlockStored", [6000 + i], 6000 + i - 1 if i else None, [q[i]], 1, None, "GPU"]
                                for i in range(B)]))
        self.wait_blocks(r, 1)
        self.assertEqual(kv(r.port, "xpyd_kv_index_pieces"), B - 1)
        t.wait_until(lambda: t.router_idle(r.port), what="load back to zero")

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


if __name__ == "__main__":
    t.main()
