"""Who may use the dashboard: `draftlab ui` refuses to serve beyond loopback without a login, and the entry
script shows nothing but the login until the visitor passes it ($DRAFTLAB_PASSWORD, or OIDC when configured)."""

from __future__ import annotations

import time

import pytest
from streamlit.testing.v1 import AppTest

from app.cli import main
from storage.analysis import catalog
from tests.test_pages import TIMEOUT, app, assert_clean, page_text
from tests.test_pages import populated as populated  # fixtures, found by name
from tests.test_pages import populated_template as populated_template

PASSWORD = "correct horse battery staple ünïcode"
OIDC = {
    "redirect_uri": "http://dash.example:8501/oauth2callback",
    "cookie_secret": "x" * 40,
    "client_id": "draftlab",
    "client_secret": "oidc-client-secret",
    "server_metadata_url": "https://idp.example/.well-known/openid-configuration",
}


@pytest.fixture(autouse=True)
def fresh_throttle(monkeypatch):
    """Each test starts with no wrong passwords counted (the throttle is one per process, shared by sessions)."""
    import pages.widgets.access as access

    throttle = access.LoginThrottle()
    monkeypatch.setattr(access, "THROTTLE", throttle)
    return throttle


@pytest.fixture
def no_login_configured(tmp_path, monkeypatch):
    """No $DRAFTLAB_PASSWORD and no secrets.toml where Streamlit looks (./.streamlit, ~/.streamlit)."""
    monkeypatch.delenv("DRAFTLAB_PASSWORD", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    from streamlit import config

    monkeypatch.setattr(
        config,
        "get_option",
        lambda name, _get=config.get_option: (
            [str(tmp_path / ".streamlit" / "secrets.toml")] if name == "secrets.files" else _get(name)
        ),
    )
    return tmp_path


class _FakeProcess:
    """Stands in for the dashboard and worker processes: records how it was started, exits at once."""

    started: list[tuple[list[str], dict]] = []

    def __init__(self, command, env=None, **_):
        self.pid, self.returncode = 4242, 0
        _FakeProcess.started.append((command, env or {}))

    def poll(self):
        return 0

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return 0

    def kill(self):
        pass


@pytest.fixture
def fake_processes(monkeypatch):
    import app.ui as ui

    _FakeProcess.started = []
    monkeypatch.setattr(ui.subprocess, "Popen", _FakeProcess)
    return _FakeProcess.started


def _one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


# --- draftlab ui ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "dash.example"])
def test_ui_refuses_to_serve_beyond_loopback_without_a_login(no_login_configured, fake_processes, capsys, host):
    db = f"sqlite:///{no_login_configured / 'ui.db'}"
    assert main(["ui", "--host", host, "--db", db]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"--host {host}" in line and "DRAFTLAB_PASSWORD" in line and "--insecure" in line and "[auth]" in line
    assert fake_processes == []  # nothing was started


@pytest.mark.parametrize(
    "argv, env",
    [
        (["--host", "127.0.0.1"], {}),
        (["--host", "localhost"], {}),
        (["--host", "0.0.0.0", "--insecure"], {}),
        (["--host", "0.0.0.0"], {"DRAFTLAB_PASSWORD": PASSWORD}),
    ],
    ids=["loopback", "localhost", "insecure", "password"],
)
def test_ui_serves_when_a_login_or_loopback_allows_it(
    no_login_configured, fake_processes, capsys, monkeypatch, argv, env
):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    db = f"sqlite:///{no_login_configured / 'ui.db'}"
    assert main(["ui", *argv, "--db", db]) == 0
    err = capsys.readouterr().err
    assert "error:" not in err
    dashboard = next(env for command, env in fake_processes if "streamlit" in command)
    worker = next(env for command, env in fake_processes if "worker" in command)
    if "DRAFTLAB_PASSWORD" in env:
        assert PASSWORD not in err and "password from $DRAFTLAB_PASSWORD" in err  # the mode, never the password
        assert dashboard["DRAFTLAB_PASSWORD"] == PASSWORD and "DRAFTLAB_PASSWORD" not in worker


def _write_secrets(directory, auth: dict) -> None:
    path = directory / ".streamlit" / "secrets.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text("[auth]\n" + "".join(f'{key} = "{value}"\n' for key, value in auth.items()))


@pytest.mark.parametrize("authlib_installed", [True, False])
def test_ui_accepts_oidc_configured_in_secrets(
    no_login_configured, fake_processes, capsys, monkeypatch, authlib_installed
):
    import sys
    import types

    _write_secrets(no_login_configured, OIDC)
    monkeypatch.setitem(sys.modules, "authlib", types.ModuleType("authlib") if authlib_installed else None)
    code = main(["ui", "--host", "0.0.0.0", "--db", f"sqlite:///{no_login_configured / 'ui.db'}"])
    err = capsys.readouterr().err
    assert "oidc-client-secret" not in err and "x" * 40 not in err
    if authlib_installed:
        assert code == 0 and "OIDC login" in err
    else:  # st.login could not work: not a login
        assert code == 2 and "Authlib is not installed" in _one_error_line(err) and fake_processes == []


def test_ui_with_unusable_oidc_names_what_is_missing(no_login_configured, fake_processes, capsys):
    _write_secrets(no_login_configured, {"redirect_uri": OIDC["redirect_uri"], "client_id": "x"})
    assert main(["ui", "--host", "0.0.0.0", "--db", f"sqlite:///{no_login_configured / 'ui.db'}"]) == 2
    assert "lacks cookie_secret" in _one_error_line(capsys.readouterr().err)
    assert fake_processes == []


# --- the login in the entry script ---------------------------------------------------------------------------


def _login(at: AppTest, password: str) -> AppTest:
    at.text_input(key="draftlab_password").set_value(password)
    return at.button[0].click().run()  # the form's submit button


def _greedy(store) -> int:
    listing = catalog.experiments(store)
    return int(listing[listing["name"] == "tiny greedy"]["experiment_id"].iloc[0])


def test_with_a_password_nothing_shows_before_login(populated, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_PASSWORD", PASSWORD)
    for page in ("experiments", "experiment", "rounds", "compare", "new", "theory"):
        at = app(page, experiment=_greedy(populated))
        assert_clean(at)
        text = page_text(at)
        assert [t.value for t in at.title] == ["DraftLab"] and at.text_input(key="draftlab_password")
        assert not at.dataframe and not at.get("vega_lite_chart") and not at.metric and not at.selectbox
        assert "tiny greedy" not in text and "tiny-target" not in text and PASSWORD not in text


def test_a_wrong_password_is_refused(populated, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_PASSWORD", PASSWORD)
    at = _login(app("experiments"), "correct horse battery staple")
    assert_clean(at)
    assert [e.value for e in at.error] == ["Wrong password."]
    assert not at.dataframe and "tiny greedy" not in page_text(at)
    at = _login(at, "")
    assert [e.value for e in at.error] == ["Wrong password."] and not at.dataframe


def test_the_right_password_admits_to_the_page_in_the_url(populated, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_PASSWORD", PASSWORD)
    experiment_id = _greedy(populated)
    at = _login(app("experiment", experiment=experiment_id), PASSWORD)
    assert_clean(at)
    assert not at.error and at.title[0].value == "Experiment detail"
    assert at.selectbox(key="select_experiment").value == experiment_id and at.get("vega_lite_chart")
    assert PASSWORD not in page_text(at)
    at.run()  # later runs of the same session stay admitted
    assert at.title[0].value == "Experiment detail" and not at.text_input
    at.sidebar.button(key="draftlab_logout").click().run()
    assert at.text_input(key="draftlab_password") and not at.get("vega_lite_chart")


def test_without_a_login_configured_the_dashboard_opens_directly(populated, monkeypatch):
    monkeypatch.delenv("DRAFTLAB_PASSWORD", raising=False)
    at = app("experiments")
    assert_clean(at)
    assert at.title[0].value == "Experiments" and at.dataframe


def test_with_oidc_configured_nothing_shows_until_the_provider_says_who_it_is(populated, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_PASSWORD", PASSWORD)  # OIDC wins when both are configured
    at = AppTest.from_string("from app.main import run\nrun('experiments')", default_timeout=TIMEOUT)
    at.secrets["auth"] = OIDC
    at.run()
    assert_clean(at)
    assert not at.dataframe and "tiny greedy" not in page_text(at) and not at.text_input
    assert any(b.label.startswith("Log in") for b in at.button) or any("Authlib" in e.value for e in at.error)
    assert "oidc-client-secret" not in page_text(at)
    at.user = {"is_logged_in": True, "email": "someone@example.com"}
    at.run()
    assert_clean(at)
    assert at.title[0].value == "Experiments" and at.dataframe


# --- login throttling across sessions ---------------------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_throttle_locks_an_address_out_and_counts_every_address_overall():
    from pages.widgets.access import LoginThrottle

    clock = _Clock()
    throttle = LoginThrottle(clock, per_address=3, overall=7, window=60, lockout=120)
    for _ in range(2):
        throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == (0.0, "")
    throttle.succeeded("10.0.0.1")  # the right password clears the count
    for _ in range(3):
        assert throttle.wait("10.0.0.1")[0] == 0
        throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == (120.0, "address")  # the third in a row locks it out
    assert throttle.wait("10.0.0.2") == (0.0, "")  # another address is not locked out ...
    clock.now += 30
    throttle.failed("10.0.0.2")
    throttle.failed("10.0.0.3")
    assert throttle.wait("10.0.0.4") == (30.0, "overall")  # ... until 7 wrong passwords overall pause everyone
    clock.now += 30
    assert throttle.wait("10.0.0.4") == (0.0, "")  # the first three are a window old
    assert throttle.wait("10.0.0.1") == (60.0, "address")
    clock.now += 60
    assert throttle.wait("10.0.0.1") == (0.0, "")  # the lockout is over
    throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == (0.0, "")  # and its count started again


def test_wrong_passwords_from_several_sessions_lock_the_address_out(populated, monkeypatch, fresh_throttle):
    """Eight parallel sessions used to get eight guesses each; now five wrong passwords from one address, in any
    sessions, lock it out, the right password included, and the page says for how long."""
    import pages.widgets.access as access

    monkeypatch.setenv("DRAFTLAB_PASSWORD", PASSWORD)
    monkeypatch.setattr(access, "WRONG_PASSWORD_DELAY_S", 0.0)
    monkeypatch.setattr(access, "client_address", lambda: "203.0.113.7")  # (AppTest has no real client)
    sessions = [app("experiments") for _ in range(3)]
    for attempt in range(access.ADDRESS_FAILURES):
        at = _login(sessions[attempt % 3], f"guess {attempt}")
        assert [e.value for e in at.error] == ["Wrong password."]
    at = _login(app("experiments"), PASSWORD)  # a fresh session, the right password: still locked out
    assert_clean(at)
    # locked out: this address (the throttle's scope), for the lockout's 15 minutes
    assert len(at.error) == 1 and "address" in at.error[0].value
    assert "15 min" in at.error[0].value and not at.dataframe and "tiny greedy" not in page_text(at)
    fresh_throttle.clock = lambda: time.monotonic() + access.LOCKOUT_S  # the lockout has passed
    at = _login(app("experiments"), PASSWORD)
    assert not at.error and at.title[0].value == "Experiments" and at.dataframe
    monkeypatch.setattr(access, "client_address", lambda: "198.51.100.9")
    assert fresh_throttle.wait("198.51.100.9") == (0.0, "")  # another address was never locked out
