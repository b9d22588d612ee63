# SPDX-License-Identifier: Apache-2.0
"""The tests' oracles' answers, kept (tests/blackbox/oracle_cache.py). Hugging Face's tokenizers under node
(tok_oracle.js) and jinja2 (tpl_oracle.py) answer one line per input line, and the same questions are asked by the
plain and the sanitized pass of scripts/test.sh and by the mutation suite's runs of the same tests: each answer is
computed once per machine and kept in an SQLite file ($XPYD_ORACLE_CACHE, default ~/.cache/xpyd-oracle; never
committed, never shared between machines). What decides an answer is its key: the oracle's command line with
every file in it read (a model's tokenizer.json by its content, not its path), the files it depends on (its
script, the npm package's manifest, jinja2's sources), the program's version, and the input line itself - so a
changed oracle, model or package asks again. Questions are asked while holding a lock per key space, so two
passes running at once compute each answer once. XPYD_ORACLE_CACHE=off asks every time."""
import fcntl
import hashlib
import os
import sqlite3
import subprocess

_file_hashes = {}


def _file_hash(path):
    st = os.stat(path)
    k = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if k not in _file_hashes:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _file_hashes[k] = h.hexdigest()
    return _file_hashes[k]


def _space(cmd, deps, version):
    h = hashlib.sha256(b"xpyd-oracle-1\0" + version.encode() + b"\0")
    for a in list(cmd) + [None] + list(deps):
        if a is None:
            h.update(b"\1")
        elif os.path.isfile(a):
            h.update(b"file:" + _file_hash(a).encode() + b"\0")
        else:
            h.update(b"arg:" + a.encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def _run(cmd, lines, env, timeout):
    """The oracle asked: one answer line per input line, in order (or AssertionError with its stderr)."""
    p = subprocess.run(cmd, input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                       timeout=timeout, env=env)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert len(out) == len(lines), "oracle %s: %d answers to %d questions\n%s" % (cmd, len(out), len(lines), p.stderr)
    return out


def ask(cmd, lines, deps=(), version="", env=None, timeout=600, cacheable=None):
    """The oracle cmd's answer line to each of lines (strings without a newline), from the cache where it was
    asked before. deps: files whose content decides the answers besides those on cmd; version: anything else that
    does (a program's version). cacheable(line) False: asked every time (an answer that depends on the clock)."""
    where = os.environ.get("XPYD_ORACLE_CACHE", os.path.expanduser("~/.cache/xpyd-oracle"))
    if where == "off":
        return _run(cmd, lines, env, timeout)
    os.makedirs(where, exist_ok=True)
    space = _space(cmd, deps, version)
    keys = [hashlib.sha256((space + "\0" + l).encode("utf-8", "surrogateescape")).digest() for l in lines]
    db = sqlite3.connect(os.path.join(where, "answers.sqlite"), timeout=120)
    try:
        db.execute("CREATE TABLE IF NOT EXISTS answers (key BLOB PRIMARY KEY, answer TEXT NOT NULL)")

        def known():
            have = {}
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                q = "SELECT key, answer FROM answers WHERE key IN (%s)" % ",".join("?" * len(part))
                have.update(db.execute(q, part).fetchall())
            return have

        have = known()
        miss = [i for i, k in enumerate(keys) if k not in have]
        if miss:
            os.makedirs(os.path.join(where, "locks"), exist_ok=True)
            with open(os.path.join(where, "locks", space[:16]), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another pass asking the same: wait for its answers
                have = known()
                miss = [i for i, k in enumerate(keys) if k not in have]
                if miss:
                    got = _run(cmd, [lines[i] for i in miss], env, timeout)
                    keep = [(keys[i], a) for i, a in zip(miss, got) if cacheable is None or cacheable(lines[i])]
                    with db:
                        db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?)", keep)
                    have.update((keys[i], a) for i, a in zip(miss, got))
        return [have[k] for k in keys]
    finally:
        db.close()


_versions = {}


def node_version():
    if "node" not in _versions:
        _versions["node"] = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return _versions["node"]


HERE = os.path.dirname(os.path.abspath(__file__))


def hf_ids(tokenizer_json, texts, special=False, config=None, timeout=600, truncate=None):
    """Hugging Face's tokenizers' ids (npm `tokenizers` through tok_oracle.js) for each of texts; special: the
    post-processor's special tokens added (config: the tokenizer_config.json whose add_bos/eos_token transformers
    applies)."""
    import json
    import xpyd_testlib as t
    t.npm_package("tokenizers")
    pkg = os.path.join(t.NPM_DIR, "node_modules", "tokenizers")
    cmd = ["node", os.path.join(HERE, "tok_oracle.js"), tokenizer_json]
    if special:
        cmd.append("--add-special-tokens")
        if config and os.path.exists(config):
            cmd += ["--config", config]
    if truncate is not None:  # left truncation to that many ids (the special tokens kept)
        cmd += ["--truncate", str(truncate)]
    out = ask(cmd, [json.dumps(s) for s in texts], deps=[os.path.join(pkg, "package.json"),
                                                        os.path.join(pkg, "tokenizers.linux-x64-gnu.node")],
              version=node_version(), env=dict(os.environ, NODE_PATH=os.path.join(t.NPM_DIR, "node_modules")),
              timeout=timeout)
    return [json.loads(l) for l in out]


def jinja_renders(cases, timeout=600):
    """jinja2 as transformers configures it (tpl_oracle.py) for each case ({"template", "special", "request"}):
    the rendered text, or {"error": ...}. A template that reads the clock (strftime_now) is asked every time."""
    import json
    if "jinja2" not in _versions:  # (this file may run under another Python than Debian's, which has jinja2)
        _versions["jinja2"] = subprocess.run(
            ["/usr/bin/python3", "-c", "import jinja2, markupsafe, os; print(jinja2.__version__); "
             "print(jinja2.__file__); print(os.path.join(os.path.dirname(jinja2.__file__), 'sandbox.py')); "
             "print(markupsafe.__file__)"], capture_output=True, text=True).stdout.split("\n")
    v = _versions["jinja2"]
    out = ask(["/usr/bin/python3", os.path.join(HERE, "tpl_oracle.py")], [json.dumps(c) for c in cases],
              deps=[f for f in v[1:] if f], version=v[0], timeout=timeout,
              cacheable=lambda l: "strftime_now" not in l)
    return [json.loads(l) for l in out]
