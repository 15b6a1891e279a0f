#!/bin/sh
# Chromium for the tests that open the HTML reports in a real browser (playwright drives
# this system browser; it never downloads one). Does nothing when chromium is already
# installed; otherwise installs Debian's package, which needs root (or sudo) and apt.
set -eu
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
