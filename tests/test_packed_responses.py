"""Padding-free logprob_spec: one row per distinct prompt holding its rows' responses. The layout by
hand, the rule that picks it, and its log-probs, entropies and gradients against the padded
path in float64 (SDPA and eager attention)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import randomise_lora_b
from numerics import GRADIENT_REL, VALUE_REL, assert_close, assert_same_gradients

from memalpha.lm.core import prompt_sharing
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.core.prompt_sharing import (
    SegmentLayout,
    packed_response_hidden,
    pad_prompt_response,
    worth_packing,
)
from memalpha.lm.logprobs import per_token
from memalpha.lm.logprobs.spec import LogprobSpec

SYSTEM = [11, 12, 13, 14, 15]
# two groups whose response lengths differ, one of them with an empty response, and a short prompt
PROMPTS = [SYSTEM + [20, 21]] * 3 + [SYSTEM + [30]] * 3
RESPONSES = [
    [100, 101, 102, 103, 104, 105, 106],
    [107],
    [108, 109, 2],
    [110, 111],
    [],
    [112, 113, 114, 115, 116, 117],
]


def test_worth_packing_by_hand():
    # per prompt 3+1 and 2+0 tokens: 2 rows x 4 = 8 tokens against 4 x 3 = 12; pairs 8 x 9 <= 12 x 8
    assert worth_packing([3, 1, 2, 0], [0, 0, 1, 1], cached=5)
    assert not worth_packing([3, 3], [0, 0], cached=5)  # 6 tokens either way
    assert not worth_packing([5, 4], [0, 0], cached=0)  # 9 < 10 tokens, but 9 x 9 pairs > 10 x 5
    assert worth_packing([5, 1], [0, 0], cached=20)  # 6 x 26 <= 10 x 25
    assert not worth_packing([0, 0], [0, 1], cached=3)


def test_segment_layout_by_hand():
    batch = pad_prompt_response([[1, 2, 3], [1, 2, 3], [7, 8]], [[10, 11, 12], [13], [14, 15]], pad_id=0)
    layout = SegmentLayout.build(batch, [0, 0, 1])
    # segments: [last prompt token, response without its last token]
    assert layout.input_ids.tolist() == [[3, 10, 11, 3], [8, 14, 0, 0]]
    assert layout.position_ids.tolist() == [[2, 3, 4, 2], [1, 2, 0, 0]]
    assert layout.order.tolist() == [0, 1, 2, 3, 4, 5]
    visible = layout.visible.int().tolist()
    # prompt 0 (columns 0-1 real), then segment a (3 tokens, causal) and segment b (1 token)
    assert visible[0] == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 1],
    ]
    # prompt 1 is left-padded by one column; its two padding queries see themselves only
    assert visible[1] == [
        [0, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]


@pytest.fixture(scope="module")
def policy64(tiny_model_dir):
    torch.manual_seed(0)
    model, tokenizer = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    randomise_lora_b(model, 0.2)
    return copy.deepcopy(model).to(torch.float64).eval(), tokenizer


def _scores_and_gradients(model, monkeypatch, packed: bool):
    used: list[bool] = []

    def counted(*args):
        rows = packed_response_hidden(*args) if packed else None
        used.append(rows is not None)
        return rows

    monkeypatch.setattr(prompt_sharing, "packed_response_hidden", counted)
    model.zero_grad(set_to_none=True)
    scores = per_token.token_scores(
        model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=6), with_entropy=True,
    )
    weights = torch.linspace(0.5, 2.0, scores.logprobs.shape[1], dtype=torch.float64)
    (scores.logprobs * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return scores, grads, used


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_scores_equal_the_padded_path(policy64, monkeypatch, attention):
    model, _ = policy64
    model.set_attn_implementation(attention)
    try:
        ours, our_grads, used = _scores_and_gradients(model, monkeypatch, packed=True)
        theirs, their_grads, _ = _scores_and_gradients(model, monkeypatch, packed=False)
    finally:
        model.set_attn_implementation("sdpa")
    assert used == [True]
    # eager attention takes its softmax in float32 even in a float64 model (numerics.py)
    rel = VALUE_REL if attention == "sdpa" else GRADIENT_REL
    assert_close(ours.logprobs, theirs.logprobs, rel, "log-probs")
    assert_close(ours.entropy, theirs.entropy, rel, "entropy")
    assert torch.all(ours.logprobs[4] == 0) and torch.all(ours.logprobs[1, 1:] == 0)
    # float32 softmax rounding reaches eager's float64 gradients at ~1e-6;
    # a wrong mask or position moves them by > 1e-3
    assert_same_gradients(our_grads, their_grads, GRADIENT_REL if attention == "sdpa" else 1e-5)
    assert any(g.abs().sum() > 0 for g in our_grads.values())


def test_the_padded_path_stays_when_packing_saves_nothing(policy64):
    model, _ = policy64
    batch = pad_prompt_response(PROMPTS[:2], [[5, 6, 7], [8, 9, 10]], pad_id=0)
    decoder = model.get_base_model().get_decoder()
    with torch.no_grad():
        assert packed_response_hidden(decoder, batch, PROMPTS[:2], None) is None
