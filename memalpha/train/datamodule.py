"""RolloutDataModule: training and validation instances, and the stream of rollout rounds.

The train stream is endless, or ``data.epochs`` passes long: each item is an
:class:`InstanceRound`, the next ``instances_per_step`` instances of this rank's shard (a seeded
shuffle shared by all ranks, then strided), with the round's index; with ``data.drop_last`` a
round never spans two passes. The module rolls a round out with its *current* policy
when it needs one (:meth:`memalpha.train.module.GRPOModule.training_step`); the DataModule
never calls the module. Its position (epoch, cursor, round) is saved in the checkpoint, so a
resumed run continues on exactly the instances it would have seen. For ``memalpha predict`` it
serves ``data.predict.path``'s instances that have no record yet
(:class:`~memalpha.train.predict_writer.PredictionWriter` tells it which).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from memalpha.agent.prompt_budget import chunk_room
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.loaders import LAYOUTS, Layout, check_source, load_instances
from memalpha.data.plain_text import TEXT_SPLITS, TextSplit, load_predict_instances
from memalpha.data.schema import DataValidationError, Instance
from memalpha.data.synthetic import SyntheticSettings
from memalpha.data.wrapping import WRAP_STYLES, WrapStyle
from memalpha.train.stream import PassCursor, as_is, endless_loader, pass_order


@dataclass
class LoadSettings:
    """How the data files are read (``data.load.*``).

    Args:
        layout: ``auto``, ``jsonl``, ``memalpha``, ``memoryagentbench``, ``longmemeval`` or ``locomo``
            (docs/data.md).
        chunk_tokens: Chunk size in policy tokens for layouts that hold one long context
            (MemoryAgentBench) and for text files; for LoCoMo the longest session chunk (a longer
            session is split between turns). null (default): the most tokens whose memorising turn
            fits ``model.rollout.max_prompt_tokens`` with the core memory at its cap, the rule the
            Python API's ``memorise`` cuts by (docs/data.md, "Chunks against the prompt budget"). A number is
            kept as set; a chunk it makes that cannot fit stops the run in one line before any
            model loads.
        wrap: Wrap chunks as dated ``dialogue`` turns or dated ``reading`` events (``None`` keeps them as is).
        skip_bad: Skip (and report) malformed records instead of refusing the whole file.
        train_limit: Use at most this many training instances.
        val_limit: Use at most this many validation instances.
    """

    layout: Layout = "auto"
    chunk_tokens: int | None = None
    wrap: WrapStyle | None = None
    skip_bad: bool = False
    train_limit: int | None = None
    val_limit: int | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"data.load.layout must be one of {list(LAYOUTS)}, got {self.layout!r}")
        if self.wrap is not None and self.wrap not in WRAP_STYLES:
            raise ValueError(f"data.load.wrap must be one of {list(WRAP_STYLES)} or null, got {self.wrap!r}")
        if self.chunk_tokens is not None and self.chunk_tokens < 1:
            raise ValueError(f"data.load.chunk_tokens must be >= 1, got {self.chunk_tokens}")
        for name in ("train_limit", "val_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.load.{name} must be >= 1 or null, got {value}")


@dataclass
class PredictSettings:
    """What ``memalpha predict`` reads and where it writes (``data.predict.*``; docs/inference.md).

    Args:
        path: The input: a ``.txt`` or ``.md`` file, a folder of them (one instance per file, no
            questions), or a data file or folder in any layout ``data.load.layout`` reads (its
            questions are answered and scored). null: ``memalpha predict`` stops and asks for it.
        output: The JSONL file of records, one per instance, appended as each batch finishes
            (null = beside the input: ``<input name without its suffix>.predictions.jsonl``). An
            existing file of the same input and settings is resumed: its instances are skipped
            and a torn last line is dropped; any other file there is refused, never overwritten.
        batch_size: Instances read together (their turns batched); their records are written
            when the batch finishes. Raise it on a GPU.
        split: How a text file is cut: ``tokens`` (chunks of ``data.load.chunk_tokens`` policy
            tokens) or ``blank_lines`` (one chunk per blank-line-separated block; a longer block
            is cut by tokens too, with a warning).
    """

    path: str | None = None
    output: str | None = None
    batch_size: int = 1
    split: TextSplit = "tokens"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"data.predict.batch_size must be >= 1, got {self.batch_size}")
        if self.split not in TEXT_SPLITS:
            raise ValueError(f"data.predict.split must be one of {list(TEXT_SPLITS)}, got {self.split!r}")
        if self.path:
            try:
                check_source(self.path)
            except DataValidationError as exc:
                raise ValueError(f"data.predict.path: {exc}") from exc
        if self.output and Path(self.output).expanduser().is_dir():
            raise ValueError(f"data.predict.output: {self.output} is a folder; give the JSONL file's path")

    def output_path(self) -> Path:
        """Where the records go: ``output``, or the input's name with ``.predictions.jsonl``."""
        if self.output:
            return Path(self.output).expanduser()
        source = Path(str(self.path)).expanduser()
        return source.with_name(f"{source.stem or source.name}.predictions.jsonl")


