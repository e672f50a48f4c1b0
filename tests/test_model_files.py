"""Model URIs, per-role resolution and `hf:` downloads (server/models/refs.py).

Downloads run against a hub on loopback that speaks the parts of the Hugging Face
protocol the downloader relies on: `/{user}/{repo}/resolve/{revision}/{file}`, ETag,
Range/206/416, bearer tokens, `X-Error-Code`, and optionally the hub's redirect of large
files to a CDN (with `X-Linked-Etag` / `X-Linked-Size` on the redirect).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from qmd.server.errors import Forbidden, InvalidInput, NotFound, QmdError
from qmd.server.models import refs as mf

ROOT = Path(__file__).resolve().parent.parent
URI = "hf:acme/tiny-GGUF/tiny-q8_0.gguf"
PIECE = 64 * 1024


def gguf_bytes(size: int, seed: int = 0) -> bytes:
    """GGUF magic followed by deterministic, seed-dependent filler."""
    block = hashlib.sha256(f"seed{seed}".encode()).digest() * (PIECE // 32)
    body = (block * (size // len(block) + 1))[: size - 4]
    return b"GGUF" + body


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Hub:
    """State of the loopback hub; tests change it between calls."""

    url: str = ""
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    redirect: bool = False
    ranges: bool = True
    token: str | None = None
    drop_after: int | None = None  # one shot: close the connection after this many body bytes
    delay: float = 0.0  # seconds per 64 KB piece of body

    def put(self, uri_path: str, data: bytes, revision: str = "main") -> str:
        user, repo, file = uri_path.split("/", 2)
        etag = hashlib.sha256(data).hexdigest()
        self.files[f"/{user}/{repo}/resolve/{revision}/{file}"] = (data, etag)
        return etag

    def gets(self, path_part: str = "/resolve/") -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and path_part in s.path]


def make_handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self.serve(body=False)

        def do_GET(self) -> None:
            self.serve(body=True)

        def serve(self, body: bool) -> None:
            hub.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self.empty(401, {"X-Error-Code": "GatedRepo"})
            if self.path.startswith("/cdn/"):
                key = "/" + self.path[len("/cdn/") :]
                data, etag = hub.files[key]
                return self.send_data(data, f'"cdn-{etag[:12]}"', body)
            if self.path not in hub.files:
                repo = "/".join(self.path.split("/")[:3])
                known = any(k.startswith(repo + "/") for k in hub.files)
                return self.empty(404, {"X-Error-Code": "EntryNotFound" if known else "RepoNotFound"})
            data, etag = hub.files[self.path]
            if hub.redirect:
                headers = {
                    "Location": "/cdn" + self.path,
                    "X-Linked-Etag": f'"{etag}"',
                    "X-Linked-Size": str(len(data)),
                }
                return self.empty(302, headers)
            self.send_data(data, f'"{etag}"', body)

        def empty(self, code: int, headers: dict[str, str]) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def send_data(self, data: bytes, etag: str, body: bool) -> None:
            start = 0
            m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if m and hub.ranges:
                start = int(m.group(1))
                if start >= len(data):
                    return self.empty(416, {"Content-Range": f"bytes */{len(data)}", "ETag": etag})
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if not body:
                return
            payload = data[start:]
            cut, hub.drop_after = hub.drop_after, None
            for i in range(0, len(payload), PIECE):
                if cut is not None and i >= cut:
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(payload[i : i + PIECE])
                if hub.delay:
                    time.sleep(hub.delay)

    return Handler


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gives up mid-response (the tests make them) is not news."""


