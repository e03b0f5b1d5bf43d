#!/usr/bin/env bash
# Every DraftLab test, on a fresh machine: sets up .venv (scripts/setup.sh), makes sure the browser and a
# PostgreSQL server are there when this machine can provide them, then runs pytest. Extra args go to pytest.
source "$(dirname "$0")/setup.sh"
# Browser tests drive Debian's chromium; install it when we may (root + apt), else they skip and say why.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }) \
    || echo "note: could not install chromium; browser tests will skip"
fi
# Storage tests use $DRAFTLAB_TEST_POSTGRES, else 127.0.0.1:5432/test, else start their own with initdb.
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null \
   && command -v pg_ctlcluster >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start 2>/dev/null || true
fi
exec python -m pytest "$@"
