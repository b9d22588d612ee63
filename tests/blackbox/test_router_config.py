"""Router configuration: host lists in every accepted form, the Python proxies' aliases, JSON topology
files (the CLI wins), DP expansion, errors, --help; and the launch helpers' --print commands."""
import json
import os
import subprocess

import socket
import tempfile

import xpyd_testlib as t

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ROUTER = os.path.join(t.BIN, "xpyd_router")


def dry(*args):
    out = subprocess.run([ROUTER, "--dry-run"] + list(args), capture_output=True, text=True, cwd=ROOT)
    return out.returncode, out.stdout, out.stderr


def ranks(out, pool):
    return [l.split()[1] for l in out.splitlines() if l.strip().startswith(pool + "[")]


class Lists(t.TestCase):
    def test_forms(self):
        for args in (["-p", "10.0.0.1:1", "10.0.0.2:2", "-d", "10.0.0.3:3"], ["-p", "10.0.0.1:1,10.0.0.2:2", "-d", "10.0.0.3:3"],
                     ["-p", "10.0.0.1:1", "-p", "10.0.0.2:2", "--decode", "10.0.0.3:3"],
                     ["--prefiller-hosts", "10.0.0.1", "10.0.0.2", "--prefiller-ports", "1", "2", "--decoder-hosts", "10.0.0.3",
                      "--decoder-ports", "3"]):
            rc, out, err = dry(*args)
            self.assertEqual(rc, 0, err)
            self.assertEqual(ranks(out, "P"), ["10.0.0.1:1", "10.0.0.2:2"], args)
            self.assertEqual(ranks(out, "D"), ["10.0.0.3:3"], args)

    def test_ipv6_and_hostnames(self):
        rc, out, err = dry("-p", "[::1]:8100", "-d", "localhost:8200")
        self.assertEqual(rc, 0, err)
        self.assertEqual(ranks(out, "P"), ["[::1]:8100"])
        self.assertEqual(ranks(out, "D"), ["localhost:8200"])

    def test_internal_dp_pins_ranks(self):
        rc, out, _ = dry("-p", "10.0.1.1:1", "-d", "10.0.1.2:2", "10.0.1.3:2", "--decode-dp", "2", "--dp-mode", "internal")
        self.assertEqual(ranks(out, "D"), ["10.0.1.2:2", "10.0.1.3:2", "10.0.1.2:2", "10.0.1.3:2"])
        self.assertEqual([l.split()[2] for l in out.splitlines() if l.strip().startswith("D[")],
                         ["dp_rank=0", "dp_rank=0", "dp_rank=1", "dp_rank=1"])

    def test_aliases_for_first_token_and_repeat(self):
        rc, out, _ = dry("-p", "10.0.1.1:1", "-d", "10.0.1.2:2", "--generator_on_p_node", "--handoff", "store",
                         "--repeat_d_times", "3")
        self.assertEqual(rc, 0)
        self.assertIn("first-token=prefill", out)
        self.assertIn("repeat-d-times=3", out)


class Files(t.TestCase):
    def test_seed_topologies(self):
        rc, out, err = dry("--config", "conf/xpyd-dp16.json")
        self.assertEqual(rc, 0, err)
        d = ranks(out, "D")
        self.assertEqual(len(d), 16)
        self.assertEqual(d[:4], ["10.0.1.1:8200", "10.0.1.2:8200", "10.0.1.1:8201", "10.0.1.2:8201"])
        self.assertEqual(d[-1], "10.0.1.2:8207")
        self.assertIn("tp=8", [l.split()[3] for l in out.splitlines() if l.strip().startswith("P[")])
        for f, handoff, np, nd in [("conf/1p1d.json", "kv-params", 1, 1), ("conf/store.json", "store", 1, 2),
                                   ("conf/sglang-bootstrap.json", "bootstrap", 1, 1),
                                   ("conf/mooncake.json", "mooncake", 2, 1),
                                   ("conf/sim-cluster.json", "kv-params", 2, 2)]:
            rc, out, err = dry("--config", f)
            self.assertEqual(rc, 0, err)
            self.assertIn("handoff=" + handoff, out)
            self.assertEqual((len(ranks(out, "P")), len(ranks(out, "D"))), (np, nd), f)
        rc, out, _ = dry("--config", "conf/sglang-bootstrap.json")
        self.assertIn("bootstrap_port=8998", out)
        rc, out, _ = dry("--config", "conf/mooncake.json")
        self.assertIn("P[1] 10.0.0.2:8100 dp_rank=0", out)
        self.assertIn("bootstrap_port=8998", out)

    def test_cli_wins(self):
        rc, out, _ = dry("--config", "conf/1p1d.json", "--port", "9999", "-d", "10.0.9.9:1")
        self.assertIn("listen 0.0.0.0:9999", out)
        self.assertEqual(ranks(out, "D"), ["10.0.9.9:1"])
        self.assertEqual(ranks(out, "P"), ["10.0.0.1:8100"])


