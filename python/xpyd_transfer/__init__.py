# SPDX-License-Identifier: Apache-2.0
"""xpyd_transfer - Python access to libxpyd_transfer (ctypes, standard library only).

    from xpyd_transfer import Engine, READ, WRITE
    e = Engine("prefill-0", transport="tcp")         # listens on 127.0.0.1, a free port: e.port
    e.register(addr, length)                          # int address, or a buffer (bytearray, numpy, memoryview,
                                                      # torch tensor: anything with a data pointer)
    seg = e.open_segment("10.0.0.2:41234")            # the peer's "host:port"
    e.transfer(seg, [(WRITE, local, remote, length), ...])   # waits; raises TransferError on failure
    b = e.submit(seg, [...]); e.batch_state(b)        # asynchronous: PENDING, COMPLETED or FAILED

The library is loaded from $XPYD_TRANSFER_LIB when set, else from where it was installed next to this package
(_paths.py, written by cmake --install), else through the system loader (libxpyd_transfer.so.0). Every
failing call raises TransferError carrying the engine's errno and message; nothing is ignored.
"""
import ctypes
import ctypes.util
import errno as _errno
import json
import os
import threading

__all__ = ["Engine", "TransferError", "READ", "WRITE", "PENDING", "COMPLETED", "FAILED", "address_of", "library"]

READ, WRITE = 0, 1
PENDING, COMPLETED, FAILED = 0, 1, 2


class TransferError(OSError):
    """A libxpyd_transfer call failed: errno is the engine's, strerror its meaning, the message says what."""

    def __init__(self, what, rc):
        code = -rc if rc < 0 else rc
        super().__init__(code, "%s: %s" % (what, os.strerror(code) if code else "failed"))
        self.what = what


class _Config(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("listen_host", ctypes.c_char_p), ("listen_port", ctypes.c_int),
                ("transport", ctypes.c_char_p), ("rdma_devices", ctypes.c_char_p), ("gid_index", ctypes.c_int),
                ("gid_index_set", ctypes.c_int), ("threads", ctypes.c_int), ("slice_bytes", ctypes.c_size_t),
                ("max_frame_bytes", ctypes.c_size_t), ("io_timeout_ms", ctypes.c_int), ("verbose", ctypes.c_int)]


class _Request(ctypes.Structure):
    _fields_ = [("opcode", ctypes.c_int), ("local", ctypes.c_void_p), ("segment", ctypes.c_int64),
                ("remote", ctypes.c_uint64), ("length", ctypes.c_size_t)]


class _TaskStatus(ctypes.Structure):
    _fields_ = [("state", ctypes.c_int), ("transferred", ctypes.c_size_t), ("error", ctypes.c_int)]


class _Notify(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("msg", ctypes.c_char * 448)]


_lib = None
_lib_lock = threading.Lock()


def _candidates():
    env = os.environ.get("XPYD_TRANSFER_LIB")
    if env:
        return [env]
    out = []
    try:
        from . import _paths  # written at install time
        out.append(os.path.join(_paths.LIBDIR, "libxpyd_transfer.so.0"))
    except ImportError:
        pass
    found = ctypes.util.find_library("xpyd_transfer")
    out += [found] if found else []
    return out + ["libxpyd_transfer.so.0", "libxpyd_transfer.so"]


