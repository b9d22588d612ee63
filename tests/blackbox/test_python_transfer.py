# SPDX-License-Identifier: Apache-2.0
"""The transfer engine from Python: the xpyd_transfer binding and the mooncake.engine-compatible TransferEngine
(python/), replaying the call sequences vLLM's MooncakeConnector and SGLang's mooncake backend make, in two
processes over tcp on loopback and in one process over the project's fake libibverbs (rdma), with every byte
checked; the error paths; and the method names and arities the two connectors call."""
import hashlib
import inspect
import json
import os
import subprocess
import sys

import xpyd_testlib as t

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LIBDIR = os.path.realpath(os.path.join(t.BIN, "..", "lib"))
PYPATH = os.path.join(ROOT, "python") + ":" + os.path.join(ROOT, "python", "compat")


def env(lib="libxpyd_transfer.so.0", **extra):
    e = dict(os.environ, PYTHONPATH=PYPATH, XPYD_TRANSFER_LIB=os.path.join(LIBDIR, lib))
    e.update(extra)
    return t.preload_sanitizers(e)


# The decode (receiver) side of vLLM's MooncakeConnector: registers its KV blocks, publishes its session and
# block addresses, waits for the prefill to write them, checks every byte. Driven over stdin/stdout.
RECEIVER = r"""
import ctypes, hashlib, json, sys
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", sys.argv[1], "") == 0
nblocks, bs = int(sys.argv[2]), int(sys.argv[3])
kv = (ctypes.c_char * (nblocks * bs))()
base = ctypes.addressof(kv)
assert e.batch_register_memory([base], [nblocks * bs]) == 0
print(json.dumps({"session": "127.0.0.1:%d" % e.get_rpc_port(), "blocks": [base + i * bs for i in range(nblocks)]}),
      flush=True)
sys.stdin.readline()  # "done": the prefill's writes returned
print(json.dumps({"sha": hashlib.sha256(bytes(kv)).hexdigest()}), flush=True)
sys.stdin.readline()
"""

# The prefill (sender) side: registers its KV, then writes each block with batch_transfer_sync_write, as the
# connector does once the decode said where (its session and block addresses).
SENDER = r"""
import ctypes, hashlib, json, os, sys
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", sys.argv[1], "") == 0
peer = json.loads(sys.argv[2])
nblocks, bs = len(peer["blocks"]), int(sys.argv[3])
src = (ctypes.c_char * (nblocks * bs)).from_buffer_copy(os.urandom(nblocks * bs))
base = ctypes.addressof(src)
assert e.register_memory(base, nblocks * bs) == 0
order = list(range(nblocks))[::-1]  # not in address order, as KV blocks are not
rc = e.batch_transfer_sync_write(peer["session"], [base + i * bs for i in order], [peer["blocks"][i] for i in order],
                                 [bs] * nblocks)
print(json.dumps({"rc": rc, "sha": hashlib.sha256(bytes(src)).hexdigest()}), flush=True)
"""


