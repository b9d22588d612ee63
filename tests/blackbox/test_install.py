# SPDX-License-Identifier: Apache-2.0
"""cmake --install into a staging prefix: the binaries, libxpyd_transfer (shared + static, header, pkg-config
file), man pages, example topologies and the Grafana dashboard land in the GNUInstallDirs layout; the demo
runs from the installed binaries; a C program builds against the installed library with pkg-config and moves
bytes through it; every binary answers --version with the git revision; the man pages render without
warnings."""
import glob
import os
import re
import shutil
import subprocess
import sys

import xpyd_testlib as t

BUILD = os.path.abspath(os.path.join(t.BIN, ".."))
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = ("xpyd_router", "xpyd_sim", "xpyd_bench", "xpyd_transfer_bench", "xpyd_register", "xpyd_tokenize")

PROG = r"""
#include <xpyd_transfer.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    struct xt_config cfg = {0};
    cfg.name = "install-test";
    cfg.transport = "tcp";
    xt_engine *e = NULL;
    if (xt_engine_create(&cfg, &e) != 0)
        return 1;
    static char buf[4096];
    memset(buf, 7, sizeof buf);
    int rc = xt_register_memory(e, buf, sizeof buf, "cpu:0");
    char desc[4096];
    int n = xt_segment_descriptor(e, desc, sizeof desc);
    printf("transport=%s port=%d register=%d descriptor=%d\n", xt_engine_transport(e), xt_engine_port(e), rc, n);
    xt_engine_destroy(e);
    return rc == 0 && n > 0 ? 0 : 2;
}
"""


