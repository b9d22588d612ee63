# SPDX-License-Identifier: Apache-2.0
"""xpyd_testlib - helpers for black-box tests: start the real binaries on ephemeral loopback ports,
poll them for readiness (never fixed sleeps), talk HTTP byte-exactly, and always stop them.

Only the Python standard library is used, so the tests need nothing beyond Debian's python3.
"""
import atexit
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("XPYD_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin")
_LIVE = []
_TMPDIRS = []


def tmpdir(**kw):
    """tempfile.mkdtemp(**kw), removed when the test file's interpreter exits, after every process it started
    is stopped (an etcd data directory preallocates 64 MB; thousands of runs filled a disk). XPYD_KEEP_TMP=1
    keeps them for a post-mortem."""
    d = tempfile.mkdtemp(**kw)
    _TMPDIRS.append(d)
    return d


@atexit.register
def _remove_tmpdirs():  # registered before _stop_all, so it runs after it
    if os.environ.get("XPYD_KEEP_TMP"):
        return
    import shutil
    for d in _TMPDIRS:
        shutil.rmtree(d, ignore_errors=True)


def _ephemeral_low():
    """The first port the kernel hands out on its own (to port-0 listeners and to every outgoing connection)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


FIXED_LOW = 10000  # fixed ports are drawn from [FIXED_LOW, the ephemeral range): nothing else takes those


def free_port_range(n):
    """A base port such that base..base+n-1 were all free a moment ago, below the kernel's ephemeral range: a port
    handed out for the next outgoing connection (tests run in parallel) cannot take it between now and its use."""
    hi = _ephemeral_low() - n
    rng = random.SystemRandom()
    for _ in range(500):
        base = rng.randrange(FIXED_LOW, hi) if hi > FIXED_LOW else None
        if base is None:
            break
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        if _reserve(base, n):
            return base
    raise RuntimeError("no free port range")


_PORT_DIR = os.path.join(tempfile.gettempdir(), "xpyd-test-ports")


def _reserve(base, n, hold_s=600):
    """Claims base..base+n-1 for this process for hold_s seconds (a file per port, created exclusively), so that
    two tests running at once never draw the same free port between its check and its bind (seen: etcd failing
    with "address already in use" on a port another test had drawn a moment before). False if any is claimed."""
    os.makedirs(_PORT_DIR, exist_ok=True)
    made = []
    for port in range(base, base + n):
        path = os.path.join(_PORT_DIR, str(port))
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                stale = time.time() - os.stat(path).st_mtime > hold_s
            except OSError:
                stale = True
            if not stale:
                for m in made:
                    os.unlink(m)
                return False
            os.utime(path) if os.path.exists(path) else open(path, "w").close()
            made.append(path)
            continue
        os.close(fd)
        made.append(path)
    return True


def free_port():
    """A port that was free a moment ago (for binaries that need a fixed port, e.g. DP external, and for an
    address where nothing listens), below the ephemeral range (see free_port_range)."""
    return free_port_range(1)


def wait_until(pred, timeout=10.0, interval=0.01, what="condition"):
    """Polls pred() until it returns a truthy value; returns it, or raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (OSError, http.client.HTTPException, ValueError) as e:
            last = e
        time.sleep(interval)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


