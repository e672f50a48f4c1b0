"""Embedding throughput of `qmd embed` against a bare llama-cpp-python loop, same run.

    .venv/bin/python bench/bench_embed.py [--files 200] [--seed 1] [--max-chars 2500]
                                          [--blocks 4] [--rounds 2] [--model GGUF] [--keep]

Generates a small corpus (bench/corpus.py, each file cut at a section boundary to
--max-chars: 200 files give ~530 chunks), deals it into --blocks collections, starts a
fresh isolated `qmdd` (temporary HOME/XDG dirs, free port) with `QMD_EMBED_MODEL=GGUF`,
warms it up (`qmd embed -c warm` on a one-file collection: worker start + model load),
and then, block by block, embeds each block three ways:

  qmd     `qmd embed -c BLOCK` (round 1) / `qmd embed -c BLOCK -f` (later rounds), a
          fresh CLI process: wall time of the process, and the daemon's own report
  worker  the daemon's inference worker (`qmd.server.models.worker.WorkerClient`) driven from this
          process as the embed job drives it, without the daemon, SQLite or HTTP:
          `chunk` every body, then `embed` the chunks 32 at a time
  bare    the exact chunk texts the daemon embedded (content_vectors pos/end_pos
          sliced out of the stored bodies, checked after every qmd pass), embedded in
          this process by llama-cpp-python, one `Llama.embed(text, normalize=True)` per
          chunk, same model, same n_threads as the worker, the models README's load
          parameters (n_ctx = n_batch = n_ubatch = 512, flash_attn)

The order alternates from block to block and from round to round (qmd, worker, bare /
bare, worker, qmd), so both sides see the same machine: on a shared machine the speed
drifts by the minute, and short interleaved passes cancel that far better than two long
ones. `ratio` = chunks/s / bare chunks/s over the same blocks: qmd's overhead (goal
>= 0.95). Every pass also records the CPU the rest of the machine used meanwhile
(`others`, from /proc/stat). After round 1, `qmd embed` with nothing left to embed is
timed (the incremental run). Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as corpus_mod  # noqa: E402
from _common import (  # noqa: E402
    CpuWindow,
    Daemon,
    Isolated,
    children_cpu_s,
    code_line,
    embed_model_path,
    machine,
    mb,
    proc_cpu_s,
    proc_status_kb,
    table,
    write_json,
)

REPORT = re.compile(r"Embedded (\d+) chunks from (\d+) documents in ([\d.]+)s \(([\d.]+) chunks/s\); (\d+) pending")
SUB_BATCH = 32
"""Texts per worker `embed` request, as the embed job sends them (server/ingest/embed_job.py, EMBED_SUB_BATCH)."""


def parse_report(stdout: str) -> dict:
    """The daemon's summary line as `qmd embed` prints it."""
    m = REPORT.search(stdout)
    if not m:
        raise RuntimeError(f"no embed report in the CLI output: {stdout!r}")
    return {
        "chunks": int(m.group(1)),
        "documents": int(m.group(2)),
        "server_s": float(m.group(3)),
        "server_chunks_per_s": float(m.group(4)),
        "pending": int(m.group(5)),
    }


