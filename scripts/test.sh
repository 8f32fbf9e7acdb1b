#!/usr/bin/env bash
# Install what the tests need (Python packages, Debian's Chromium for the browser tests, nginx for the
# replica test) and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements-test.txt
if ! command -v chromium >/dev/null 2>&1 || ! [ -x /usr/sbin/nginx ]; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get install -y -q chromium nginx >/dev/null 2>&1 || { $sudo_cmd apt-get update -q >/dev/null && $sudo_cmd apt-get install -y -q chromium nginx >/dev/null; }
fi
# two workers, a test file each (its module fixtures stay in one process): the suite mostly waits on
# app processes, browsers and ranks it starts, so two files at a time fit the 2 cores (tests/README.md)
exec python3 -m pytest -n "${TPU_DEMO_TEST_WORKERS:-2}" --dist loadfile "$@"
