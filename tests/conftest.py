"""Shared test setup."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download; an unknown id must fail fast
# a finding rule that raises fails the test (storage/analysis/findings/__init__.py, STRICT_ENV)
os.environ.setdefault("DRAFTLAB_STRICT_RULES", "1")

try:
    import torch

    # Tiny models on a shared 2-core machine: one intra-op thread is ~10x faster than two fighting for cores.
    torch.set_num_threads(1)
except ImportError:  # storage-only environments
    pass


# --- services the suite needs: PostgreSQL and a browser ------------------------------------------------------
# scripts/test.sh (the README's test command, all CI runs) sets DRAFTLAB_REQUIRE_SERVICES=1: a test whose server
# or browser is missing then FAILS with the reason. Plain `pytest` skips such tests, with the reason, and so does
# scripts/test.sh when DRAFTLAB_ALLOW_SKIP=1 says so on purpose.
REQUIRE_ENV, ALLOW_SKIP_ENV = "DRAFTLAB_REQUIRE_SERVICES", "DRAFTLAB_ALLOW_SKIP"
BROWSER_TESTS = "test_browser_"  # test_browser_*.py: their module-level skipif (no chromium) becomes a failure below


def services_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" and os.environ.get(ALLOW_SKIP_ENV) != "1"


def _required_message(reason: str) -> str:
    return f"{reason}. scripts/test.sh requires it (set {ALLOW_SKIP_ENV}=1 to let the tests that need it skip instead)"


def missing_service(reason: str):
    """A test cannot run without a service: fail when the run requires services, else skip; both say why."""
    if services_required():
        pytest.fail(_required_message(reason), pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and item.path.name.startswith(BROWSER_TESTS)
        and services_required()
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = _required_message(reason.removeprefix("Skipped: "))


# --- storage: SQLite and PostgreSQL -------------------------------------------------------------------------
# `db_url` / `store` run a test on SQLite and on a real PostgreSQL server ($DRAFTLAB_TEST_POSTGRES, else
# 127.0.0.1:5432/test, else one started here with initdb/pg_ctl — as the `postgres` user when run as root —,
# else skipped or failed with the reason, see above). Each PostgreSQL test gets a fresh schema, dropped afterwards.
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import quote  # noqa: E402

DEFAULT_TEST_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def _pg_unreachable(url: str) -> str | None:
    """None if a connection works, else why not."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    try:
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def _unprivileged_prefix(base: Path):
    """([], None) normally; as root (initdb refuses root) the `runuser -u postgres --` prefix, with `base` handed
    to that user; (None, why) when there is no such user."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return [], None
    import pwd

    runuser = shutil.which("runuser")
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        return None, "initdb refuses to run as root and there is no `postgres` user to run it as"
    if not runuser:
        return None, "initdb refuses to run as root and runuser (util-linux) is missing"
    os.chown(base, user.pw_uid, user.pw_gid)
    return [runuser, "-u", "postgres", "--"], None


def _start_temporary_postgres(base: Path):
    """initdb + pg_ctl in a temp dir. Returns (url or None, why not, stop)."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not (initdb and pg_ctl):
        return None, "no initdb/pg_ctl on PATH", lambda: None
    prefix, why = _unprivileged_prefix(base)
    if prefix is None:
        return None, why, lambda: None
    data = base / "pgdata"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-U", "postgres", "--auth=trust"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [
                *prefix,
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(base / "pg.log"),
                "-w",
                "-o",
                f"-p {port} -k {base} -c listen_addresses=127.0.0.1",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"could not start a temporary PostgreSQL ({exc})", lambda: None

    def stop():
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)

    return f"postgresql://postgres@127.0.0.1:{port}/postgres", "", stop


