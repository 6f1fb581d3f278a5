"""The saved-bytes harness excludes the model's parameters and buffers by storage address
(``hf_saved.PinnedStorages``). An address names a storage only while that storage lives: CTRL's forward replaces its
``pos_encoding`` buffer with a bf16 copy, the fp32 one is freed, and the allocator may hand its address to a tensor
autograd keeps, which was then excluded as if it were the buffer. One CI run measured ctrl-small 1 MiB short that way
(the loss's fp32 log-probabilities, 128 x 2,048 x 4 B); whether the address comes back depends on what the allocator
has free, so the loss is not reproducible on demand. Holding the storages keeps their addresses taken."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py)
import torch  # noqa: E402

pytestmark = pytest.mark.torch


def test_an_excluded_buffer_dropped_by_the_forward_stays_allocated():
    table = torch.full((4096,), 7.0)
    address = table.data_ptr()
    pinned = hf_saved.PinnedStorages([table])
    del table  # as CTRL's forward drops its fp32 pos_encoding
    fresh = [torch.zeros(4096) for _ in range(64)]  # what the allocator would hand a freed address to
    assert address in pinned
    assert all(t.data_ptr() != address for t in fresh)
    held = torch.empty(0).set_(pinned.storages[0])
    assert held.data_ptr() == address
    assert torch.equal(held, torch.full((4096,), 7.0))  # still the buffer's own values: nothing took its memory
