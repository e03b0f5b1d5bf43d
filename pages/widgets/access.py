"""Who may use the dashboard: Streamlit's OIDC login when `.streamlit/secrets.toml` configures `[auth]`,
else a shared password from $DRAFTLAB_PASSWORD, else nobody is asked (fine on 127.0.0.1 only).

`draftlab ui` refuses to bind beyond loopback with neither, unless `--insecure` says something in front of the
dashboard (a VPN, an authenticating proxy) already controls access. The password is never printed or logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import threading
import time
from collections import deque
from pathlib import Path

PASSWORD_ENV = "DRAFTLAB_PASSWORD"
_ADMITTED = "_draftlab_admitted"  # session-state flag set by a correct password
_PASSWORD_FIELD = "draftlab_password"
WRONG_PASSWORD_DELAY_S = 1.0  # each wrong guess costs the guesser a second
# Throttling that holds across sessions (every browser session of one dashboard process shares it): an address
# with ADDRESS_FAILURES wrong passwords within LOGIN_WINDOW_S is locked out for LOCKOUT_S (the right password
# included); with GLOBAL_FAILURES wrong passwords from all addresses together within the window, every login
# waits until the oldest of them is LOGIN_WINDOW_S old (a guesser with many addresses gets that many guesses per
# window, no more). A correct password clears its address's count.
ADDRESS_FAILURES, GLOBAL_FAILURES = 5, 50
LOGIN_WINDOW_S, LOCKOUT_S = 15 * 60.0, 15 * 60.0
MAX_TRACKED_ADDRESSES = 10_000  # the oldest address is forgotten past this (bounded memory under a spray)


class LoginThrottle:
    """Wrong-password counts per client address and overall, with lockouts (see ADDRESS_FAILURES above).
    Thread-safe: Streamlit runs each session's script in its own thread. `clock` is injectable for tests."""

    def __init__(
        self,
        clock=time.monotonic,
        per_address: int = ADDRESS_FAILURES,
        overall: int = GLOBAL_FAILURES,
        window: float = LOGIN_WINDOW_S,
        lockout: float = LOCKOUT_S,
    ):
        self.clock, self.per_address, self.overall, self.window, self.lockout = (
            clock,
            per_address,
            overall,
            window,
            lockout,
        )
        self._lock = threading.Lock()
        self._failures: dict[str, deque] = {}  # address -> times of its recent wrong passwords
        self._locked_until: dict[str, float] = {}
        self._all: deque = deque()  # times of every recent wrong password

    def _prune(self, now: float) -> None:
        while self._all and self._all[0] <= now - self.window:
            self._all.popleft()
        for address in [a for a, until in self._locked_until.items() if until <= now]:
            del self._locked_until[address]

    def wait(self, address: str) -> tuple[float, str]:
        """(seconds before `address` may try a password, why) — (0, "") when it may try now."""
        with self._lock:
            now = self.clock()
            self._prune(now)
            until = self._locked_until.get(address, 0.0)
            if until > now:
                return until - now, "address"
            if len(self._all) >= self.overall:
                return self._all[len(self._all) - self.overall] + self.window - now, "overall"
            return 0.0, ""

    def failed(self, address: str) -> None:
        with self._lock:
            now = self.clock()
            self._prune(now)
            self._all.append(now)
            times = self._failures.pop(address, deque())  # re-inserted last: the dict stays oldest-first
            times.append(now)
            while times and times[0] <= now - self.window:
                times.popleft()
            self._failures[address] = times
            if len(times) >= self.per_address:
                self._locked_until[address] = now + self.lockout
                times.clear()
            while len(self._failures) > MAX_TRACKED_ADDRESSES:
                del self._failures[next(iter(self._failures))]

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._failures.pop(address, None)


THROTTLE = LoginThrottle()  # one per dashboard process: every session's login goes through it


def client_address() -> str:
    """The browser's address as Streamlit sees it (behind a proxy: the proxy's). Streamlit gives None for a browser
    on this machine (127.0.0.1 or ::1): that is "localhost", what the docs' `local ADDRESS` then reads; "unknown"
    only outside a browser session, where Streamlit cannot be asked."""
    import streamlit as st

    try:
        address = st.context.ip_address
    except Exception:  # noqa: BLE001 - outside a browser session
        return "unknown"
    return address if isinstance(address, str) and address else "localhost"


def _refusal(seconds: float, why: str) -> str:
    minutes = max(1, round(seconds / 60))
    where = "from this address" if why == "address" else "on this dashboard"
    return (
        f"Too many wrong passwords {where}: logins are paused for about {minutes} min. "
        f"Try again then (ask whoever runs the dashboard if you forgot the password)."
    )


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
    return (
        f"--host {host} serves the dashboard beyond this machine, and it can launch jobs, but no login is "
        f"configured ({problem}); set {PASSWORD_ENV} to a shared password, or configure Streamlit's OIDC login "
        f"in .streamlit/secrets.toml [auth], or pass --insecure if something in front of it already "
        f"authenticates"
    )


def login_mode(host: str, cwd: Path | None = None) -> str:
    """How the dashboard will ask for access, in words, for the startup line (never the password itself)."""
    auth = secrets_auth_section(cwd)
    if auth:  # the app lets [auth] decide whenever it exists
        problem = oidc_problem(auth)
        return (
            "OIDC login (.streamlit/secrets.toml [auth])"
            if problem is None
            else f"OIDC login misconfigured, so every visitor is refused: {problem}"
        )
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
            st.button(
                label,
                on_click=st.login,
                args=(() if provider is None else (provider,)),
                icon=":material/login:",
                key=f"draftlab_login_{provider or 'default'}",
            )
        return
    password = configured_password()
    with st.form("draftlab_login"):
        entered = st.text_input("Password", type="password", key=_PASSWORD_FIELD)
        submitted = st.form_submit_button("Log in", icon=":material/login:")
    if submitted and password is not None:
        address = client_address()
        seconds, why = THROTTLE.wait(address)
        if seconds > 0:  # locked out: the password is not even compared
            st.error(_refusal(seconds, why), icon=":material/lock:")
            return
        if hmac.compare_digest(entered.encode("utf-8"), password.encode("utf-8")):
            THROTTLE.succeeded(address)
            st.session_state[_ADMITTED] = True
            st.rerun()  # the page the URL asked for, now
        THROTTLE.failed(address)
        time.sleep(WRONG_PASSWORD_DELAY_S)
        st.error("Wrong password.", icon=":material/lock:")


def launcher() -> str:
    """Who is queuing work from this session, as experiments.launched_by stores it: the OIDC user's email (or
    name), else "password from ADDRESS" or "local ADDRESS" (no login configured)."""
    import streamlit as st

    if _app_auth_section():
        user = st.user
        who = user.get("email") or user.get("name") or user.get("sub") or "unknown"
        return f"oidc:{who}"[:200]
    address = client_address()
    return (f"password from {address}" if configured_password() is not None else f"local {address}")[:200]


def cli_launcher() -> str:
    """The CLI's launched_by: `cli USER@HOST`."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment
        user = "unknown"
    return f"cli {user}@{socket.gethostname()}"[:200]


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