def library():
    """The loaded libxpyd_transfer (ctypes.CDLL), loading it on first use."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        for c in _candidates():
            try:
                lib = ctypes.CDLL(c)
                break
            except OSError as e:
                errors.append("%s: %s" % (c, e))
        else:
            raise OSError("cannot load libxpyd_transfer (set XPYD_TRANSFER_LIB): " + "; ".join(errors))
        P, I, I64, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
        sig = {
            "xt_engine_create": (I, [ctypes.POINTER(_Config), ctypes.POINTER(P)]),
            "xt_engine_destroy": (None, [P]),
            "xt_engine_port": (I, [P]),
            "xt_engine_transport": (ctypes.c_char_p, [P]),
            "xt_register_memory": (I, [P, P, SZ, ctypes.c_char_p]),
            "xt_unregister_memory": (I, [P, P]),
            "xt_segment_descriptor": (I, [P, ctypes.c_char_p, SZ]),
            "xt_open_segment": (I, [P, ctypes.c_char_p, ctypes.POINTER(I64)]),
            "xt_close_segment": (I, [P, I64]),
            "xt_peer_descriptor": (I, [P, I64, ctypes.c_char_p, SZ]),
            "xt_alloc_batch": (I, [P, SZ, ctypes.POINTER(I64)]),
            "xt_submit": (I, [P, I64, ctypes.POINTER(_Request), SZ]),
            "xt_task_status": (I, [P, I64, SZ, ctypes.POINTER(_TaskStatus)]),
            "xt_batch_status": (I, [P, I64, ctypes.POINTER(I)]),
            "xt_wait_batch": (I, [P, I64, I, ctypes.POINTER(I)]),
            "xt_free_batch": (I, [P, I64]),
            "xt_send_notify": (I, [P, I64, ctypes.c_char_p]),
            "xt_get_notifies": (I, [P, ctypes.POINTER(_Notify), SZ]),
        }
        for name, (res, args) in sig.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        _lib = lib
        return lib


def address_of(buf):
    """The address of a buffer's first byte: an int stays as is; numpy arrays (.ctypes.data), torch tensors
    (.data_ptr()), objects with __array_interface__, and writable buffers (bytearray, memoryview, ctypes
    arrays) are resolved."""
    if isinstance(buf, int):
        return buf
    if hasattr(buf, "data_ptr"):
        return int(buf.data_ptr())
    if hasattr(buf, "__array_interface__"):
        return int(buf.__array_interface__["data"][0])
    if hasattr(buf, "ctypes") and hasattr(buf.ctypes, "data"):
        return int(buf.ctypes.data)
    mv = memoryview(buf)
    if mv.readonly:
        raise TypeError("a read-only buffer cannot be registered (the peer may write into it)")
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def _nbytes(buf):
    if hasattr(buf, "nbytes"):
        return int(buf.nbytes)
    if hasattr(buf, "element_size") and hasattr(buf, "numel"):
        return int(buf.element_size() * buf.numel())
    return memoryview(buf).nbytes


def _check(what, rc):
    if rc < 0:
        raise TransferError(what, rc)
    return rc


class Engine:
    """One transfer engine: a listener for peers plus initiator workers. Thread-safe."""

    def __init__(self, name, listen_host="127.0.0.1", port=0, transport="auto", rdma_devices=None, threads=4,
                 slice_bytes=0, io_timeout_ms=10000, verbose=False):
        self._lib = library()
        self._cfg = _Config(name=name.encode(), listen_host=listen_host.encode(), listen_port=port,
                            transport=transport.encode(), rdma_devices=rdma_devices.encode() if rdma_devices else None,
                            threads=threads, slice_bytes=slice_bytes, io_timeout_ms=io_timeout_ms,
                            verbose=1 if verbose else 0)
        self._e = ctypes.c_void_p()
        _check("engine create (transport %s)" % transport, self._lib.xt_engine_create(ctypes.byref(self._cfg),
                                                                                     ctypes.byref(self._e)))
        self.name = name
        self.host = listen_host
        self._keep = {}  # registered buffers kept alive while registered

    def close(self):
        if self._e:
            self._lib.xt_engine_destroy(self._e)
            self._e = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def port(self):
        return self._lib.xt_engine_port(self._e)

    @property
    def transport(self):
        return self._lib.xt_engine_transport(self._e).decode()

    @property
    def session(self):
        """This engine's "host:port", what peers open (Mooncake calls it the session id)."""
        return "%s:%d" % (self.host, self.port)

    def register(self, buf, length=None, location="cpu"):
        """Registers memory peers may read and write: an int address with length, or a buffer object.
        Returns the address."""
        addr = address_of(buf)
        n = length if length is not None else _nbytes(buf)
        if getattr(buf, "is_cuda", False) and self.transport == "tcp":
            raise TransferError("register: GPU memory needs the rdma transport (tcp copies with the CPU)", -14)
        rc = self._lib.xt_register_memory(self._e, ctypes.c_void_p(addr), n, location.encode())
        if rc == -14:  # EFAULT: the CUDA driver says it is device memory
            raise TransferError("register %#x+%d: GPU memory needs the rdma transport (tcp copies with the CPU)"
                                % (addr, n), rc)
        _check("register %#x+%d" % (addr, n), rc)
        if not isinstance(buf, int):
            self._keep[addr] = buf
        return addr

    def unregister(self, buf):
        addr = address_of(buf)
        _check("unregister %#x" % addr, self._lib.xt_unregister_memory(self._e, ctypes.c_void_p(addr)))
        self._keep.pop(addr, None)

    def descriptor(self):
        buf = ctypes.create_string_buffer(1 << 20)
        _check("descriptor", self._lib.xt_segment_descriptor(self._e, buf, len(buf)))
        return json.loads(buf.value.decode())

    def open_segment(self, peer):
        seg = ctypes.c_int64()
        _check("open %s" % peer, self._lib.xt_open_segment(self._e, peer.encode(), ctypes.byref(seg)))
        return seg.value

    def close_segment(self, seg):
        _check("close segment", self._lib.xt_close_segment(self._e, seg))

    def peer_descriptor(self, seg):
        buf = ctypes.create_string_buffer(1 << 20)
        _check("peer descriptor", self._lib.xt_peer_descriptor(self._e, seg, buf, len(buf)))
        return json.loads(buf.value.decode())

    def submit(self, seg, requests):
        """Queues [(opcode, local, remote, length), ...] on segment seg; returns a batch id (free it with
        free_batch once it is no longer pending, or use transfer())."""
        n = len(requests)
        b = ctypes.c_int64()
        _check("alloc batch", self._lib.xt_alloc_batch(self._e, max(n, 1), ctypes.byref(b)))
        arr = (_Request * max(n, 1))()
        for i, (op, local, remote, length) in enumerate(requests):
            arr[i].opcode, arr[i].local, arr[i].segment = op, address_of(local), seg
            arr[i].remote, arr[i].length = remote, length
        rc = self._lib.xt_submit(self._e, b.value, arr, n)
        if rc < 0:
            self._lib.xt_free_batch(self._e, b.value)
            raise TransferError("submit", rc)
        return b.value

    def batch_state(self, batch):
        st = ctypes.c_int()
        _check("batch status", self._lib.xt_batch_status(self._e, batch, ctypes.byref(st)))
        return st.value

    def task_status(self, batch, task):
        st = _TaskStatus()
        _check("task status", self._lib.xt_task_status(self._e, batch, task, ctypes.byref(st)))
        return st.state, st.transferred, st.error

    def wait(self, batch, timeout_ms=-1):
        """Waits until the batch is no longer pending; returns COMPLETED or FAILED (TransferError on timeout)."""
        st = ctypes.c_int()
        _check("wait", self._lib.xt_wait_batch(self._e, batch, timeout_ms, ctypes.byref(st)))
        return st.value

    def first_error(self, batch, n):
        for i in range(n):
            state, _, err = self.task_status(batch, i)
            if state == FAILED:
                return err
        return 0

    def free_batch(self, batch):
        _check("free batch", self._lib.xt_free_batch(self._e, batch))

    def transfer(self, seg, requests, timeout_ms=-1):
        """submit + wait + free; raises TransferError naming the first failed task's error."""
        b = self.submit(seg, requests)
        try:
            state = self.wait(b, timeout_ms)
            if state != COMPLETED:
                raise TransferError("transfer", self.first_error(b, len(requests)) or -_errno.EIO)
        finally:
            try:
                self.free_batch(b)
            except TransferError:
                pass
        return len(requests)

    def send_notify(self, seg, msg):
        _check("notify", self._lib.xt_send_notify(self._e, seg, msg.encode()))

    def get_notifies(self, max_n=64):
        arr = (_Notify * max_n)()
        n = _check("get notifies", self._lib.xt_get_notifies(self._e, arr, max_n))
        return [(arr[i].name.decode(), arr[i].msg.decode()) for i in range(n)]
