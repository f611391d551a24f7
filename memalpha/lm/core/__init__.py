"""What sampling and log-probs share: loading, layout, attention, caches, LoRA handling."""