def check_data_settings(data: Mapping[str, Any]) -> None:
    """Refuse out-of-range ``data`` settings and missing data files when the config is read,
    before any model loads (the messages name the ``data.*`` option; ``data.load.*`` and
    ``data.synthetic.*`` check themselves: :class:`LoadSettings`,
    :class:`~memalpha.data.synthetic.SyntheticSettings`)."""
    for name in ("instances_per_step", "val_batch_size"):
        if data[name] < 1:
            raise ValueError(f"data.{name} must be >= 1, got {data[name]}")
    epochs = data.get("epochs")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"data.epochs must be an integer >= 1 or null, got {epochs!r}")
    for name in ("train_path", "val_path"):
        if data[name]:
            try:
                check_source(data[name])
            except DataValidationError as exc:
                raise ValueError(f"data.{name}: {exc}") from exc


def run_rounds(instances: int, instances_per_step: int, world_size: int, epochs: int, drop_last: bool) -> int:
    """Rollout rounds in ``epochs`` passes over ``instances`` training instances.

    Each rank's shard of a pass holds ``instances // world_size`` instances (the remainder is left
    out of every pass) and a round takes ``instances_per_step`` of them on every rank. With
    ``drop_last`` a pass gives ``floor(shard / instances_per_step)`` whole rounds, which is
    ``floor(instances / (instances_per_step * world_size))``, as verl's ``drop_last`` DataLoader
    of global batches (567 instances, 32 a round, 5 epochs: 85 rounds); without it the
    rounds run on across passes and the run ends with the round that finishes pass ``epochs``
    (``ceil(epochs * shard / instances_per_step)``).
    """
    shard = instances // world_size
    if shard < 1:
        raise ValueError(f"{instances} training instances cannot be shared by {world_size} ranks")
    if drop_last:
        per_pass = shard // instances_per_step
        if per_pass < 1:
            raise ValueError(
                f"data.drop_last: a pass has {shard} instances per rank, fewer than data.instances_per_step="
                f"{instances_per_step}, so it cannot fill one round"
            )
        return epochs * per_pass
    return math.ceil(epochs * shard / instances_per_step)


class InstanceRound(NamedTuple):
    """One round of the train stream: its index (counted from 0 over the run) and its instances."""

    index: int
    instances: list[Instance]