class Errors(t.TestCase):
    def test_clear_errors(self):
        for args, needle in [(["-p", "10.0.1.1:1"], "at least one prefill"), (["-p", "10.0.1.1:1", "-d", "10.0.1.2:x"], "bad decode address"),
                             (["-p", "10.0.1.1:1", "-d", "10.0.1.2:1", "--bogus", "1"], "unknown option"),
                             (["-p", "10.0.1.1:1", "-d", "10.0.1.2:1", "--handoff", "magic"], "unknown value"),
                             (["-p", "10.0.1.1:1", "-d", "10.0.1.2:1", "--repeat-d-times", "2"], "needs --handoff store"),
                             (["-p", "10.0.1.1:1", "-d", "10.0.1.2:1", "--connect-timeout-ms", "0"], "[1, 3600000]"),
                             (["--config", "/nonexistent.json"], "cannot open config")]:
            rc, out, err = dry(*args)
            self.assertEqual(rc, 2, args)
            self.assertIn(needle, err)

    def topo(self, obj):
        path = os.path.join(tempfile.mkdtemp(prefix="xpyd-topo-"), "t.json")
        with open(path, "w") as f:
            json.dump(obj, f)
        return dry("--config", path)

    def test_topology_keys_are_strict_at_every_level(self):
        base = lambda: {"prefill": {"hosts": [{"host": "10.0.0.1", "port": 8100}]},
                        "decode": {"hosts": [{"host": "10.0.0.2", "port": 8200}]}}
        for mutate, path in [(lambda o: o["prefill"].update(polcy="rr"), "prefill.polcy"),
                             (lambda o: o["decode"].update({"max-inflght": 4}), "decode.max-inflght"),
                             (lambda o: o["decode"]["hosts"][0].update(wieght=2), "decode.hosts[0].wieght"),
                             (lambda o: o["prefill"]["hosts"].append({"host": "10.0.0.3", "port": 1, "bootstrap": 1}),
                              "prefill.hosts[1].bootstrap"),
                             (lambda o: o.update(helth_interval_ms=5), "helth_interval_ms")]:
            o = base()
            mutate(o)
            rc, out, err = self.topo(o)
            self.assertEqual(rc, 2, (path, out))
            self.assertIn('"%s"' % path, err)
        # '-' and '_' are the same at every level; "_comment" keys are skipped
        o = base()
        o["_comment"] = "x"
        o["prefill"].update({"max-inflight": 3, "_note": "y"})
        o["decode"]["hosts"][0].update({"max-model-len": 4096, "weight": 2})
        o["health-interval-ms"] = 500
        rc, out, err = self.topo(o)
        self.assertEqual(rc, 0, err)
        self.assertIn("max_inflight=3", [w for l in out.splitlines() if "P[0]" in l for w in l.split()])
        self.assertIn("max_model_len=4096", out)
        self.assertIn("weight=2", out)
        # wrong shapes say where
        o = base()
        o["decode"]["hosts"] = {"host": "10.0.0.2"}
        self.assertIn('"decode.hosts" must be an array', self.topo(o)[2])
        o = base()
        o["prefill"]["hosts"][0]["port"] = "8100"
        self.assertIn('"prefill.hosts[0].port" must be a non-negative integer', self.topo(o)[2])

    def test_dry_run_resolves_names_and_aliases_pair(self):
        rc, out, err = dry("-p", "no-such-host.invalid:1", "-d", "127.0.0.1:2")
        self.assertEqual(rc, 2)
        self.assertIn("cannot resolve 'no-such-host.invalid'", err)
        rc, out, err = dry("-p", "10.0.0.1:1", "--decoder-hosts", "10.0.0.2", "--decoder-ports", "8200", "8201")
        self.assertEqual(rc, 0, err)
        self.assertEqual(ranks(out, "D"), ["10.0.0.2:8200", "10.0.0.2:8201"])  # one host on each port
        rc, out, err = dry("-p", "10.0.0.1:1", "--decoder-hosts", "10.0.0.2", "10.0.0.3", "--decoder-ports", "8200")
        self.assertEqual(ranks(out, "D"), ["10.0.0.2:8200", "10.0.0.3:8200"])  # one port for every host
        rc, out, err = dry("-p", "10.0.0.1:1", "--decoder-hosts", "10.0.0.2", "10.0.0.3", "10.0.0.4",
                           "--decoder-ports", "8200", "8201")
        self.assertEqual(rc, 2)
        self.assertIn("3 hosts and --decoder-ports 2 ports", err)

    def test_help_documents_every_setting(self):
        out = subprocess.run([ROUTER, "--help"], capture_output=True, text=True).stdout
        for flag in ["--prefill", "--decode", "--prefill-dp", "--decode-tp", "--dp-mode", "--handoff", "--first-token",
                     "--repeat-d-times", "--config", "--dry-run", "--prefiller-hosts", "--generator_on_p_node",
                     "--threads", "--connect-timeout-ms", "--first-token-timeout-ms", "--stream-idle-timeout-ms",
                     "--max-body-bytes", "--max-retries", "--prefill-policy"]:
            self.assertIn(flag, out)