def read_index(db: Path, collection: str) -> tuple[list[str], list[tuple[str, bytes]]]:
    """The collection's stored bodies (by content hash), and (text, stored vector) of
    each of its embedded chunks in the order the embed job wrote them (content hash,
    then seq). The text is the body sliced at the chunk's pos/end_pos: exactly what the
    daemon gave the model."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        bodies = dict(
            conn.execute(
                "SELECT DISTINCT c.hash, c.doc FROM content c JOIN documents d ON d.hash = c.hash"
                " WHERE d.collection = ? AND d.active = 1 ORDER BY c.hash",
                (collection,),
            )
        )
        rows = conn.execute("SELECT hash, pos, end_pos, embedding FROM content_vectors ORDER BY hash, seq")
        return list(bodies.values()), [(bodies[h][pos:end], emb) for h, pos, end, emb in rows if h in bodies]
    finally:
        conn.close()


class Bare:
    """llama-cpp-python with the models README's load parameters, in this process."""

    def __init__(self, model: str, threads: int) -> None:
        t0 = time.perf_counter()
        from llama_cpp import Llama

        from qmd.server.models.worker_child import model_params

        self.import_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with model_params():  # as the worker loads it: no AMX weight repacking where that crashes
            self.llm = Llama(
                model_path=model,
                embedding=True,
                n_ctx=512,
                n_batch=512,
                n_ubatch=512,
                n_threads=threads,
                n_threads_batch=threads,
                flash_attn=True,
                verbose=False,
            )
        self.load_s = time.perf_counter() - t0
        self.llm.embed("warm up", normalize=True)

    def run(self, texts: list[str]) -> tuple[float, float, list[list[float]]]:
        """(wall s, CPU s of this process, vectors): one embed() call per text."""
        c0, t0 = time.process_time(), time.perf_counter()
        out = [self.llm.embed(t, normalize=True) for t in texts]
        return time.perf_counter() - t0, time.process_time() - c0, out


class WorkerSide:
    """qmd's inference worker without the daemon: a child process, pickled frames."""

    def __init__(self, model: str, threads: int) -> None:
        from qmd.server.models.embedders import _chunk_tokens
        from qmd.server.models.worker import ModelSpec, WorkerClient

        self.worker = WorkerClient(n_threads=threads, idle_seconds=3600, force_cpu=False)
        self.spec = ModelSpec(role="embed", path=model)
        self.max_tokens = _chunk_tokens(self.worker.model_info(self.spec))
        t0 = time.perf_counter()
        self.worker.embed(self.spec, ["warm up"], kind="document")
        self.start_s = time.perf_counter() - t0
        self.pid = self.worker.status()["pid"]

    def chunk_texts(self, bodies: list[str]) -> list[str]:
        return [b[c.start : c.end] for b in bodies for c in self.worker.chunk(self.spec, b, max_tokens=self.max_tokens)]

    def run(self, bodies: list[str], texts: list[str]) -> dict:
        c0, w0 = time.process_time(), proc_cpu_s(self.pid)
        t0 = time.perf_counter()
        chunked = [self.worker.chunk(self.spec, b, max_tokens=self.max_tokens) for b in bodies]
        t1 = time.perf_counter()
        for i in range(0, len(texts), SUB_BATCH):
            self.worker.embed(self.spec, texts[i : i + SUB_BATCH], kind="document")
        t2 = time.perf_counter()
        c1, w1 = time.process_time(), proc_cpu_s(self.pid)
        made = [b[c.start : c.end] for b, cs in zip(bodies, chunked) for c in cs]
        return {
            "chunks": len(texts),
            "same_chunks": made == texts,
            "wall_s": round(t2 - t0, 3),
            "chunk_s": round(t1 - t0, 3),
            "embed_s": round(t2 - t1, 3),
            "ours_cpu_s": round((c1 - c0) + (w1 - w0), 2) if w0 is not None and w1 is not None else None,
        }

    def close(self) -> None:
        self.worker.close()


def cosine_check(stored: list[bytes], bare: list[list[float]]) -> tuple[float, float]:
    """(min, mean) cosine between the daemon's stored vectors and the bare loop's: unit
    vectors of the same texts by the same model, so ~1.0 unless the inputs differ."""
    from qmd.server.store import vector_codec

    sims = []
    for blob, v in zip(stored, bare):
        a = vector_codec.decode([blob], len(v))[0].tolist()  # as stored: half floats
        sims.append(sum(x * y for x, y in zip(a, v)))
    return min(sims), statistics.fmean(sims)


