"""The docs are a site that builds strictly, and they keep up with the code: the CLI
reference is the commands' own `--help`, every `QMD_*` variable the code reads is in the
configuration table, and the README's links into docs/ land (on GitHub too)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))

import gen_cli  # noqa: E402

CODE = ("qmd", "server", "client", "mcp_bridge", "tests", "bench")
VARIABLE = re.compile(r"\bQMD_[A-Z0-9_]*[A-Z0-9]\b")


def test_site_builds_strictly(tmp_path: Path) -> None:
    """`--strict` makes every warning fatal: a link to a missing page or anchor fails."""
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml")]
        + ["--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_cli_reference_is_current() -> None:
    assert gen_cli.PAGE.read_text() == gen_cli.render(), (
        "docs/reference/cli.md differs from the commands' --help: run .venv/bin/python docs/gen_cli.py"
    )


def test_cli_reference_covers_every_command() -> None:
    """Subcommands included: a command added to a group gets its own section."""
    headings = set(re.findall(r"^## (.+)$", gen_cli.PAGE.read_text(), re.M))
    assert {"qmd", "qmd collection add", "qmd daemon stop", "qmd index copy", "qmd trust revoke", "qmdd"} <= headings


def test_the_mcp_reference_names_every_parameter_of_every_tool() -> None:
    """docs/reference/mcp-tools.md has a section per tool and a row per parameter, with the
    default the tool's schema gives where it gives one."""
    from qmd.server.http.mcp import TOOLS

    page = (DOCS / "reference" / "mcp-tools.md").read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    for name, spec in TOOLS.items():
        assert name in sections, f"docs/reference/mcp-tools.md has no section for the '{name}' tool"
        rows = {
            param: row
            for row in re.findall(r"^\| (`.*)$", sections[name], re.M)
            for param in re.findall(r"`(\w+)`", row.split(" | ")[0])
        }
        for param, schema in (spec.definition.input_schema or {}).get("properties", {}).items():
            assert param in rows, f"the '{name}' tool's '{param}' has no row in docs/reference/mcp-tools.md"
            default = schema.get("default")
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                given = re.findall(r"[\d.]+", rows[param].split(" | ")[1])  # "50, 0" for a row of two
                assert f"{default:g}" in given, f"'{name}' '{param}': the schema's default is {default:g}"


def code_variables() -> set[str]:
    found: set[str] = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            found |= set(VARIABLE.findall(path.read_text()))
    return found


def test_every_qmd_variable_is_in_the_configuration_table() -> None:
    """One table names them all, and no row outlives its variable."""
    table = set(re.findall(r"^\| `(QMD_[A-Z0-9_]+)` \|", (DOCS / "configuration.md").read_text(), re.M))
    code = code_variables()
    assert not code - table, f"read by the code but not in docs/configuration.md: {sorted(code - table)}"
    assert not table - code, f"in docs/configuration.md but read nowhere: {sorted(table - code)}"


def slug(heading: str) -> str:
    """The anchor mkdocs (and GitHub, for these headings) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)


def test_readme_links_into_docs_land() -> None:
    """Relative links, so they work on GitHub as in a checkout; each names a page that
    exists and, with `#`, a heading it has."""
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links into docs/"
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert not path.startswith("/") and target.is_file(), f"README.md links to {link}, which is not a file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"README.md links to {link}: no such heading"


def test_every_section_the_code_cites_has_its_heading() -> None:
    """`§7.1` in a comment lands on `## §7.1 …` of docs/design/original.md, the page that
    says what qmd keeps from the original's behaviour and what it changes."""
    cited: set[str] = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for m in re.finditer(r"(README(?:\.md)?|RFC \d+)?\s?§(\d+(?:\.\d+)*)", path.read_text()):
                if not m.group(1):  # the models README's and RFCs' sections are theirs
                    cited.add(m.group(2))
    headings = set(re.findall(r"^## §(\d+(?:\.\d+)*) ", (DOCS / "design" / "original.md").read_text(), re.M))
    assert cited, "the code cites the original's sections"
    assert not cited - headings, f"cited in the code, no heading in docs/design/original.md: {sorted(cited - headings)}"


def code_defaults() -> dict[str, float]:
    """Each variable's default where the code reads it as `("QMD_…", DEFAULT` (a number, or a
    module constant set to one in the same file)."""
    found: dict[str, float] = {}
    for folder in ("qmd", "server"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            constants = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)(?:: [^=\n]+)? = ([0-9][0-9_.]*)\s*$", text, re.M))
            for var, value in re.findall(r"\"(QMD_[A-Z0-9_]+)\", ([A-Z0-9_.]+)\b", text):
                number = constants.get(value, value).replace("_", "")
                if re.fullmatch(r"[0-9]+(\.[0-9]+)?", number):
                    found[var] = float(number)
    return found


def test_the_defaults_the_configuration_table_quotes_are_the_codes() -> None:
    rows = re.findall(
        r"^\| `(QMD_[A-Z0-9_]+)` \| [^|]+ \| `([0-9][0-9_.]*)` \|", (DOCS / "configuration.md").read_text(), re.M
    )
    code = code_defaults()
    checked = {var: float(value) for var, value in rows if var in code}
    assert len(checked) >= 8, f"too few defaults found to check: {checked}"
    wrong = {var: (quoted, code[var]) for var, quoted in checked.items() if quoted != code[var]}
    assert not wrong, f"docs/configuration.md quotes (documented, code) defaults that differ: {wrong}"