@pytest.fixture
def hub() -> Iterator[Hub]:
    state = Hub()
    server = QuietServer(("127.0.0.1", 0), make_handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def environ(hub: Hub, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}


def ref() -> mf.HfRef:
    parsed = mf.parse_model_ref(URI)
    assert isinstance(parsed, mf.HfRef)
    return parsed


def leftovers(final: Path) -> list[str]:
    return sorted(p.name for p in final.parent.glob("*") if p.name.endswith((".part", ".part.json")))


# --- parsing -------------------------------------------------------------------------


def test_parse_hf_uris() -> None:
    r = mf.parse_model_ref("hf:ggml-org/embeddinggemma-300M-GGUF/sub/dir/model-Q8_0.gguf")
    assert isinstance(r, mf.HfRef)
    assert (r.kind, r.user, r.repo, r.file, r.revision) == (
        "hf",
        "ggml-org",
        "embeddinggemma-300M-GGUF",
        "sub/dir/model-Q8_0.gguf",
        "main",
    )
    pinned = mf.parse_model_ref("hf:u/r/m.gguf#v1.2")
    assert isinstance(pinned, mf.HfRef)
    assert pinned.revision == "v1.2" and pinned.uri == "hf:u/r/m.gguf#v1.2"
    assert mf.parse_model_ref("  hf:u/r/m.gguf#main ").uri == "hf:u/r/m.gguf"
    for bad in ("hf:u/r", "hf:u//m.gguf", "hf:../r/m.gguf", "hf:u/r/../x.gguf", "hf:u/r/m.gguf#a/b", "hf:u/r/m#.."):
        with pytest.raises(InvalidInput):
            mf.parse_model_ref(bad)


def test_parse_local_and_remote(tmp_path: Path) -> None:
    home = Path(os.path.expanduser("~"))
    local = mf.parse_model_ref("~/models/x.gguf")
    assert isinstance(local, mf.FileRef) and local.path == home / "models" / "x.gguf"
    based = mf.parse_model_ref("models/../m.gguf", base=tmp_path)
    assert isinstance(based, mf.FileRef) and based.path == tmp_path / "m.gguf"
    with pytest.raises(InvalidInput, match="relative"):
        mf.parse_model_ref("models/m.gguf")

    oa = mf.parse_model_ref("openai:text-embedding-3-small")
    assert isinstance(oa, mf.RemoteRef)
    assert (oa.kind, oa.endpoint, oa.model) == ("remote", mf.OPENAI_ENDPOINT, "text-embedding-3-small")
    local_server = mf.parse_model_ref("http://127.0.0.1:8080/v1/#nomic-embed-text")
    assert isinstance(local_server, mf.RemoteRef)
    assert (local_server.endpoint, local_server.model) == ("http://127.0.0.1:8080/v1", "nomic-embed-text")
    bare = mf.parse_model_ref("https://example.org/v1")
    assert isinstance(bare, mf.RemoteRef) and bare.model is None
    for bad in ("", "openai:", "http://", "s3://bucket/m.gguf"):
        with pytest.raises(InvalidInput):
            mf.parse_model_ref(bad)


def test_local_file_must_exist_and_be_gguf(tmp_path: Path) -> None:
    good = tmp_path / "ok.gguf"
    good.write_bytes(gguf_bytes(1000))
    assert mf.ensure_local(mf.parse_model_ref(str(good))) == good
    with pytest.raises(NotFound, match="not found"):
        mf.ensure_local(mf.parse_model_ref(str(tmp_path / "missing.gguf")))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"<html>nope</html>")
    with pytest.raises(InvalidInput, match="not a GGUF"):
        mf.ensure_local(mf.parse_model_ref(str(fake)))
    with pytest.raises(InvalidInput, match="remote"):
        mf.ensure_local(mf.parse_model_ref("openai:m"))


# --- resolution ----------------------------------------------------------------------