class Proc:
    """A binary under test. Started with a port file so an ephemeral port can be used; stop() is idempotent
    and also runs at interpreter exit, so nothing is left behind when a test fails."""

    def __init__(self, name, args, port_flag=True, ready_path="/health", env=None):
        self.tmp = tmpdir(prefix="xpyd-test-")
        self.port_file = os.path.join(self.tmp, "port")
        self.log_path = os.path.join(self.tmp, "log")
        argv = [os.path.join(BIN, name)] + list(args)
        self.argv0 = name
        self.stopped = False
        if port_flag:
            argv += ["--port-file", self.port_file]
        self.log = open(self.log_path, "w+b")
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, **(env or {})))
        _LIVE.append(self)
        self.port = None
        self.bootstrap_port = None
        if port_flag:
            self.port = wait_until(self._read_port, timeout=20, what="%s port file" % name)
            if ready_path:
                wait_until(lambda: request(self.port, "GET", ready_path)[0] < 500, timeout=20,
                           what="%s readiness" % name)

    def _read_port(self):
        """The port file: the HTTP port, then (xpyd_sim with a bootstrap listener) its bootstrap port."""
        if self.p.poll() is not None:
            raise AssertionError("process exited with %s: %s" % (self.p.returncode, self.output()))
        try:
            with open(self.port_file) as f:
                ports = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return None
        self.bootstrap_port = ports[1] if len(ports) > 1 else None
        return ports[0] if ports else None

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        self.p.send_signal(sig)

    def stop(self, timeout=10, check=True):
        """Stops the process (SIGTERM, then SIGKILL after timeout). With check, a process that did not exit 0
        on SIGTERM (a crash, a sanitizer report, a hang) fails the test with its output."""
        if self.stopped:
            return self.p.returncode
        self.stopped = True
        killed = False
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                killed = True
        if self in _LIVE:
            _LIVE.remove(self)
        out = self.output() if check else ""
        self.log.close()
        if check and (killed or self.p.returncode != 0):
            raise AssertionError("%s exited with %s%s:\n%s" % (self.argv0, self.p.returncode,
                                 " (killed after SIGTERM timeout)" if killed else "", out[-4000:]))
        return self.p.returncode


@atexit.register
def _stop_all():
    for p in list(_LIVE):
        p.stop(check=False)


def preload_sanitizers(env):
    """For a Python process that loads one of the build's shared libraries with ctypes: in the sanitizer build
    the ASan/UBSan runtimes must come first, so they are preloaded (leak checks off: the interpreter's own
    allocations at exit are not ours)."""
    if os.environ.get("XPYD_SANITIZED") == "ON":
        libs = [subprocess.run(["gcc", "-print-file-name=%s" % n], capture_output=True, text=True).stdout.strip()
                for n in ("libasan.so", "libubsan.so")]
        env["LD_PRELOAD"] = " ".join(libs)
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    return env


def sim(*args, env=None):
    return Proc("xpyd_sim", ["--port", "0", "--log-level", "warn"] + list(args), env=env)


def rss_kib(pid):
    """Resident set size of process pid, in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


CMPL = {"prompt": "a b c", "max_tokens": 4}


def stream_body(n=4):
    """A streamed completions body with usage, n tokens."""
    return {"prompt": "a b c", "max_tokens": n, "stream": True, "stream_options": {"include_usage": True}}


def request(port, method, path, body=None, headers=None, timeout=10, host="127.0.0.1"):
    """One HTTP request; returns (status, headers dict with lower-case names, body bytes)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def recv_until_close(sock):
    """Every byte the peer sends until it closes."""
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def raw_response(sock, timeout=10):
    """Reads one whole answer until the peer closes; returns (status, headers dict lower-case, body bytes)."""
    sock.settimeout(timeout)
    got = recv_until_close(sock)
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body


