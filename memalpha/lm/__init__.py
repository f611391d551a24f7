"""Causal-LM mechanics, in three folders:

* :mod:`memalpha.lm.core`: what sampling and log-probs share: policy loading (fp32/bf16/NF4 with
  LoRA), the embedded default model, the padded batch layout, attention, the prefix cache,
  LoRA folding, the KL reference, adapter export, model-server HTTP;
* :mod:`memalpha.lm.sampling`: new tokens: one backend selector (:mod:`memalpha.lm.sampling.backend`)
  over the decoding loops and the vLLM engine, and the sampling filters;
* :mod:`memalpha.lm.logprobs`: per-token log-probs of given responses (policy, reference, SFT).

The lowest compute layer: it imports nothing of memalpha but :mod:`memalpha.seeding`; ``core``
imports no other ``lm`` folder, ``logprobs`` only ``core``, ``sampling`` ``core`` alone.
"""
