"""Model references: what a model URI names, which model each role uses, and getting
`hf:` files onto disk.

This module knows nothing of llama.cpp, so `qmd pull`, `qmd doctor` and the tests can
resolve and download models without loading one.

Downloads are built for multi-gigabyte files on flaky links and for several processes
sharing one cache: bytes land in `<file>.part` (resumed with a `Range` request, restarted
when the remote file changed), the model path appears only by an atomic rename once the
full size and the GGUF magic are verified, and a per-file lock keeps two downloaders off
the same `.part`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import httpx

from qmd.paths import cache_root
from qmd.server.errors import Forbidden, InvalidInput, NotFound, QmdError

Role = Literal["embed", "rerank", "generate"]
Source = Literal["config", "env", "default"]

ROLES: tuple[Role, ...] = ("embed", "rerank", "generate")

# The original's models (spec §9.1): the same defaults keep results comparable with it.
DEFAULT_MODELS: dict[Role, str] = {
    "embed": "hf:ggml-org/embeddinggemma-300M-GGUF/embeddinggemma-300M-Q8_0.gguf",
    "rerank": "hf:ggml-org/Qwen3-Reranker-0.6B-Q8_0-GGUF/qwen3-reranker-0.6b-q8_0.gguf",
    "generate": "hf:tobil/qmd-query-expansion-1.7B-gguf/qmd-query-expansion-1.7B-q4_k_m.gguf",
}
ENV_VARS: dict[Role, str] = {
    "embed": "QMD_EMBED_MODEL",
    "rerank": "QMD_RERANK_MODEL",
    "generate": "QMD_GENERATE_MODEL",
}

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
OPENAI_ENDPOINT = "https://api.openai.com/v1"
COSINE = "cosine"
"""The rerank setting that scores with the embedder's vectors instead of a model."""
GGUF_MAGIC = b"GGUF"

# Reads of this size bound both the progress-callback rate and what an interrupted
# transfer can lose from httpx's buffer before the bytes reach the `.part` file.
_CHUNK = 256 * 1024
# Generous read timeout: a CDN may pause mid-stream; a dead link still fails in a minute.
_TIMEOUT = httpx.Timeout(60.0, connect=15.0)

_HF_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_CONTENT_RANGE_RE = re.compile(r"^bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)$")

Progress = Callable[[int, int | None], None]
"""`(done_bytes, total_bytes)`; total is None when the server does not say. Raising from
the callback aborts the download and keeps the `.part` for a later resume."""

_URI_FORMS = (
    "hf:<user>/<repo>/<file>[#revision], an absolute .gguf path, openai:<model>, http(s)://<host>/v1#<model>"
    " or (rerank only) cosine"
)


@dataclass(frozen=True)
class HfRef:
    """A file in a Hugging Face repo. `#revision` follows node-llama-cpp's syntax, which the
    original's users already write in their `index.yml`."""

    user: str
    repo: str
    file: str
    revision: str = DEFAULT_REVISION
    kind: Literal["hf"] = field(default="hf", init=False)

    @property
    def uri(self) -> str:
        suffix = "" if self.revision == DEFAULT_REVISION else f"#{self.revision}"
        return f"hf:{self.user}/{self.repo}/{self.file}{suffix}"

    @property
    def repo_id(self) -> str:
        return f"{self.user}/{self.repo}"