def split_blocks(root: Path, paths: list[str], blocks: int) -> list[Path]:
    """Deal the generated files into `blocks` folders (file i into block i mod blocks)."""
    dirs = [root / f"b{k + 1}" for k in range(blocks)]
    for i, rel in enumerate(paths):
        dst = dirs[i % blocks] / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (root / "all" / rel).rename(dst)
    shutil.rmtree(root / "all")
    return dirs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-chars", type=int, default=2500, help="cap each file at a section boundary")
    ap.add_argument("--blocks", type=int, default=4, help="collections the corpus is dealt into")
    ap.add_argument("--rounds", type=int, default=2, help="passes over every block, order alternating")
    ap.add_argument("--model", default=None, help="embed GGUF [$QMD_BENCH_EMBED_MODEL or the shared MiniLM Q8_0]")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args(argv)
    model = embed_model_path(args.model)

    env = Isolated(keep=args.keep)
    env.vars["QMD_EMBED_MODEL"] = model
    daemon: Daemon | None = None
    worker: WorkerSide | None = None
    try:
        root = env.base / "corpus"
        stats = corpus_mod.generate(root / "all", args.files, args.seed, args.max_chars)
        dirs = split_blocks(root, stats.paths, args.blocks)
        names = [d.name for d in dirs]
        warm = env.base / "warm"
        warm.mkdir()
        (warm / "warm.md").write_text("# Warm up\n\nOne short document that loads the embedder.\n")
        print(
            f"corpus: {stats.files} files, {stats.bytes / 1e6:.2f} MB (generated, seed {args.seed}, capped at "
            f"{args.max_chars} chars), dealt into {args.blocks} collections"
        )
        print(f"model: {model} ({os.path.getsize(model) / 1e6:.1f} MB)")
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        print(code_line(), flush=True)

        daemon = Daemon(env)
        t0 = time.perf_counter()
        for d in dirs:
            env.cli("collection", "add", str(d), "--name", d.name)
        index_s = time.perf_counter() - t0
        env.cli("collection", "add", str(warm), "--name", "warm")
        warm_s, r = env.cli("embed", "-c", "warm")
        inference = daemon.http.get("/v1/status").raise_for_status().json()["inference"]
        threads, worker_pid = int(inference["n_threads"]), int(inference["pid"])
        print(
            f"indexed in {index_s:.1f}s; warm-up 'qmd embed -c warm' (worker start + model load + 1 chunk) "
            f"{warm_s:.2f}s; the daemon's worker runs {threads} threads",
            flush=True,
        )

        # The chunks, before any round, by the worker's own chunker (the daemon's, checked
        # after every qmd pass): a round that starts with the bare loop needs them.
        worker = WorkerSide(model, threads)
        bodies: dict[str, list[str]] = {}
        texts: dict[str, list[str]] = {}
        for name in names:
            bodies[name], _ = read_index(env.db, name)
            texts[name] = worker.chunk_texts(bodies[name])
        n = sum(len(t) for t in texts.values())
        bare = Bare(model, threads)

        passes: list[dict] = []
        stored: dict[str, list[bytes]] = {}
        bare_vecs: dict[str, list[list[float]]] = {}
        inc: dict = {}
        for rnd in range(1, args.rounds + 1):
            for k, name in enumerate(names):
                order = ["qmd", "worker", "bare"] if (rnd + k) % 2 else ["bare", "worker", "qmd"]
                for pos, side in enumerate(order):
                    rec: dict = {"round": rnd, "block": name, "side": side, "position": pos + 1}
                    if side == "qmd":
                        cmd = ["embed", "-c", name] + (["-f"] if rnd > 1 else [])
                        d0, w0, k0 = proc_cpu_s(daemon.pid), proc_cpu_s(worker_pid), children_cpu_s()
                        win = CpuWindow()
                        wall, r = env.cli(*cmd)
                        win.stop()
                        d1, w1, k1 = proc_cpu_s(daemon.pid), proc_cpu_s(worker_pid), children_cpu_s()
                        rep = parse_report(r.stdout)
                        _, chunks = read_index(env.db, name)
                        if [c[0] for c in chunks] != texts[name]:
                            raise RuntimeError(f"the daemon embedded other chunks than the worker's chunker in {name}")
                        if rnd == 1:
                            stored[name] = [c[1] for c in chunks]
                        cpu = {
                            "daemon_cpu_s": d1 - d0 if d0 is not None and d1 is not None else 0.0,
                            "worker_cpu_s": w1 - w0 if w0 is not None and w1 is not None else 0.0,
                            "cli_cpu_s": k1 - k0,
                        }
                        rec.update(
                            command="qmd " + " ".join(cmd),
                            chunks=rep["chunks"],
                            wall_s=wall,
                            server_s=rep["server_s"],
                            **cpu,
                            **win.others(sum(cpu.values())),
                        )
                    elif side == "worker":
                        win = CpuWindow()
                        res = worker.run(bodies[name], texts[name])
                        win.stop()
                        rec.update(res, **win.others(res["ours_cpu_s"]))
                    else:
                        win = CpuWindow()
                        wall, cpu, vecs = bare.run(texts[name])
                        win.stop()
                        if rnd == 1:
                            bare_vecs[name] = vecs
                        rec.update(chunks=len(texts[name]), wall_s=wall, cpu_s=cpu, **win.others(cpu))
                    rec["capacity_s"] = win.seconds * (os.cpu_count() or 1)
                    passes.append(rec)
            print(f"round {rnd} done", flush=True)
            if rnd == 1:  # everything is embedded now: the incremental run has nothing to do
                win = CpuWindow()
                inc_s, r = env.cli("embed")
                win.stop()
                inc = {"command": "qmd embed", "wall_s": round(inc_s, 3), **parse_report(r.stdout)}
        rss_worker = proc_status_kb(worker_pid, "VmRSS")
        rss_daemon = proc_status_kb(daemon.pid, "VmRSS")
        daemon.stop()
        daemon = None

        # -- report ---------------------------------------------------------------------
        all_texts = [t for name in names for t in texts[name]]
        tok = [len(bare.llm.tokenize(t.encode("utf-8", "replace"), add_bos=True, special=False)) for t in all_texts]
        lo, mean = cosine_check(
            [v for name in names for v in stored[name]], [v for name in names for v in bare_vecs[name]]
        )
        print()
        print(
            f"{n} chunks from {stats.files} documents: mean {statistics.fmean(len(t) for t in all_texts):.0f} "
            f"chars, {statistics.fmean(tok):.0f} tokens (max {max(tok)}); the daemon's stored vectors vs the bare "
            f"loop's: cosine min {lo:.4f}, mean {mean:.4f}"
        )
        agg = aggregate(passes, args.rounds)
        rows = []
        for rnd in range(1, args.rounds + 1):
            a = agg[rnd]
            b = a["bare"]["chunks_per_s"]
            rows += [
                [
                    f"round {rnd}",
                    "qmd embed (CLI wall)",
                    a["qmd"]["wall_s"],
                    a["qmd"]["chunks_per_s"],
                    a["qmd"]["chunks_per_s"] / b,
                    a["qmd"]["others_share"],
                ],
                [
                    "",
                    "qmd embed (daemon report)",
                    a["qmd"]["server_s"],
                    a["qmd"]["server_chunks_per_s"],
                    a["qmd"]["server_chunks_per_s"] / b,
                    None,
                ],
                [
                    "",
                    "worker: chunk + embed",
                    a["worker"]["wall_s"],
                    a["worker"]["chunks_per_s"],
                    a["worker"]["chunks_per_s"] / b,
                    a["worker"]["others_share"],
                ],
                [
                    "",
                    "worker: embed only",
                    a["worker"]["embed_s"],
                    a["worker"]["embed_chunks_per_s"],
                    a["worker"]["embed_chunks_per_s"] / b,
                    None,
                ],
                ["", "bare llama-cpp-python loop", a["bare"]["wall_s"], b, 1.0, a["bare"]["others_share"]],
            ]
        a = agg["all"]
        b = a["bare"]["chunks_per_s"]
        ratio = {
            "qmd_wall": round(a["qmd"]["chunks_per_s"] / b, 3),
            "qmd_server": round(a["qmd"]["server_chunks_per_s"] / b, 3),
            "worker": round(a["worker"]["chunks_per_s"] / b, 3),
            "worker_embed_only": round(a["worker"]["embed_chunks_per_s"] / b, 3),
        }
        rows += [
            [
                "all rounds",
                "qmd embed (CLI wall)",
                a["qmd"]["wall_s"],
                a["qmd"]["chunks_per_s"],
                ratio["qmd_wall"],
                a["qmd"]["others_share"],
            ],
            [
                "",
                "qmd embed (daemon report)",
                a["qmd"]["server_s"],
                a["qmd"]["server_chunks_per_s"],
                ratio["qmd_server"],
                None,
            ],
            [
                "",
                "worker: chunk + embed",
                a["worker"]["wall_s"],
                a["worker"]["chunks_per_s"],
                ratio["worker"],
                a["worker"]["others_share"],
            ],
            ["", "bare llama-cpp-python loop", a["bare"]["wall_s"], b, 1.0, a["bare"]["others_share"]],
        ]
        print()
        print(
            table(
                ["", "run", "s", "chunks/s", "ratio", "others"],
                rows,
                title=(
                    f"Embedding {n} chunks in {args.blocks} blocks x {args.rounds} rounds, {threads} threads "
                    "(ratio = chunks/s / bare chunks/s; others = CPU share other processes used meanwhile)"
                ),
                formats=[None, None, ".2f", ".1f", ".3f", ".0%"],
            )
        )
        print(
            f"\nqmd embed / bare loop: {ratio['qmd_wall']:.3f} (CLI wall), {ratio['qmd_server']:.3f} (daemon "
            "report); goal >= 0.95"
        )
        print()
        print(table(["where a qmd embed goes (all rounds)", "s", "share"], breakdown(a), formats=[None, ".2f", ".0%"]))
        print()
        print(
            table(
                ["CPU s (all rounds)", "qmd: daemon", "qmd: worker", "qmd: CLI", "worker alone", "bare loop"],
                [
                    [
                        "",
                        a["qmd"]["daemon_cpu_s"],
                        a["qmd"]["worker_cpu_s"],
                        a["qmd"]["cli_cpu_s"],
                        a["worker"]["ours_cpu_s"],
                        a["bare"]["cpu_s"],
                    ]
                ],
                formats=[None, ".2f", ".2f", ".2f", ".2f", ".2f"],
            )
        )
        print(
            f"\nstart-up: bare 'import llama_cpp' {bare.import_s:.2f}s + load {bare.load_s:.3f}s; in-process "
            f"Worker start + load + 1 embed {worker.start_s:.2f}s; 'qmd embed -c warm' (the same through the "
            f"daemon and the CLI) {warm_s:.2f}s"
        )
        print(
            f"incremental 'qmd embed' after round 1 (nothing to embed): {inc['wall_s'] * 1000:.0f} ms wall, daemon "
            f"report {inc['server_s']:.1f}s, {inc['chunks']} chunks written, {inc['pending']} pending"
        )
        print(f"RSS at the end: daemon {mb(rss_daemon)} MB, its inference worker {mb(rss_worker)} MB")
        disturbed = sorted(
            {f"round {p['round']} {p['side']}" for p in passes if (p["others_share"] or 0) > 0.1},
        )
        if disturbed:
            print(
                f"warning: other processes used over 10% of the machine during a pass of {', '.join(disturbed)}: "
                "compare those figures with care, or run again on a quiet machine."
            )

        result = {
            "machine": machine(),
            "model": {"path": model, "bytes": os.path.getsize(model)},
            "corpus": {
                "files": stats.files,
                "mb": round(stats.bytes / 1e6, 3),
                "max_chars": args.max_chars,
                "seed": args.seed,
                "blocks": args.blocks,
            },
            "chunks": {
                "count": n,
                "mean_chars": round(statistics.fmean(len(t) for t in all_texts), 1),
                "mean_tokens": round(statistics.fmean(tok), 1),
                "max_tokens": max(tok),
            },
            "cosine_qmd_vs_bare": {"min": round(lo, 5), "mean": round(mean, 5)},
            "n_threads": threads,
            "index_s": round(index_s, 2),
            "warmup_cli_s": round(warm_s, 3),
            "worker_start_s": round(worker.start_s, 3),
            "bare_import_s": round(bare.import_s, 3),
            "bare_load_s": round(bare.load_s, 3),
            "ratio": ratio,
            "rounds": {str(k): v for k, v in agg.items()},
            "passes": [{k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()} for p in passes],
            "incremental": inc,
            "rss_mb": {"daemon": mb(rss_daemon), "worker": mb(rss_worker)},
            "disturbed": disturbed,
        }
        path = write_json("embed", result)
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
        if args.keep:
            print(f"kept {env.base}")
    finally:
        if daemon is not None:
            daemon.stop()
        if worker is not None:
            worker.close()
        env.cleanup()
    return 0


