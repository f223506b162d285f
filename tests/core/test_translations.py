"""The translation check CI runs: every catalogue complete, compiled and current.

Catalogues: the project's (``locale/``, templates) and each app's (``<app>/locale/``, Python strings). For
each ``django.po``: ``msgfmt --check`` passes; no entry is untranslated or fuzzy; the committed ``.mo`` holds
exactly what the ``.po`` compiles to; and ``makemessages`` run over a copy of the sources would add no msgid
(a string marked for translation but never translated fails here, not in front of a Chinese reader). Django
merges every catalogue into one table per language, so one msgid translated two ways in two catalogues would
show whichever wins; that fails too.
"""

from __future__ import annotations

import ast
import gettext
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from django.conf import settings
from django.utils.translation import to_language
from django.utils.translation import trans_real as translation_trans_real

ROOT = Path(settings.BASE_DIR)
MSGFMT = shutil.which("msgfmt")
needs_msgfmt = pytest.mark.skipif(
    MSGFMT is None, reason="msgfmt (GNU gettext) is not installed; CI installs it (apt-get install gettext)"
)

# What makemessages reads (django domain: .py, .html, .txt) and where catalogues live; nothing else is copied.
_SOURCE_SUFFIXES = {".py", ".html", ".txt", ".po"}
_SKIPPED_DIRS = {"var", "node_modules", "__pycache__", "htmlcov"}


def catalogues() -> list[Path]:
    """Every committed django.po: the project's and the apps'."""
    found = sorted(ROOT.glob("locale/*/LC_MESSAGES/django.po")) + sorted(
        ROOT.glob("*/locale/*/LC_MESSAGES/django.po")
    )
    return [p for p in found if not p.relative_to(ROOT).parts[0].startswith(".")]


def _ids() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in catalogues()]


def po_entries(path: Path) -> dict[str, tuple[str, ...]]:
    """``{key: translations}`` of a .po file, obsolete entries left out. The key is the msgid (with its
    msgctxt before ``\\x04``, as gettext stores it); translations are msgstr or msgstr[0..n]."""
    entries: dict[str, tuple[str, ...]] = {}
    fields: dict[str, list[str]] = {}
    current = ""

    def flush() -> None:
        if "msgid" in fields:
            text = {k: "".join(ast.literal_eval(part) for part in v) for k, v in fields.items()}
            key = text["msgid"] if "msgctxt" not in text else f"{text['msgctxt']}\x04{text['msgid']}"
            strs = tuple(v for k, v in sorted(text.items()) if k.startswith("msgstr"))
            entries[key] = strs
        fields.clear()

    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if not line.strip():
            flush()
            current = ""
            continue
        if line.startswith("#"):
            continue
        match = re.match(r'^(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?)\s+(".*")$', line)
        if match:
            if match.group(1) in ("msgctxt", "msgid") and "msgstr" in "".join(fields):
                flush()
            current = match.group(1)
            fields[current] = [match.group(2)]
        elif line.startswith('"') and current:
            fields[current].append(line)
    return entries


def fuzzy_msgids(path: Path) -> list[str]:
    """Fuzzy entries, the header included (a fuzzy header makes msgfmt drop the plural forms)."""
    fuzzy, flagged = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#,") and "fuzzy" in line:
            flagged = True
        elif line.startswith("msgid ") and flagged:
            fuzzy.append(ast.literal_eval(line[6:]))
            flagged = False
        elif not line.startswith("#"):
            flagged = flagged and not line.startswith("msgid")
    return fuzzy


def _compile(po: Path, mo: Path) -> subprocess.CompletedProcess[str]:
    assert MSGFMT is not None
    return subprocess.run(  # noqa: S603 (fixed program, our own files)
        [MSGFMT, "--check", "--statistics", "-o", str(mo), str(po)], capture_output=True, text=True
    )


def _copy_sources(target: Path) -> None:
    """Copy what makemessages reads into ``target``, with settings that keep every catalogue it writes there.

    The project is installed editable, and its import hook finds ``config`` in the real tree before any
    copy: without ``LOCALE_PATHS`` pointed into the copy, makemessages would write templates' strings into
    the real ``locale/``."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIPPED_DIRS]
        relative = Path(dirpath).relative_to(ROOT)
        for name in filenames:
            if Path(name).suffix in _SOURCE_SUFFIXES:
                (target / relative).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(dirpath) / name, target / relative / name)
    (target / "i18n_check_settings.py").write_text(
        f"from config.settings.test import *  # noqa: F403\nLOCALE_PATHS = [{str(target / 'locale')!r}]\n"
    )


def _makemessages(copy: Path, *, cwd: Path, languages: list[str]) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "i18n_check_settings", "PYTHONPATH": str(copy)}
    result = subprocess.run(  # noqa: S603 (our own manage.py)
        [sys.executable, str(copy / "manage.py"), "makemessages", "--no-obsolete"]
        + [arg for language in languages for arg in ("-l", language)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


@cache
def regenerated(tmp_root: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """Run makemessages once over a copy of the sources (from its root, as a developer does: app strings
    go to their app's locale, templates to the project's) and return each catalogue's entries there."""
    copy = Path(tmp_root) / "src"
    _copy_sources(copy)
    _makemessages(copy, cwd=copy, languages=sorted({p.parts[-3] for p in catalogues()}))
    return {str(p.relative_to(ROOT)): po_entries(copy / p.relative_to(ROOT)) for p in catalogues()}


