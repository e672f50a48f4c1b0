"""Text handling both the ingest and the search side need, on the ground floor: chunking
(markdown break points and code cut at its syntax), CJK normalisation, frontmatter, pages.
Pure functions over strings: no database, no model, no I/O."""
