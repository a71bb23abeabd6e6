"""write_kv, copy_pages and swap_pages of the torch reference backend."""

import pytest
import torch

from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.torch_backend import host_runs
from tests.devices import DEVICES

PAGE_SHAPE = (4, 2, 3)  # page_size, num_kv_heads, head_dim


def _cache(num_pages, fill=0.0):
    return torch.full((num_pages, *PAGE_SHAPE), fill)


def test_write_kv_stores_each_token_at_its_slot():
    meta = AttentionMetadata.build(
        block_tables=[[5, 2], [0]], seq_lens=[6, 3], query_lens=[3, 1], page_size=4
    )
    key = torch.randn(4, 2, 3)
    value = torch.randn(4, 2, 3)
    k_cache, v_cache = _cache(6), _cache(6)
    get_backend("torch").write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    # seq 0 writes positions 3, 4, 5: page 5 offset 3, page 2 offsets 0 and 1; seq 1 position 2
    torch.testing.assert_close(k_cache[5, 3], key[0], rtol=0, atol=0)
    torch.testing.assert_close(k_cache[2, :2], key[1:3], rtol=0, atol=0)
    torch.testing.assert_close(v_cache[0, 2], value[3], rtol=0, atol=0)
    assert int((k_cache != 0).any(dim=(2, 3)).sum()) == 4


def test_write_kv_skips_slots_marked_minus_one():
    key = torch.ones(3, 2, 3)
    k_cache, v_cache = _cache(2), _cache(2)
    slots = torch.tensor([1, -1, 6])
    get_backend("torch").write_kv(key, key * 2, k_cache, v_cache, slots)
    written = (k_cache.view(8, 2, 3) != 0).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert written == [1, 6]
    assert bool((v_cache.view(8, 2, 3)[[1, 6]] == 2).all())


def test_copy_pages_copies_sources_to_destinations_and_nothing_else():
    k_cache, v_cache = torch.randn(5, *PAGE_SHAPE), torch.randn(5, *PAGE_SHAPE)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    get_backend("torch").copy_pages(k_cache, v_cache, torch.tensor([[0, 3], [4, 1]]))
    assert torch.equal(k_cache[3], k_before[0]) and torch.equal(v_cache[1], v_before[4])
    for page in (0, 2, 4):
        assert torch.equal(k_cache[page], k_before[page])


def test_copy_pages_reads_every_source_before_writing():
    # a chain 0 -> 1 -> 2: page 2 must receive page 1's old content, not page 0's
    k_cache, v_cache = torch.randn(3, *PAGE_SHAPE), torch.randn(3, *PAGE_SHAPE)
    k_before = k_cache.clone()
    get_backend("torch").copy_pages(k_cache, v_cache, torch.tensor([[0, 1], [1, 2]]))
    assert torch.equal(k_cache[1], k_before[0]) and torch.equal(k_cache[2], k_before[1])


def test_swap_out_then_in_restores_pages_bit_exact():
    backend = get_backend("torch")
    dev_k, dev_v = torch.randn(6, *PAGE_SHAPE), torch.randn(6, *PAGE_SHAPE)
    host_k, host_v = _cache(4), _cache(4)
    original_k, original_v = dev_k[[1, 4]].clone(), dev_v[[1, 4]].clone()
    backend.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[1, 3], [4, 0]]))
    dev_k[[1, 4]] = 0
    dev_v[[1, 4]] = 0
    backend.swap_pages(host_k, host_v, dev_k, dev_v, torch.tensor([[3, 5], [0, 2]]))
    assert torch.equal(dev_k[[5, 2]], original_k) and torch.equal(dev_v[[5, 2]], original_v)


@pytest.mark.parametrize("device", DEVICES)
def test_swap_between_device_and_host_by_runs_and_scattered_is_bit_exact(device):
    backend = get_backend("torch")
    dev_k = torch.randn(12, *PAGE_SHAPE, device=device)
    dev_v = torch.randn(12, *PAGE_SHAPE, device=device)
    pin = device != "cpu"
    host_k = torch.zeros(10, *PAGE_SHAPE, pin_memory=pin)
    host_v = torch.zeros(10, *PAGE_SHAPE, pin_memory=pin)
    # host pages in two runs and two strays; device pages scattered
    out = torch.tensor([[7, 2], [0, 3], [11, 4], [5, 9], [3, 0], [8, 6], [1, 7]])
    backend.swap_pages(dev_k, dev_v, host_k, host_v, out)
    for dev, host in ((dev_k, host_k), (dev_v, host_v)):
        assert torch.equal(host[out[:, 1]], dev[out[:, 0].to(device)].cpu())
        assert not host[[1, 5, 8]].any()  # pages no pair names keep what they held
    back = torch.stack([out[:, 1], torch.tensor([10, 4, 6, 2, 1, 9, 0])], 1)
    backend.swap_pages(host_k, host_v, dev_k, dev_v, back)
    for dev, host in ((dev_k, host_k), (dev_v, host_v)):
        assert torch.equal(dev[back[:, 1].to(device)].cpu(), host[back[:, 0]])


def test_host_runs_cover_each_host_page_once_in_order():
    pages = [5, 6, 7, 2, 3, 9, 0, 1]
    runs = host_runs(pages)
    assert runs == [(5, 0, 3), (2, 3, 2), (9, 5, 1), (0, 6, 2)]
    assert [first + k for first, _, count in runs for k in range(count)] == pages
    assert [start + k for _, start, count in runs for k in range(count)] == list(range(8))
    assert host_runs([]) == []
