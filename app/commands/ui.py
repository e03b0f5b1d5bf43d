"""`draftlab ui`: the dashboard, plus a local worker when no live one serves the database (app/ui.py)."""

from __future__ import annotations

from app.arguments import whole
from app.ui import PORTS as UI_PORTS  # (stdlib only at import)

NAME = "ui"


def add_parser(sub):
    p = sub.add_parser(NAME, help="the dashboard, plus a local worker if none is alive")
    p.add_argument("--db", default=None)
    p.add_argument("--port", type=whole(*UI_PORTS, what="a TCP port"), default=8501)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; beyond loopback (0.0.0.0) it needs $DRAFTLAB_PASSWORD or OIDC "
        "in .streamlit/secrets.toml [auth]",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve beyond loopback without a login (only behind a VPN or an authenticating proxy)",
    )
    return p


def run(args) -> int:
    from app.ui import main as ui_main

    return ui_main(db=args.db, port=args.port, host=args.host, insecure=args.insecure)
