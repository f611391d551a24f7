"""Lightning glue: GRPOModule, the rollout DataModule, the CLI class, checkpoint I/O and the
validation report; one GRPO step free of Lightning (:mod:`memalpha.train.step`).
"""
