#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/package.sh - builds the Debian package build/xpyd_<version>_amd64.deb with CPack: binaries, man pages,
# libxpyd_transfer (shared + static, header, pkg-config), example topologies, Grafana dashboard, the
# xpyd-router systemd unit and /etc/xpyd/router.json; dependencies computed by dpkg-shlibdeps.
# Then: dpkg -i build/xpyd_*.deb. The package build has its own folder (XPYD_PACKAGE_BUILD_DIR, default
# build/package), configured for /usr, without tests or sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh help2man man-db dpkg-dev adduser # man pages, dpkg-shlibdeps, the unit's user
B=${XPYD_PACKAGE_BUILD_DIR:-build/package}
XPYD_BUILD_DIR=$B XPYD_BUILD_TYPE=RelWithDebInfo XPYD_ASSERTS=OFF ./scripts/build.sh -DCMAKE_INSTALL_PREFIX=/usr \
  -DXPYD_TESTS=OFF -DXPYD_SANITIZE=OFF >/dev/null
rm -f "$B"/xpyd_*.deb
(cd "$B" && cpack -G DEB >/dev/null)
mkdir -p build
cp "$B"/xpyd_*.deb build/
ls build/xpyd_*.deb