@pytest.fixture(scope="session")
def makemessages_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[str, ...]]]:
    return regenerated(str(tmp_path_factory.mktemp("makemessages")))


def test_there_are_catalogues_for_every_app_with_marked_strings() -> None:
    apps = {p.relative_to(ROOT).parts[0] for p in catalogues()}
    assert {"core", "federation", "metering", "broker"} <= apps


@needs_msgfmt
@pytest.mark.parametrize("relative", _ids())
def test_catalogue_compiles_with_no_untranslated_or_fuzzy_entry(relative: str, tmp_path: Path) -> None:
    po = ROOT / relative
    result = _compile(po, tmp_path / "django.mo")
    assert result.returncode == 0, result.stderr
    assert "fuzzy" not in result.stderr and "untranslated" not in result.stderr, result.stderr
    assert fuzzy_msgids(po) == []
    empty = [key for key, strs in po_entries(po).items() if key and not all(strs)]
    assert empty == []


@needs_msgfmt
@pytest.mark.parametrize("relative", _ids())
def test_committed_mo_is_the_compiled_po(relative: str, tmp_path: Path) -> None:
    po = ROOT / relative
    committed = po.with_suffix(".mo")
    assert committed.exists(), f"{committed.relative_to(ROOT)} is missing: run compilemessages and commit it"
    fresh = tmp_path / "django.mo"
    assert _compile(po, fresh).returncode == 0
    with committed.open("rb") as a, fresh.open("rb") as b:
        ours, theirs = gettext.GNUTranslations(a), gettext.GNUTranslations(b)
    assert ours._catalog == theirs._catalog, (  # type: ignore[attr-defined]
        f"{committed.relative_to(ROOT)} is stale: run compilemessages and commit it"
    )


@needs_msgfmt
@pytest.mark.parametrize("relative", _ids())
def test_makemessages_would_add_no_msgid(
    relative: str, makemessages_run: dict[str, dict[str, tuple[str, ...]]]
) -> None:
    committed = set(po_entries(ROOT / relative))
    extracted = set(makemessages_run[relative])
    new = sorted(extracted - committed)
    assert new == [], f"marked but not in {relative} (run makemessages, translate, compile): {new}"


def test_one_msgid_is_translated_one_way_across_catalogues() -> None:
    seen: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {}
    clashes = []
    for po in catalogues():
        language = po.parts[-3]
        for key, strs in po_entries(po).items():
            if not key:
                continue
            where = str(po.relative_to(ROOT))
            if (language, key) in seen and seen[language, key][0] != strs:
                other, other_where = seen[language, key]
                clashes.append(f"{key!r}: {other!r} in {other_where}, {strs!r} in {where}")
            seen.setdefault((language, key), (strs, where))
    assert clashes == []


def test_every_entry_is_served_as_translated() -> None:
    """What a reader gets is the merged catalogue: LOCALE_PATHS, then the apps in INSTALLED_APPS order (the
    first wins), then Django's own. A third-party app listed earlier with the same msgid (django_celery_beat's
    "Name" is 任务名) would silently replace ours."""
    wrong = []
    for po in catalogues():
        language = to_language(po.parts[-3])
        served = translation_trans_real.translation(language)._catalog  # type: ignore[attr-defined]
        for key, strs in po_entries(po).items():
            if not key:
                continue
            got = (
                tuple(served.get((key, i)) for i in range(len(strs)))
                if (key, 0) in served
                else (served.get(key),)
            )
            if got != strs:
                wrong.append(f"{po.relative_to(ROOT)}: {key!r} is served as {got!r}, not {strs!r}")
    assert wrong == []


def test_the_check_sees_a_newly_marked_string(tmp_path: Path) -> None:
    """The makemessages comparison is not vacuous: a string marked in a copy shows up as new, and the real
    tree is left alone."""
    if MSGFMT is None:
        pytest.skip("msgfmt (GNU gettext) is not installed")
    project_locale_before = sorted(ROOT.glob("locale/**/*"))
    copy = tmp_path / "src"
    _copy_sources(copy)
    marked = copy / "core" / "i18n_probe.py"
    marked.write_text(
        'from django.utils.translation import gettext as _\n\nPROBE = _("A string nobody translated")\n'
    )
    _makemessages(copy, cwd=copy / "core", languages=["zh_Hans"])
    regenerated_core = po_entries(copy / "core/locale/zh_Hans/LC_MESSAGES/django.po")
    committed_core = po_entries(ROOT / "core/locale/zh_Hans/LC_MESSAGES/django.po")
    assert set(regenerated_core) - set(committed_core) == {"A string nobody translated"}
    assert not (ROOT / "core" / "i18n_probe.py").exists()
    assert sorted(ROOT.glob("locale/**/*")) == project_locale_before
