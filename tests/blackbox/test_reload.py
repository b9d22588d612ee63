# SPDX-License-Identifier: Apache-2.0
"""SIGHUP reloads the pools from the configuration without dropping streams: instances that appeared are
added, ones that disappeared stop getting new requests while their streams finish, changed settings apply;
a configuration that does not load changes nothing; the router keeps serving throughout."""
import json
import os
import signal
import threading

import xpyd_testlib as t


def write_config(path, prefills, decodes, **extra):
    cfg = {"prefill": {"hosts": [{"host": "127.0.0.1", "port": p} for p in prefills]},
           "decode": {"hosts": [{"host": "127.0.0.1", "port": d} for d in decodes]}}
    cfg.update(extra)
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f)
    os.replace(path + ".tmp", path)


class Reload(t.TestCase):
    def test_sighup_applies_pool_changes(self):
        p = self.start(t.sim("--role", "prefill"))
        d1 = self.start(t.sim("--role", "decode", "--decode-us-per-token", "20000"))
        d2 = self.start(t.sim("--role", "decode"))
        path = os.path.join(t.tmpdir(prefix="xpyd-reload-"), "router.json")
        write_config(path, [p.port], [d1.port])
        r = self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--config", path]))
        results = {}
        stream = t.Stream(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 30, "stream": True})
        th = threading.Thread(target=lambda: results.setdefault("p", stream.read_all()))
        th.start()
        t.wait_until(lambda: t.metric(d1.port, "vllm:num_requests_running") == 1, what="stream running on d1")

        write_config(path, [p.port], [d2.port])
        r.signal(signal.SIGHUP)
        # exact counts: the prefill is listed again unchanged, d2 added, d1 removed
        t.wait_until(lambda: "event=reloaded added=1 revived=0 updated=0 unchanged=1 removed=1" in r.output(),
                     what="reload logged")
        self.assertNotIn("reload_needs_restart", r.output())
        th.join()
        self.assertEqual(results["p"][-1], "[DONE]")
        self.assertEqual(len(t.content_events(results["p"])), 30)  # the stream on the removed d1 finished
        for _ in range(3):
            self.assertEqual(t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})[0], 200)
        self.assertEqual(t.metric(d2.port, "xpyd_sim:requests_total"), 3)
        self.assertEqual([i["port"] for i in t.status(r.port)["pools"]["decode"]["instances"]], [d2.port])

        # a broken file changes nothing
        with open(path, "w") as f:
            f.write("{ not json")
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: "event=reload_failed" in r.output(), what="failed reload logged")
        self.assertEqual(t.post_json(r.port, "/v1/completions", {"prompt": "a", "max_tokens": 2})[0], 200)
        self.assertEqual([i["port"] for i in t.status(r.port)["pools"]["decode"]["instances"]], [d2.port])

        # back to d1, with a setting changed on it
        write_config(path, [p.port], [d1.port])
        with open(path) as f:
            cfg = json.load(f)
        cfg["decode"]["hosts"][0]["weight"] = 3
        with open(path, "w") as f:
            json.dump(cfg, f)
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: "revived=1" in r.output(), what="second reload logged")
        inst = t.status(r.port)["pools"]["decode"]["instances"]
        self.assertEqual([(i["port"], i["weight"]) for i in inst], [(d1.port, 3)])
        t.wait_until(lambda: t.router_idle(r.port), what="router load back to zero")

        # a setting that only a restart applies is named, and keeps its running value
        with open(path) as f:
            cfg = json.load(f)
        cfg["decode"]["hosts"][0]["weight"] = 4
        cfg["max_retries"] = 5
        cfg["threads"] = 3
        with open(path, "w") as f:
            json.dump(cfg, f)
        r.signal(signal.SIGHUP)
        t.wait_until(lambda: "updated=1 unchanged=1 removed=0" in r.output(), what="third reload logged")
        t.wait_until(lambda: 'event=reload_needs_restart settings="threads,max-retries"' in r.output(),
                     what="restart-only settings named")
        self.assertEqual([i["weight"] for i in t.status(r.port)["pools"]["decode"]["instances"]], [4])


if __name__ == "__main__":
    t.main()
