"""Who may use the dashboard: Streamlit's OIDC login when `.streamlit/secrets.toml` configures `[auth]`,
else a shared password from $DRAFTLAB_PASSWORD, else nobody is asked (fine on 127.0.0.1 only).

`draftlab ui` refuses to bind beyond loopback with neither, unless `--insecure` says something in front of the
dashboard (a VPN, an authenticating proxy) already controls access. The password is never printed or logged.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import time
from pathlib import Path

PASSWORD_ENV = "DRAFTLAB_PASSWORD"
_ADMITTED = "_draftlab_admitted"  # session-state flag set by a correct password
_PASSWORD_FIELD = "draftlab_password"
WRONG_PASSWORD_DELAY_S = 1.0  # each wrong guess costs the guesser a second


def configured_password() -> str | None:
    """$DRAFTLAB_PASSWORD, unless unset or empty."""
    return os.environ.get(PASSWORD_ENV) or None


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


# --- OIDC, read the way Streamlit reads it --------------------------------------------------------------------

def _providers(auth: dict) -> list[str | None]:
    """The providers an `[auth]` section defines: None for the default one (client_id right in [auth]), else the
    names of its `[auth.NAME]` sub-tables that have a client_id."""
    providers: list[str | None] = [None] if auth.get("client_id") else []
    providers += [name for name, value in auth.items() if hasattr(value, "get") and value.get("client_id")]
    return providers


def oidc_problem(auth) -> str | None:
    """None when `auth` (the [auth] section, or None) makes st.login usable, else what is missing."""
    if not auth:
        return "no [auth] section in .streamlit/secrets.toml"
    missing = [key for key in ("redirect_uri", "cookie_secret") if not auth.get(key)]
    if missing:
        return f"[auth] in .streamlit/secrets.toml lacks {', '.join(missing)}"
    if not _providers(auth):
        return "[auth] in .streamlit/secrets.toml names no provider with a client_id"
    try:
        import authlib  # noqa: F401 - st.login needs it
    except ImportError:
        return "[auth] is configured but Authlib is not installed (pip install Authlib)"
    return None


def secrets_auth_section(cwd: Path | None = None) -> dict | None:
    """The [auth] table of the secrets files Streamlit will read (`secrets.files`: ~/.streamlit/secrets.toml and
    ./.streamlit/secrets.toml by default; later files win), outside a running app; None when there is none."""
    import tomllib

    try:
        from streamlit import config

        files = list(config.get_option("secrets.files"))
    except Exception:  # noqa: BLE001 - Streamlit's defaults
        files = [str(Path.home() / ".streamlit" / "secrets.toml"), ".streamlit/secrets.toml"]
    auth: dict = {}
    for name in files:
        path = Path(name).expanduser()
        path = path if path.is_absolute() else (cwd or Path.cwd()) / path
        if path.is_file():
            with open(path, "rb") as f:
                auth.update(tomllib.load(f).get("auth", {}) or {})
    return auth or None


def serving_refusal(host: str, insecure: bool = False, cwd: Path | None = None) -> str | None:
    """Why `draftlab ui --host HOST` must not start (one line, no secrets), or None."""
    if insecure or is_loopback(host) or configured_password():
        return None
    problem = oidc_problem(secrets_auth_section(cwd))
    if problem is None:
        return None
    return (f"--host {host} serves the dashboard beyond this machine, and it can launch jobs, but no login is "
            f"configured ({problem}); set {PASSWORD_ENV} to a shared password, or configure Streamlit's OIDC login "
            f"in .streamlit/secrets.toml [auth], or pass --insecure if something in front of it already "
            f"authenticates")


def login_mode(host: str, cwd: Path | None = None) -> str:
    """How the dashboard will ask for access, in words, for the startup line (never the password itself)."""
    auth = secrets_auth_section(cwd)
    if auth:  # the app lets [auth] decide whenever it exists
        problem = oidc_problem(auth)
        return ("OIDC login (.streamlit/secrets.toml [auth])" if problem is None
                else f"OIDC login misconfigured, so every visitor is refused: {problem}")
    if configured_password():
        return f"password from ${PASSWORD_ENV}"
    return "no login" + ("" if is_loopback(host) else " (--insecure)")


# --- inside the running app ----------------------------------------------------------------------------------

def _app_auth_section():
    import streamlit as st

    try:
        return st.secrets.get("auth")
    except Exception:  # noqa: BLE001 - no secrets file at all
        return None


def is_admitted() -> bool:
    """True when this session may see the dashboard: OIDC configured and logged in, else the password entered in
    this session, else no login configured. Draws nothing."""
    import streamlit as st

    auth = _app_auth_section()
    if auth:  # OIDC configured: it decides, even when a password is set too
        return bool(st.user.get("is_logged_in"))
    return configured_password() is None or bool(st.session_state.get(_ADMITTED))


def login() -> None:
    """Draw the login, and nothing else, for a session that is not admitted. Call it after st.navigation, so the
    rerun after a successful login stays on the page the URL asked for."""
    import streamlit as st

    st.title("DraftLab")
    auth = _app_auth_section()
    if auth:
        problem = oidc_problem(auth)
        if problem:
            st.error(f"Login is configured but cannot work: {problem}.", icon=":material/lock:")
            return
        st.caption("Log in to see the experiments.")
        for provider in _providers(auth):
            label = "Log in" if provider is None else f"Log in with {provider}"
            st.button(label, on_click=st.login, args=(() if provider is None else (provider,)),
                      icon=":material/login:", key=f"draftlab_login_{provider or 'default'}")
        return
    password = configured_password()
    with st.form("draftlab_login"):
        entered = st.text_input("Password", type="password", key=_PASSWORD_FIELD)
        submitted = st.form_submit_button("Log in", icon=":material/login:")
    if submitted and password is not None:
        if hmac.compare_digest(entered.encode("utf-8"), password.encode("utf-8")):
            st.session_state[_ADMITTED] = True
            st.rerun()  # the page the URL asked for, now
        time.sleep(WRONG_PASSWORD_DELAY_S)
        st.error("Wrong password.", icon=":material/lock:")


def logout_button() -> None:
    """A sidebar "Log out" for an admitted session, when some login is configured."""
    import streamlit as st

    if _app_auth_section():
        st.sidebar.button("Log out", on_click=st.logout, icon=":material/logout:", key="draftlab_logout")
    elif configured_password() is not None:
        st.sidebar.button("Log out", on_click=_log_out, icon=":material/logout:", key="draftlab_logout")


def _log_out() -> None:
    import streamlit as st

    st.session_state.pop(_ADMITTED, None)
