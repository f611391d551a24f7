"""Instances (chunks to memorise + questions), their loaders and the synthetic memory tasks.

>>> from memalpha.data.loaders import load_instances, save_jsonl
>>> from memalpha.data.synthetic import generate_synthetic
"""