class Install(t.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prefix = t.tmpdir(prefix="xpyd-install-")
        subprocess.run(["cmake", "--install", BUILD, "--prefix", cls.prefix], check=True, stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.prefix, ignore_errors=True)

    def p(self, *parts):
        return os.path.join(self.prefix, *parts)

    def test_layout(self):
        for tool in TOOLS:
            self.assertTrue(os.access(self.p("bin", tool), os.X_OK), tool)
            self.assertTrue(os.path.exists(self.p("share", "man", "man1", tool + ".1.gz")), tool)
        libdir = os.path.dirname(glob.glob(self.p("lib*", "**", "libxpyd_transfer.a"), recursive=True)[0])
        for name in ("libxpyd_transfer.a", "libxpyd_transfer.so", "libxpyd_transfer.so.0",
                     os.path.join("pkgconfig", "xpyd_transfer.pc")):
            self.assertTrue(os.path.exists(os.path.join(libdir, name)), name)
        self.assertTrue(os.path.exists(self.p("include", "xpyd", "xpyd_transfer.h")))
        for conf in glob.glob(os.path.join(ROOT, "conf", "*.json")):
            self.assertTrue(os.path.exists(self.p("share", "xpyd", "conf", os.path.basename(conf))), conf)
        self.assertTrue(os.path.exists(self.p("share", "xpyd", "grafana", "xpyd.json")))
        self.assertTrue(os.path.exists(self.p("lib", "systemd", "system", "xpyd-router.service")))

    def test_version(self):
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
        for tool in TOOLS:
            out = subprocess.run([self.p("bin", tool), "--version"], capture_output=True, text=True, check=True).stdout
            self.assertRegex(out, r"^%s \d+\.\d+\.\d+ \(git ([0-9a-f]{12}(-dirty)?|unknown)\)\n$" % tool)
            if rev.returncode == 0:
                self.assertIn(rev.stdout.strip(), out)

    def test_status_names_the_revision(self):
        p, d = self.start(t.sim("--role", "prefill")), self.start(t.sim("--role", "decode"))
        r = self.start(t.router([p.port], [d.port]))
        out = subprocess.run([self.p("bin", "xpyd_router"), "--version"], capture_output=True, text=True).stdout
        s = t.status(r.port)
        self.assertIn("(git %s)" % s["git_revision"], out)
        self.assertIn(s["version"], out)

    def test_demo_runs_from_the_prefix(self):
        tmp = t.tmpdir(prefix="xpyd-install-demo-")  # its own work dirs: test_demo may run meanwhile
        self.addCleanup(shutil.rmtree, tmp, True)
        env = dict(os.environ, XPYD_SKIP_BUILD="1", XPYD_BIN_DIR=self.p("bin"), DEMO_PROMPTS="20",
                   DEMO_CONCURRENCY="4", TMPDIR=tmp)
        out = subprocess.run([os.path.join(ROOT, "scripts", "demo.sh")], env=env, capture_output=True, text=True,
                             timeout=240)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        self.assertIn("data: [DONE]", out.stdout)
        self.assertRegex(out.stdout, r"Successful requests:\s+20")

    def test_c_program_against_the_installed_library(self):
        pcdir = os.path.dirname(glob.glob(self.p("lib*", "**", "xpyd_transfer.pc"), recursive=True)[0])
        env = dict(os.environ, PKG_CONFIG_PATH=pcdir)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "xpyd_transfer"], env=env, capture_output=True,
                               text=True, check=True).stdout.split()
        work = t.tmpdir(prefix="xpyd-pc-")
        self.addCleanup(shutil.rmtree, work, True)
        src = os.path.join(work, "prog.c")
        with open(src, "w") as f:
            f.write(PROG)
        san = ["-fsanitize=address,undefined"] if os.environ.get("XPYD_SANITIZED") == "ON" else []
        subprocess.run(["cc", "-std=c11", "-o", os.path.join(work, "prog"), src] + flags + san, check=True)
        run_env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(pcdir))
        out = subprocess.run([os.path.join(work, "prog")], env=run_env, capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertRegex(out.stdout, r"transport=tcp port=[1-9]\d* register=0 descriptor=[1-9]")

    def test_python_packages_from_the_prefix(self):
        # the binding finds the installed library by itself; the mooncake.engine compatibility package is on
        # PYTHONPATH as a user would put it
        pypath = self.p("lib", "python3", "dist-packages") + ":" + self.p("share", "xpyd", "python-compat")
        env = t.preload_sanitizers(dict(os.environ, PYTHONPATH=pypath))
        env.pop("XPYD_TRANSFER_LIB", None)
        code = ("import ctypes, os, xpyd_transfer\n"
                "from mooncake.engine import TransferEngine\n"
                "assert xpyd_transfer.library()._name.startswith(%r), xpyd_transfer.library()._name\n"
                "a, b = TransferEngine(), TransferEngine()\n"
                "assert a.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0\n"
                "assert b.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0\n"
                "x = (ctypes.c_char * 65536).from_buffer_copy(os.urandom(65536)); y = (ctypes.c_char * 65536)()\n"
                "assert a.register_memory(ctypes.addressof(x), 65536) == 0\n"
                "assert b.register_memory(ctypes.addressof(y), 65536) == 0\n"
                "rc = a.transfer_sync_write('127.0.0.1:%%d' %% b.get_rpc_port(), ctypes.addressof(x), "
                "ctypes.addressof(y), 65536)\n"
                "print(rc, bytes(x) == bytes(y))\n") % self.prefix
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["0", "True"])

    def test_man_pages_render_without_warnings(self):
        for tool in TOOLS:
            page = self.p("share", "man", "man1", tool + ".1.gz")
            out = subprocess.run(["man", "--warnings", "-l", page], capture_output=True, text=True,
                                 env=dict(os.environ, MANWIDTH="80"))
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stderr.strip(), "", "%s: %s" % (tool, out.stderr))
            self.assertIn(tool, out.stdout)
            self.assertRegex(out.stdout, re.compile(r"--help|--version"))



class SharedLibraryExports(t.TestCase):
    """The built library, without an install (the mutation suite builds only what a mutant touches)."""

    def test_the_shared_library_exports_its_api_only(self):
        """libxpyd_transfer.so exports exactly the functions xpyd_transfer.h declares (XT_API): no internal symbol
        a program could come to depend on, nor clash with."""
        with open(os.path.join(ROOT, "transfer", "xpyd_transfer.h")) as f:
            api = set(re.findall(r"^XT_API [^(]*?\b(xt_\w+)\(", f.read(), re.M))
        self.assertGreaterEqual(len(api), 20)
        so = os.path.join(BUILD, "lib", "libxpyd_transfer.so")
        out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
        exported = {l.split()[-1] for l in out.splitlines() if l.split()[1:2] and l.split()[1] in "TtDdBbRrWwVv"}
        self.assertEqual({x for x in exported if not x.startswith("_")}, api)


if __name__ == "__main__":
    t.main()
