#!/usr/bin/env bash
# Install Debian's chromium for the dashboard's browser tests (tests/dashboard/test_browser.py) when it is missing.
# Idempotent and quiet; Playwright (a dev extra) drives it, so no browser is ever downloaded. Without apt-get, or
# without root, it says so and leaves the browser tests to skip.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-browser: no chromium and no apt-get; the browser tests will be skipped" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
  else
    echo "setup-browser: not root and no sudo; install chromium to run the browser tests" >&2
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq chromium >/dev/null 2>&1; then
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq chromium >/dev/null
fi