class LaunchHelpers(t.TestCase):
    def run_print(self, script, *args):
        out = subprocess.run([os.path.join(ROOT, "scripts", script)] + list(args) + ["--print"],
                             capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, XPYD_BIN=t.BIN))
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip().splitlines()

    def test_nixl_external_dp(self):
        lines = self.run_print("launch_engine.sh", "--role", "decode", "--connector", "nixl", "--model", "m",
                               "--port", "8200", "--dp", "2")
        self.assertEqual(len(lines), 2)
        for r, l in enumerate(lines):
            self.assertIn("VLLM_NIXL_SIDE_CHANNEL_PORT=%d" % (5600 + r), l)
            self.assertIn("--port %d" % (8200 + r), l)
            self.assertIn("--data-parallel-rank %d" % r, l)
            self.assertIn("\"kv_connector\":\"NixlConnector\"", l)

    def test_mooncake_and_store_and_sglang(self):
        l = self.run_print("launch_engine.sh", "--role", "prefill", "--connector", "mooncake-ascend", "--model", "m")[0]
        self.assertIn("\"kv_connector\":\"MooncakeConnectorV1\"", l)
        self.assertIn("\"kv_role\":\"kv_producer\"", l)
        l = self.run_print("launch_engine.sh", "--role", "decode", "--connector", "mooncake-store", "--model", "m")[0]
        self.assertTrue(l.startswith("env MOONCAKE_CONFIG_PATH="))
        self.assertIn("\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"kv_consumer\"", l)
        l = self.run_print("launch_engine.sh", "--role", "prefill", "--connector", "sglang", "--model", "m")[0]
        self.assertIn("--disaggregation-mode prefill", l)
        self.assertIn("--disaggregation-bootstrap-port 8998", l)
        l = self.run_print("launch_engine.sh", "--role", "decode", "--connector", "sglang", "--model", "m")[0]
        self.assertNotIn("bootstrap-port", l)

    def launch_recorded(self, *args):
        """Runs launch_engine.sh for real with a recording `vllm` first on PATH; returns what each started
        process received: [(argv, VLLM_MOONCAKE_BOOTSTRAP_PORT or None)]."""
        tmp = tempfile.mkdtemp(prefix="xpyd-launch-")
        rec = os.path.join(tmp, "rec")
        os.mkdir(rec)
        fake = os.path.join(tmp, "vllm")
        with open(fake, "w") as f:
            f.write("#!/usr/bin/env python3\nimport json, os, sys\n"
                    "json.dump({'argv': sys.argv[1:], 'boot': os.environ.get('VLLM_MOONCAKE_BOOTSTRAP_PORT')},"
                    " open(os.path.join(%r, str(os.getpid())), 'w'))\n" % rec)
        os.chmod(fake, 0o755)
        env = dict(os.environ, PATH=tmp + ":" + os.environ["PATH"])
        run = os.path.join(tmp, "run")
        out = subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh")] + list(args) + ["--run-dir", run],
                             capture_output=True, text=True, cwd=ROOT, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        n = len(out.stdout.strip().splitlines())
        t.wait_until(lambda: len(os.listdir(rec)) == n, what="every launched engine recorded")
        subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh"), "--stop", "--run-dir", run], check=True)
        got = []
        for name in sorted(os.listdir(rec)):
            with open(os.path.join(rec, name)) as f:
                j = json.load(f)
            got.append((j["argv"], j["boot"]))
        return sorted(got, key=lambda g: g[0])

    def test_vllm_mooncake_connector_launched(self):
        # upstream vLLM's MooncakeConnector, executed (not only printed): the prefill runs DP internally with
        # its bootstrap server's port in VLLM_MOONCAKE_BOOTSTRAP_PORT; the decodes are consumers without it
        got = self.launch_recorded("--role", "prefill", "--connector", "mooncake", "--model", "m", "--port", "8100",
                                   "--dp", "2", "--dp-mode", "internal", "--bootstrap-port", "9100")
        self.assertEqual(len(got), 1)
        argv, boot = got[0]
        self.assertEqual(boot, "9100")
        self.assertEqual(argv[:2], ["serve", "m"])
        self.assertEqual(argv[argv.index("--port") + 1], "8100")
        self.assertEqual(argv[argv.index("--data-parallel-size") + 1], "2")
        self.assertNotIn("--data-parallel-rank", argv)
        self.assertEqual(json.loads(argv[argv.index("--kv-transfer-config") + 1]),
                         {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"})
        got = self.launch_recorded("--role", "decode", "--connector", "mooncake", "--model", "m", "--port", "8200",
                                   "--dp", "2")
        self.assertEqual(len(got), 2)
        for r, (argv, boot) in enumerate(got):
            self.assertIsNone(boot)
            self.assertEqual(argv[argv.index("--port") + 1], str(8200 + r))
            self.assertEqual(argv[argv.index("--data-parallel-rank") + 1], str(r))
            self.assertEqual(json.loads(argv[argv.index("--kv-transfer-config") + 1]),
                             {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"})

    def test_mooncake_prefill_refuses_external_dp(self):
        out = subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh"), "--role", "prefill", "--connector",
                              "mooncake", "--model", "m", "--dp", "2", "--print"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)
        self.assertIn("use --dp-mode internal", out.stderr)

    def test_router_from_topology(self):
        lines = self.run_print("launch_router.sh", "--config", "conf/xpyd-dp16.json")
        self.assertTrue(lines[0].endswith("xpyd_router --config conf/xpyd-dp16.json"))
        self.assertIn("decode pool: 16 ranks, policy lot", lines)


class Ipv6Live(t.TestCase):
    def test_router_reaches_ipv6_engines(self):
        # whether this machine has an IPv6 loopback is decided here, by the test itself; a sim that fails to
        # start on [::1] where Python can bind it is a failure, not a skip
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.bind(("::1", 0))
        except OSError as e:
            self.skipTest("no IPv6 loopback here: %s" % e)
        p = self.start(t.Proc("xpyd_sim", ["--host", "::1", "--port", "0", "--role", "prefill"], ready_path=None))
        d = self.start(t.Proc("xpyd_sim", ["--host", "::1", "--port", "0", "--role", "decode"], ready_path=None))
        r = self.start(t.router(["[::1]:%d" % p.port], ["[::1]:%d" % d.port]))
        st, _, out = t.post_json(r.port, "/v1/completions", {"prompt": "a b", "max_tokens": 2})
        self.assertEqual(st, 200, out)


if __name__ == "__main__":
    t.main()
