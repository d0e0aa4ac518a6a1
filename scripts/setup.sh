#!/usr/bin/env bash
# Installs what building and testing kayra needs on a fresh Debian machine:
# protoc (etcd-client's build compiles etcd's .proto files), etcd (the
# production store; the test suite starts private instances of it), and
# chromium with chromedriver (the web console's browser tests drive them;
# nothing is downloaded at test time), cargo-machete (`scripts/test`
# fails on a dependency a crate declares but does not use), and cargo-deb
# (`scripts/package` builds the Debian package with it; `scripts/test`
# checks the package).
# Idempotent: does nothing when all are present.
set -euo pipefail

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server etcd-client)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
# `scripts/check-package` verifies the units with it.
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  # One installer at a time, even when tests start several.
  exec 9>/tmp/kayra-apt.lock
  flock 9
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo-machete >/dev/null 2>&1; then
  echo "setup: installing cargo-machete" >&2
  # One build at a time, even when tests start several (a few minutes).
  exec 8>/tmp/kayra-cargo-install.lock
  flock 8
  command -v cargo-machete >/dev/null 2>&1 || cargo install --locked --quiet cargo-machete@0.9.2
fi

if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "setup: installing cargo-deb" >&2
  exec 8>/tmp/kayra-cargo-install.lock
  flock 8
  command -v cargo-deb >/dev/null 2>&1 || cargo install --locked --quiet cargo-deb@3.8.0
fi
