"""kill -9 of the daemon mid-index, mid-update and mid-embed (issue 13): after a restart the
index opens, `PRAGMA integrity_check` is ok, the keyword index and `documents` agree (every
active document is found by a word of its own, no removed or replaced version is), no
document holds a body that was never a whole version of its file, status counts the vectors
vector search reaches (item 5: the vectors written before the kill are searchable at once,
without another embed), and a second update or embed completes and converges.

The kill moments are random but seeded: a read-only connection watches the index until a
random share of the job is committed, then the daemon gets SIGKILL after a random delay, so
it dies between commits or inside one."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import MODELS_DIR, Daemon, Env, require

from qmd.server.ingest.embed_job import EMBED_SUB_BATCH, embed_pending
from qmd.server.models.embedders import Embedder
from qmd.server.models.worker import Embeddings
from qmd.server.store import vectors
from qmd.server.store.db import sqlite3
from qmd.server.text.chunking import Chunk
from qmd.server.text.split import split

MODEL = "all-MiniLM-L6-v2-Q8_0.gguf"
VOCAB = "river stone cloud market engine garden ledger signal harbor forest lantern meadow copper".split()
WORD = re.compile(r"\btok\d{6}z\b")
FILES = 2500
NEW = "SELECT count(*) FROM documents WHERE id >= ?"


class Corpus:
    """A collection's folder, and every version of every file ever written to it: a document
    in the index must hold one of them whole. Each version carries a word no other has."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.root, self.rng = root, rng
        self.serial = 0
        self.versions: dict[str, set[str]] = {}
        self.current: dict[str, str] = {}
        self.words: set[str] = set()

    def write(self, rel: str, words: int = 0) -> None:
        self.serial += 1
        word = f"tok{self.serial:06d}z"
        filler = " ".join(self.rng.choice(VOCAB) for _ in range(words or self.rng.randint(15, 60)))
        text = f"---\nqmd:\n  metadata:\n    group: g{self.serial % 7}\n---\n# Note {rel}\n\n{word} {filler}.\n"
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        self.versions.setdefault(rel, set()).add(text)
        self.current[rel] = text
        self.words.add(word)

    def delete(self, rel: str) -> None:
        (self.root / rel).unlink()
        del self.current[rel]


def connect(db: Path) -> sqlite3.Connection:
    """A read-only look at the index beside the daemon (never the last connection to close, so
    it never checkpoints the log in the daemon's place)."""
    import sqlite_vec

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None, timeout=30)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    return conn


def count(db: Path, sql: str, args: tuple = ()) -> int:
    conn = connect(db)
    try:
        return int(conn.execute(sql, args).fetchone()[0])
    finally:
        conn.close()


# -- the daemon, killed ----------------------------------------------------


def children(pid: int) -> list[int]:
    kids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(p.name))
    return kids


def kill9(d: Daemon) -> int:
    """SIGKILL the daemon. Its model worker, if it outlives it (issue 13 item 7, not this file's
    subject), is ended by pid so it cannot load the machine. Returns how many outlived it."""
    kids = [k for k in children(d.pid) if b"worker_child" in Path(f"/proc/{k}/cmdline").read_bytes()]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(timeout=30)
    d.http.close()
    lingering = 0
    for k in kids:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{k}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if Path(f"/proc/{k}").exists():
            lingering += 1
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return lingering


class Job:
    """A streamed job (`/v1/update`, `/v1/embed`) read on its own thread, so the test can kill
    the daemon under it; the stream breaking then is expected."""

    def __init__(self, env: Env, route: str, body: dict) -> None:
        self.events: list[dict] = []
        self.error: Exception | None = None
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(env.url, route, body), daemon=True)
        self.thread.start()

    def _run(self, url: str, route: str, body: dict) -> None:
        try:
            with httpx.Client(base_url=url, timeout=300) as c, c.stream("POST", route, json=body) as r:
                for line in r.iter_lines():
                    if line.strip():
                        self.events.append(json.loads(line))
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            self.error = e
        finally:
            self.finished.set()


