# SPDX-License-Identifier: Apache-2.0
"""What the TLS tests share (test_tls.py, test_tls_stream.py): a throwaway CA and its certificates (openssl CLI),
HTTPS helpers over Python's ssl, and TlsCase, a test case with a server certificate and a TLS router."""
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile

import xpyd_testlib as t

BODY = {"prompt": "hello tls", "max_tokens": 5, "ignore_eos": True}


class Certs:
    """A CA and certificates it signs, in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="xpyd-tls-")
        self.ca, self.ca_key = self.path("ca.pem"), self.path("ca.key")
        self.run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 self.ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=xpyd test CA %s" % os.path.basename(self.dir))

    def path(self, name):
        return os.path.join(self.dir, name)

    def run(self, *args):
        subprocess.run(["openssl"] + list(args), check=True, capture_output=True)

    def issue(self, name, sans="DNS:localhost,IP:127.0.0.1", days=2, client=False):
        """Returns (cert, key) paths for a certificate with these subject alternative names."""
        key, csr, cert, ext = (self.path(name + x) for x in (".key", ".csr", ".pem", ".ext"))
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", "/CN=%s" % name)
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\n" % sans if sans else "")
            f.write("extendedKeyUsage=%s\n" % ("clientAuth" if client else "serverAuth"))
        self.run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial", "-out", cert,
                 "-days", str(days), "-extfile", ext)
        return cert, key

    def intermediate(self, name="inter"):
        """A CA certificate the root signs (an intermediate): (cert, key)."""
        key, csr, cert, ext = (self.path(name + x) for x in (".key", ".csr", ".pem", ".ext"))
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", "/CN=xpyd test intermediate %s" % name)
        with open(ext, "w") as f:
            f.write("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
        self.run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext)
        return cert, key

    def issue_under(self, issuer, name, sans="DNS:localhost,IP:127.0.0.1"):
        """A server certificate signed by issuer (cert, key): returns (cert, key)."""
        key, csr, cert, ext = (self.path(name + x) for x in (".key", ".csr", ".pem", ".ext"))
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
                 "-subj", "/CN=%s" % name)
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=serverAuth\n" % sans)
        self.run("x509", "-req", "-in", csr, "-CA", issuer[0], "-CAkey", issuer[1], "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext)
        return cert, key

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def https_get(port, path, ctx, host="localhost"):
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=host)
    s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
    got = t.recv_until_close(s)
    s.close()
    return got.partition(b"\r\n\r\n")[2]


def tls_ctx(ca, cert=None, key=None, maxv=None):
    c = ssl.create_default_context(cafile=ca)
    if cert:
        c.load_cert_chain(cert, key)
    if maxv:
        c.maximum_version = maxv
    return c


def https_post(port, body, ctx, host="localhost", path="/v1/completions", session=None):
    """One request on a new TLS connection; returns (status, body bytes, sslsock facts)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname=host, session=session)
    data = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ssl.SSLError:
            break
        if not chunk:
            break
        got += chunk
    facts = {"alpn": s.selected_alpn_protocol(), "reused": s.session_reused, "session": s.session,
             "version": s.version(), "cert": s.getpeercert()}
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest, facts


class TlsCase(t.TestCase):
    def setUp(self):
        super().setUp()
        self.certs = Certs()
        self.addCleanup(self.certs.cleanup)
        self.cert, self.key = self.certs.issue("server")

    def engine(self, *args):
        return self.start(t.sim("--role", "both", "--decode-us-per-token", "200", *args))

    def tls_router(self, engines, *args):
        return self.start(t.Proc("xpyd_router", ["--port", "0", "--log-level", "warn", "--handoff", "none", "-d"] +
                                 engines + ["--tls-cert", self.cert, "--tls-key", self.key] + list(args),
                                 ready_path=None))
