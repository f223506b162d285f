"""`.env.example` lists every variable of the README's production table, and nothing the table lacks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_variables() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| variable | required | meaning |") : readme.index("Development-only:")]
    names: set[str] = set()
    for line in table.splitlines()[2:]:
        first_cell = line.split("|")[1] if line.startswith("|") else ""
        names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def _example_variables() -> set[str]:
    text = (ROOT / ".env.example").read_text()
    return set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", text, re.M))


def test_env_example_and_the_readme_table_name_the_same_variables() -> None:
    readme, example = _readme_variables(), _example_variables()
    assert len(readme) > 60
    assert readme - example == set(), "in the README table but not in .env.example"
    assert example - readme == set(), "in .env.example but not in the README table"