SUMMED = (
    "chunks",
    "wall_s",
    "server_s",
    "chunk_s",
    "embed_s",
    "cpu_s",
    "daemon_cpu_s",
    "worker_cpu_s",
    "cli_cpu_s",
    "ours_cpu_s",
    "others_cpu_s",
    "capacity_s",
)


def aggregate(passes: list[dict], rounds: int) -> dict:
    """Per round and over all rounds, per side: the passes' sums, then rates and shares."""
    out: dict = {}
    for key in [*range(1, rounds + 1), "all"]:
        out[key] = {}
        for side in ("qmd", "worker", "bare"):
            ps = [p for p in passes if p["side"] == side and key in (p["round"], "all")]
            a = {f: sum(p.get(f) or 0.0 for p in ps) for f in SUMMED if any(f in p for p in ps)}
            a["chunks_per_s"] = a["chunks"] / a["wall_s"]
            if "server_s" in a:
                a["server_chunks_per_s"] = a["chunks"] / a["server_s"]
            if "embed_s" in a:
                a["embed_chunks_per_s"] = a["chunks"] / a["embed_s"]
            a["others_share"] = a["others_cpu_s"] / a["capacity_s"] if a.get("capacity_s") else None
            out[key][side] = {k: round(v, 3) if isinstance(v, float) else v for k, v in a.items()}
    return out


def breakdown(a: dict) -> list[list]:
    """qmd's CLI wall split into what the bare loop does, what the worker adds (its
    protocol, chunking), and what the daemon and the CLI add on top."""
    q, server = a["qmd"]["wall_s"], a["qmd"]["server_s"]
    w_chunk, w_embed, bare = a["worker"]["chunk_s"], a["worker"]["embed_s"], a["bare"]["wall_s"]
    parts = [
        ["bare embed() loop over the same chunks", bare],
        ["+ worker embed beyond bare (pickle, pipe, its decode loop)", w_embed - bare],
        ["+ chunking in the worker (the chunker's token counts)", w_chunk],
        ["+ daemon beyond the worker (SQLite writes, job, partitions)", server - w_embed - w_chunk],
        ["+ CLI beyond the daemon's report (start-up, HTTP, output)", q - server],
    ]
    return [*([name, s, s / q] for name, s in parts), ["= qmd embed, CLI wall", q, 1.0]]


if __name__ == "__main__":
    sys.exit(main())