class TwoProcessesOverTcp(t.TestCase):
    def test_vllm_connector_sequence(self):
        for nblocks, bs in ((256, 16384), (4, 4 << 20)):  # many KV blocks; a few large ones
            with self.subTest(nblocks=nblocks, bs=bs):
                rx = subprocess.Popen([sys.executable, "-c", RECEIVER, "tcp", str(nblocks), str(bs)], env=env(),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                self.addCleanup(rx.kill)
                peer = rx.stdout.readline()
                self.assertTrue(peer, "receiver did not start")
                tx = subprocess.run([sys.executable, "-c", SENDER, "tcp", peer.strip(), str(bs)], env=env(),
                                    capture_output=True, text=True, timeout=60)
                self.assertEqual(tx.returncode, 0, tx.stderr)
                sent = json.loads(tx.stdout)
                self.assertEqual(sent["rc"], 0)
                rx.stdin.write("done\n")
                rx.stdin.flush()
                got = json.loads(rx.stdout.readline())
                self.assertEqual(got["sha"], sent["sha"])  # every byte landed where it belonged
                rx.stdin.write("bye\n")
                rx.stdin.flush()
                self.assertEqual(rx.wait(10), 0)


IN_PROCESS = r"""
import ctypes, hashlib, json, os, sys
import xpyd_transfer as xt
from mooncake.engine import TransferEngine
proto = sys.argv[1]
out = {}
p, d = TransferEngine(), TransferEngine()
assert p.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
assert d.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
out["transport"] = p._e.transport
n, bs = 64, 65536
a = (ctypes.c_char * (n * bs)).from_buffer_copy(os.urandom(n * bs))
b = (ctypes.c_char * (n * bs))()
pa, da = ctypes.addressof(a), ctypes.addressof(b)
assert p.register_memory(pa, n * bs) == 0 and d.register_memory(da, n * bs) == 0
dsess = "127.0.0.1:%d" % d.get_rpc_port()
psess = "127.0.0.1:%d" % p.get_rpc_port()
# vLLM's sequence: the prefill writes every block with batch_transfer_sync_write, out of order
order = list(range(n))[::-1]
out["vllm_rc"] = p.batch_transfer_sync_write(dsess, [pa + i * bs for i in order], [da + i * bs for i in order], [bs] * n)
out["vllm_same"] = bytes(a) == bytes(b)
ctypes.memset(da, 0, n * bs)
# SGLang's sequence: async batch writes of the KV, status polled, then a read back of one block
bid = p.batch_transfer_async_write(dsess, [pa + i * bs for i in range(n)], [da + i * bs for i in range(n)], [bs] * n)
assert bid > 0
out["batch_status"] = p.get_batch_transfer_status([bid])
out["same"] = bytes(a) == bytes(b)
c = (ctypes.c_char * bs)()
assert d.register_memory(ctypes.addressof(c), bs) == 0
out["read"] = d.transfer_sync_read(psess, ctypes.addressof(c), pa + 5 * bs, bs)
out["read_same"] = bytes(c) == bytes(a)[5 * bs:6 * bs]
# single-request submit + check_status
bid = p.transfer_submit_write(dsess, pa, da + bs, 4096)
st = 0
while st == 0:
    st = p.transfer_check_status(bid)
out["check_status"] = st
out["first_buffer"] = p.get_first_buffer_address(dsess) == da
m = p.allocate_managed_buffer(1 << 20)
out["managed"] = m != 0 and p.free_managed_buffer(m, 1 << 20) == 0
# errors: conventions, never an exception
out["unregistered_local"] = p.transfer_sync_write(dsess, 0x1000, da, 64)
out["out_of_range"] = p.transfer_sync_write(dsess, pa, da + n * bs - 8, 64)
out["double_register"] = p.register_memory(pa, 4096)
out["mismatched"] = p.batch_transfer_sync_write(dsess, [pa], [da, da], [8])
out["bad_protocol"] = None
try:
    TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "nvlink", "")
except NotImplementedError as ex:
    out["bad_protocol"] = str(ex)
out["missing_method"] = None
try:
    p.get_local_topology()
except AttributeError as ex:
    out["missing_method"] = str(ex)
print(json.dumps(out))
"""


class OneProcess(t.TestCase):
    def run_sequence(self, proto, lib):
        res = subprocess.run([sys.executable, "-c", IN_PROCESS, proto], env=env(lib), capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["transport"], proto)
        self.assertEqual((out["vllm_rc"], out["vllm_same"]), (0, True))
        self.assertEqual(out["batch_status"], 0)
        self.assertTrue(out["same"])
        self.assertEqual(out["read"], 0)
        self.assertTrue(out["read_same"])
        self.assertEqual(out["check_status"], 1)
        self.assertTrue(out["first_buffer"])
        self.assertTrue(out["managed"])
        self.assertEqual(out["unregistered_local"], -1)
        self.assertEqual(out["out_of_range"], -1)
        self.assertNotEqual(out["double_register"], 0)
        self.assertEqual(out["mismatched"], -1)
        self.assertIn("tcp and rdma", out["bad_protocol"])
        self.assertIn("not provided by xpyd", out["missing_method"])
        return res.stderr

    def test_sglang_sequence_over_tcp(self):
        err = self.run_sequence("tcp", "libxpyd_transfer.so.0")
        self.assertIn("failed", err)  # the failures said why on stderr, as Mooncake logs them

    def test_sglang_sequence_over_fake_rdma(self):
        self.run_sequence("rdma", "libxpyd_transfer_fakeverbs.so")


class Binding(t.TestCase):
    def test_dead_peer_fails_within_the_timeout_and_errors_are_exceptions(self):
        code = r"""
import ctypes, socket, time, json
import xpyd_transfer as xt
e = xt.Engine("x", transport="tcp", io_timeout_ms=1000)
buf = bytearray(4096)
addr = e.register(buf)
out = {}
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
t0 = time.monotonic()
try:
    e.open_segment("127.0.0.1:%d" % port)
except xt.TransferError as ex:
    out["dead"] = [ex.errno, round(time.monotonic() - t0, 2)]
try:
    e.register(buf)
except xt.TransferError as ex:
    out["double"] = ex.errno
try:
    e.register(b"read-only")
except TypeError as ex:
    out["readonly"] = str(ex)
print(json.dumps(out))
"""
        res = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertGreater(out["dead"][0], 0)
        self.assertLess(out["dead"][1], 5)
        self.assertEqual(out["double"], 17)  # EEXIST
        self.assertIn("read-only", out["readonly"])

    def test_gpu_memory_refused_over_tcp(self):
        # a stand-in CUDA driver (libcuda.so.1 on LD_LIBRARY_PATH) calls one buffer device memory: the tcp
        # transport refuses it at registration with a clear error; host memory still registers
        import shutil
        import tempfile
        cc = shutil.which("cc") or shutil.which("gcc")
        self.assertIsNotNone(cc, "a C compiler (scripts/deps.sh installs gcc)")
        tmp = t.tmpdir(prefix="xpyd-fakecuda-")
        src = os.path.join(tmp, "cuda.c")
        with open(src, "w") as f:
            f.write("#include <stdlib.h>\nint cuInit(unsigned f) { return 0; }\n"
                    "int cuPointerGetAttribute(void *data, int attr, unsigned long long p) {\n"
                    "  const char *d = getenv(\"FAKE_CUDA_DEVICE_PTR\");\n"
                    "  *(unsigned *)data = d && strtoull(d, 0, 10) == p ? 2 : 1; return 0; }\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", os.path.join(tmp, "libcuda.so.1"), src], check=True)
        code = r"""
import ctypes, os, json
import xpyd_transfer as xt
gpu, host = bytearray(4096), bytearray(4096)
gaddr = xt.address_of(gpu)
os.environ["FAKE_CUDA_DEVICE_PTR"] = str(gaddr)
e = xt.Engine("g", transport="tcp")
out = {}
try:
    e.register(gpu)
except xt.TransferError as ex:
    out["gpu"] = [ex.errno, str(ex)]
out["host"] = e.register(host) == xt.address_of(host)
print(json.dumps(out))
"""
        res = subprocess.run([sys.executable, "-c", code], env=env(LD_LIBRARY_PATH=tmp), capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["gpu"][0], 14)  # EFAULT
        self.assertIn("GPU memory needs the rdma transport", out["gpu"][1])
        self.assertTrue(out["host"])

    def test_notification_arrives_after_the_data(self):
        code = r"""
import os, time, json
import xpyd_transfer as xt
a, b = xt.Engine("sender", transport="tcp"), xt.Engine("receiver", transport="tcp")
src, dst = bytearray(os.urandom(1 << 20)), bytearray(1 << 20)
sa, da = a.register(src), b.register(dst)
seg = a.open_segment(b.session)
bt = a.submit(seg, [(xt.WRITE, sa, da, 1 << 20)])
a.send_notify(seg, "kv ready: req-7")   # delivered only after the write before it landed
got = []
for _ in range(500):
    got = b.get_notifies()
    if got:
        break
    time.sleep(0.01)
print(json.dumps({"notes": got, "data": bytes(src) == bytes(dst), "state": a.wait(bt, 10000)}))
a.free_batch(bt)
"""
        res = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["notes"], [["sender", "kv ready: req-7"]])
        self.assertTrue(out["data"])  # the data was there when the notification was
        self.assertEqual(out["state"], 1)

    def test_library_is_found_or_the_error_says_how(self):
        code = "import xpyd_transfer as xt\ntry:\n    xt.library()\nexcept OSError as e:\n    print(e)\n"
        res = subprocess.run([sys.executable, "-c", code], env=env("nope.so"), capture_output=True, text=True)
        self.assertIn("set XPYD_TRANSFER_LIB", res.stdout)


