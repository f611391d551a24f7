"""How response log-probs are computed: one typed specification, built once by a trainer and handed
down to every log-prob call (policy, old policy, reference, SFT)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogprobSpec:
    """The settings of :func:`memalpha.lm.logprobs.per_token.token_scores`.

    Args:
        temperature: the logits are divided by it, as sampling divided them.
        micro_batch_size: sequences through the decoder at a time.
        pad_id: the id padding takes (masked out of attention).
        share_prefix: compute the prompt tokens rows share once (:mod:`memalpha.lm.core.prompt_sharing`).
        token_chunk: response rows through the head at a time (bounds the logits held).
        vocab_chunk: vocabulary columns at a time with a running log-sum-exp (None: all).
    """

    temperature: float = 1.0
    micro_batch_size: int = 4
    pad_id: int = 0
    share_prefix: bool = True
    token_chunk: int = 512
    vocab_chunk: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.micro_batch_size < 1 or self.token_chunk < 1:
            raise ValueError(
                "micro_batch_size and token_chunk must be >= 1, "
                f"got {self.micro_batch_size}, {self.token_chunk}"
            )
        if self.vocab_chunk is not None and self.vocab_chunk < 1:
            raise ValueError(f"vocab_chunk must be >= 1 or None, got {self.vocab_chunk}")


DEFAULT_SCORING = LogprobSpec()
"""Temperature 1, micro-batches of 4, pad id 0, prefixes shared."""