def run_job(d: Daemon, route: str, body: dict) -> dict:
    with d.http.stream("POST", route, json=body, timeout=600) as r:
        events = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert events and events[-1]["event"] == "done", events[-3:]
    return events[-1]


def kill_when(d: Daemon, rng: random.Random, reached: Callable[[], bool], job: Job, jitter: float) -> tuple[bool, int]:
    """Watch until `reached()` (or the job ends), wait a random part of `jitter` seconds, SIGKILL.
    Returns (the job was still running when killed, workers that outlived the daemon)."""
    deadline = time.monotonic() + 240
    while not reached() and not job.finished.is_set() and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, jitter))
    midway = not job.finished.is_set()
    lingering = kill9(d)
    job.thread.join(timeout=30)
    return midway, lingering


# -- the checks ------------------------------------------------------------


def check_index(env: Env, d: Daemon, corpus: Corpus, collection: str, *, converged: bool) -> dict[str, str]:
    """The index after a restart agrees with itself and with what was written; `converged`:
    and with the folder as it is now. Returns the active documents' bodies by path."""
    conn = connect(env.db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = conn.execute(
            "SELECT d.id, d.path, d.hash, c.doc FROM documents d LEFT JOIN content c ON c.hash = d.hash"
            " WHERE d.active = 1 AND d.collection = ?",
            (collection,),
        ).fetchall()
        own: dict[int, str] = {}
        held: dict[str, str] = {}
        for doc_id, path, h, body in rows:
            assert body is not None, f"{path}: active without its body"
            assert body in corpus.versions.get(path, set()), f"{path}: a body that was never a whole version"
            assert hashlib.sha256(body.encode()).hexdigest() == h, f"{path}: hash of another body"
            (word,) = WORD.findall(body)
            own[doc_id] = word
            held[path] = body
        fts = {r[0] for r in conn.execute("SELECT rowid FROM documents_fts")}
        assert fts == set(own), f"FTS rows {len(fts)} vs active documents {len(own)}"
        for doc_id, word in own.items():
            found = {r[0] for r in conn.execute("SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?", (word,))}
            assert found == {doc_id}, f"{word}: {found} instead of {doc_id}"
        gone = corpus.words - set(own.values())
        for word in gone:
            assert (
                conn.execute("SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?", (word,)).fetchone() is None
            )
    finally:
        conn.close()
    if converged:
        assert held == corpus.current, "after a complete update the index holds the folder as it is"
    # and the daemon answers from that index: a sample of live words, and of gone ones
    status = d.http.get("/v1/status").json()
    assert status["documents"] == len(own)
    rng = random.Random(len(own))
    for word in rng.sample(sorted(own.values()), 8):
        hits = d.http.post("/v1/keyword", json={"query": word, "limit": 5}).json()["results"]
        assert len(hits) == 1 and WORD.findall(held[hits[0]["path"]]) == [word]
    for word in rng.sample(sorted(gone), min(8, len(gone))):
        assert d.http.post("/v1/keyword", json={"query": word}).json()["results"] == []
    return held


def active(db: Path, collection: str) -> int:
    return count(db, "SELECT count(*) FROM documents WHERE active = 1 AND collection = ?", (collection,))


def report(name: str, rounds: list[str], lingering: int, t0: float) -> None:
    print(
        f"\n{name}: {len(rounds)} kills ({', '.join(rounds)}); workers outliving the daemon: {lingering};"
        f" {time.monotonic() - t0:.1f}s"
    )


# -- kill -9 mid-index and mid-update --------------------------------------


def big_collection(env: Env, rng: random.Random) -> tuple[Corpus, Daemon]:
    """FILES generated notes in 20 folders, added (not yet indexed) as collection `big` of a new daemon."""
    corpus = Corpus(env.base / "big", rng)
    for i in range(FILES):
        corpus.write(f"d{i % 20:02}/n{i:05}.md")
    d = Daemon(env)
    d.http.post("/v1/collections", json={"path": str(corpus.root), "name": "big"}).raise_for_status()
    return corpus, d


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_mid_index_then_resume(env: Env) -> None:
    t0 = time.monotonic()
    rng = random.Random(1301)
    corpus, d = big_collection(env, rng)
    rounds: list[str] = []
    lingering = 0
    try:
        for _ in range(3):
            have = active(env.db, "big")
            if have >= FILES - 1:
                break
            target = rng.randint(have + 1, FILES - 1)
            job = Job(env, "/v1/update", {})
            midway, n = kill_when(d, rng, lambda t=target: active(env.db, "big") >= t, job, 0.03)
            lingering += n
            d = Daemon(env)
            now = len(check_index(env, d, corpus, "big", converged=False))
            rounds.append(f"{'mid-index' if midway else 'after the index'} at {now}/{FILES}")
        assert any(r.startswith("mid-index") for r in rounds), rounds
        summary = run_job(d, "/v1/update", {})["report"]["collections"][0]
        assert summary["removed"] == 0
        assert len(check_index(env, d, corpus, "big", converged=True)) == FILES
        again = run_job(d, "/v1/update", {})["report"]["collections"][0]
        assert (again["new"], again["updated"], again["removed"]) == (0, 0, 0), again
        meta = d.http.post("/v1/metadata", json={}).json()
        assert meta["with_metadata"] == FILES and meta["pending"] == 0, meta
    finally:
        d.stop()
    report("kill -9 mid-index", rounds, lingering, t0)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_mid_update_after_edits_and_deletions(env: Env) -> None:
    t0 = time.monotonic()
    rng = random.Random(1302)
    corpus, d = big_collection(env, rng)
    run_job(d, "/v1/update", {})
    rounds: list[str] = []
    lingering = 0
    serial = FILES
    try:
        for r in range(3):
            names = sorted(corpus.current)
            rng.shuffle(names)
            edited, deleted = names[:300], names[300:500]
            for rel in edited:
                corpus.write(rel)
            for rel in deleted:
                corpus.delete(rel)
            added = [f"d{i % 20:02}/n{i:05}.md" for i in range(serial, serial + 300)]
            serial += len(added)
            for rel in added:
                corpus.write(rel)
            job = Job(env, "/v1/update", {})
            if r % 2 == 0:  # once some of the new files are committed, or soon after
                first = count(env.db, "SELECT COALESCE(MAX(id), 0) FROM documents") + 1
                target = rng.randint(1, 300)
                midway, n = kill_when(d, rng, lambda f=first, t=target: count(env.db, NEW, (f,)) >= t, job, 0.05)
            else:  # at a random moment from the start: perhaps before the first commit
                midway, n = kill_when(d, rng, lambda: True, job, 0.4)
            lingering += n
            d = Daemon(env)
            held = check_index(env, d, corpus, "big", converged=False)
            applied = (
                sum(held.get(p) == corpus.current[p] for p in edited),
                sum(p in held for p in added),
                sum(p in held for p in deleted),
            )
            rounds.append(
                f"{'mid-update' if midway else 'after the update'}:"
                " {} of 300 edits, {} of 300 new files, {} of 200 deleted still in".format(*applied)
            )
        assert any(r.startswith("mid-update") for r in rounds), rounds
        run_job(d, "/v1/update", {})
        assert len(check_index(env, d, corpus, "big", converged=True)) == len(corpus.current)
        again = run_job(d, "/v1/update", {})["report"]["collections"][0]
        assert (again["new"], again["updated"], again["removed"]) == (0, 0, 0), again
        meta = d.http.post("/v1/metadata", json={}).json()
        assert meta["with_metadata"] == len(corpus.current) and meta["pending"] == 0, meta
    finally:
        d.stop()
    report("kill -9 mid-update", rounds, lingering, t0)


# -- kill -9 mid-embed (item 5) --------------------------------------------


def vector_view(env: Env, d: Daemon, collection: str) -> dict[str, Any]:
    """What status says of the vectors, what vector search returns, and what the index holds:
    contents whose chunks are all written, and the chunks vector search can reach (a search row,
    `vector_rows`, in the collection of an active document holding them)."""
    st = d.http.get("/v1/status").json()["vector"]
    conn = connect(env.db)
    try:
        (space_id,) = conn.execute(
            "SELECT id FROM vector_spaces WHERE fingerprint = ?", (st["fingerprint"],)
        ).fetchone()
        docs = conn.execute(
            "SELECT path, hash FROM documents WHERE active = 1 AND collection = ?", (collection,)
        ).fetchall()
        totals = {
            h: (n, total)
            for h, n, total in conn.execute(
                "SELECT hash, COUNT(*), MAX(total_chunks) FROM content_vectors WHERE space_id = ? GROUP BY hash",
                (space_id,),
            )
        }
        reach = conn.execute(
            "SELECT vr.id, vr.chunk_id FROM vector_rows vr JOIN content_vectors cv ON cv.id = vr.chunk_id"
            " JOIN vector_collection_ids vc ON vc.id = vr.collection_id WHERE vr.space_id = ? AND EXISTS"
            " (SELECT 1 FROM documents d WHERE d.active = 1 AND d.hash = cv.hash AND d.collection = vc.name)",
            (space_id,),
        ).fetchall()
        written = conn.execute("SELECT COUNT(*) FROM content_vectors WHERE space_id = ?", (space_id,)).fetchone()[0]
    finally:
        conn.close()
    hits = d.http.post(
        "/v1/vector", json={"query": "river stone market", "all": True, "min_score": 0, "collections": [collection]}
    ).json()
    return {
        "status": st,
        "active": {p for p, _ in docs},
        "complete": {p for p, h in docs if h in totals and totals[h][0] == totals[h][1]},
        "partial": {p for p, h in docs if h in totals and totals[h][0] < totals[h][1]},
        "reachable_chunks": len({chunk for _rid, chunk in reach}),
        "written": written,
        "found": {h["path"] for h in hits["results"]},
        "degraded": hits["degraded"],
    }


def check_vectors(v: dict[str, Any]) -> None:
    """What status counts is what vector search sees."""
    st = v["status"]
    assert st["pending"] == len(v["active"]) - len(v["complete"]), st
    assert st["embedded_chunks"] == v["reachable_chunks"], (st, v["reachable_chunks"])
    if v["complete"]:
        assert not v["degraded"] and st["available"]
    assert v["found"] == v["complete"], (
        f"vector search finds {len(v['found'])} documents, {len(v['complete'])} are embedded"
        f" (status: {st['embedded_chunks']} chunks, {st['pending']} pending)"
    )


@pytest.fixture(scope="module")
def model() -> Path:
    return require(MODELS_DIR / MODEL, "the MiniLM test embedder (../shared/models)")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_kill_mid_embed_vectors_searchable_after_restart(env: Env, model: Path) -> None:
    t0 = time.monotonic()
    rng = random.Random(1305)
    corpus = Corpus(env.base / "emb", rng)
    for i in range(64):
        corpus.write(f"n{i:03}.md", 12)
    for i in range(4):
        corpus.write(f"long{i}.md", 260)  # two chunks of the embedder's 256 tokens: a request may cut one
    env.vars["QMD_EMBED_MODEL"] = str(model)
    d = Daemon(env)
    d.http.post("/v1/collections", json={"path": str(corpus.root), "name": "emb"}).raise_for_status()
    run_job(d, "/v1/update", {})
    rounds: list[str] = []
    lingering = 0
    try:
        for attempt in range(2):
            job = Job(env, "/v1/embed", {})
            if attempt == 0:  # once a batch is committed, perhaps inside the next one
                target = rng.randint(1, d.http.get("/v1/status").json()["vector"]["pending"] // 2)

                def reached(t: int = target, job: Job = job) -> bool:
                    return any(e.get("event") == "progress" and e["done"] >= t for e in list(job.events))

                midway, n = kill_when(d, rng, reached, job, 0.6)
            else:  # at a random moment from the start: loading the model, embedding, committing
                midway, n = kill_when(d, rng, lambda: True, job, 2.5)
            lingering += n
            d = Daemon(env)
            v = vector_view(env, d, "emb")
            rounds.append(
                f"{'mid-embed' if midway else 'after the embed'}: {len(v['complete'])}/{len(v['active'])} embedded,"
                f" {len(v['partial'])} half"
            )
            if attempt == 0:
                assert v["complete"], "the kill came after a batch was committed"
            check_vectors(v)
        assert any(r.startswith("mid-embed") for r in rounds), rounds
        before = vector_view(env, d, "emb")
        done = run_job(d, "/v1/embed", {})["report"]
        assert done["documents"] == before["status"]["pending"] and done["pending_after"] == 0, done
        after = vector_view(env, d, "emb")
        check_vectors(after)
        assert after["complete"] == after["active"] == set(corpus.current) and not after["partial"]
        assert done["embedded"] == after["written"] - before["written"], "resumed: no chunk embedded twice"
        assert run_job(d, "/v1/embed", {})["report"]["embedded"] == 0
    finally:
        d.stop()
    report("kill -9 mid-embed", rounds, lingering, t0)


# -- the same, in process: a job that dies between two requests -----------


class Killed(Exception):
    pass


class Dying:
    """An embed backend that dies (as a killed daemon does) on its `die_at`-th request."""

    def __init__(self, die_at: int | None) -> None:
        self.die_at, self.requests = die_at, 0

    def chunk(self, text: str, max_tokens: int, language: str | None = None) -> list[Chunk]:
        return list(split(text, max_tokens=max_tokens, tokenizer=self, language=language))

    def count(self, text: str) -> int:
        return len(text) // 4 + 1

    def embed(self, texts: list[str], kind: str, titles: list[str | None] | None = None) -> Embeddings:
        self.requests += 1
        if self.requests == self.die_at:
            raise Killed
        return Embeddings([[1.0, 0.5, 0.25, 0.0]] * len(texts), clipped=(), n_tokens=[1] * len(texts), limit=512)


def test_each_batch_is_searchable_as_it_commits(tmp_path: Path) -> None:
    """Item 5 without a daemon: the job dies on its third request; what the first two wrote is
    in the search partitions, the content they cut in two is neither searchable nor counted, and
    the resumed job completes it without embedding a chunk twice."""
    import qmd

    rng = random.Random(5)
    corpus = Corpus(tmp_path / "notes", rng)
    for i in range(60):
        corpus.write(f"n{i:02}.md", rng.choice([10, 10, 10, 120]))  # every fourth: several chunks
    with qmd.open(tmp_path / "i.sqlite", collections={"notes": {"path": str(corpus.root)}}) as index:
        store = index.engine.store
        index.update()
        embedder = Embedder("fake", Dying(3), 64, "f" * 64, 4, "fake")
        with pytest.raises(Killed):
            embed_pending(store, embedder, collections=None)
        with store.read() as conn:
            space = vectors.find_space(conn, embedder.fingerprint)
            assert space is not None
            complete = vectors.complete_hashes(conn, space)
            written = conn.execute("SELECT hash, COUNT(*) FROM content_vectors GROUP BY hash").fetchall()
            in_rows = conn.execute("SELECT COUNT(*) FROM vector_rows WHERE space_id = ?", (space.id,)).fetchone()[0]
            counted = vectors.count_vectors(conn, space).embedded_chunks
            half = [h for h, _ in written if h not in complete]
            assert sum(n for _, n in written) == 2 * EMBED_SUB_BATCH
            assert half, "a request cut a content in two"
            assert in_rows == counted == sum(n for h, n in written if h in complete) > 0
            hits = vectors.search(conn, space, [1.0, 0.5, 0.25, 0.0], "notes", 100)
            assert len(hits) == len(complete)
        report_ = embed_pending(store, Embedder("fake", Dying(None), 64, "f" * 64, 4, "fake"), collections=None)
        with store.read() as conn:
            total = conn.execute("SELECT COUNT(*) FROM content_vectors").fetchone()[0]
            assert report_.embedded == total - 2 * EMBED_SUB_BATCH and report_.pending_after == 0
            assert conn.execute("SELECT COUNT(*) FROM vector_rows").fetchone()[0] == total
            assert report_.partitions_added == total - in_rows
            assert len(vectors.search(conn, space, [1.0, 0.5, 0.25, 0.0], "notes", 100)) == 60
