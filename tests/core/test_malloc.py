"""glibc malloc tuning of the ``fedforge`` command (fedforge.core.malloc)."""

import platform
import sys

import pytest

from fedforge.core.malloc import keep_freed_memory


def test_off_switch(monkeypatch):
    monkeypatch.setenv("FEDFORGE_MALLOC_TUNING", "0")
    assert keep_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt tuning applies to Linux with glibc only")
def test_applies_on_glibc(monkeypatch):
    monkeypatch.delenv("FEDFORGE_MALLOC_TUNING", raising=False)
    assert keep_freed_memory() is True
