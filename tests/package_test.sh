#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/package_test.sh - the Debian package end to end, as an operator gets it: scripts/package.sh builds
# build/xpyd_<version>_amd64.deb; dpkg -i installs it; the files, the xpyd user, the units (systemd-analyze
# verify where systemd is installed, else the unit's keys are checked), the man pages (rendered without
# warnings) and xpyd_router --version are checked; a router started as the unit would start it serves with
# the packaged /etc/xpyd/router.json; dpkg -r leaves only the conffile /etc/xpyd/router.json; dpkg -P leaves
# nothing (the user too). Needs root (dpkg); skipped (exit 77) without it or when an xpyd package is already
# installed (it is never replaced by a test). Always purges what it installed, even when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for dpkg -i"; exit 77; }
if dpkg-query -W -f='${Status}' xpyd 2>/dev/null | grep -q "installed\|config-files"; then
  echo "SKIP: an xpyd package is already on this machine; not touching it"; exit 77
fi
export XPYD_PACKAGE_BUILD_DIR=${XPYD_PACKAGE_BUILD_DIR:-build/package-test}
WORK=$(mktemp -d /tmp/xpyd-pkg.XXXXXX)
RPID="" SP="" SD="" FAKE_SYSTEMD=""
cleanup() {
  for p in $RPID $SP $SD; do kill "$p" 2>/dev/null || true; done
  dpkg -P xpyd >/dev/null 2>&1 || true
  [ -z "$FAKE_SYSTEMD" ] || rmdir /run/systemd/system /run/systemd 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

deb=$(./scripts/package.sh | tail -1)
[ -f "$deb" ] || fail "no package built"
case "$deb" in build/xpyd_*_amd64.deb) ;; *) fail "unexpected package name $deb" ;; esac
dpkg-deb -f "$deb" Depends | grep -q "libevhtp0" || fail "dependencies not computed: $(dpkg-deb -f "$deb" Depends)"
dpkg-deb -f "$deb" Depends | grep -qw "python3" || fail "no python3 in Depends (the Python binding needs it)"
# The maintainer scripts' systemd calls, seen through a systemctl that records them: where systemd does not run
# (this machine) its directory is made for the test and removed after.
mkdir -p "$WORK/bin"
printf '#!/bin/sh\necho "$*" >>%s/systemctl.log\n' "$WORK" >"$WORK/bin/systemctl"
chmod +x "$WORK/bin/systemctl"
if [ ! -d /run/systemd/system ]; then mkdir -p /run/systemd/system; FAKE_SYSTEMD=1; fi
PATH="$WORK/bin:$PATH" dpkg -i "$deb" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; fail "dpkg -i"; }
grep -q "daemon-reload" "$WORK/systemctl.log" || fail "postinst did not reload systemd"
! grep -q "restart" "$WORK/systemctl.log" || fail "a first install started or restarted the router"
: >"$WORK/systemctl.log"
PATH="$WORK/bin:$PATH" dpkg -i "$deb" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; fail "dpkg -i (upgrade)"; }
grep -qx "try-restart xpyd-router.service" "$WORK/systemctl.log" || fail "an upgrade does not restart a running router"
if [ -n "$FAKE_SYSTEMD" ]; then rmdir /run/systemd/system /run/systemd 2>/dev/null || true; FAKE_SYSTEMD=""; fi

# files
for f in /usr/bin/xpyd_router /usr/bin/xpyd_sim /usr/bin/xpyd_bench /usr/bin/xpyd_transfer_bench /usr/bin/xpyd_register \
         /usr/bin/xpyd_tokenize \
         /usr/include/xpyd/xpyd_transfer.h /etc/xpyd/router.json /usr/share/xpyd/grafana/xpyd.json \
         /usr/share/xpyd/conf/1p1d.json /usr/lib/systemd/system/xpyd-router.service \
         /usr/lib/systemd/system/xpyd-sim@.service /usr/share/doc/xpyd/copyright \
         /usr/share/doc/xpyd/examples/low-port.conf; do
  [ -e "$f" ] || fail "missing $f"
