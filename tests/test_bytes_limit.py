"""The bytes-read limit of a decoding step, checked against numbers worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memalpha_lab.bytes_limit import (
    StepShape,
    bandwidth_for,
    dense_weight_params,
    fraction_of_limit,
    kv_bytes_per_token,
    limit_record,
)

QWEN3_4B = SimpleNamespace(
    vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128,
)


def test_qwen3_4b_reads_147_kb_per_cached_token_and_8_gb_of_bf16_weights():
    assert kv_bytes_per_token(36, 8, 128, 2) == 36 * 8 * 128 * 2 * 2 == 147_456
    # per layer: q 2560x4096, k and v 2560x1024, o 4096x2560, gate/up/down 3x2560x9728; head 151936x2560
    per_layer = 10_485_760 + 2 * 2_621_440 + 10_485_760 + 74_711_040
    assert per_layer == 100_925_440
    assert dense_weight_params(QWEN3_4B) == 36 * per_layer + 388_956_160 == 4_022_272_000


def test_a_step_after_6144_token_prompts_on_an_h100():
    """8 rows whose caches hold 7,168 tokens on average (6,144 prompt + half of 2,048 new)."""
    shape = StepShape.of_config(QWEN3_4B, weight_dtype_bytes=2, kv_dtype_bytes=2, filled_tokens=7168, rows=8)
    assert shape.weight_bytes == 8_044_544_000
    assert shape.kv_bytes == 147_456 * 7168 * 8 == 8_455_716_864
    assert shape.bytes_read == 16_500_260_864
    assert shape.limit_s(3.35e12) == pytest.approx(4.92545e-3, rel=1e-5)
    # 900 tokens/s at 8 rows is 8.889 ms a step: 55 % of the limit
    assert fraction_of_limit(shape, 3.35e12, 8 / 900 * 1000) == pytest.approx(0.55412, rel=1e-4)
    record = limit_record(shape, 3.35e12, 8.0, "NVIDIA H100 80GB HBM3")
    assert record["fraction"] == pytest.approx(4.92545 / 8.0, rel=1e-5)
    assert record["limit_ms_per_step"] == pytest.approx(4.92545, rel=1e-5)
    assert record["rows"] == 8 and record["filled_tokens"] == 7168 and "bandwidth_Bps" in record["formula"]
    unknown = limit_record(shape, None, 8.0)
    assert unknown["fraction"] is None and unknown["limit_ms_per_step"] is None


def test_bandwidth_table_matches_the_most_specific_name_first():
    assert bandwidth_for("NVIDIA H100 80GB HBM3") == 3.35e12
    assert bandwidth_for("NVIDIA H100 PCIe") == 2.0e12
    assert bandwidth_for("NVIDIA H200") == 4.8e12
    assert bandwidth_for("nvidia h200 nvl") == 4.8e12
    assert bandwidth_for("cpu") is None and bandwidth_for(None) is None
    with pytest.raises(ValueError):
        fraction_of_limit(StepShape(1, 1, 1.0, 1), 1e12, 0.0)
    with pytest.raises(ValueError):
        StepShape(1, 1, 1.0, 1).limit_s(0)
