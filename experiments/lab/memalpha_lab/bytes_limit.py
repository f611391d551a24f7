"""The bytes-read limit of a decoding step, and the fraction of it a measured step reaches.

At a few rows a decoding step of a dense decoder does little arithmetic per byte: it must read
every weight it multiplies once, and every row's keys and values of the tokens cached so far.
No kernel can finish the step faster than those bytes take to stream from the GPU's memory::

    bytes = weight_bytes + kv_bytes_per_token * filled_tokens * rows
    kv_bytes_per_token = layers * kv_heads * head_dim * 2 (keys and values) * dtype_bytes
    limit_s = bytes / bandwidth            fraction = limit_s / measured_s_per_step

For Qwen3-4B in bf16: 36 layers x 8 KV heads x 128 x 2 x 2 B = 147,456 B per cached token per
row, and 8.04 GB of dense weights (:func:`dense_weight_params` x 2 B). ``filled_tokens`` is the
mean length a row's cache holds over the steps measured, not the static cache's capacity: a
step that reads past the filled columns pays for bytes the limit does not count, and the
fraction shows it. Activations, norms, biases and the embedding lookup are left out (a few MB).

:data:`GPU_BANDWIDTH` holds the peak memory bandwidth of the GPUs memalpha is measured on, keyed
by a substring of ``torch.cuda.get_device_name()`` (:func:`bandwidth_for`); the vendors' figures,
which no kernel quite reaches, so a fraction near 0.8 is already very good.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GPU_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),  # SXM (HBM3), what "NVIDIA H100 80GB HBM3" names
    ("H200", 4.8e12),
    ("RTX 4090", 1.008e12),
)
"""Peak memory bandwidth in bytes per second by device-name substring; the first match wins, so
the specific names come before the general ones."""


def bandwidth_for(device_name: str | None) -> float | None:
    """The peak bandwidth (B/s) of the first :data:`GPU_BANDWIDTH` entry whose key occurs in
    ``device_name`` (case-insensitive); None for a device the table does not know."""
    if not device_name:
        return None
    name = device_name.lower()
    return next((bandwidth for key, bandwidth in GPU_BANDWIDTH if key.lower() in name), None)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of keys and values one cached token takes in one row, over all layers."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def head_dim_of(config) -> int:
    """A transformers config's attention head width (``head_dim``, else hidden / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def dense_weight_params(config) -> int:
    """Weights a decoding step multiplies for a Llama-style decoder config: per layer the query,
    key, value and output projections and the three MLP projections, then the output head
    (read whole at every step, tied to the embedding or not)."""
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = head_dim_of(config)
    attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    mlp = 3 * hidden * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp) + config.vocab_size * hidden


@dataclass(frozen=True)
class StepShape:
    """What one decoding step must read: ``weight_bytes`` once, and ``kv_bytes_per_token`` for each
    of ``filled_tokens`` cached tokens (mean per row over the steps measured) of each of ``rows``."""

    weight_bytes: int
    kv_bytes_per_token: int
    filled_tokens: float
    rows: int

    @classmethod
    def of_config(cls, config, *, weight_dtype_bytes: int, kv_dtype_bytes: int, filled_tokens: float,
                  rows: int) -> StepShape:
        """The shape of a step of a Llama-style decoder with dense weights of ``weight_dtype_bytes``."""
        kv = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, head_dim_of(config),
                                kv_dtype_bytes)
        return cls(dense_weight_params(config) * weight_dtype_bytes, kv, filled_tokens, rows)

    @property
    def kv_bytes(self) -> float:
        return self.kv_bytes_per_token * self.filled_tokens * self.rows

    @property
    def bytes_read(self) -> float:
        return self.weight_bytes + self.kv_bytes

    def limit_s(self, bandwidth: float) -> float:
        """The shortest time the step can take at ``bandwidth`` bytes per second."""
        if bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0 B/s, got {bandwidth}")
        return self.bytes_read / bandwidth


def fraction_of_limit(shape: StepShape, bandwidth: float, ms_per_step: float) -> float:
    """The limit's share of a measured step: 1.0 means the step streams its bytes at peak."""
    if ms_per_step <= 0:
        raise ValueError(f"ms_per_step must be > 0, got {ms_per_step}")
    return shape.limit_s(bandwidth) / (ms_per_step / 1000.0)


def limit_record(shape: StepShape, bandwidth: float | None, ms_per_step: float | None,
                 device_name: str | None = None) -> dict[str, Any]:
    """The formula, its inputs and its results as a JSON-ready dict (``limit_ms_per_step`` and
    ``fraction`` None when the bandwidth or the measurement is missing)."""
    known = bandwidth is not None and bandwidth > 0
    return {
        "formula": "(weight_bytes + kv_bytes_per_token * filled_tokens * rows) / bandwidth_Bps",
        **asdict(shape),
        "bytes_read": shape.bytes_read,
        "device_name": device_name,
        "bandwidth_Bps": bandwidth,
        "limit_ms_per_step": 1000.0 * shape.limit_s(bandwidth) if known else None,
        "ms_per_step": ms_per_step,
        "fraction": fraction_of_limit(shape, bandwidth, ms_per_step) if known and ms_per_step else None,
    }
