"""Issue 31: the daemon reports the daemon-read `QMD_*` settings it started with, and the CLI
says when its own environment has another value, which that daemon ignores."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from conftest import Daemon, Env, write

from qmd.settings import DAEMON_SETTINGS, SECRET_SETTINGS, daemon_settings, differences

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_list_is_the_configuration_tables_daemon_rows() -> None:
    rows = re.findall(r"^\| `(QMD_[A-Z0-9_]+)` \| ([^|]+) \|", (DOCS / "configuration.md").read_text(), re.M)
    assert set(DAEMON_SETTINGS) == {name for name, by in rows if by.strip() == "daemon"}
    assert len(set(DAEMON_SETTINGS)) == len(DAEMON_SETTINGS)


def test_secrets_are_reported_as_a_hash_and_differences_name_what_changed() -> None:
    started = daemon_settings({"QMD_EMBED_API_KEY": "sk-secret", "QMD_WATCH": "0", "HOME": "/x"})
    assert set(started) == {"QMD_EMBED_API_KEY", "QMD_WATCH"} and "sk-secret" not in started["QMD_EMBED_API_KEY"]
    assert set(DAEMON_SETTINGS) >= SECRET_SETTINGS
    here = {"QMD_EMBED_API_KEY": "sk-secret", "QMD_WATCH": "1", "QMD_EMBED_MODEL": "m.gguf"}
    assert differences(started, here) == [("QMD_WATCH", "0"), ("QMD_EMBED_MODEL", None)]
    assert differences(started, {"QMD_EMBED_API_KEY": "sk-other"}) == [
        ("QMD_EMBED_API_KEY", started["QMD_EMBED_API_KEY"])
    ]
    assert differences(started, {}) == []  # a variable unset here is not a change asked for


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "the running daemon" in line]


@pytest.mark.slow
def test_a_setting_the_running_daemon_ignores_is_said_once_and_restart_applies_it(env: Env) -> None:
    key = "sk-do-not-show-me"
    d = Daemon(env, extra_env={"QMD_EMBED_API_KEY": key, "QMD_WATCH_SWEEP_S": "600"})
    try:
        h = d.http.get("/v1/settings").raise_for_status().json()
        assert h["settings"]["QMD_WATCH_SWEEP_S"] == "600" and h["settings"]["QMD_WATCH"] == "0"
        assert h["settings"]["QMD_EMBED_API_KEY"].startswith("sha256:") and key not in str(h)
        assert "settings" not in httpx.get(f"{env.url}/health").json()  # /health is open to every local user

        same = env.qmd("status", env={"QMD_EMBED_API_KEY": key, "QMD_WATCH_SWEEP_S": "600"})
        assert same.returncode == 0 and warnings(same.stderr) == []
        notes = write(env.base / "notes", {"a.md": "# A\n\nanything at all\n"})  # something to search
        env.ok("collection", "add", str(notes), "--name", "notes", env={"QMD_EMBED_API_KEY": key})

        changed = {
            "QMD_EMBED_MODEL": "/models/other.gguf",
            "QMD_TRUST_LOCAL_CONFIG": "1",
            "QMD_EMBED_API_KEY": "sk-new",
        }
        for args in (("status",), ("search", "anything"), ("update",)):
            r = env.qmd(*args, env=changed)
            assert r.returncode == 0, r.stderr
            said = warnings(r.stderr)
            assert said == [
                f"QMD_TRUST_LOCAL_CONFIG: the running daemon (PID {d.pid}) was started without "
                "QMD_TRUST_LOCAL_CONFIG and keeps its setting. Run 'qmd daemon restart' to apply yours.",
                f"QMD_EMBED_MODEL: the running daemon (PID {d.pid}) was started without "
                "QMD_EMBED_MODEL and keeps its setting. Run 'qmd daemon restart' to apply yours.",
                f"QMD_EMBED_API_KEY: the running daemon (PID {d.pid}) was started with "
                f"QMD_EMBED_API_KEY={h['settings']['QMD_EMBED_API_KEY']} and keeps its setting. "
                "Run 'qmd daemon restart' to apply yours.",
            ], args
            assert "sk-new" not in r.stderr and key not in r.stderr

        status = env.ok("daemon", "status")
        assert "QMD_WATCH_SWEEP_S=600" in status and key not in status

        out = env.ok("daemon", "restart", env=changed)
        new = int(out.splitlines()[-1].rsplit("PID ", 1)[1].rstrip(")"))
        assert d.proc.wait(timeout=30) == 0 and new != d.pid
        after = env.qmd("status", env=changed)
        assert after.returncode == 0 and warnings(after.stderr) == []
        settings = env.json("daemon", "status", "--json")["settings"]
        assert settings["QMD_EMBED_MODEL"] == "/models/other.gguf" and "QMD_WATCH_SWEEP_S" not in settings
        assert env.ok("daemon", "stop").strip() == f"Stopped qmdd (PID {new})."
    finally:
        d.stop()
        env.qmd("daemon", "stop")  # the restarted one, if an assertion left it running
