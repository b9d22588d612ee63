# SPDX-License-Identifier: Apache-2.0
"""etcdlib - a real etcd (Debian's etcd-server) for black-box tests: single members and clusters on loopback
ephemeral ports, polled for readiness, always stopped; and a tiny client of its JSON gateway (put, get,
delete, compact) so the tests need no etcdctl."""
import base64
import http.client
import json
import os
import shutil
import signal
import subprocess

from xpyd_testlib import _LIVE, free_port, tmpdir, wait_until

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def have_etcd():
    return os.path.exists(ETCD)


def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def unb64(s):
    return base64.b64decode(s).decode(errors="replace")


class Member:
    """One etcd member. name/cluster: for clusters (initial-cluster string shared by all members)."""

    def __init__(self, name="m0", client_port=None, peer_port=None, cluster=None, data_dir=None, tls=None,
                 verify_host=True):
        """tls: (ca, cert, key): clients must speak https with a certificate that CA signed. verify_host False:
        the tests' own calls skip the name check (a member serving a certificate for another name)."""
        self.tls = tls
        self.verify_host = verify_host
        self.name = name
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.data_dir = data_dir or tmpdir(prefix="xpyd-etcd-")
        self.cluster = cluster or "%s=http://127.0.0.1:%d" % (name, self.peer_port)
        self.p = None
        self.log = None
        self.stopped = True
        for attempt in range(3):
            try:
                self.start()
                break
            except AssertionError as e:  # a port drawn free was taken before etcd bound it: draw others
                if attempt == 2 or "address already in use" not in str(e) or client_port or peer_port or cluster \
                        or data_dir:
                    raise
                self.p.wait(5)
                self.client_port, self.peer_port = free_port(), free_port()
                self.data_dir = tmpdir(prefix="xpyd-etcd-")
                self.cluster = "%s=http://127.0.0.1:%d" % (name, self.peer_port)

    def argv(self):
        scheme = "https" if getattr(self, "tls", None) else "http"
        extra = ["--cert-file", self.tls[1], "--key-file", self.tls[2], "--trusted-ca-file", self.tls[0],
                 "--client-cert-auth"] if getattr(self, "tls", None) else []
        return [ETCD, "--name", self.name, "--data-dir", os.path.join(self.data_dir, "data"),
                "--listen-client-urls", "%s://127.0.0.1:%d" % (scheme, self.client_port),
                "--advertise-client-urls", "%s://127.0.0.1:%d" % (scheme, self.client_port)] + extra + [
                "--listen-peer-urls", "http://127.0.0.1:%d" % self.peer_port,
                "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % self.peer_port,
                "--initial-cluster", self.cluster, "--initial-cluster-token", "xpyd-test",
                "--initial-cluster-state", "new", "--heartbeat-interval", "50", "--election-timeout", "500",
                "--log-level", "warn", "--logger", "zap"]

    def start(self, wait=True):
        """(Re)starts the member with the same data directory and ports."""
        self.log = open(os.path.join(self.data_dir, "log"), "ab")
        self.p = subprocess.Popen(self.argv(), stdout=self.log, stderr=subprocess.STDOUT)
        self.stopped = False
        _LIVE.append(self)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=30):
        wait_until(self.healthy, timeout=timeout, interval=0.05, what="etcd %s health" % self.name)

    def healthy(self):
        if self.p.poll() is not None:
            raise AssertionError("etcd exited with %s: %s" % (self.p.returncode, self.output()[-3000:]))
        st, body = self.call("GET", "/health", None, timeout=2)
        return st == 200 and json.loads(body).get("health") == "true"

    def output(self):
        with open(os.path.join(self.data_dir, "log"), "rb") as f:
            return f.read().decode(errors="replace")

    def call(self, method, path, body, timeout=5):
        if getattr(self, "tls", None):
            import ssl
            ctx = ssl.create_default_context(cafile=self.tls[0])
            ctx.check_hostname = self.verify_host
            ctx.load_cert_chain(self.tls[1], self.tls[2])  # etcd's own pair is also a client certificate here
            c = http.client.HTTPSConnection("127.0.0.1", self.client_port, timeout=timeout, context=ctx)
        else:
            c = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def rpc(self, path, body):
        st, data = self.call("POST", path, body)
        if st != 200:
            raise AssertionError("etcd %s answered %d: %r" % (path, st, data))
        return json.loads(data)

    def put(self, key, value, lease=None):
        body = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return self.rpc("/v3/kv/put", body)

    def delete(self, key):
        return self.rpc("/v3/kv/deleterange", {"key": b64(key)})

    def get_prefix(self, prefix):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        r = self.rpc("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)})
        return {unb64(kv["key"]): unb64(kv.get("value", "")) for kv in r.get("kvs", [])}

    def revision(self):
        return int(self.rpc("/v3/kv/range", {"key": b64("\0")})["header"]["revision"])

    def compact(self, rev):
        return self.rpc("/v3/kv/compaction", {"revision": str(rev), "physical": True})

    def kill(self):
        """SIGKILL (a crash); start() brings it back with its data."""
        if self.p and self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self._done()

    def stop(self, timeout=10, check=False):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._done()

    def _done(self):
        self.stopped = True
        if self in _LIVE:
            _LIVE.remove(self)
        if self.log and not self.log.closed:
            self.log.close()


def cluster(n):
    """n members on loopback, started together (they elect a leader among themselves)."""
    names = ["m%d" % i for i in range(n)]
    peers = [free_port() for _ in names]
    spec = ",".join("%s=http://127.0.0.1:%d" % (nm, pp) for nm, pp in zip(names, peers))
    members = []
    for nm, pp in zip(names, peers):
        m = Member.__new__(Member)
        m.name, m.client_port, m.peer_port = nm, free_port(), pp
        m.data_dir = tmpdir(prefix="xpyd-etcd-")
        m.cluster, m.p, m.log, m.stopped, m.tls = spec, None, None, True, None
        m.start(wait=False)
        members.append(m)
    for m in members:
        m.wait_ready()
    return members


def url(members, prefix):
    return "etcd://%s/%s" % (",".join("127.0.0.1:%d" % m.client_port for m in members), prefix)