def test_precedence_config_env_default(tmp_path: Path) -> None:
    env = {"QMD_EMBED_MODEL": "hf:env/embed/e.gguf", "QMD_RERANK_MODEL": "hf:env/rerank/r.gguf"}
    models = {"embed": "hf:cfg/embed/e.gguf"}
    got = mf.resolve_models(models, env)
    assert (got["embed"].source, got["embed"].ref.uri) == ("config", "hf:cfg/embed/e.gguf")
    assert (got["rerank"].source, got["rerank"].ref.uri) == ("env", "hf:env/rerank/r.gguf")
    assert (got["generate"].source, got["generate"].ref.uri) == ("default", mf.DEFAULT_MODELS["generate"])
    defaults = mf.resolve_models(None, {"QMD_EMBED_MODEL": "  "})
    assert {r: m.ref.uri for r, m in defaults.items()} == mf.DEFAULT_MODELS
    assert all(m.source == "default" for m in defaults.values())
    # relative paths: against the config's directory; from the environment they are refused
    cfg = mf.resolve_model("embed", {"embed": "m/e.gguf"}, {}, config_dir=tmp_path)
    assert isinstance(cfg.ref, mf.FileRef) and cfg.ref.path == tmp_path / "m" / "e.gguf"
    with pytest.raises(InvalidInput, match="QMD_EMBED_MODEL"):
        mf.resolve_model("embed", {}, {"QMD_EMBED_MODEL": "m/e.gguf"})


def test_resolution_errors_name_the_setting() -> None:
    with pytest.raises(InvalidInput, match="unknown role.*embedding"):
        mf.resolve_models({"embedding": "hf:u/r/m.gguf"}, {})
    with pytest.raises(InvalidInput, match=r"index.yml models.embed"):
        mf.resolve_models({"embed": "hf:nope"}, {})
    with pytest.raises(InvalidInput, match="QMD_RERANK_MODEL: OpenAI has no rerank endpoint"):
        mf.resolve_model("rerank", {}, {"QMD_RERANK_MODEL": "openai:m"})
    assert mf.resolve_model("embed", {"embed": "http://127.0.0.1:9/v1#m"}, {}).ref.kind == "remote"


def test_resolution_never_touches_index_yml(tmp_path: Path) -> None:
    config = tmp_path / "qmd" / "index.yml"
    config.parent.mkdir()
    config.write_text("collections: {}\n", encoding="utf-8")
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    got = mf.resolve_models(raw.get("models"), {"QMD_EMBED_MODEL": "hf:env/e/e.gguf"}, config.parent)
    assert got["embed"].source == "env"
    assert (config.read_bytes(), config.stat().st_mtime_ns) == before
    assert sorted(p.name for p in config.parent.iterdir()) == ["index.yml"]


# --- downloads -----------------------------------------------------------------------


def test_full_download_with_progress_and_sidecar(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(3 * 1024 * 1024)
    etag = hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)
    final = mf.cache_path(ref(), environ)
    assert final == Path(environ["XDG_CACHE_HOME"]) / "qmd/models/acme/tiny-GGUF/main/tiny-q8_0.gguf"
    calls: list[tuple[int, int | None]] = []

    def progress(done: int, total: int | None) -> None:
        # atomicity: while bytes arrive, the model path does not exist at all
        assert not final.exists()
        calls.append((done, total))

    got = mf.fetch(ref(), progress, environ=environ)
    assert got == mf.Fetched(final, len(data), etag, downloaded=True)
    assert final.read_bytes() == data
    assert mf._sibling(final, ".etag").read_text().strip() == etag
    assert leftovers(final) == []
    assert calls[0] == (0, len(data)) and calls[-1] == (len(data), len(data))
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(hub.gets()) == 1 and hub.gets()[0].path == "/acme/tiny-GGUF/resolve/main/tiny-q8_0.gguf"
    # cached: no network at all
    assert mf.ensure_local(ref(), environ=environ) == final
    assert mf.fetch(ref(), environ=environ).downloaded is False
    assert len(hub.seen) == 1


def test_hf_endpoint_default_and_override() -> None:
    r = mf.parse_model_ref("hf:u/r/dir/m f.gguf#v2")
    assert isinstance(r, mf.HfRef)
    assert mf.hf_url(r, {}) == "https://huggingface.co/u/r/resolve/v2/dir/m%20f.gguf"
    assert (
        mf.hf_url(r, {"HF_ENDPOINT": "http://mirror.local:9/"}) == "http://mirror.local:9/u/r/resolve/v2/dir/m%20f.gguf"
    )