def raw_exchange(port, data, timeout=10, host="127.0.0.1"):
    """Sends raw bytes on a new connection and reads the answer until the router closes it."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        if data:
            s.sendall(data)
        return raw_response(s, timeout)
    finally:
        s.close()


def post_json(port, path, body, headers=None, timeout=10):
    st, h, data = request(port, "POST", path, body, headers, timeout)
    try:
        return st, h, json.loads(data) if data else None
    except ValueError:
        return st, h, data


class Stream:
    """A streaming request read incrementally: events() yields each SSE event's payload as it arrives."""

    def __init__(self, port, path, body, headers=None, timeout=10, host="127.0.0.1", lazy=False):
        """Sends the request; unless lazy, also waits for the response head (lazy: on first events())."""
        self.c = http.client.HTTPConnection(host, port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        raw = body if isinstance(body, (bytes, str)) else json.dumps(body)  # bytes/str: sent as they are
        self.c.request("POST", path, body=raw, headers=h)
        self.r = None
        self.raw = b""
        self._buf = b""
        if not lazy:
            self.response()

    def response(self):
        if self.r is None:
            self.r = self.c.getresponse()
            self.status = self.r.status
            self.headers = {k.lower(): v for k, v in self.r.getheaders()}
        return self.r

    def events(self):
        """Yields (payload str, raw bytes) per event; stops at EOF."""
        self.response()
        while True:
            while b"\n\n" in self._buf:
                ev, self._buf = self._buf.split(b"\n\n", 1)
                yield ev.decode()[len("data: "):] if ev.startswith(b"data: ") else ev.decode(), ev + b"\n\n"
            chunk = self.r.read1(65536) if hasattr(self.r, "read1") else self.r.read(1)
            if not chunk:
                if self._buf:
                    yield None, self._buf  # trailing partial bytes
                return
            self.raw += chunk
            self._buf += chunk

    def read_all(self):
        out = []
        try:
            for payload, _ in self.events():
                out.append(payload)
        except (http.client.IncompleteRead, ConnectionError):
            out.append(None)  # the stream was cut
        self.c.close()
        return out

    def close(self):
        try:
            self.c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.c.close()


def content_events(payloads):
    """The parsed JSON chunks that carry content (completions text or chat delta.content, non-empty)."""
    out = []
    for p in payloads:
        if p is None or p == "[DONE]":
            continue
        j = json.loads(p)
        for ch in j.get("choices") or []:
            text = ch.get("text")
            if text is None:
                text = (ch.get("delta") or {}).get("content")
            if text:
                out.append(j)
    return out


_METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class Metrics(dict):
    """{name{labels}: float} plus {name: sum over label sets}; .families holds every metric name the page
    declares (# TYPE), with or without samples."""
    families = frozenset()


def metrics(port):
    """Parses the router's Prometheus text page into {name{labels}: float}; also {name: sum over label sets}."""
    st, _, body = request(port, "GET", "/metrics")
    if st != 200:
        raise ValueError("/metrics answered %d" % st)
    return parse_metrics(body.decode())


def parse_metrics(text):
    """A Prometheus text page as metrics() returns it."""
    out = Metrics()
    fams = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            fams.add(line.split()[2])
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        assert m, "bad metrics line: %r" % line
        name, labels, val = m.group(1), m.group(2) or "", float(m.group(3))
        out[name + labels] = val
        fams.add(name)
        if labels:
            out[name] = out.get(name, 0.0) + val
    out.families = frozenset(fams)
    return out


_NO_DEFAULT = object()


def metric_sum(port, selector):
    """The sum of the series that carry these labels and any others: metric_sum(p, 'x{role="decode"}') adds
    x{role="decode",cause="a"} and x{role="decode",cause="b"}. The family must be on the page."""
    name, _, rest = selector.partition("{")
    want = set(re.findall(r'(\w+)="([^"]*)"', rest))
    m = metrics(port)
    if name not in m.families:
        raise AssertionError("metric %s is not exported at all (renamed or removed?)" % name)
    total = 0.0
    for key, val in m.items():
        k_name, _, k_rest = key.partition("{")
        if k_name == name and k_rest and want <= set(re.findall(r'(\w+)="([^"]*)"', k_rest)):
            total += val
    return total


def metric(port, key, default=_NO_DEFAULT):
    """One series' value. A series that is not on the page fails the test (a renamed metric must not make
    '== 0' checks pass), unless a default is given for series that only appear once counted; even then the
    metric itself must be declared on the page."""
    m = metrics(port)
    if key in m:
        return m[key]
    family = key.split("{", 1)[0]
    base = re.sub(r"_(bucket|sum|count|total)$", "", family)
    if family not in m.families and base not in m.families and family + "_total" not in m.families:
        raise AssertionError("metric %s is not exported at all (renamed or removed?)" % family)
    if default is _NO_DEFAULT:
        raise AssertionError("metric series %s is not on the page; pass default= if it appears only once "
                             "counted" % key)
    return default


class TestCase(unittest.TestCase):
    """Stops every process a test started, even when it fails."""

    def setUp(self):
        self._procs = []

    def start(self, proc):
        self._procs.append(proc)
        return proc

    def tearDown(self):
        errors = []
        for p in self._procs:
            try:
                p.stop()
            except AssertionError as e:
                errors.append(str(e))
        if errors:
            raise AssertionError("\n".join(errors))

    def idle(self, r, headers=None):
        """Waits until router r holds no load (in-flight requests and outstanding tokens back to zero)."""
        wait_until(lambda: router_idle(r.port, headers), what="router load back to zero")

    def assertOpenAIError(self, status, body, want_status, needle=""):
        self.assertEqual(status, want_status, body)
        self.assertIsInstance(body, dict, body)
        err = body.get("error")
        self.assertIsInstance(err, dict, body)
        self.assertEqual(err.get("code"), want_status)
        self.assertIsInstance(err.get("message"), str)
        self.assertIsInstance(err.get("type"), str)
        self.assertIn(needle, err["message"])


SKIPPED = 77  # ctest's SKIP_RETURN_CODE for these files (tests/CMakeLists.txt)


NPM_DIR = os.environ.get("XPYD_NPM_DIR", os.path.expanduser("~/.cache/xpyd-npm"))


def npm_package(name):
    """The directory of npm package name in the tests' npm cache, installed there by scripts/deps.sh when it is
    missing (as scripts/test.sh does); the test is skipped, saying why, only when that cannot be done here."""
    path = os.path.join(NPM_DIR, "node_modules", name)
    if not os.path.exists(os.path.join(path, "package.json")):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        r = subprocess.run([os.path.join(root, "scripts", "deps.sh")], env=dict(os.environ, XPYD_TEST_DEPS="1"),
                           capture_output=True, text=True)
        if not os.path.exists(os.path.join(path, "package.json")):
            raise unittest.SkipTest("npm package %s is not in %s and scripts/deps.sh could not install it: %s"
                                    % (name, NPM_DIR, (r.stderr or r.stdout)[-300:]))
    return path


def main():
    """Runs the file's tests; exit 0 when every test that ran passed (skipped ones are listed), 1 a failure, 77
    when every test was skipped (so ctest reports the file as skipped, never as passed for nothing)."""
    import sys
    import warnings
    warnings.simplefilter("ignore", ResourceWarning)
    prog = unittest.main(verbosity=2, exit=False)
    res = prog.result
    if not res.wasSuccessful():
        sys.exit(1)
    if res.skipped:
        print("skipped: %s" % "; ".join("%s (%s)" % (tc.id(), why) for tc, why in res.skipped))
    if res.testsRun == 0 or len(res.skipped) == res.testsRun:
        sys.exit(SKIPPED)
    sys.exit(0)


def router(prefills, decodes, *args, ready_path="/health", env=None):
    """Starts xpyd_router on an ephemeral port in front of the given engines: sim processes (Proc), ports, or
    HOST:PORT strings. A sim prefill with a bootstrap listener gets its bootstrap port through a topology file
    (per host, as a deployment gives it)."""
    fmt = lambda p: p if isinstance(p, str) else "127.0.0.1:%d" % (p.port if isinstance(p, Proc) else p)
    argv = ["--port", "0", "--log-level", "warn", "--threads", "2"]
    if any(isinstance(p, Proc) and p.bootstrap_port for p in prefills):
        host = lambda p: {"host": "127.0.0.1", "port": p.port, "bootstrap_port": p.bootstrap_port} \
            if isinstance(p, Proc) and p.bootstrap_port else fmt(p)
        topo = {"prefill": {"hosts": [host(p) for p in prefills]}, "decode": {"hosts": [fmt(d) for d in decodes]}}
        path = os.path.join(tmpdir(prefix="xpyd-topo-"), "topology.json")
        with open(path, "w") as f:
            json.dump(topo, f)
        argv += ["--config", path]
    else:
        argv += (["-p"] + [fmt(p) for p in prefills] if prefills else []) + ["-d"] + [fmt(d) for d in decodes]
    return Proc("xpyd_router", argv + list(args), ready_path=ready_path, env=env)


def request_json_status(port, headers=None):
    """GET /status with headers (e.g. an API key); the parsed JSON."""
    st, _, body = request(port, "GET", "/status", headers=headers)
    if st != 200:
        raise ValueError("/status answered %d" % st)
    return json.loads(body)


def status(port):
    st, _, body = request(port, "GET", "/status")
    assert st == 200, st
    return json.loads(body)


def router_idle(port, headers=None):
    """True when the router holds no load: in-flight and outstanding tokens are zero in both pools."""
    s = request_json_status(port, headers)
    return s["active_requests"] == 0 and all(
        p["inflight"] == 0 and p["outstanding_tokens"] == 0 and
        all(i["inflight"] == 0 and i["outstanding_tokens"] == 0 for i in p["instances"])
        for p in s["pools"].values())


def read_to_close(sock):
    """Everything sock receives until the peer closes it: (bytes, None), or (what came, the OSError) when the
    connection fails (a reset)."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data, None
            data += chunk
    except OSError as e:
        return data, e


class RawConn:
    """One client connection spoken byte-exactly: send() raw bytes, response() reads one answer (framed by
    Content-Length, chunked or the close), closed() tells whether the router closed the connection."""

    def __init__(self, port, timeout=10, host="127.0.0.1"):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)
        return self

    def _fill(self):
        c = self.s.recv(65536)
        if not c:
            raise EOFError("connection closed by the router")
        self.buf += c

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def response(self, head=False):
        """(status, reason, headers dict lower-case, body bytes); head: the answer to a HEAD (no body)."""
        status_line = self._line().decode("latin-1")
        parts = status_line.split(" ", 2)
        assert parts[0] in ("HTTP/1.1", "HTTP/1.0"), status_line
        status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
        hdrs = {}
        while True:
            ln = self._line().decode("latin-1")
            if not ln:
                break
            k, _, v = ln.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if head or status < 200 or status in (204, 304):
            return status, reason, hdrs, b""
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                n = int(self._line().split(b";")[0], 16)
                if n == 0:
                    while self._line():
                        pass
                    return status, reason, hdrs, body
                body += self._take(n)
                self._line()
        if "content-length" in hdrs:
            return status, reason, hdrs, self._take(int(hdrs["content-length"]))
        try:
            while True:
                self._fill()
        except (EOFError, OSError):
            pass
        body, self.buf = self.buf, b""
        return status, reason, hdrs, body

    def closed(self, timeout=5.0):
        """True when the router closes the connection within timeout (pending bytes are discarded)."""
        self.s.settimeout(timeout)
        try:
            while True:
                c = self.s.recv(65536)
                if not c:
                    return True
        except socket.timeout:
            return False
        except OSError:
            return True

    def close(self):
        self.s.close()


def recv_request(sock, buf):
    """Reads one request (head, and a Content-Length body) for a raw engine: returns (head, body, the bytes after
    it), head without its empty line, or None when the peer closed first. buf: bytes already read."""
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            return None
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        d = sock.recv(65536)
        if not d:
            return None
        rest += d
    return head, rest[:n], rest[n:]


class RawServer:
    """A raw TCP server on an ephemeral loopback port for engines that misbehave below HTTP: each accepted
    connection is handed to serve(conn, n) (n counts connections from 1) on a thread of its own; stop() ends
    the accept loop (the serving threads are daemons and end with their connections)."""

    def __init__(self, serve):
        import threading
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self.n = 0
        self.stop_ev = threading.Event()
        self._serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        import threading
        self.srv.settimeout(0.2)
        while not self.stop_ev.is_set():
            try:
                c, _ = self.srv.accept()
            except OSError:
                continue
            self.n += 1
            threading.Thread(target=self._serve, args=(c, self.n), daemon=True).start()

    def stop(self):
        self.stop_ev.set()
        self.srv.close()


class FakeEngine:
    """A scripted backend on an ephemeral loopback port, for failures xpyd_sim does not produce (non-JSON
    answers, huge bodies, ...). handler(method, path, body) returns (status, content_type, bytes) or
    (status, content_type, bytes, {extra header: value})."""

    def __init__(self, handler):
        import http.server
        import threading

        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _do(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                # headers first: a reader that sees a request in `requests` finds its headers too
                outer.headers.append({k: v for k, v in self.headers.items()})
                outer.requests.append((self.command, self.path, body))
                res = handler(self.command, self.path, body)
                st, ctype, data = res[:3]
                self.send_response(st)
                for k, v in (res[3] if len(res) > 3 else {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _do

        self.requests = []
        self.headers = []
        class Srv(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                import sys
                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)  # a leg the router closed is expected

        self.srv = Srv(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        self.th = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.th.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()
