"""Lightning glue: GRPOModule, the rollout DataModule, the CLI class, checkpoint I/O, the
validation report and the generated configuration reference.
"""
