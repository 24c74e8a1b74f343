#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the end-to-end browser test (idempotent).
# Playwright drives it through executable_path=/usr/bin/chromium; `playwright install` is never needed.
set -euo pipefail
if [ -x /usr/bin/chromium ] && /usr/bin/chromium --version >/dev/null 2>&1; then
    echo "chromium present: $(/usr/bin/chromium --version)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
