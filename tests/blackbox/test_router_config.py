# SPDX-License-Identifier: Apache-2.0
"""Router configuration: host lists in every accepted form, the Python proxies' aliases, JSON topology
files (the CLI wins), DP expansion, errors, --help; and the launch helpers' --print commands."""
import json
import os
import re
import shutil
import subprocess

import socket

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

    def test_hosts_that_cannot_name_an_engine_are_refused(self):
        for bad in ("a b", 'a"b', "a\\b", "h\u00e9te"):
            rc, out, err = dry("-p", "%s:1" % bad, "-d", "10.0.0.3:3")
            self.assertNotEqual(rc, 0, bad)
            self.assertIn("bad prefill address", err)
            path = os.path.join(t.tmpdir(), "topology.json")
            with open(path, "w") as f:
                json.dump({"prefill": {"hosts": [{"host": bad, "port": 1}]}, "decode": {"hosts": ["10.0.0.3:3"]}}, f)
            rc, out, err = dry("--config", path)
            self.assertNotEqual(rc, 0, bad)
            self.assertIn('"prefill.hosts[0].host" must be a host name or an IP address', err)
        rc, out, err = dry("-p", "[::1]:1", "-d", "localhost:3")  # (names with '_' and zones: test_util)
        self.assertEqual(rc, 0, err)

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


    def test_per_host_settings_override_the_pool(self):
        """A host's own tp, weight, max_inflight and max_model_len win over the pool's: capacity weights
        placement by them (a tp=4 host takes four times the load of a tp=1 one)."""
        path = os.path.join(t.tmpdir(prefix="xpyd-topo-"), "t.json")
        with open(path, "w") as f:
            json.dump({"prefill": {"hosts": ["10.0.0.1:8100"]},
                       "decode": {"tp": 2, "max_inflight": 8, "hosts": [
                           {"host": "10.0.1.1", "port": 8200, "tp": 4, "weight": 3, "max_inflight": 16,
                            "max_model_len": 4096},
                           {"host": "10.0.1.2", "port": 8200}]}}, f)
        rc, out, err = dry("--config", path)
        self.assertEqual(rc, 0, err)
        d = [l for l in out.splitlines() if l.strip().startswith("D[")]
        self.assertIn("10.0.1.1:8200 dp_rank=-1 tp=4 weight=3 max_model_len=4096 max_inflight=16", d[0])
        self.assertIn("10.0.1.2:8200 dp_rank=-1 tp=2 weight=1 max_model_len=0 max_inflight=8", d[1])


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
        path = os.path.join(t.tmpdir(prefix="xpyd-topo-"), "t.json")
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

    def test_mistakes_in_the_topology_are_refused(self):
        P, D = ["-p", "10.0.0.1:8100"], ["-d", "10.0.0.2:8200"]
        for args, needle in [
                (P + ["-d", "10.0.0.2:8200,10.0.0.3:8200", "10.0.0.2:8200"],
                 "the decode pool lists 10.0.0.2:8200 twice (entries 1 and 3)"),
                (P + ["-d", "10.0.0.2:8200", "10.0.0.2:8202", "--decode-dp", "4"],
                 "decode hosts 10.0.0.2:8200 (ports 8200-8203) and 10.0.0.2:8202 (ports 8202-8205) overlap"),
                (["-p", "10.0.0.1:8100", "10.0.0.2:8200"] + D, "10.0.0.2:8200 is in both the prefill and the decode"),
                (P + D + ["--query-interval-ms", "500"], "--query-interval-ms does nothing with --handoff kv-params"),
                (P + D + ["--prefill-bootstrap-port", "9000"],
                 "--prefill-bootstrap-port does nothing with --handoff kv-params"),
                (P + D + ["--handoff", "bootstrap", "--local-prefill-max-tokens", "100"],
                 "--local-prefill-max-tokens does nothing with --handoff bootstrap"),
                (P + D + ["--handoff", "mooncake", "--migration-prefill-min-tokens", "100"],
                 "--migration-prefill-min-tokens does nothing with --handoff mooncake")]:
            with self.subTest(args=args):
                rc, out, err = dry(*args)
                self.assertEqual(rc, 2, out)
                self.assertIn(needle, err)
        # what is fine: internal DP ranks on one port, distinct ports of one host, the flags where they apply,
        # and an engine in both pools when the operator says it serves both
        for args in (P + ["-d", "10.0.0.2:8200", "10.0.0.2:8204", "--decode-dp", "4"],
                     P + ["-d", "10.0.0.2:8200", "--decode-dp", "4", "--dp-mode", "internal"],
                     P + D + ["--handoff", "mooncake", "--query-interval-ms", "500", "--prefill-bootstrap-port", "9000"],
                     P + D + ["--local-prefill-max-tokens", "100"]):
            rc, out, err = dry(*args)
            self.assertEqual(rc, 0, (args, err))
        rc, out, err = dry("-p", "10.0.0.1:8100", "-d", "10.0.0.1:8100", "--allow-engine-in-both-pools", "on")
        self.assertEqual(rc, 0, err)
        self.assertIn("warning: 10.0.0.1:8100 is in both pools", err)
        # a host's own bootstrap port in a file, with a mode that has no bootstrap server
        rc, out, err = self.topo({"prefill": {"hosts": [{"host": "10.0.0.1", "port": 8100, "bootstrap_port": 9}]},
                                  "decode": {"hosts": ["10.0.0.2:8200"]}})
        self.assertEqual(rc, 2, out)
        self.assertIn('a host\'s "bootstrap_port" does nothing with --handoff kv-params', err)

    def test_a_malformed_file_names_line_and_column(self):
        path = os.path.join(t.tmpdir(prefix="xpyd-topo-"), "t.json")
        for text, needle in [('{\n  "prefill": {"hosts": ["10.0.0.1:1"]},\n  "decode": {"hosts": ["10.0.0.2:1"]\n}\n',
                              "line 5, column 1: "),
                             ('{"prefill": {"hosts": ["10.0.0.1:1"]},\n "decode": {"hosts": [\'10.0.0.2:1\']}}',
                              "line 2, column 23: invalid JSON value"),
                             ('{"prefill": {"hosts": ["10.0.0.1:1"]}, "decode": {"hosts": ["10.0.0.2:1"]}} x',
                              "line 1, column 77: unexpected data after the JSON value"),
                             ('{"prefill": {"hosts": ["10.0.0.1:1"]}, "decode": {"hosts": ["10.0.0.2:1"]},\n'
                              ' "threads": 2, "threads": 4}', '"threads" is given twice'),
                             ('{"prefill": {"hosts": [{"host": "10.0.0.1", "port": 1, "tp": 2, "tp": 4}]},'
                              ' "decode": {"hosts": ["10.0.0.2:1"]}}', '"tp" is given twice in prefill.hosts[0]'),
                             ('{"prefill": {"hosts": ["10.0.0.1:1"], "max-inflight": 2, "max_inflight": 3},'
                              ' "decode": {"hosts": ["10.0.0.2:1"]}}', '"max_inflight" is given twice in prefill')]:
            with self.subTest(text=text):
                with open(path, "w") as f:
                    f.write(text)
                rc, out, err = dry("--config", path)
                self.assertEqual(rc, 2, out)
                self.assertIn(needle, err)

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

    def test_help_names_only_real_flags(self):
        """Every --flag the help text mentions is one the router takes (it once cited --engine-metrics, which
        never existed): each is tried on a dry run, where an unknown one is refused by name."""
        out = subprocess.run([ROUTER, "--help"], capture_output=True, text=True).stdout
        mentioned = set(re.findall(r"(--[a-z][a-z0-9_-]*[a-z0-9_])(?![-a-z0-9_/])", out)) - {"--help", "--version"}
        self.assertGreater(len(mentioned), 80)
        for flag in sorted(mentioned):
            rc, _, err = dry(flag, "x", "-p", "10.0.0.1:1", "-d", "10.0.0.2:1")
            self.assertNotIn("unknown option '%s'" % flag, err)
            self.assertNotIn("unknown or incomplete option '%s'" % flag, err)


