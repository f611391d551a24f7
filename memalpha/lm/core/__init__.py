"""What sampling and scoring share: loading, layout, attention, caches, LoRA handling."""