def test_resume_after_dropped_connection(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(3 * 1024 * 1024, seed=1)
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)
    final = mf.cache_path(ref(), environ)
    hub.drop_after = len(data) // 2
    with pytest.raises(QmdError, match="interrupted.*run again to resume") as err:
        mf.fetch(ref(), environ=environ)
    assert hub.url in err.value.message
    part = mf._sibling(final, ".part")
    kept = part.stat().st_size
    assert 0 < kept <= len(data) // 2 and part.read_bytes() == data[:kept]
    assert not final.exists()

    calls: list[tuple[int, int | None]] = []
    got = mf.fetch(ref(), lambda d, t: calls.append((d, t)), environ=environ)
    assert got.downloaded and final.read_bytes() == data
    assert hub.gets()[-1].headers.get("range") == f"bytes={kept}-"
    assert calls[0] == (kept, len(data))
    assert leftovers(final) == []


@pytest.mark.parametrize("ranges", [True, False], ids=["206-new-etag", "200-ignores-range"])
def test_changed_remote_restarts_the_part(hub: Hub, environ: dict[str, str], ranges: bool) -> None:
    old, new = gguf_bytes(2 * 1024 * 1024, seed=2), gguf_bytes(2 * 1024 * 1024, seed=3)  # same size: the ETag tells
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", old)
    hub.drop_after = len(old) // 2
    with pytest.raises(QmdError):
        mf.fetch(ref(), environ=environ)
    new_etag = hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", new)
    hub.ranges = ranges
    before = len(hub.gets())
    got = mf.fetch(ref(), environ=environ)
    assert got.path.read_bytes() == new and got.etag == new_etag
    second = hub.gets()[before:]
    assert "range" in second[0].headers
    # a 206 of another file costs one more, plain request; a 200 is used as the fresh body
    assert [("range" in s.headers) for s in second] == ([True, False] if ranges else [True])


def test_complete_part_is_finished_without_downloading(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(1024 * 1024, seed=4)
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)

    def stop_at_end(done: int, total: int | None) -> None:
        if done == total:
            raise KeyboardInterrupt  # e.g. Ctrl-C between the last byte and the rename

    with pytest.raises(KeyboardInterrupt):
        mf.fetch(ref(), stop_at_end, environ=environ)
    final = mf.cache_path(ref(), environ)
    assert not final.exists() and mf._sibling(final, ".part").stat().st_size == len(data)
    mf.fetch(ref(), environ=environ)
    assert final.read_bytes() == data
    assert hub.gets()[-1].headers.get("range") == f"bytes={len(data)}-"  # answered 416


def test_refresh_checks_etag(hub: Hub, environ: dict[str, str]) -> None:
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", gguf_bytes(300_000, seed=5))
    mf.fetch(ref(), environ=environ)
    assert mf.fetch(ref(), refresh=True, environ=environ).downloaded is False
    assert [s.method for s in hub.seen] == ["GET", "HEAD"]
    newer = gguf_bytes(310_000, seed=6)
    etag = hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", newer)
    assert mf.fetch(ref(), environ=environ).downloaded is False  # no refresh: no network
    got = mf.fetch(ref(), refresh=True, environ=environ)
    assert got.downloaded and got.path.read_bytes() == newer and got.etag == etag
    assert mf._sibling(got.path, ".etag").read_text().strip() == etag
    assert [s.method for s in hub.seen] == ["GET", "HEAD", "HEAD", "GET"]


def test_cdn_redirect_linked_etag_and_resume(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(2 * 1024 * 1024, seed=7)
    etag = hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)
    hub.redirect = True
    hub.drop_after = len(data) // 3
    with pytest.raises(QmdError):
        mf.fetch(ref(), environ=environ)
    got = mf.fetch(ref(), environ=environ)
    assert got.path.read_bytes() == data and got.etag == etag  # the hub's linked ETag, not the CDN's
    cdn = hub.gets("/cdn/")
    assert len(cdn) == 2 and cdn[1].headers["range"].startswith("bytes=")
    assert mf.fetch(ref(), refresh=True, environ=environ).downloaded is False
    assert [s.path.startswith("/cdn/") for s in hub.seen if s.method == "HEAD"] == [False]  # ETag from the redirect