@dataclass(frozen=True)
class FileRef:
    """A GGUF file the user already has; never copied into the cache."""

    path: Path
    kind: Literal["file"] = field(default="file", init=False)

    @property
    def uri(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class RemoteRef:
    """An endpoint (an OpenAI-compatible API base, or a rerank server's) and model name; the
    remote backends (`models.remote`) do the talking."""

    endpoint: str
    model: str | None
    kind: Literal["remote"] = field(default="remote", init=False)

    @property
    def uri(self) -> str:
        if self.endpoint == OPENAI_ENDPOINT and self.model:
            return f"openai:{self.model}"
        return f"{self.endpoint}#{self.model}" if self.model else self.endpoint


@dataclass(frozen=True)
class CosineRef:
    """`cosine`: no model; the rerank stage scores each candidate by the embedder's cosine to
    its nearest chunk, vectors the index already holds (`search.rerank.CosineScorer`)."""

    kind: Literal["cosine"] = field(default="cosine", init=False)

    @property
    def uri(self) -> str:
        return COSINE


ModelRef = HfRef | FileRef | RemoteRef | CosineRef


@dataclass(frozen=True)
class ResolvedModel:
    """The model a role uses and where that choice came from (for `doctor` and errors)."""

    role: Role
    ref: ModelRef
    source: Source


@dataclass(frozen=True)
class Fetched:
    """A cached `hf:` file. `downloaded` is False when the cached copy was used as is
    (after a matching ETag check when a refresh was asked for)."""

    path: Path
    size: int
    etag: str | None
    downloaded: bool


def parse_model_ref(text: str, base: Path | None = None) -> ModelRef:
    """Classify a model URI. Pure syntax: whether a file exists is checked when it is
    needed (`ensure_local`), so a missing rerank model never stops keyword search.

    A relative path is resolved against `base` (the directory of the config naming it);
    without one it is refused, because the daemon serves clients from many directories
    and no single cwd is the right one.
    """
    uri = text.strip()
    if not uri:
        raise InvalidInput(f"empty model URI: use {_URI_FORMS}")
    lower = uri.lower()
    if lower == COSINE:
        return CosineRef()
    if lower.startswith("hf:"):
        return _parse_hf(uri)
    if lower.startswith("openai:"):
        model = uri[len("openai:") :].strip()
        if not model or any(c.isspace() for c in model):
            raise InvalidInput(f"invalid model URI {uri!r}: expected openai:<model name>")
        return RemoteRef(endpoint=OPENAI_ENDPOINT, model=model)
    if lower.startswith(("http://", "https://")):
        return _parse_http(uri)
    if _SCHEME_RE.match(uri):
        raise InvalidInput(f"unsupported model URI {uri!r}: use {_URI_FORMS}")
    path = Path(os.path.expanduser(uri))
    if not path.is_absolute():
        if base is None:
            raise InvalidInput(f"model path {uri!r} is relative: give an absolute path or one starting with ~")
        path = base / path
    return FileRef(path=Path(os.path.normpath(path)))


def _parse_hf(uri: str) -> HfRef:
    body, _, revision = uri[3:].partition("#")
    parts = body.split("/")
    bad = (
        len(parts) < 3
        or not all(_HF_NAME_RE.match(p) for p in parts[:2])
        or any(p in ("", ".", "..") for p in parts[2:])
        or any(ord(c) < 32 or c == "\\" for c in body)
    )
    if bad:
        raise InvalidInput(f"invalid model URI {uri!r}: expected hf:<user>/<repo>/<file>[#revision]")
    revision = revision or DEFAULT_REVISION
    # One path segment in the cache; branch names with '/' (refs/pr/N) are not supported.
    if not _HF_NAME_RE.match(revision) or ".." in revision:
        raise InvalidInput(f"invalid revision {revision!r} in {uri!r}: use a branch, tag or commit hash")
    return HfRef(user=parts[0], repo=parts[1], file="/".join(parts[2:]), revision=revision)


def _parse_http(uri: str) -> RemoteRef:
    address, _, model = uri.partition("#")
    try:
        host = httpx.URL(address).host
    except httpx.InvalidURL:
        host = ""
    if not host:
        raise InvalidInput(f"invalid model URI {uri!r}: expected http(s)://<host>[:port]/v1#<model>")
    return RemoteRef(endpoint=address.rstrip("/"), model=model.strip() or None)


def resolve_model(
    role: Role,
    models: Mapping[str, str] | None = None,
    environ: Mapping[str, str] = os.environ,
    config_dir: Path | None = None,
) -> ResolvedModel:
    """The model for one role: `index.yml` `models:` > `QMD_<ROLE>_MODEL` > default.

    Reads only; unlike the original (spec §26.19) it never writes the choice back into
    the user's config, so an env override stays an override.
    """
    if role not in ROLES:
        raise InvalidInput(f"unknown model role {role!r}: expected one of {', '.join(ROLES)}")
    configured = (models or {}).get(role, "").strip()
    from_env = environ.get(ENV_VARS[role], "").strip()
    if configured:
        return ResolvedModel(role, _parse_for(role, configured, f"index.yml models.{role}", config_dir), "config")
    if from_env:
        return ResolvedModel(role, _parse_for(role, from_env, ENV_VARS[role], None), "env")
    return ResolvedModel(role, parse_model_ref(DEFAULT_MODELS[role]), "default")


def resolve_models(
    models: Mapping[str, str] | None = None,
    environ: Mapping[str, str] = os.environ,
    config_dir: Path | None = None,
) -> dict[Role, ResolvedModel]:
    """All three roles. An unknown key in `models:` is an error: a typo (`embedding:`)
    would otherwise fall back to the default model without a word."""
    unknown = sorted(set(models or {}) - set(ROLES))
    if unknown:
        raise InvalidInput(f"index.yml models: unknown role(s) {', '.join(unknown)}: expected {', '.join(ROLES)}")
    return {role: resolve_model(role, models, environ, config_dir) for role in ROLES}


def _parse_for(role: Role, text: str, where: str, base: Path | None) -> ModelRef:
    """Parse with the setting's name in the message, so the user knows what to fix."""
    try:
        ref = parse_model_ref(text, base)
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}") from None
    if ref.kind == "cosine" and role != "rerank":
        raise InvalidInput(f"{where}: {COSINE} is a rerank scorer (the embedder's similarity), not a {role} model")
    if ref.kind == "remote" and role == "rerank" and ref.endpoint == OPENAI_ENDPOINT:
        raise InvalidInput(f"{where}: OpenAI has no rerank endpoint: write http(s)://<host>[:port]/v1#<model>")
    return ref


