"""New tokens from the policy or the reader: the backend selector, the decoding loops, the filters, the vLLM
engine."""
