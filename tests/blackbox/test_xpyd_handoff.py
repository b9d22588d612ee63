# SPDX-License-Identifier: Apache-2.0
"""--handoff xpyd end to end: the prefill sim registers its KV with libxpyd_transfer and says where it is
(xpyd_segment/addr/len/key in kv_transfer_params); the router passes that to the decode, which reads the
bytes through its own transfer engine, verifies them against the prompt and asks the prefill to release
them; the router records bytes and time per handoff. When no decode took the KV, the router itself tells
the prefill's engine to release it (no waiting for the lease). Also the router's Mooncake-compatible
metadata store (GET|PUT|DELETE /metadata?key=)."""
import json

import xpyd_testlib as t


def xpyd_sim(role, *args):
    return t.sim("--role", role, "--handoff", "xpyd", "--kv-lease-ms", "60000", "--kv-bytes-per-token", "4096",
                 *args)


class XpydHandoff(t.TestCase):
    def test_stream_and_non_stream(self):
        p, d = self.start(xpyd_sim("prefill")), self.start(xpyd_sim("decode"))
        r = self.start(t.router([p.port], [d.port], "--handoff", "xpyd"))
        prompt = "the quick brown fox jumps over the lazy dog " * 20
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": prompt, "max_tokens": 5})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["usage"]["completion_tokens"], 5)
        payloads = t.Stream(r.port, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "stream": True}).read_all()
        self.assertEqual(payloads[-1], "[DONE]")
        self.assertEqual(len(t.content_events(payloads)), 4)
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="xpyd",result="done"}'), 2)
        # the KV moved through the engines (4096 bytes per prompt token), verified, then released by the decode
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, what="leases released")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_xpyd_releases_total"), 2)
        self.assertGreater(t.metric(r.port, "xpyd_kv_bytes_total"), 2 * 100 * 4096)
        self.assertEqual(t.metric(r.port, "xpyd_kv_handoff_seconds_count"), 2)
        self.assertEqual(t.metric(r.port, "xpyd_kv_releases_total"), 0)  # nothing to release: both succeeded
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_router_releases_when_decode_fails(self):
        p = self.start(xpyd_sim("prefill"))
        bad = self.start(xpyd_sim("decode", "--status-code", "503"))
        r = self.start(t.router([p.port], [bad.port], "--handoff", "xpyd", "--max-retries", "0"))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b c", "max_tokens": 3})
        self.assertOpenAIError(st, out, 503, "injected")
        # released through the prefill's engine by the router, well before the 60 s lease
        t.wait_until(lambda: t.metric(p.port, "xpyd_sim:kv_leases_active") == 0, timeout=5, what="KV released")
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_xpyd_releases_total"), 1)
        self.assertEqual(t.metric(p.port, "xpyd_sim:kv_leases_expired_total"), 0)
        t.wait_until(lambda: t.metric(r.port, "xpyd_kv_releases_total") == 1, what="release counted")
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

    def test_decode_cannot_reach_prefill_engine(self):
        # a decode given an unreachable segment fails the request clearly (and holds nothing)
        d = self.start(xpyd_sim("decode"))
        body = {"prompt": "a b", "max_tokens": 2, "kv_transfer_params": {
            "do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "x", "remote_host": "127.0.0.1",
            "remote_port": 1, "remote_block_ids": [1], "xpyd_segment": "127.0.0.1:%d" % t.free_port(),
            "xpyd_addr": "4096", "xpyd_len": 8, "xpyd_key": "req:x"}}
        st, _, out = t.post_json(d.port, "/v1/completions", body)
        self.assertOpenAIError(st, out, 500, "transfer engine")
        self.assertEqual(t.metric(d.port, 'xpyd_sim:handoffs_total{mode="xpyd",result="failed"}'), 1)


class MetadataStore(t.TestCase):
    def test_get_put_delete(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port], "--metadata-max-keys", "2", "--metadata-max-value-bytes", "64",
                                "--metadata-write-key", "mdk"))
        w = {"Authorization": "Bearer mdk"}
        key = "/metadata?key=mooncake%2Fram%2Fseg-1"
        st, _, _ = t.request(r.port, "GET", key)
        self.assertEqual(st, 404)
        desc = json.dumps({"name": "seg-1", "buffers": [{"addr": 4096, "len": 8}]})
        self.assertEqual(t.request(r.port, "PUT", key, desc, headers=w)[0], 200)
        st, _, out = t.request(r.port, "GET", "/metadata?key=mooncake/ram/seg-1")  # same key, unescaped
        self.assertEqual((st, json.loads(out)["name"]), (200, "seg-1"))
        self.assertEqual(t.metric(r.port, "xpyd_metadata_keys"), 1)
        st, _, out = t.request(r.port, "PUT", "/metadata?key=big", "x" * 65, headers=w)
        self.assertOpenAIError(st, json.loads(out), 413, "max-value-bytes")
        self.assertEqual(t.request(r.port, "PUT", "/metadata?key=k2", "v", headers=w)[0], 200)
        st, _, out = t.request(r.port, "PUT", "/metadata?key=k3", "v", headers=w)
        self.assertOpenAIError(st, json.loads(out), 507, "max-keys")
        self.assertEqual(t.request(r.port, "DELETE", key, headers=w)[0], 200)
        self.assertEqual(t.request(r.port, "DELETE", key, headers=w)[0], 404)
        st, _, out = t.request(r.port, "GET", "/metadata")
        self.assertOpenAIError(st, json.loads(out), 400, "key=")

    def test_writes_need_the_write_or_admin_key(self):
        """Segment descriptors steer KV transfers: writes are not open to any client (issue: /metadata writes)."""
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        st, _, out = t.request(r.port, "PUT", "/metadata?key=k", "v")
        self.assertOpenAIError(st, json.loads(out), 403, "--metadata-write-key")
        self.assertEqual(t.request(r.port, "DELETE", "/metadata?key=k")[0], 403)
        r2 = self.start(t.router([p.port], [d.port], "--api-key", "ck", "--admin-key", "ak",
                                 "--metadata-write-key", "mk"))
        ck, ak, mk = ({"Authorization": "Bearer " + k} for k in ("ck", "ak", "mk"))
        st, h, out = t.request(r2.port, "PUT", "/metadata?key=k", "v", headers=ck)  # the client key cannot write
        self.assertOpenAIError(st, json.loads(out), 401, "metadata write key")
        self.assertEqual(h.get("www-authenticate"), "Bearer")
        self.assertEqual(t.request(r2.port, "PUT", "/metadata?key=k", "v1", headers=mk)[0], 200)
        self.assertEqual(t.request(r2.port, "PUT", "/metadata?key=k", "v2", headers=ak)[0], 200)
        self.assertEqual(t.request(r2.port, "GET", "/metadata?key=k")[0], 401)  # reads need the client key
        st, _, out = t.request(r2.port, "GET", "/metadata?key=k", headers=ck)
        self.assertEqual((st, out), (200, b"v2"))
        st, h, _ = t.request(r2.port, "PATCH", "/metadata?key=k", "v", headers=mk)
        self.assertEqual((st, h.get("allow")), (405, "GET, HEAD, PUT, POST, DELETE"))


if __name__ == "__main__":
    t.main()
