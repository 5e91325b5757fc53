"""The model's large CPU tensors on 2 MB pages: where, and that nothing else changes."""
import os
import platform
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.model import huge_pages
from engine.model.huge_pages import HUGE_PAGE, collapse, covering_pages, on_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_covering_pages_are_whole_2mb_pages_each_once():
    spans = [(HUGE_PAGE + 100, 10), (HUGE_PAGE + 5000, HUGE_PAGE), (5 * HUGE_PAGE, 1)]
    assert covering_pages(spans) == [HUGE_PAGE, 2 * HUGE_PAGE, 5 * HUGE_PAGE]
    assert covering_pages([]) == []


def _thp_refused() -> str | None:
    """Why this machine cannot put memory on huge pages (None: it can)."""
    if not sys.platform.startswith("linux") or not THP.exists():
        return "no transparent huge pages here"
    if "[never]" in THP.read_text():
        return "transparent huge pages are off"
    release = re.match(r"(\d+)\.(\d+)", platform.release())
    if release is None or (int(release[1]), int(release[2])) < (6, 1):
        return "MADV_COLLAPSE came in Linux 6.1"
    return None


def test_a_models_weights_move_onto_huge_pages_with_the_same_values_and_addresses():
    model = nn.Linear(1024, 4096)  # 16 MB of fp32 weights
    with torch.no_grad():
        model.weight.copy_(torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0)))
    before, address = model.weight.clone(), model.weight.data_ptr()
    moved = collapse(model)
    assert torch.equal(model.weight, before) and model.weight.data_ptr() == address
    if (why := _thp_refused()) is not None:
        pytest.skip(why)
    assert moved >= 6 * HUGE_PAGE  # the weights' 16 MB hold at least 6 whole pages of 2 MB
    assert on_huge_pages(model.weight) >= 6 * HUGE_PAGE


def test_without_madvise_nothing_moves(monkeypatch):
    monkeypatch.setattr(huge_pages, "_madvise", lambda: None)
    assert collapse(nn.Linear(1024, 4096)) == 0


def test_the_load_does_not_wait_for_the_move(monkeypatch):
    """collapse_soon returns at once; the move happens on its own thread, at the lowest priority."""
    import threading
    started, release, seen = threading.Event(), threading.Event(), {}

    def slow(model):
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        started.set()
        release.wait(10)
        return 0
    monkeypatch.setattr(huge_pages, "collapse", slow)
    thread = huge_pages.collapse_soon(torch.nn.Linear(4, 4))
    assert started.wait(10) and thread.is_alive()  # running, and collapse_soon has returned
    release.set()
    thread.join(10)
    assert seen["nice"] == 19
