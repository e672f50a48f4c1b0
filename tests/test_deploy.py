"""The login units and the Kubernetes manifests start the same command the tests run, and are valid files."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import NOTES, Daemon, Env, write

from qmd.server.config import Config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _exec_args(unit: str) -> list[str]:
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return line.split("=", 1)[1].split()


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = (DEPLOY / "qmdd.service").read_text()
    qmdd = Path(sys.executable).with_name("qmdd")
    local = tmp_path / "qmdd.service"
    local.write_text(unit.replace("%h/.local/bin/qmdd", str(qmdd)))
    r = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_units_run_valid_qmdd_arguments() -> None:
    unit_args = _exec_args((DEPLOY / "qmdd.service").read_text())
    plist_args = plistlib.loads((DEPLOY / "com.qmd.qmdd.plist").read_bytes())["ProgramArguments"]
    for args in (unit_args, plist_args):
        assert args[0].endswith("/qmdd")
        # --help after the real arguments: click parses them all and fails on any bad one.
        r = subprocess.run(
            [sys.executable, "-m", "qmd.server.daemon", *args[1:], "--help"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr


def _manifest(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_the_postgres_manifest_runs_replicas_on_one_index() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _manifest("k8s-postgres.yaml")}
    qmd, pg = docs[("Deployment", "qmd")], docs[("StatefulSet", "qmd-postgres")]
    assert qmd["spec"]["replicas"] >= 2 and qmd["spec"]["strategy"]["type"] == "RollingUpdate"
    (container,) = qmd["spec"]["template"]["spec"]["containers"]
    single = next(d for d in _manifest("k8s.yaml") if d["kind"] == "Deployment")
    assert container["command"] == single["spec"]["template"]["spec"]["containers"][0]["command"]
    url = _env_of(container)["QMD_INDEX_URL"]["valueFrom"]["secretKeyRef"]
    password = _env_of(pg["spec"]["template"]["spec"]["containers"][0])["POSTGRES_PASSWORD"]["valueFrom"][
        "secretKeyRef"
    ]
    assert url["name"] == password["name"] == "qmd-postgres"
    assert docs[("Service", "qmd")]["spec"]["selector"] == qmd["spec"]["selector"]["matchLabels"]
    assert docs[("Service", "qmd-postgres")]["spec"]["selector"] == pg["spec"]["selector"]["matchLabels"]
    # the config every replica mounts is a valid qmd config, its collection on the shared volume
    cfg = Config.from_yaml(yaml.safe_load(docs[("ConfigMap", "qmd-config")]["data"]["index.yml"]), Path("index.yml"))
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data/config/qmd"]["readOnly"] and mounts["/docs"]["readOnly"]
    assert all(str(c.root).startswith("/docs") for c in cfg.collections.values())


@pytest.mark.slow
def test_two_replicas_as_the_manifest_runs_them_answer_alike(env: Env, tmp_path: Path, pg_index: str) -> None:
    """The manifest's replicas on this machine: its config (the collection moved to a temp
    folder), its allowed hosts, one Postgres index; either replica answers through the
    Service's name, the same pointers."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _manifest("k8s-postgres.yaml")}
    (container,) = docs[("Deployment", "qmd")]["spec"]["template"]["spec"]["containers"]
    allowed = _env_of(container)["QMD_ALLOWED_HOSTS"]["value"]
    notes = write(tmp_path / "docs", NOTES)
    config = docs[("ConfigMap", "qmd-config")]["data"]["index.yml"].replace("/docs", str(notes))
    replicas = [env, Env(tmp_path / "b")]
    daemons = []
    try:
        for e in replicas:
            (e.config / "qmd").mkdir(parents=True, exist_ok=True)
            (e.config / "qmd" / "index.yml").write_text(config)
            e.vars.update(QMD_INDEX_URL=pg_index, QMD_ALLOWED_HOSTS=allowed)
            daemons.append(Daemon(e, "--host", "127.0.0.1"))
        replicas[0].ok("update")
        answers = []
        for d in daemons:
            r = d.http.post("/search", json={"query": "fundraising"}, headers={"Host": "qmd.default.svc:8181"})
            assert r.status_code == 200, r.text
            answers.append([(h["file"], h["docid"]) for h in r.json()["results"]])
        assert answers[0] and answers[0] == answers[1]
    finally:
        for d in daemons:
            d.stop()
