"""Adversarial fixtures: a small valid bundle (no compiler needed) published in a mirror."""

from __future__ import annotations

import os

import pytest

from tests.adversarial.hostile import published, tiny_bundle


@pytest.fixture
def honest(tmp_path):
    """A bundle of 64 KiB of random bytes (room for hostile archives padded to its size),
    published: (mirror, catalog sha256, catalog entry, archive)."""
    archive = tiny_bundle(tmp_path, {"lib/x.so": os.urandom(64 * 1024)})
    mirror, catalog_sha, entry = published(tmp_path, archive)
    return mirror, catalog_sha, entry, archive
