"""Offline mirrors: one folder with wheels (PEP 503 index), environment manifests, bundle
catalogs and bundles, an inventory with every file's sha256, and a loopback server for it."""

from turbo_dllm.mirror.layout import MIRROR_FILE, MirrorIndex
from turbo_dllm.mirror.source import MirrorSource, open_mirror

__all__ = ["MIRROR_FILE", "MirrorIndex", "MirrorSource", "open_mirror"]