def hf_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    return (environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")


def hf_url(ref: HfRef, environ: Mapping[str, str] = os.environ) -> str:
    return f"{hf_endpoint(environ)}/{ref.user}/{ref.repo}/resolve/{quote(ref.revision, safe='')}/{quote(ref.file)}"


def models_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return cache_root(dict(environ)) / "models"


def cache_path(ref: HfRef, environ: Mapping[str, str] = os.environ) -> Path:
    """`models/<user>/<repo>/<revision>/<file>`: a directory per repo, because many repos
    ship a `model.gguf`; it also keeps clear of the original's flat `hf_*` files there."""
    return models_dir(environ) / ref.user / ref.repo / ref.revision / ref.file


def check_gguf_file(path: Path) -> Path:
    """A local model must exist and be GGUF; say so now rather than let llama.cpp fail
    with a bare 'failed to load model'."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        raise NotFound(f"model file not found: {path}", path=str(path)) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read model file {path}: {exc.strerror or exc}", path=str(path)) from None
    if head != GGUF_MAGIC:
        raise InvalidInput(f"{path} is not a GGUF model (it does not start with 'GGUF')", path=str(path))
    return path


def ensure_local(ref: ModelRef, progress: Progress | None = None, *, environ: Mapping[str, str] = os.environ) -> Path:
    """A path llama.cpp can open: the cached (downloaded if needed) file of an `hf:` ref,
    or the checked file of a local ref."""
    if isinstance(ref, HfRef):
        return fetch(ref, progress, environ=environ).path
    if isinstance(ref, FileRef):
        return check_gguf_file(ref.path)
    if isinstance(ref, CosineRef):
        raise InvalidInput(f"{COSINE} scores with the embedder's vectors: it has no model file")
    raise InvalidInput(f"{ref.uri} is a remote endpoint: it has no local model file")


def local_model(
    role: Role, models: Mapping[str, str] | None, config_dir: Path | None, environ: Mapping[str, str] = os.environ
) -> tuple[str, Path]:
    """(URI, local file) of a role's model, never downloading: a query must not stall on
    a gigabyte. The error says what to run instead."""
    ref = resolve_model(role, models, environ, config_dir).ref
    if isinstance(ref, HfRef):
        path = cache_path(ref, environ)
        if not path.exists():
            raise NotFound(f"the {role} model {ref.uri} is not downloaded (run 'qmd pull')")
        return ref.uri, path
    return ref.uri, ensure_local(ref, environ=environ)


def fetch(
    ref: HfRef,
    progress: Progress | None = None,
    *,
    refresh: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> Fetched:
    """The cached file of `ref`, downloaded when missing. With `refresh`, the remote ETag
    is checked (HEAD) and the file downloaded again when it changed (`qmd pull --refresh`);
    the old file stays usable until the new one replaces it."""
    final = cache_path(ref, environ)
    if final.exists() and not refresh:
        return _cached(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(_sibling(final, ".lock")), _client(environ) as client:
        if final.exists():
            if not refresh:  # another process finished it while we waited for the lock
                return _cached(final)
            remote = _remote_etag(client, ref, environ)
            if remote is not None and remote == _read_etag(final):
                return _cached(final)
        etag = _download(client, ref, final, progress, environ)
    return Fetched(final, final.stat().st_size, etag, downloaded=True)


def _cached(final: Path) -> Fetched:
    return Fetched(final, final.stat().st_size, _read_etag(final), downloaded=False)


def _sibling(final: Path, suffix: str) -> Path:
    return final.with_name(final.name + suffix)


def _read_etag(final: Path) -> str | None:
    try:
        return _sibling(final, ".etag").read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """flock: serialises threads (each opens its own description) and processes alike,
    and the kernel drops it if the holder dies, so a crash never leaves a stale lock."""
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


def _client(environ: Mapping[str, str]) -> httpx.Client:
    # identity encoding: sizes and ranges must count the bytes that land on disk.
    headers = {"User-Agent": "qmd-model-download", "Accept-Encoding": "identity"}
    token = environ.get("HF_TOKEN", "").strip()
    if token:
        # httpx drops it on a redirect to another host, so the CDN never sees it.
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(headers=headers, follow_redirects=True, timeout=_TIMEOUT)


def _remote_etag(client: httpx.Client, ref: HfRef, environ: Mapping[str, str]) -> str | None:
    url = hf_url(ref, environ)
    try:
        # The hub's redirect already names the file's ETag; a HEAD sent on to a signed CDN
        # URL may be refused, so redirects are followed only when they carry no answer
        # (a renamed repo, a plain mirror).
        resp = client.head(url, follow_redirects=False)
        if resp.is_redirect and not resp.headers.get("x-linked-etag"):
            resp = client.head(url)
    except httpx.RequestError as exc:
        raise _network_error(ref, environ, exc, None) from None
    _check_status(resp, ref, environ)
    return _etag_of(resp)


def _etag_of(resp: httpx.Response) -> str | None:
    """The hub answers a large file with a redirect carrying `X-Linked-Etag` (the file's
    identity); the CDN's own ETag differs, so the linked one wins when present."""
    for hop in (*resp.history, resp):
        linked = hop.headers.get("x-linked-etag")
        if linked:
            return _clean_etag(linked)
    raw = resp.headers.get("etag")
    return _clean_etag(raw) if raw else None


def _clean_etag(raw: str) -> str:
    raw = raw.strip()
    return (raw[2:] if raw.startswith("W/") else raw).strip('"')


def _size_of(resp: httpx.Response) -> int | None:
    for hop in (*resp.history, resp):
        linked = hop.headers.get("x-linked-size")
        if linked and linked.isdigit():
            return int(linked)
    length = resp.headers.get("content-length", "")
    return int(length) if length.isdigit() else None


def _check_status(resp: httpx.Response, ref: HfRef, environ: Mapping[str, str]) -> None:
    code = resp.status_code
    if code < 400:
        return
    url = hf_url(ref, environ)
    if code in (401, 403):
        if environ.get("HF_TOKEN", "").strip():
            hint = "HF_TOKEN was sent and refused: check the token, and accept the model's terms on its page"
        else:
            hint = "a private or gated repo needs a token: set HF_TOKEN"
        raise Forbidden(f"access to {ref.uri} denied (HTTP {code} from {url}): {hint}", uri=ref.uri, url=url)
    if code == 404:
        kind = resp.headers.get("x-error-code", "")
        if kind == "RepoNotFound":
            message = f"no such repo {ref.repo_id} on {hf_endpoint(environ)} (or it is private: set HF_TOKEN)"
        elif kind == "RevisionNotFound":
            message = f"no revision {ref.revision} in repo {ref.repo_id}"
        else:
            message = f"no such file in repo {ref.repo_id} at revision {ref.revision}: {ref.file}"
        raise NotFound(f"{message} ({url} → 404)", uri=ref.uri, url=url)
    raise QmdError(f"download of {ref.uri} failed: {url} answered HTTP {code}", uri=ref.uri, url=url)


@dataclass(frozen=True)
class _PartState:
    """What the bytes in `.part` belong to; a resume must match both."""

    etag: str | None
    size: int | None


def _load_state(meta: Path, part: Path) -> _PartState | None:
    """Resumable only with a known size and a non-empty `.part`; anything else restarts."""
    try:
        raw = json.loads(meta.read_text(encoding="utf-8"))
        state = _PartState(etag=raw.get("etag"), size=raw.get("size"))
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(state.size, int) or not part.exists() or part.stat().st_size == 0:
        return None
    return state


def _discard(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _download(
    client: httpx.Client, ref: HfRef, final: Path, progress: Progress | None, environ: Mapping[str, str]
) -> str | None:
    part, meta = _sibling(final, ".part"), _sibling(final, ".part.json")
    try:
        state = _transfer(client, ref, part, meta, progress, environ)
    except httpx.RequestError as exc:
        raise _network_error(ref, environ, exc, part) from None
    return _finish(ref, part, meta, final, state)


def _transfer(
    client: httpx.Client, ref: HfRef, part: Path, meta: Path, progress: Progress | None, environ: Mapping[str, str]
) -> _PartState:
    """Fill `.part`, resuming when it holds the start of the same remote file. At most two
    requests: a resume found stale drops the state, and a plain request always ends."""
    url = hf_url(ref, environ)
    state = _load_state(meta, part)
    while True:
        offset = part.stat().st_size if state else 0
        with client.stream("GET", url, headers={"Range": f"bytes={offset}-"} if offset else {}) as resp:
            if state and resp.status_code == 416:
                if _already_complete(resp, offset, state):
                    return state
                _discard(part, meta)
                state = None
                continue
            if resp.status_code == 404:
                _discard(part, meta)  # the file is gone: its part can never be finished
            _check_status(resp, ref, environ)
            etag = _etag_of(resp)
            if state and resp.status_code == 206:
                if not _same_file(resp, offset, state, etag):
                    _discard(part, meta)
                    state = None
                    continue
            elif resp.status_code == 200:  # fresh, or a server that ignores Range
                offset = 0
                state = _PartState(etag=etag, size=_size_of(resp))
                _discard(meta)
                if state.size is not None:
                    meta.write_text(json.dumps({"etag": state.etag, "size": state.size}), encoding="utf-8")
            else:
                raise QmdError(f"download of {ref.uri} failed: {url} answered HTTP {resp.status_code}", uri=ref.uri)
            _receive(resp, part, offset, state.size, progress, ref)
            return state


def _already_complete(resp: httpx.Response, offset: int, state: _PartState) -> bool:
    """416 for `bytes=N-` where N is the full size: the previous run got every byte but
    stopped before the rename."""
    m = _CONTENT_RANGE_RE.match(resp.headers.get("content-range", ""))
    etag = _etag_of(resp)
    return m is not None and m.group(2) == str(offset) == str(state.size) and etag in (None, state.etag)


def _same_file(resp: httpx.Response, offset: int, state: _PartState, etag: str | None) -> bool:
    """A 206 continues our `.part` only if it starts where we stopped and is the same
    file (ETag and total size); otherwise the remote changed and we start over."""
    m = _CONTENT_RANGE_RE.match(resp.headers.get("content-range", ""))
    return m is not None and m.group(1) == str(offset) and m.group(2) == str(state.size) and etag == state.etag


def _receive(
    resp: httpx.Response, part: Path, offset: int, total: int | None, progress: Progress | None, ref: HfRef
) -> None:
    if total is not None:
        free = shutil.disk_usage(part.parent).free
        if free < total - offset:
            raise QmdError(
                f"not enough disk space to download {ref.uri}: {_human(total - offset)} needed, "
                f"{_human(free)} free in {part.parent}",
                uri=ref.uri,
            )
    done = offset
    try:
        with open(part, "ab" if offset else "wb") as fh:
            try:
                if progress:
                    progress(done, total)
                for chunk in resp.iter_bytes(_CHUNK):
                    fh.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
            finally:
                # Also on interruption: a resume must never build on bytes the OS lost.
                fh.flush()
                os.fsync(fh.fileno())
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise QmdError(
                f"disk full while downloading {ref.uri} into {part.parent}: free some space and run again "
                f"to resume ({_human(done)} kept)",
                uri=ref.uri,
            ) from None
        raise


def _finish(ref: HfRef, part: Path, meta: Path, final: Path, state: _PartState) -> str | None:
    """Verify, then publish with one rename: the model path never names a partial file."""
    size = part.stat().st_size
    if state.size is not None and size != state.size:
        if size > state.size:
            _discard(part, meta)
        raise QmdError(
            f"download of {ref.uri} incomplete: got {size} of {state.size} bytes; run again to resume", uri=ref.uri
        )
    with open(part, "rb") as fh:
        head = fh.read(64)
    if not head.startswith(GGUF_MAGIC):
        _discard(part, meta)
        hint = (
            " — the server sent a web page: a proxy or captive portal, or a wrong HF_ENDPOINT?"
            if head.lstrip()[:1] == b"<"
            else ""
        )
        raise InvalidInput(f"{ref.uri} is not a GGUF model (it does not start with 'GGUF'){hint}", uri=ref.uri)
    os.replace(part, final)
    _fsync_dir(final.parent)
    # After the rename: a crash in between leaves an old or missing sidecar, which only
    # makes the next refresh download again, never trust a stale file.
    etag_file = _sibling(final, ".etag")
    if state.etag is None:
        _discard(etag_file)
    else:
        tmp = _sibling(final, ".etag.tmp")
        tmp.write_text(state.etag + "\n", encoding="utf-8")
        os.replace(tmp, etag_file)
    _discard(meta)
    return state.etag


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _network_error(ref: HfRef, environ: Mapping[str, str], exc: Exception, part: Path | None) -> QmdError:
    endpoint = hf_endpoint(environ)
    reason = str(exc) or type(exc).__name__
    if part is not None and part.exists() and part.stat().st_size:
        kept = part.stat().st_size
        return QmdError(
            f"download of {ref.uri} from {endpoint} interrupted ({reason}); {_human(kept)} kept, run again to resume",
            uri=ref.uri,
            endpoint=endpoint,
        )
    return QmdError(
        f"cannot download {ref.uri}: network failure talking to {endpoint} ({reason})", uri=ref.uri, endpoint=endpoint
    )


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
