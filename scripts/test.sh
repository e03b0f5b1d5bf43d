#!/usr/bin/env bash
# Every DraftLab test, on a fresh machine: sets up .venv (scripts/setup.sh), makes sure the browser and a
# PostgreSQL server are there, then runs pytest. Extra args go to pytest.
#
# Both are required: a test that needs the browser or PostgreSQL FAILS, saying why, when it is missing (CI must
# not pass by skipping half the storage suite). DRAFTLAB_ALLOW_SKIP=1 lets those tests skip instead, for a machine
# that deliberately has neither.
source "$(dirname "$0")/setup.sh"
if [ "${DRAFTLAB_ALLOW_SKIP:-0}" = 1 ]; then
  echo "note: DRAFTLAB_ALLOW_SKIP=1: the PostgreSQL and browser tests skip if their service is missing" >&2
else
  export DRAFTLAB_REQUIRE_SERVICES=1  # read by tests/conftest.py
fi
as_root=0; [ "$(id -u)" = 0 ] && as_root=1
have_apt=0; command -v apt-get >/dev/null 2>&1 && have_apt=1
apt_install() {  # quietly; refresh the package lists once if the first try fails
  apt-get install -y -q "$@" >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$@" >/dev/null 2>&1; }
}

# The browser test drives Debian's chromium; install it when we may (root + apt).
if [ ! -x /usr/bin/chromium ] && [ $as_root = 1 ] && [ $have_apt = 1 ]; then
  apt_install chromium || echo "note: could not install chromium (apt-get install -y chromium)" >&2
fi

# PostgreSQL: $DRAFTLAB_TEST_POSTGRES if set; else the server at 127.0.0.1:5432 (db `test`), which we start here
# when root with Debian's pg_ctlcluster (installing the server first if there is none); else tests/conftest.py
# starts a throw-away server with initdb (as the `postgres` user when root, since initdb refuses root).
if [ -z "${DRAFTLAB_TEST_POSTGRES:-}" ] && [ $as_root = 1 ]; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1 && [ $have_apt = 1 ]; then
    apt_install postgresql || echo "note: could not install PostgreSQL (apt-get install -y postgresql)" >&2
  fi
  if command -v pg_ctlcluster >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    for version in $(ls /etc/postgresql 2>/dev/null); do
      [ -d "/etc/postgresql/$version/main" ] || continue
      pg_ctlcluster --skip-systemctl-redirect "$version" main start >/dev/null 2>&1 && break
    done
  fi
fi
# vLLM (tests/test_confirm_vllm.py, `draftlab confirm` against a real server): $DRAFTLAB_VLLM if set; else the CPU
# build in .vllm-venv, installed here when missing (scripts/install_vllm.sh: its own venv, a few minutes once).
if [ -z "${DRAFTLAB_VLLM:-}" ] && [ "${DRAFTLAB_ALLOW_SKIP:-0}" != 1 ]; then
  bash "$(dirname "$0")/install_vllm.sh" || echo "note: could not install vLLM (scripts/install_vllm.sh)" >&2
fi
exec python -m pytest "$@"
