"""PredictionWriter: where ``memalpha predict``'s records go, batch by batch, resumable, per rank.

:class:`~memalpha.train.module.GRPOModule` adds it when it predicts. At setup every rank reads
the records already written (``data.predict.output`` and any part files a killed data-parallel
run left; :mod:`memalpha.train.predict_file`), all ranks wait for each other, and the
DataModule then serves only the instances without a record, in input order (Lightning shards
them over the ranks without repeating any). Each batch's records are appended as the batch
ends, then dropped: nothing is kept in memory (the CLI turns Lightning's
``return_predictions`` off). One process appends to the output itself; under data parallelism
each rank appends to its own part file and rank 0 merges them into the output, in input order,
when every rank is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from memalpha.train.agent_digest import agent_digest
from memalpha.train.predict_file import (
    RECORD_FORMAT,
    Scan,
    append_record,
    drop_torn_tail,
    in_order,
    merge_records,
    part_path,
    part_paths,
    replies_cut,
    scan_records,
)


class PredictionWriter(BasePredictionWriter):
    """Appends each batch's records to ``data.predict.output`` (or this rank's part file) and
    merges the ranks' parts at the end; see the module docstring."""

    def __init__(self) -> None:
        super().__init__(write_interval="batch")
        self.output: Path | None = None
        self.target: Path | None = None
        self.agent = ""
        self.order: dict[str, int] = {}
        self._handle: BinaryIO | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "predict":
            return
        datamodule = trainer.datamodule
        self.output = datamodule.predict.output_path()
        self.order = {instance.instance_id: i for i, instance in enumerate(datamodule.predict_instances)}
        self.agent = agent_digest(pl_module, datamodule, trainer.ckpt_path)
        scans = self._scans()
        done = {instance_id for scan in scans for instance_id, _, _ in scan.records}
        trainer.strategy.barrier("memalpha predict: records read")  # nobody appends before all have read
        self.target = self.output if trainer.world_size == 1 else part_path(self.output, trainer.global_rank)
        for scan in scans:
            if scan.path == self.target:
                drop_torn_tail(scan)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        datamodule.skip_predicted(done)
        rank_zero_info(
            f"memalpha predict: {len(done)} of {len(self.order)} instances already in {self.output};"
            f" reading {len(datamodule.predict_pending)}"
        )

    def _scans(self) -> list[Scan]:
        paths = (self.output, *part_paths(self.output))
        return [scan_records(path, self.agent, self.order) for path in paths]

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx: int, dataloader_idx: int
    ) -> None:
        if self._handle is None:
            self._handle = open(self.target, "ab")  # noqa: SIM115 - kept open for the run, closed at its end
        for record in prediction:
            append_record(self._handle, {"format": RECORD_FORMAT, "agent": self.agent, **record})

    def on_predict_end(self, trainer, pl_module) -> None:
        self._close()
        trainer.strategy.barrier("memalpha predict: every rank written")
        if trainer.is_global_zero:
            scans = self._scans()
            if len(scans) > 1 or not in_order(scans[0], self.order):
                merge_records(self.output, scans, self.order)
            written = len(scan_records(self.output, self.agent, self.order).records)
            cut, turns = replies_cut(self.output)
            rank_zero_info(
                f"memalpha predict: {written} records in {self.output}; {cut} of {turns} replies cut at"
                f" model.rollout.max_new_tokens={pl_module.rollout_settings.max_new_tokens}"
            )
        trainer.strategy.barrier("memalpha predict: merged")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
