"""TieredSequence.append_heads_first / attend_heads_first: transformers' [heads, n, head_dim]
views of one batch row, read where they lie (no copy), give what append / attend give on
contiguous [n, heads, head_dim] copies, bit for bit: outputs, position mass, scores and tiers,
over randomized layouts (the layout transformers' projections leave, contiguous heads-first,
sliced for left padding, GQA), windows and softcaps, with pages leaving T0. Bad views are
refused naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvtier

L = 2


def open_sequence(h: int, kvh: int, d: int, prompt: int = 20):
    runtime = kvtier.Runtime(L, h, kvh, d, d**-0.5, page_tokens=4, arena_bytes=64 << 20,
                             ddr_bytes=16 << 20, compressed_bytes=8 << 20)
    return runtime, runtime.open(policy="hierarchy", prompt_tokens=prompt, hbm_ratio=0.3,
                                 window_tokens=4, sink_tokens=0, protect_prompt=False,
                                 retier_interval=3)


def heads_first(gen: torch.Generator, heads: int, n: int, d: int, layout: str) -> torch.Tensor:
    """A [heads, n, d] float32 view in one of the layouts transformers hands the attention."""
    if layout == "projected":  # view(b, n, h, d).transpose(1, 2), what q/k/v_proj leave
        return torch.randn((1, n, heads, d), generator=gen).transpose(1, 2)[0]
    if layout == "contiguous":  # e.g. after torch.cat (partial rotary)
        return torch.randn((1, heads, n, d), generator=gen)[0]
    if layout == "padded":  # a left-padded row: its real positions are a slice of a longer call
        return torch.randn((1, n + 3, heads, d), generator=gen).transpose(1, 2)[0, :, 3:]
    if layout == "wide":  # a view into a wider tensor: gaps between heads and between tokens
        return torch.randn((1, heads, n, d + 8), generator=gen)[0, :, :, 4:4 + d]
    raise AssertionError(layout)


LAYOUTS = ("projected", "contiguous", "padded", "wide")


@pytest.mark.parametrize("seed", range(6))
def test_heads_first_is_bit_identical_to_contiguous_copies(seed):
    rng = np.random.default_rng(seed)
    kvh = int(rng.choice([1, 2, 3]))
    h = kvh * int(rng.choice([1, 3]))
    d = int(rng.choice([8, 16, 24, 64]))
    window = int(rng.choice([0, 7]))
    softcap = float(rng.choice([0.0, 3.0]))
    gen = torch.Generator().manual_seed(seed)
    sizes = [int(rng.integers(20, 40))] + [1] * 12 + [5]
    _, old = open_sequence(h, kvh, d, sizes[0])
    _, new = open_sequence(h, kvh, d, sizes[0])
    seen_strided = False
    for step, n in enumerate(sizes):
        for layer in range(L):
            layouts = [LAYOUTS[int(i)] for i in rng.integers(0, len(LAYOUTS), 3)]
            k = heads_first(gen, kvh, n, d, layouts[0])
            v = heads_first(gen, kvh, n, d, layouts[1])
            q = heads_first(gen, h, n, d, layouts[2])
            seen_strided |= not q.transpose(0, 1).is_contiguous()
            # The old path: contiguous [n, heads, head_dim] copies.
            old.append(layer, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
            new.append_heads_first(layer, k, v)
            out_old = torch.full((n, h, d), float("nan"))
            out_new = torch.full((n, h, d), float("nan"))
            mass_old = np.full(old.length(layer), np.nan, dtype=np.float32)
            mass_new = np.full(new.length(layer), np.nan, dtype=np.float32)
            old.attend(layer, q.transpose(0, 1).contiguous(), out_old, mass_old, window=window,
                       softcap=softcap)
            new.attend_heads_first(layer, q, out_new, mass_new, window=window, softcap=softcap)
            assert torch.equal(out_old, out_new), (step, layer, layouts)
            assert np.array_equal(mass_old, mass_new), (step, layer, layouts)
        assert np.array_equal(old.scores(), new.scores()), step
        assert np.array_equal(old.tiers(), new.tiers()), step
    assert seen_strided
    assert (new.tiers() == kvtier.T1).sum() > 0, "no page left T0: the tiered read was not tried"


def test_bad_views_are_refused_naming_the_argument():
    _, seq = open_sequence(6, 2, 16, 5)
    k = torch.zeros((2, 5, 16))
    with pytest.raises(ValueError, match=r"k: needs a float32 CPU array of shape \[2, n, 16\]"):
        seq.append_heads_first(0, torch.zeros((5, 2, 16)), k)
    with pytest.raises(ValueError, match="v: needs a float32"):
        seq.append_heads_first(0, k, k.to(torch.float64))
    with pytest.raises(ValueError, match="head_dim must be contiguous"):
        seq.append_heads_first(0, k, torch.zeros((2, 16, 5)).transpose(1, 2))
    with pytest.raises(ValueError, match="strides positive"):
        seq.append_heads_first(0, k, torch.zeros((1, 5, 16)).expand(2, 5, 16))
    with pytest.raises(ValueError, match="k has 5 tokens but v has 4"):
        seq.append_heads_first(0, k, torch.zeros((2, 4, 16)))
    assert seq.length(0) == 0  # nothing was stored
    seq.append_heads_first(0, k, k)
    with pytest.raises(ValueError, match=r"out: needs shape \[5, 6, 16\]"):
        seq.attend_heads_first(0, torch.zeros((6, 5, 16)), torch.zeros((6, 5, 16)))