RECORDER = """#!/usr/bin/env python3
import json, os, sys, time
args = sys.argv[1:]
real = %(real)r
if real and args[:2] != ["-m", "sglang.launch_server"]:
    os.execv(real, [real] + args)  # a stand-in python3 runs everything but SGLang's launcher for real
keep = ("CUDA_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "VLLM_MOONCAKE_BOOTSTRAP_PORT", "MOONCAKE_CONFIG_PATH", "PYTHONHASHSEED")
path = os.path.join(%(rec)r, str(os.getpid()))
with open(path + ".tmp", "w") as f:
    json.dump({"prog": os.path.basename(sys.argv[0]), "argv": args,
               "env": {k: os.environ[k] for k in keep if k in os.environ}}, f)
os.rename(path + ".tmp", path)
code = int(os.environ.get("FAKE_EXIT", "-1"))
if code >= 0:
    sys.exit(code)
time.sleep(60)  # a live engine until --stop
"""


def opt(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


class LaunchHelpers(t.TestCase):
    """The launch helpers run for real against recording stand-ins for `vllm` and `python3 -m
    sglang.launch_server` put first on PATH: each started engine records its argv and environment."""

    def run_print(self, script, *args):
        out = subprocess.run([os.path.join(ROOT, "scripts", script)] + list(args) + ["--print"],
                             capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, XPYD_BIN=t.BIN))
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip().splitlines()

    def launch(self, *args, fake_exit=None, expect_rc=0):
        tmp = t.tmpdir(prefix="xpyd-launch-")
        rec = os.path.join(tmp, "rec")
        os.mkdir(rec)
        real_py = shutil.which("python3")
        for prog, real in (("vllm", None), ("python3", real_py)):
            path = os.path.join(tmp, prog)
            with open(path, "w") as f:
                f.write(RECORDER.replace("#!/usr/bin/env python3", "#!" + real_py) % {"real": real, "rec": rec})
            os.chmod(path, 0o755)
        env = dict(os.environ, PATH=tmp + ":" + os.environ["PATH"])
        if fake_exit is not None:
            env["FAKE_EXIT"] = str(fake_exit)
        run = os.path.join(tmp, "run")
        out = subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh")] + list(args) +
                             ["--run-dir", run, "--check-s", "1.5"], capture_output=True, text=True, cwd=tmp, env=env)
        self.addCleanup(subprocess.run, [os.path.join(ROOT, "scripts", "launch_engine.sh"), "--stop", "--run-dir", run])
        self.assertEqual(out.returncode, expect_rc, out.stdout + out.stderr)
        n = len([l for l in out.stdout.splitlines() if l.startswith("started pid")])
        t.wait_until(lambda: len([x for x in os.listdir(rec) if not x.endswith(".tmp")]) == n,
                     what="every launched engine recorded")
        got = []
        for name in [x for x in os.listdir(rec) if not x.endswith(".tmp")]:
            with open(os.path.join(rec, name)) as f:
                got.append(json.load(f))
        return sorted(got, key=lambda g: int(opt(g["argv"], "--port") or 0)), out

    def kv(self, argv):
        return json.loads(opt(argv, "--kv-transfer-config"))

    def test_nixl_one_host_prefill_and_decode(self):
        # vLLM's NIXL guide: producer/consumer roles, the side channel's host set, one base port per instance
        # (vLLM adds the DP rank), prefill and decode on one host not sharing ports, a GPU set per rank
        (p,), _ = self.launch("--role", "prefill", "--connector", "nixl", "--model", "m", "--side-host", "10.0.0.5",
                              "--gpus", "0")
        self.assertEqual(p["prog"], "vllm")
        self.assertEqual(p["argv"][:2], ["serve", "m"])
        self.assertEqual(opt(p["argv"], "--port"), "8100")
        self.assertEqual(p["env"], {"CUDA_VISIBLE_DEVICES": "0", "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.5",
                                    "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"})
        # no kv_load_failure_policy: "fail" is vLLM's default, and vLLM < 0.11.1 refuses the key at start
        self.assertEqual(self.kv(p["argv"]), {"kv_connector": "NixlConnector", "kv_role": "kv_producer"})
        ds, _ = self.launch("--role", "decode", "--connector", "nixl", "--model", "m", "--side-host", "10.0.0.5",
                            "--dp", "2", "--tp", "2", "--gpus", "1,2,3,4")
        self.assertEqual([opt(d["argv"], "--port") for d in ds], ["8200", "8201"])
        self.assertEqual([opt(d["argv"], "--data-parallel-rank") for d in ds], ["0", "1"])
        self.assertEqual([d["env"]["CUDA_VISIBLE_DEVICES"] for d in ds], ["1,2", "3,4"])
        self.assertEqual({d["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for d in ds}, {"6600"})  # 6600+r: no clash
        self.assertEqual({self.kv(d["argv"])["kv_role"] for d in ds}, {"kv_consumer"})

    def test_decode_dp16_over_two_nodes_gives_global_ranks(self):
        # conf/xpyd-dp16.json's decode side: DP 16 over two nodes, 8 ranks each on ports 8200-8207
        ranks = []
        for start in (0, 8):
            ds, _ = self.launch("--role", "decode", "--connector", "nixl", "--model", "m", "--dp-size", "16",
                                "--dp-local", "8", "--dp-start-rank", str(start), "--dp-address", "10.0.1.1",
                                "--gpus", "0,1,2,3,4,5,6,7")
            self.assertEqual([opt(d["argv"], "--port") for d in ds], [str(8200 + i) for i in range(8)])
            for d in ds:
                self.assertEqual(opt(d["argv"], "--data-parallel-size"), "16")
                self.assertEqual(opt(d["argv"], "--data-parallel-address"), "10.0.1.1")
            ranks += [int(opt(d["argv"], "--data-parallel-rank")) for d in ds]
        self.assertEqual(sorted(ranks), list(range(16)))
        # internal DP: one process per node, the second headless
        (d,), _ = self.launch("--role", "decode", "--connector", "nixl", "--model", "m", "--dp-size", "16",
                              "--dp-local", "8", "--dp-start-rank", "8", "--dp-mode", "internal")
        self.assertEqual((opt(d["argv"], "--data-parallel-size-local"), opt(d["argv"], "--data-parallel-start-rank")),
                         ("8", "8"))
        self.assertIn("--headless", d["argv"])

    def test_vllm_mooncake_connector_launched(self):
        (p,), _ = self.launch("--role", "prefill", "--connector", "mooncake", "--model", "m", "--dp", "2",
                              "--dp-mode", "internal", "--bootstrap-port", "9100")
        self.assertEqual(p["env"], {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "9100"})
        self.assertEqual(opt(p["argv"], "--data-parallel-size"), "2")
        self.assertNotIn("--data-parallel-rank", p["argv"])
        self.assertEqual(self.kv(p["argv"]), {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"})
        ds, _ = self.launch("--role", "decode", "--connector", "mooncake", "--model", "m", "--dp", "2")
        self.assertEqual([d["env"] for d in ds], [{}, {}])
        self.assertEqual([opt(d["argv"], "--data-parallel-rank") for d in ds], ["0", "1"])
        self.assertEqual({json.dumps(self.kv(d["argv"])) for d in ds},
                         {json.dumps({"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"})})

    def test_mooncake_ascend_and_store(self):
        (p,), _ = self.launch("--role", "prefill", "--connector", "mooncake-ascend", "--model", "m", "--dp", "2",
                              "--dp-mode", "internal", "--tp", "8", "--decode-sizes", "32x1")
        self.assertEqual(self.kv(p["argv"])["kv_connector"], "MooncakeConnectorV1")
        self.assertEqual(self.kv(p["argv"])["kv_port"], "20001")
        # both roles' parallel sizes, which vllm-ascend's connector needs to map the KV
        self.assertEqual(self.kv(p["argv"])["kv_connector_extra_config"],
                         {"prefill": {"dp_size": 2, "tp_size": 8}, "decode": {"dp_size": 32, "tp_size": 1}})
        out = subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh"), "--role", "prefill", "--connector",
                              "mooncake-ascend", "--model", "m", "--print"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)
        self.assertIn("needs --decode-sizes", out.stderr)
        (d,), _ = self.launch("--role", "decode", "--connector", "mooncake-store", "--model", "m",
                              "--mooncake-config", "/etc/mc.json")
        # the store keys blocks by Python hashes: every engine shares one seed
        self.assertEqual(d["env"], {"MOONCAKE_CONFIG_PATH": "/etc/mc.json", "PYTHONHASHSEED": "0"})
        self.assertEqual(self.kv(d["argv"]), {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_consumer"})

    def test_sglang_internal_and_external_dp(self):
        # DP replicas (the default): DP x TP GPUs, no attention DP (it was always added once: DP=2 TP=4 then used 4
        # GPUs instead of 8, and TP=1 failed SGLang's tp_size % dp_size check at start)
        (p,), _ = self.launch("--role", "prefill", "--connector", "sglang", "--model", "m", "--dp", "2",
                              "--dp-mode", "internal", "--tp", "4", "--gpus", "0,1,2,3,4,5,6,7")
        self.assertEqual(p["argv"][:2], ["-m", "sglang.launch_server"])
        self.assertEqual((opt(p["argv"], "--port"), opt(p["argv"], "--dp-size"), opt(p["argv"], "--tp-size")),
                         ("8100", "2", "4"))
        self.assertNotIn("--enable-dp-attention", p["argv"])
        self.assertEqual(p["env"]["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7")
        # attention DP when asked (MLA/MoE models): the TP group's GPUs, tp divisible by dp
        (a,), _ = self.launch("--role", "prefill", "--connector", "sglang", "--model", "m", "--dp", "2",
                              "--dp-mode", "internal", "--tp", "4", "--dp-attention", "on", "--gpus", "0,1,2,3")
        self.assertIn("--enable-dp-attention", a["argv"])
        self.assertEqual((opt(a["argv"], "--dp-size"), opt(a["argv"], "--tp-size")), ("2", "4"))
        self.assertEqual(a["env"]["CUDA_VISIBLE_DEVICES"], "0,1,2,3")
        self.assertEqual(opt(p["argv"], "--disaggregation-bootstrap-port"), "8998")
        self.assertEqual(opt(p["argv"], "--disaggregation-mode"), "prefill")
        ds, _ = self.launch("--role", "decode", "--connector", "sglang", "--model", "m", "--dp", "2",
                            "--gpus", "4,5")
        self.assertEqual([opt(d["argv"], "--port") for d in ds], ["8200", "8201"])  # decode's own default port
        self.assertEqual([d["env"]["CUDA_VISIBLE_DEVICES"] for d in ds], ["4", "5"])
        self.assertEqual([opt(d["argv"], "--disaggregation-bootstrap-port") for d in ds], [None, None])
        self.assertEqual([opt(d["argv"], "--dp-size") for d in ds], [None, None])

    def test_engine_that_dies_at_once_is_reported(self):
        got, out = self.launch("--role", "prefill", "--connector", "nixl", "--model", "m", fake_exit=3, expect_rc=1)
        self.assertEqual(len(got), 1)
        self.assertIn("exited at once", out.stderr)

    def test_bad_combinations_refused(self):
        for args, needle in [(["--connector", "mooncake", "--dp", "2"], "use --dp-mode internal"),
                             (["--connector", "nixl", "--dp-size", "4", "--dp-local", "2", "--dp-start-rank", "3"],
                              "more than --dp-size"),
                             (["--connector", "nixl", "--dp", "2", "--tp", "2", "--gpus", "0,1,2"], "need 4"),
                             (["--connector", "sglang", "--dp", "4", "--dp-mode", "internal", "--tp", "2",
                               "--dp-attention", "on"], "must be a multiple of --dp-size"),
                             (["--connector", "sglang", "--dp", "2", "--dp-mode", "internal", "--tp", "4", "--gpus",
                               "0,1,2,3"], "need 8"),
                             (["--connector", "nixl", "--polcy", "x"], "unknown argument")]:
            out = subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh"), "--role", "prefill", "--model",
                                  "m", "--print"] + args, capture_output=True, text=True)
            self.assertEqual(out.returncode, 2, args)
            self.assertIn(needle, out.stderr)

    def test_help_lists_every_flag(self):
        out = subprocess.run([os.path.join(ROOT, "scripts", "launch_engine.sh"), "--help"], capture_output=True,
                             text=True).stdout
        src = open(os.path.join(ROOT, "scripts", "launch_engine.sh")).read()
        for flag in re.findall(r'^  "(--[a-z-]+)\|', src, re.M):
            self.assertRegex(out, r"\n  %s " % re.escape(flag))
        self.assertNotIn("set -euo", out)

    def test_router_from_topology(self):
        lines = self.run_print("launch_router.sh", "--config", "conf/xpyd-dp16.json")
        self.assertTrue(lines[0].endswith("xpyd_router --config %s" % os.path.realpath(
            os.path.join(ROOT, "conf", "xpyd-dp16.json"))), lines[0])
        self.assertIn("decode pool: 16 ranks, policy lot", lines)

    def test_launch_router_paths_and_outcome(self):
        # a relative --config is the caller's; a router that exits is reported, one that comes up too
        tmp = t.tmpdir(prefix="xpyd-lr-")
        with open(os.path.join(tmp, "good.json"), "w") as f:
            json.dump({"port": 0, "prefill": {"hosts": ["127.0.0.1:9"]}, "decode": {"hosts": ["127.0.0.1:10"]}}, f)
        with open(os.path.join(tmp, "bad.json"), "w") as f:
            json.dump({"port": 0, "prefill": {"hosts": ["127.0.0.1:9"]}, "decode": {"hosts": [{"hots": "x"}]}}, f)
        script = os.path.join(ROOT, "scripts", "launch_router.sh")
        env = dict(os.environ, XPYD_BIN=t.BIN)
        run = os.path.join(tmp, "run")
        out = subprocess.run([script, "--config", "bad.json", "--run-dir", run], cwd=tmp, env=env,
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("exited (status 2) instead of starting", out.stderr)
        self.assertIn("decode.hosts[0]", out.stderr)
        out = subprocess.run([script, "--config", "good.json", "--run-dir", run], cwd=tmp, env=env,
                             capture_output=True, text=True)
        self.addCleanup(subprocess.run, [script, "--stop", "--run-dir", run])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"xpyd_router (ready|up)")
        port = int(open(os.path.join(run, "router.port")).read())
        self.assertLess(t.request(port, "GET", "/health")[0], 600)
        subprocess.run([script, "--stop", "--run-dir", run], check=True)
        self.assertFalse(os.path.exists(os.path.join(run, "router.pid")))
        out = subprocess.run([script, "--config", "missing.json"], cwd=tmp, env=env, capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)
        self.assertIn("relative paths are from %s" % tmp, out.stderr)

    def test_gaudi_start_proxy_as_the_guide_runs_it(self):
        """scripts/xpyd_start_proxy.sh X Y Z false [benchmark], the Gaudi guide's command, with its IP arrays
        (here from the environment) mapped onto xpyd_router: X prefill nodes on 8100, Y decode nodes of 8 / Z DP
        ranks each on 8200.. (port-major across nodes), Mooncake store handoff, the proxy port; benchmark adds
        repeat mode. Ports are moved to free ones for the test."""
        pbase, dbase, proxy = t.free_port(), t.free_port_range(2), t.free_port()
        store = t.tmpdir(prefix="xpyd-store-")
        sims = [t.Proc("xpyd_sim", ["--port", str(pbase), "--role", "prefill", "--handoff", "store", "--store-dir",
                                    store, "--log-level", "warn"], port_flag=False)]
        for host in ("127.0.0.1", "127.0.0.2"):
            sims.append(t.Proc("xpyd_sim", ["--host", host, "--port", str(dbase), "--dp-size", "2", "--role", "decode",
                                            "--handoff", "store", "--store-dir", store, "--decode-us-per-token", "0",
                                            "--log-level", "warn"], port_flag=False))
        for s in sims:
            self.start(s)
        for host, port in (("127.0.0.1", pbase), ("127.0.0.1", dbase), ("127.0.0.1", dbase + 1),
                           ("127.0.0.2", dbase), ("127.0.0.2", dbase + 1)):
            t.wait_until(lambda: t.request(port, "GET", "/health", host=host)[0] == 200, what="%s:%d" % (host, port))
        env = dict(os.environ, XPYD_ROUTER=os.path.join(t.BIN, "xpyd_router"), XPYD_PREFILL_IPS="127.0.0.1",
                   XPYD_DECODE_IPS="127.0.0.1 127.0.0.2", PBASE_PORT=str(pbase), DBASE_PORT=str(dbase),
                   PROXY_PORT=str(proxy), XPYD_ROUTER_ARGS="--host 127.0.0.1")
        script = os.path.join(ROOT, "scripts", "xpyd_start_proxy.sh")
        for args, repeat in ((["1", "2", "4", "false"], 0), (["1", "2", "4", "false", "benchmark"], 127),
                             (["1", "2", "4", "true", "3", "benchmark"], 3)):
            p = subprocess.Popen([script] + args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            try:
                t.wait_until(lambda: t.request(proxy, "GET", "/health")[0] == 200, timeout=20, what="the proxy")
                s = t.status(proxy)
                self.assertEqual([(i["host"], i["port"], i["tp"]) for i in s["pools"]["decode"]["instances"]],
                                 [("127.0.0.1", dbase, 4), ("127.0.0.2", dbase, 4), ("127.0.0.1", dbase + 1, 4),
                                  ("127.0.0.2", dbase + 1, 4)])
                self.assertEqual([(i["host"], i["port"]) for i in s["pools"]["prefill"]["instances"]],
                                 [("127.0.0.1", pbase)])
                self.assertEqual(s["handoff"], "store")
                self.assertEqual(s["first_token"], "prefill" if args[3] == "true" else "decode")
                st, _, out = t.post_json(proxy, "/v1/completions", {"prompt": "hello", "max_tokens": 3})
                self.assertEqual(st, 200, out)
                t.wait_until(lambda: t.metric(proxy, "xpyd_repeat_clones_total") == repeat, what="the clones")
            finally:
                p.terminate()
                p.wait(30)
        bad = subprocess.run([script, "1", "3", "4", "false"], env=env, capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("3 decode nodes, but DECODE_IPS lists 2", bad.stderr)


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
