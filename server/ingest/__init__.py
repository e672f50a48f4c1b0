"""The workshop: files → rows → vectors. The indexer walks a collection and writes what
changed, loaders turn a file's bytes into text, the embed job turns chunks into vectors,
upkeep prunes and vacuums, and the watcher keeps collections fresh as files change."""