def test_404_is_clear_and_leaves_nothing(hub: Hub, environ: dict[str, str]) -> None:
    hub.put("acme/tiny-GGUF/other.gguf", gguf_bytes(1000))
    with pytest.raises(NotFound, match=r"no such file in repo acme/tiny-GGUF at revision main: tiny-q8_0.gguf"):
        mf.fetch(ref(), environ=environ)
    with pytest.raises(NotFound, match="no such repo nobody/none"):
        mf.ensure_local(mf.parse_model_ref("hf:nobody/none/m.gguf"), environ=environ)
    final = mf.cache_path(ref(), environ)
    assert not final.exists() and leftovers(final) == []


def test_401_needs_token(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(200_000)
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)
    hub.token = "hf_secret"
    with pytest.raises(Forbidden, match="set HF_TOKEN"):
        mf.fetch(ref(), environ=environ)
    with pytest.raises(Forbidden, match="HF_TOKEN was sent and refused"):
        mf.fetch(ref(), environ={**environ, "HF_TOKEN": "hf_wrong"})
    final = mf.cache_path(ref(), environ)
    assert not final.exists() and leftovers(final) == []
    got = mf.fetch(ref(), environ={**environ, "HF_TOKEN": "hf_secret"})
    assert got.path.read_bytes() == data
    assert hub.gets()[-1].headers["authorization"] == "Bearer hf_secret"


def test_not_gguf_is_refused_with_a_hint(hub: Hub, environ: dict[str, str]) -> None:
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", b"<!doctype html><title>Sign in to the Wi-Fi</title>" * 100)
    with pytest.raises(InvalidInput, match="not a GGUF model.*captive portal"):
        mf.fetch(ref(), environ=environ)
    final = mf.cache_path(ref(), environ)
    assert not final.exists() and leftovers(final) == []


def test_network_failure_names_the_endpoint(environ: dict[str, str]) -> None:
    dead = {**environ, "HF_ENDPOINT": "http://127.0.0.1:9"}
    with pytest.raises(QmdError, match=r"network failure talking to http://127.0.0.1:9"):
        mf.fetch(ref(), environ=dead)


def test_disk_full_is_clear(hub: Hub, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", gguf_bytes(500_000))
    monkeypatch.setattr(mf.shutil, "disk_usage", lambda _: SimpleNamespace(free=1000))
    with pytest.raises(QmdError, match="not enough disk space.*488.3 KB needed, 1000 B free"):
        mf.fetch(ref(), environ=environ)
    assert not mf.cache_path(ref(), environ).exists()


def test_concurrent_threads_download_once(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(2 * 1024 * 1024, seed=8)
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)
    hub.delay = 0.01  # ~0.3 s per transfer, so the threads overlap
    results: list[mf.Fetched] = []
    threads = [threading.Thread(target=lambda: results.append(mf.fetch(ref(), environ=environ))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len({r.path for r in results}) == 1
    assert sum(r.downloaded for r in results) == 1
    assert results[0].path.read_bytes() == data and len(hub.gets()) == 1


def test_concurrent_processes_download_once(hub: Hub, environ: dict[str, str]) -> None:
    data = gguf_bytes(2 * 1024 * 1024, seed=9)
    hub.put("acme/tiny-GGUF/tiny-q8_0.gguf", data)
    hub.delay = 0.02  # ~0.7 s per transfer: longer than a Python start-up
    code = f"from qmd.server.models import refs as mf; print(mf.fetch(mf.parse_model_ref({URI!r})).downloaded)"
    env = {**os.environ, **environ}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == ["False", "True"]
    assert mf.cache_path(ref(), environ).read_bytes() == data and len(hub.gets()) == 1
