"""Every entry point runs with the production settings unless told otherwise, and production refuses to
start without its secrets: forgetting DJANGO_SETTINGS_MODULE never means DEBUG with a public key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "CELERY_"))}
    return subprocess.run(  # noqa: S603
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "code",
    [
        "import config.wsgi",
        "from config.celery_app import app; app.loader.import_default_modules()",
        "import sys; sys.argv = ['manage.py', 'check']; import manage; manage.main()",
    ],
    ids=["wsgi", "celery", "manage.py"],
)
def test_without_a_settings_module_entry_points_refuse_to_start(code: str) -> None:
    result = run(code)

    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr or "ImproperlyConfigured" in result.stderr, result.stderr


def test_asking_for_local_settings_still_works() -> None:
    result = run(
        "import config.wsgi; from django.conf import settings; print(settings.SETTINGS_MODULE, settings.DEBUG)",
        DJANGO_SETTINGS_MODULE="config.settings.local",
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["config.settings.local", "True"]
