#!/usr/bin/env bash
# The dashboard on the embedded demo pair (no GPU, no download): sets up .venv, then `draftlab ui`
# (http://127.0.0.1:8501, SQLite database ./draftlab.db, a local worker). Extra args go to `draftlab ui`.
source "$(dirname "$0")/setup.sh"
exec draftlab ui "$@"