# What vLLM's MooncakeConnector and SGLang's mooncake backend call on mooncake.engine.TransferEngine, with the
# number of positional arguments they pass (read from their sources).
CONNECTOR_CALLS = {
    "initialize": 4, "initialize_ext": 5, "get_rpc_port": 0, "register_memory": 2, "unregister_memory": 1,
    "batch_register_memory": 2, "batch_unregister_memory": 1, "transfer_sync_write": 4, "transfer_sync_read": 4,
    "batch_transfer_sync_write": 4, "batch_transfer_sync_read": 4, "batch_transfer_async_write": 4,
    "batch_transfer_async_read": 4, "get_batch_transfer_status": 1, "transfer_submit_write": 4,
    "transfer_check_status": 1, "allocate_managed_buffer": 1, "free_managed_buffer": 2,
    "get_first_buffer_address": 1,
}


class Compatibility(t.TestCase):
    def test_every_connector_call_exists_with_its_arity(self):
        sys.path[:0] = PYPATH.split(":")
        from mooncake.engine import TransferEngine
        for name, nargs in CONNECTOR_CALLS.items():
            fn = getattr(TransferEngine, name)
            params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
            required = [p for p in params if p.default is inspect.Parameter.empty]
            self.assertLessEqual(len(required), nargs, name)
            self.assertGreaterEqual(len(params), nargs, name)


if __name__ == "__main__":
    t.main()
