#!/usr/bin/env bash
# Install a Debian package when the command it provides is missing: `setup-debian.sh COMMAND PACKAGE WHY`.
# COMMAND is a command name or a path pattern (PostgreSQL's initdb is not on PATH).
# Used for chromium (the dashboard's browser tests), bubblewrap (`bwrap`, the verification sandbox's namespaces)
# and postgresql (the store's tests on a throwaway PostgreSQL server).
# Idempotent and quiet. Without apt-get, or without root, it says what is missing and what goes without it.
set -euo pipefail
command_name=$1 package=$2 why=$3
if command -v "$command_name" >/dev/null 2>&1 || compgen -G "$command_name" >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-debian: no $command_name and no apt-get; $why" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
  else
    echo "setup-debian: not root and no sudo; install $package: $why" >&2
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq "$package" >/dev/null 2>&1; then
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq "$package" >/dev/null
fi
