# SPDX-License-Identifier: Apache-2.0
"""mooncake.engine-compatible TransferEngine over libxpyd_transfer.

The methods, argument order, return values and error conventions of Mooncake's pybind TransferEngine
(mooncake-integration/transfer_engine/transfer_engine_py.cpp), as vLLM's MooncakeConnector and SGLang's mooncake
disaggregation backend call them: 0 on success and a negative value on failure for the synchronous calls, a
batch id (0 on failure) for the asynchronous ones, peers named "host:rpc_port" (P2PHANDSHAKE). Failures are
also printed to stderr with the engine's reason, as Mooncake logs them. What this engine does not support
raises NotImplementedError naming it (never a silent success). Timeouts: MC_TRANSFER_TIMEOUT seconds (default
30, at least 5) plus one nanosecond per byte, as Mooncake.
"""
import os
import sys
import threading
import time

import xpyd_transfer as xt

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify"]


class TransferOpcode:
    READ = 0
    WRITE = 1


class TransferNotify:
    def __init__(self, name="", msg=""):
        self.name, self.msg = name, msg


def _log(msg):
    sys.stderr.write("[xpyd mooncake.engine] %s\n" % msg)


class TransferEngine:
    def __init__(self):
        self._e = None
        self._segs = {}
        self._lock = threading.Lock()
        self._batches = {}       # our id (>0) -> (xpyd batch, n tasks, deadline)
        self._next_id = 1
        self._managed = {}       # address -> (buffer object, length)
        t = int(os.environ.get("MC_TRANSFER_TIMEOUT", "30") or 30)
        self._timeout_s = max(5, t)

    # ---- lifetime ----
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        conn = metadata_server
        mtype = ""
        if "://" in conn:
            mtype, conn = conn.split("://", 1)
        elif conn != "P2PHANDSHAKE":
            mtype = "etcd"  # Mooncake reads a bare address as etcd
        return self.initialize_ext(local_hostname, conn, protocol, device_name, mtype)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        if metadata_server != "P2PHANDSHAKE" and metadata_type not in ("http", "https", "p2p", ""):
            raise NotImplementedError("metadata server %s://%s: this engine finds peers by P2PHANDSHAKE "
                                      "(host:rpc_port) or an HTTP metadata URL only (etcd: not yet)"
                                      % (metadata_type, metadata_server))
        if protocol not in ("tcp", "rdma"):
            raise NotImplementedError("protocol %r: this engine speaks tcp and rdma" % protocol)
        host, port = local_hostname, 0
        if local_hostname.count(":") == 1:  # "host:port" (Mooncake's MC_LEGACY_RPC_PORT_BINDING form)
            host, p = local_hostname.rsplit(":", 1)
            port = int(p)
        try:
            self._e = xt.Engine("mooncake-%s-%d" % (host, os.getpid()), listen_host=host, port=port,
                                transport=protocol, rdma_devices=device_name or None)
        except (xt.TransferError, OSError) as ex:
            _log("initialize failed: %s" % ex)
            return -1
        return 0

    def get_rpc_port(self):
        return self._engine().port

    def get_session_id(self):
        return self._engine().session

    def _engine(self):
        if self._e is None:
            raise RuntimeError("TransferEngine used before initialize()")
        return self._e

    # ---- memory ----
    def register_memory(self, buffer_addr, capacity, location="*"):
        return self._call(lambda: self._engine().register(int(buffer_addr), int(capacity), location), "register")

    def unregister_memory(self, buffer_addr):
        return self._call(lambda: self._engine().unregister(int(buffer_addr)), "unregister")

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        if len(buffer_addresses) != len(capacities):
            _log("batch_register_memory: %d addresses, %d capacities" % (len(buffer_addresses), len(capacities)))
            return -1
        for a, c in zip(buffer_addresses, capacities):
            if self.register_memory(a, c, location) != 0:
                return -1
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        rc = 0
        for a in buffer_addresses:
            rc = self.unregister_memory(a) or rc
        return rc

    def allocate_managed_buffer(self, length):
        import ctypes
        buf = (ctypes.c_char * int(length))()
        addr = ctypes.addressof(buf)
        if self.register_memory(addr, int(length)) != 0:
            return 0
        self._managed[addr] = (buf, int(length))
        return addr

    def free_managed_buffer(self, buffer_addr, length):
        if buffer_addr not in self._managed:
            _log("free_managed_buffer: %#x was not allocated here" % buffer_addr)
            return -1
        self.unregister_memory(buffer_addr)
        del self._managed[buffer_addr]
        return 0

    def get_first_buffer_address(self, segment_name):
        seg = self._segment(segment_name)
        if seg is None:
            return 0
        bufs = self._engine().peer_descriptor(seg).get("buffers") or []
        return int(bufs[0]["addr"]) if bufs else 0

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        import ctypes
        ctypes.memmove(dest_address, src_ptr, length)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        import ctypes
        return ctypes.string_at(source_address, length)

    # ---- transfers ----
    def _call(self, fn, what):
        try:
            fn()
            return 0
        except (xt.TransferError, ValueError, TypeError) as ex:
            _log("%s failed: %s" % (what, ex))
            return -1

    def _segment(self, target_hostname):
        with self._lock:
            if target_hostname in self._segs:
                return self._segs[target_hostname]
        try:
            seg = self._engine().open_segment(target_hostname)
        except xt.TransferError as ex:
            _log("open segment %s failed: %s" % (target_hostname, ex))
            return None
        with self._lock:
            self._segs[target_hostname] = seg
        return seg

    def _drop_segment(self, target_hostname):
        with self._lock:
            seg = self._segs.pop(target_hostname, None)
        if seg is not None:
            try:
                self._engine().close_segment(seg)
            except xt.TransferError:
                pass

    def _timeout_ms(self, total):
        return int((self._timeout_s + total / 1e9) * 1000)

    def _sync(self, target_hostname, op, buffers, peers, lengths):
        if not (len(buffers) == len(peers) == len(lengths)):
            _log("buffers, peer_buffer_addresses and lengths have different size")
            return -1
        seg = self._segment(target_hostname)
        if seg is None:
            return -1
        reqs = [(op, int(b), int(p), int(n)) for b, p, n in zip(buffers, peers, lengths)]
        try:
            self._engine().transfer(seg, reqs, timeout_ms=self._timeout_ms(sum(lengths)))
            return 0
        except xt.TransferError as ex:
            _log("transfer to %s failed: %s" % (target_hostname, ex))
            self._drop_segment(target_hostname)  # reconnect next time (a restarted peer)
            return -1

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._sync(target_hostname, xt.WRITE, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._sync(target_hostname, xt.READ, [buffer], [peer_buffer_address], [length])

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._sync(target_hostname, xt.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._sync(target_hostname, xt.READ, buffers, peer_buffer_addresses, lengths)

    def _async(self, target_hostname, op, buffers, peers, lengths):
        if not (len(buffers) == len(peers) == len(lengths)):
            _log("buffers, peer_buffer_addresses and lengths have different size")
            return 0
        seg = self._segment(target_hostname)
        if seg is None:
            return 0
        try:
            b = self._engine().submit(seg, [(op, int(x), int(p), int(n)) for x, p, n in zip(buffers, peers, lengths)])
        except xt.TransferError as ex:
            _log("submit to %s failed: %s" % (target_hostname, ex))
            return 0
        with self._lock:
            bid = self._next_id
            self._next_id += 1
            self._batches[bid] = (b, len(buffers), time.monotonic() + self._timeout_ms(sum(lengths)) / 1000)
        return bid

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._async(target_hostname, xt.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._async(target_hostname, xt.READ, buffers, peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        bid = self._async(target_hostname, xt.WRITE, [buffer], [peer_buffer_address], [length])
        return bid if bid else -1

    def _finish(self, bid):
        with self._lock:
            b = self._batches.pop(bid, None)
        if b:
            try:
                self._engine().free_batch(b[0])
            except xt.TransferError:
                pass

    def transfer_check_status(self, batch_id):
        """1 completed, 0 pending, -1 failed, -2 timed out (the batch is released on 1 and -1)."""
        with self._lock:
            b = self._batches.get(batch_id)
        if b is None:
            return -1
        state = self._engine().batch_state(b[0])
        if state == xt.COMPLETED:
            self._finish(batch_id)
            return 1
        if state == xt.FAILED:
            self._finish(batch_id)
            return -1
        return -2 if time.monotonic() > b[2] else 0

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch: 0 when all completed, -1 when one failed or timed out."""
        failed = False
        for bid in batch_ids:
            with self._lock:
                b = self._batches.get(bid)
            if b is None:
                failed = True
                continue
            left = max(0, int((b[2] - time.monotonic()) * 1000))
            try:
                state = self._engine().wait(b[0], left)
            except xt.TransferError:
                state = xt.FAILED
            failed |= state != xt.COMPLETED
            if state != xt.PENDING:
                self._finish(bid)
        return -1 if failed else 0

    # ---- notifications (Mooncake's submitTransferWithNotify / getNotifies) ----
    def batch_transfer_sync_write_with_notify(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                              notify):
        rc = self.batch_transfer_sync_write(target_hostname, buffers, peer_buffer_addresses, lengths)
        if rc == 0:
            try:
                self._engine().send_notify(self._segments_of(target_hostname), notify.msg)
            except xt.TransferError as ex:
                _log("notify %s failed: %s" % (target_hostname, ex))
                return -1
        return rc

    def _segments_of(self, target_hostname):
        with self._lock:
            return self._segs[target_hostname]

    def get_notifies(self):
        return [TransferNotify(n, m) for n, m in self._engine().get_notifies()]

    # ---- what this engine does not offer ----
    def __getattr__(self, name):
        # an AttributeError (so hasattr() probes work) that says why, never a silent no-op
        raise AttributeError("mooncake.engine.TransferEngine.%s is not provided by xpyd's transfer engine" % name)