class RolloutDataModule(LightningDataModule):
    """Train/validation instances and the on-policy rollout stream.

    Args:
        train_path: Training data: our JSONL/JSON, an official Mem-alpha parquet, a MemoryAgentBench file,
            a ``load_from_disk`` folder or a hub dataset name. ``None`` generates synthetic memory tasks.
        val_path: Validation data, same kinds; ``None`` generates a synthetic validation split (disjoint
            entities).
        load: How the data files are read (``data.load.*``: layout, chunking, wrapping, bad
            records, instance limits).
        synthetic: The synthetic data generated where ``train_path`` or ``val_path`` is ``None``
            (``data.synthetic.*``: instance counts, sizes, families).
        instances_per_step: Instances rolled out per round on each rank (each gives ``group_size`` rollouts).
        drop_last: Keep every round inside one pass, as a DataLoader with ``drop_last`` (official):
            a pass that cannot fill a whole round (``instances_per_step`` on every rank) ends, its
            leftover instances are skipped and the next, reshuffled pass starts. False: a round
            that reaches a pass's end goes on with the next pass's first instances.
        epochs: Passes over the training instances the run takes, then it stops by itself
            (official 5). With ``drop_last`` that is ``epochs * floor(instances / (instances_per_step
            * world size))`` rounds (official: 567 instances, 32 a round, 85 rounds); without it the
            run ends with the round that finishes the last pass. ``trainer.max_steps`` counts
            optimiser steps, several per round with ``update.mini_batch_size``, so set it to -1 to
            let the epochs decide (when both are set the first reached ends the run). The rounds
            are also what ``optimizer.schedule_unit: round`` warms up over. None: the stream is
            endless and ``trainer.max_steps`` ends the run.
        val_batch_size: Validation instances rolled out together.
        shuffle: Reshuffle the training instances every pass.
        seed: Seed of the synthetic data and of the shuffling.
        tokenizer_name: The policy's model, linked from ``model.model`` by the CLI: chunking long
            contexts (MemoryAgentBench) counts tokens with its tokenizer.
        predict: What ``memalpha predict`` reads and writes (``data.predict.*``: input, output,
            batch size, how text is cut).
    """

    def __init__(
        self,
        train_path: str | None = None,
        val_path: str | None = None,
        load: LoadSettings = LoadSettings(),  # noqa: B008 - a value object; jsonargparse shows its fields
        synthetic: SyntheticSettings = SyntheticSettings(),  # noqa: B008 - a value object; jsonargparse shows its fields
        instances_per_step: int = 2,
        drop_last: bool = False,
        epochs: int | None = None,
        val_batch_size: int = 4,
        shuffle: bool = True,
        seed: int = 0,
        tokenizer_name: str | None = None,
        predict: PredictSettings = PredictSettings(),  # noqa: B008 - a value object; jsonargparse shows its fields
    ) -> None:
        super().__init__()
        # kept in checkpoints and in the run's config.yaml, but not handed to the loggers: Lightning
        # merges module and data hyperparameters there and refuses keys that differ, and both
        # have a ``seed`` (model.seed and data.seed are separate settings)
        self.save_hyperparameters(logger=False)
        # the memory agent's settings, the module's: with data.load.chunk_tokens null, chunks are as
        # long as their prompt budget allows; the CLI sets them from the module it built
        self.rollout: RolloutSettings | None = None
        check_data_settings(self.hparams)
        # Lightning's CLI and checkpoints hand the groups over as dicts
        self.load = LoadSettings(**load) if isinstance(load, Mapping) else load
        self.synthetic = SyntheticSettings(**synthetic) if isinstance(synthetic, Mapping) else synthetic
        self.predict = PredictSettings(**predict) if isinstance(predict, Mapping) else predict
        self.train_instances: list[Instance] = []
        self.val_instances: list[Instance] = []
        self.predict_instances: list[Instance] = []  # all of data.predict.path's instances, in order
        self.predict_pending: list[Instance] = []  # those without a record in data.predict.output yet
        self._position = PassCursor()
        self._round = 0
        self.seen_instance_ids: list[str] = []  # this process's rollout instances, in order (for audits)

    # ------------------------------------------------------------------ data
    def _tokenizer(self):
        """The policy's tokenizer (for token-sized chunking), or None when no model is linked."""
        if self.hparams.tokenizer_name is None:
            return None
        from memalpha.lm.core.embedded import load_tokenizer

        return load_tokenizer(self.hparams.tokenizer_name)

    def chunk_tokens(self, tokenizer) -> int | None:
        """The chunk size long inputs are cut to: ``data.load.chunk_tokens``, or when it is null the
        most tokens that fit the rollout's prompt budget with the core at its cap
        (:func:`~memalpha.agent.prompt_budget.chunk_room`); None when it is null and no rollout
        settings or tokenizer were given (a layout that cuts chunks then refuses to load)."""
        if self.load.chunk_tokens is not None:
            return self.load.chunk_tokens
        if self.rollout is None or tokenizer is None:
            return None
        return chunk_room(tokenizer, self.rollout)

    def _load(self, path: str, limit: int | None) -> list[Instance]:
        load = self.load
        tokenizer = self._tokenizer() if load.layout in ("auto", "memoryagentbench", "locomo") else None
        instances, _ = load_instances(
            path,
            layout=load.layout,
            tokenizer=tokenizer,
            chunk_tokens=self.chunk_tokens(tokenizer),
            wrap=load.wrap,
            skip_bad=load.skip_bad,
            limit=limit,
        )
        return instances

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and not self.train_instances:
            self.train_instances = (
                self._load(hp.train_path, self.load.train_limit)
                if hp.train_path
                else self.synthetic.generate("train", hp.seed)
            )
            if not self.train_instances:
                raise ValueError(f"no training instances in {hp.train_path or 'the synthetic generator'}")
        if stage in ("fit", "validate") and not self.val_instances:
            self.val_instances = (
                self._load(hp.val_path, self.load.val_limit)
                if hp.val_path
                else self.synthetic.generate("val", hp.seed)
            )

        if stage == "predict" and not self.predict_instances:
            if not self.predict.path:
                raise DataValidationError(
                    "data.predict.path",
                    "not set: memalpha predict reads a text or markdown file, a folder of them, a data file",
                )
            load, tokenizer = self.load, self._tokenizer()
            self.predict_instances = load_predict_instances(
                self.predict.path, tokenizer=tokenizer, chunk_tokens=self.chunk_tokens(tokenizer),
                split=self.predict.split, layout=load.layout, wrap=load.wrap, skip_bad=load.skip_bad,
            )  # fmt: skip
            self.predict_pending = list(self.predict_instances)

    def loaded_splits(self) -> list[tuple[str, list[Instance]]]:
        """The instances :meth:`setup` loaded, each list with where it came from, for messages:
        ``data.train_path=<path>``, ``synthetic train data`` or ``data.predict.path=<path>``."""
        hp = self.hparams
        splits = [
            (f"data.{split}_path={path}" if path else f"synthetic {split} data", instances)
            for split, path, instances in (
                ("train", hp.train_path, self.train_instances), ("val", hp.val_path, self.val_instances)
            )
            if instances
        ]
        if self.predict_instances:
            splits.append((f"data.predict.path={self.predict.path}", self.predict_instances))
        return splits

    def skip_predicted(self, done: set[str]) -> None:
        """Serve only the predict instances whose ids are not in ``done`` (those with a record)."""
        self.predict_pending = [i for i in self.predict_instances if i.instance_id not in done]

    # ---------------------------------------------------------------- stream
    def _rank_and_world(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def shard_order(self, epoch: int) -> list[int]:
        """This rank's instance indices for one pass: a seeded shuffle shared by all ranks, then strided."""
        order = pass_order(len(self.train_instances), self.hparams.seed, epoch, self.hparams.shuffle)
        rank, world = self._rank_and_world()
        usable = len(order) - len(order) % world if len(order) >= world else len(order)
        shard = order[:usable][rank::world]
        if not shard:
            raise ValueError(f"{len(order)} training instances cannot be shared by {world} ranks")
        return shard

    def total_rounds(self) -> int | None:
        """Rounds of the whole run with ``data.epochs`` (:func:`run_rounds`); None when the stream is
        endless."""
        hp = self.hparams
        if hp.epochs is None:
            return None
        _, world = self._rank_and_world()
        return run_rounds(len(self.train_instances), hp.instances_per_step, world, hp.epochs, hp.drop_last)

    def next_round(self) -> InstanceRound | None:
        """The next round of this rank's stream: the next ``instances_per_step`` instances of its
        shard, wrapping into a new pass (with ``data.drop_last``, skipping a pass's leftovers that
        cannot fill a round); advances the position saved in checkpoints.

        None once the run's ``data.epochs`` rounds are served (the train loader then ends).
        """
        total = self.total_rounds()
        if total is not None and self._round >= total:
            return None
        hp = self.hparams
        indices = self._position.take(hp.instances_per_step, self.shard_order, hp.drop_last)
        picked = [self.train_instances[index] for index in indices]
        self.seen_instance_ids.extend(inst.instance_id for inst in picked)
        self._round += 1
        return InstanceRound(self._round - 1, picked)

    def train_dataloader(self) -> DataLoader:
        return endless_loader(self.next_round)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_instances, batch_size=self.hparams.val_batch_size, collate_fn=as_is, num_workers=0
        )

    def predict_dataloader(self) -> DataLoader:
        """The predict instances without a record yet, in input order, ``data.predict.batch_size``
        at a time (Lightning shards them over the ranks without repeating any)."""
        return DataLoader(
            self.predict_pending, batch_size=self.predict.batch_size, collate_fn=as_is, num_workers=0
        )

    # ----------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The stream's position: the pass (``epoch``), the place in this rank's shard, the rounds served.

        Every rank holds the same position (equal shards, equal rounds), so rank 0's copy in the
        checkpoint serves all ranks. ``data.drop_last`` and ``data.epochs`` add no state: the
        skip of a pass's leftovers is decided from ``(epoch, cursor)`` at the next round, and the
        end of the run from ``round``.
        """
        return {"epoch": self._position.epoch, "cursor": self._position.cursor, "round": self._round}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position = PassCursor(state_dict["epoch"], state_dict["cursor"])
        self._round = state_dict["round"]
