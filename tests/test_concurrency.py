"""Operations that race on one engine: a collection removed or renamed while an update
runs never leaves documents behind under its old name (issue 13, item 4)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import NOTES, write

from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.store import catalog


@pytest.mark.slow
@pytest.mark.parametrize("change", ["remove", "rename"])
def test_an_update_queued_behind_a_removal_does_not_bring_the_collection_back(tmp_path: Path, change: str) -> None:
    engine = Engine(IndexPaths("t", tmp_path / "index.sqlite", tmp_path / "index.yml", tmp_path))
    try:
        engine.create_collection(str(write(tmp_path / "big", NOTES)), name="big")
        engine.create_collection(str(write(tmp_path / "small", {"a.md": "# A\n\nalpha\n"})), name="small")
        engine.update()
        engine.set_collection("big", update_cmd="sleep 1")  # the first update is slow
        threads = [threading.Thread(target=engine.update)]
        threads[0].start()
        time.sleep(0.3)  # the update holds its lock, in the hook
        if change == "remove":
            threads.append(threading.Thread(target=engine.remove_collection, args=("small",)))
        else:
            threads.append(threading.Thread(target=engine.rename_collection, args=("small", "tiny")))
        threads[1].start()
        time.sleep(0.1)
        threads.append(threading.Thread(target=engine.update))  # queued while the change waits
        threads[2].start()
        for t in threads:
            t.join(timeout=30)
        with engine.store.read() as conn:
            states = catalog.collection_states(conn)
        assert states.get("small", catalog.CollectionState()).files == 0
        assert set(engine.config.collections) == ({"big"} if change == "remove" else {"big", "tiny"})
        if change == "rename":
            assert states["tiny"].files == 1
    finally:
        engine.close()