@pytest.fixture(scope="session")
def postgres_server():
    """URL of a PostgreSQL server for the session, else a skip or failure (missing_service) that says why."""
    url = os.environ.get("DRAFTLAB_TEST_POSTGRES")
    if url:
        reason = _pg_unreachable(url)
        if reason:
            pytest.fail(f"$DRAFTLAB_TEST_POSTGRES={url} is set but unreachable: {reason}")
        yield url
        return
    reason = _pg_unreachable(DEFAULT_TEST_POSTGRES)
    if reason is None:
        yield DEFAULT_TEST_POSTGRES
        return
    base = Path(tempfile.mkdtemp(prefix="draftlab-pg-"))
    started, why, stop = _start_temporary_postgres(base)
    if started is None:
        shutil.rmtree(base, ignore_errors=True)
        missing_service(
            f"no PostgreSQL: {DEFAULT_TEST_POSTGRES} unreachable ({reason}); {why}. Set "
            f"$DRAFTLAB_TEST_POSTGRES, or start a server there, to run the PostgreSQL half of the suite"
        )
    try:
        yield started
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server):
    """A SQLAlchemy URL on a fresh, empty schema of the test server (dropped after the test)."""
    import psycopg

    schema = f"draftlab_test_{uuid.uuid4().hex[:12]}"
    plain = postgres_server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in plain else "?"
    yield f"{plain}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """The same test on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'draftlab.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(db_url):
    from storage import open_store

    s = open_store(db_url)
    yield s
    s.dispose()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Tiny random models saved with save_pretrained, loadable by path: a target, a draft that often
    agrees with it (a noisy copy), and a draft whose tokenizer does not match."""
    from tests import tiny_models

    base = tmp_path_factory.mktemp("models")
    target = tiny_models.llama(0, layers=2, sharpness=4.0)
    draft = tiny_models.noisy_copy(target, seed=1, noise=0.3)
    alien = tiny_models.llama(2, layers=1)
    paths = {}
    for name, model, tok in (
        ("target", target, tiny_models.tokenizer()),
        ("draft", draft, tiny_models.tokenizer()),
        ("alien", alien, tiny_models.tokenizer(prefix="w")),
    ):
        path = base / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths[name] = str(path)
    return paths


@pytest.fixture
def wait_for():
    """wait_for(predicate, timeout): poll until predicate() is truthy, else fail."""

    def _wait(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout}s waiting for {what}")

    return _wait


# --- vLLM: `draftlab confirm`'s real-server test ------------------------------------------------------------------
# Required like PostgreSQL and the browser (scripts/test.sh installs it with scripts/install_vllm.sh): missing, the
# test fails with the reason under scripts/test.sh, and skips with it elsewhere or with DRAFTLAB_ALLOW_SKIP=1.
@pytest.fixture(scope="session")
def vllm_command():
    """The command that starts vLLM's OpenAI server ($DRAFTLAB_VLLM, else .vllm-venv's CPU build)."""
    from app.serving.vllm_server import LOCAL_VENV_PYTHON, default_command

    if os.environ.get("DRAFTLAB_VLLM", "").strip():
        return default_command()
    if not LOCAL_VENV_PYTHON.is_file():
        missing_service(
            f"no vLLM: {LOCAL_VENV_PYTHON} does not exist and $DRAFTLAB_VLLM is not set; run scripts/install_vllm.sh"
        )
    probe = subprocess.run([str(LOCAL_VENV_PYTHON), "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        missing_service(f"no vLLM: {LOCAL_VENV_PYTHON} cannot import vllm ({last}); rerun scripts/install_vllm.sh")
    return default_command()


# --- an EAGLE-3 head with real acceptance for demo-target (tests/eagle3_heads.py) ---------------------------------
@pytest.fixture(scope="session")
def demo_eagle3_head(tmp_path_factory):
    """engine/zoo/demo-eagle3 once shipped, else a stand-in trained once per session (~20 s of CPU)."""
    from tests.eagle3_heads import demo_head

    return demo_head(tmp_path_factory.mktemp("demo-eagle3"))
