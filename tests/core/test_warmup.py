"""core.warmup: a new server process imports its request path before it serves, and starts even when the
cache cannot be reached."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from core.warmup import request_path_warm, startup_objects_freeze

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter set up as a server process is (django.setup(), nothing requested yet): which view
# modules are loaded before and after the warm-up.
CHECK = """
import os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
os.environ.pop("DATABASE_URL", None)
import django
django.setup()
views = ("broker.api.buyer", "broker.api.operator", "federation.api.views", "metering.api.payments")
print(sum(name in sys.modules for name in views))
from core.warmup import request_path_warm, startup_objects_freeze
request_path_warm()
print(sum(name in sys.modules for name in views))
"""


def test_the_warm_up_imports_every_view_a_first_request_would() -> None:
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "4"]


@override_settings(
    CACHES={
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
)
def test_an_unreachable_cache_is_logged_and_the_process_still_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="core.warmup"):
        request_path_warm()
    assert "warming the cache client failed" in caplog.text


def test_the_objects_loaded_at_start_are_left_out_of_full_collections() -> None:
    import gc

    held: list[object] = [["loaded at start"]]  # a container the collector tracks, alive for the test
    try:
        startup_objects_freeze()
        assert gc.get_freeze_count() > 1_000  # the modules, classes and settings a set-up process holds
        gc.collect()
        # A full collection neither walks nor thaws it: it stays in the permanent generation, outside the
        # generations a collection examines. (The frozen count itself may drop by a few: frozen objects are
        # still freed when their last reference goes, which a collection's finalisers can cause.)
        assert gc.is_tracked(held)
        assert not any(obj is held for obj in gc.get_objects())
        gc.unfreeze()
        assert any(obj is held for obj in gc.get_objects())  # the check above can fail
    finally:
        gc.unfreeze()