done
ls /usr/lib/*/libxpyd_transfer.so.0 /usr/lib/*/libxpyd_transfer.a /usr/lib/*/pkgconfig/xpyd_transfer.pc >/dev/null \
  || fail "library files missing"
pkg-config --exists xpyd_transfer || fail "pkg-config does not find xpyd_transfer"
[ "$(pkg-config --variable=prefix xpyd_transfer | xargs realpath)" = /usr ] || fail "pkg-config prefix is not /usr"
grep -q "^License: Apache-2.0" /usr/share/doc/xpyd/copyright || fail "copyright names no licence"
grep -q "/usr/share/common-licenses/Apache-2.0" /usr/share/doc/xpyd/copyright || fail "copyright: no licence text"
dpkg-query -W -f='${Conffiles}\n' xpyd | grep -q "/etc/xpyd/router.json" || fail "router.json is not a conffile"
id xpyd >/dev/null 2>&1 || fail "no xpyd system user"
[ "$(getent passwd xpyd | cut -d: -f7)" != /bin/bash ] || fail "xpyd user has a login shell"

# version
out=$(xpyd_router --version)
echo "$out" | grep -Eq '^xpyd_router [0-9]+\.[0-9]+\.[0-9]+ \(git ([0-9a-f]{12}(-dirty)?|unknown)\)$' || fail "--version: $out"

# man pages
for m in xpyd_router xpyd_sim xpyd_bench xpyd_transfer_bench xpyd_register xpyd_tokenize; do
  err=$(MANWIDTH=80 man --warnings "$m" 2>&1 >/dev/null) || fail "man $m"
  [ -z "$err" ] || fail "man $m warnings: $err"
done

# units
unit=/usr/lib/systemd/system/xpyd-router.service
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$unit" 2>&1 | tee "$WORK/verify.log"
  [ ! -s "$WORK/verify.log" ] || fail "systemd-analyze verify: $(cat "$WORK/verify.log")"
  systemd-analyze verify /usr/lib/systemd/system/xpyd-sim@.service 2>&1 | grep -v "^$" && fail "sim unit" || true
fi
for key in "ExecStart=/usr/bin/xpyd_router --config /etc/xpyd/router.json" "ExecReload=/bin/kill -HUP \$MAINPID" \
           "User=xpyd" "NoNewPrivileges=yes" "ProtectSystem=strict" "ProtectHome=yes" "LimitNOFILE=65536" \
           "TimeoutStopSec=40"; do
  grep -qxF "$key" "$unit" || fail "unit lacks $key"
done
grep -q "^ExecStop=.*kill -TERM \$MAINPID; while kill -0" "$unit" || fail "unit ExecStop does not drain"

# the unit's command line, run by hand as the unit would (as xpyd, with the packaged config, a free port)
xpyd_sim --role prefill --port 0 --port-file "$WORK/p" --log-level warn >/dev/null 2>&1 &
SP=$!
xpyd_sim --role decode --port 0 --port-file "$WORK/d" --log-level warn >/dev/null 2>&1 &
SD=$!
for _ in $(seq 100); do [ -s "$WORK/p" ] && [ -s "$WORK/d" ] && break; sleep 0.05; done
chmod 755 "$WORK"
install -d -o xpyd "$WORK/run"
setpriv --reuid=xpyd --regid=xpyd --init-groups xpyd_router --config /etc/xpyd/router.json --port 0 --port-file "$WORK/run/r" \
  -p "127.0.0.1:$(cat "$WORK/p")" -d "127.0.0.1:$(cat "$WORK/d")" >"$WORK/router.log" 2>&1 &
RPID=$!
for _ in $(seq 100); do [ -s "$WORK/run/r" ] && break; sleep 0.05; done
[ -s "$WORK/run/r" ] || { cat "$WORK/router.log"; fail "the packaged router did not start"; }
code=$(curl -s -o "$WORK/out" -w '%{http_code}' "http://127.0.0.1:$(cat "$WORK/run/r")/v1/completions" \
  -H 'Content-Type: application/json' -d '{"prompt":"a","max_tokens":2}')
[ "$code" = 200 ] || fail "request through the packaged router: $code $(cat "$WORK/out")"
kill "$RPID"; wait "$RPID" || fail "router exit status $?"
RPID=""

# a port below 1024 as the unit's user: refused without a capability, served with the one the documented
# drop-in gives (low-port.conf: AmbientCapabilities=CAP_NET_BIND_SERVICE)
if [ "$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start 2>/dev/null || echo 1024)" -gt 1000 ] &&
   ! (exec 3<>/dev/tcp/127.0.0.1/1000) 2>/dev/null; then
  grep -qx "AmbientCapabilities=CAP_NET_BIND_SERVICE" /usr/share/doc/xpyd/examples/low-port.conf || fail "drop-in"
  as_xpyd=(setpriv --reuid=xpyd --regid=xpyd --init-groups)
  router=(xpyd_router --config /etc/xpyd/router.json --host 127.0.0.1 --port 1000 -p "127.0.0.1:$(cat "$WORK/p")"
          -d "127.0.0.1:$(cat "$WORK/d")")
  "${as_xpyd[@]}" "${router[@]}" >"$WORK/low.log" 2>&1 && fail "port 1000 without the capability: the router started"
  grep -q "cannot listen on 127.0.0.1:1000: Permission denied" "$WORK/low.log" ||
    fail "port 1000 refused without saying why: $(cat "$WORK/low.log")"
  "${as_xpyd[@]}" --inh-caps=+net_bind_service --ambient-caps=+net_bind_service "${router[@]}" >"$WORK/low.log" 2>&1 &
  RPID=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:1000/health" && break; sleep 0.05; done
  [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:1000/health)" = 200 ] ||
    { cat "$WORK/low.log"; fail "port 1000 with CAP_NET_BIND_SERVICE"; }
  kill "$RPID"; wait "$RPID" || fail "router exit status $?"
  RPID=""
fi
kill "$SP" "$SD"; wait "$SP" "$SD" 2>/dev/null || true

# remove: only the conffile stays; purge: nothing stays
dpkg -r xpyd >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; fail "dpkg -r"; }
left=$(ls -d /usr/bin/xpyd_* /usr/lib/*/libxpyd_transfer* /usr/share/xpyd /usr/include/xpyd \
       /usr/lib/systemd/system/xpyd-* /usr/share/man/man1/xpyd_* 2>/dev/null || true)
[ -z "$left" ] || fail "left after dpkg -r: $left"
[ -f /etc/xpyd/router.json ] || fail "the conffile went with dpkg -r"
dpkg -P xpyd >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; fail "dpkg -P"; }
[ ! -e /etc/xpyd ] || fail "/etc/xpyd left after purge"
! id xpyd >/dev/null 2>&1 || fail "xpyd user left after purge"
echo "package test: 1 passed, 0 failed"
