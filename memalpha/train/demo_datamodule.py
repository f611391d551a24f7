"""DemoDataModule: demonstration files in, token-id batches for supervised fine-tuning out.

Each demonstration (``memalpha.data.demos``) becomes a prompt (its messages through the chat
template with the generation prompt, as a rollout templates a memorising turn) and a response
(the reply's tokens followed by the end-of-turn token): the tokens the policy learns to write.
The train stream is endless: seeded reshuffles, ``batch_size`` demonstrations per optimiser
step; its position is saved in checkpoints, so a resumed run trains on exactly the batches the
interrupted one would have.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset

from memalpha.data.demos import Demonstration, load_demonstrations
from memalpha.lm.embedded import load_tokenizer


@dataclass
class TokenizedDemo:
    """One demonstration as token ids: the templated prompt and the response to learn."""

    prompt_ids: list[int]
    response_ids: list[int]


def tokenize_demonstration(tokenizer, demo: Demonstration, chat_template_kwargs: dict[str, Any]) -> TokenizedDemo:
    """The prompt as a rollout would template it, and the reply's tokens plus the end-of-turn token."""
    ids = tokenizer.apply_chat_template(
        demo.messages, add_generation_prompt=True, tokenize=True, **chat_template_kwargs
    )
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    response = list(tokenizer(demo.response, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response.append(tokenizer.eos_token_id)
    return TokenizedDemo(prompt, response)


def _as_is(item):
    return item


class _DemoStream(IterableDataset):
    def __init__(self, datamodule: DemoDataModule) -> None:
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[list[TokenizedDemo]]:
        while True:
            yield self.datamodule.next_batch()


class DemoDataModule(LightningDataModule):
    """Demonstrations for ``memalpha sft``.

    Args:
        train_path: JSONL file of demonstrations (``memalpha data demos`` writes one).
        val_path: JSONL file of held-out demonstrations for ``val/loss`` (None: no validation).
        batch_size: Demonstrations per optimiser step (the module splits them into micro-batches).
        val_batch_size: Demonstrations per validation batch.
        max_tokens: Longest prompt plus response kept; longer demonstrations are refused with an
            error naming them (a silently cut response would teach a truncated reply).
        chat_template_kwargs: Extra chat-template arguments, as the rollout's (e.g.
            ``{"enable_thinking": false}`` for Qwen3).
        train_limit: Use at most this many training demonstrations.
        val_limit: Use at most this many validation demonstrations.
        shuffle: Reshuffle the training demonstrations every pass.
        seed: Seed of the shuffling.
        tokenizer_name: The policy's model, linked from ``model.model`` by the CLI.
    """

    def __init__(
        self,
        train_path: str | None = None,
        val_path: str | None = None,
        batch_size: int = 4,
        val_batch_size: int = 8,
        max_tokens: int = 8192,
        chat_template_kwargs: dict[str, Any] | None = None,
        train_limit: int | None = None,
        val_limit: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        tokenizer_name: str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size), ("max_tokens", max_tokens)):
            if value < 1:
                raise ValueError(f"data.{name} must be >= 1, got {value}")
        self.save_hyperparameters()
        self.train_demos: list[TokenizedDemo] = []
        self.val_demos: list[TokenizedDemo] = []
        self._epoch = 0
        self._cursor = 0

    def _load(self, path: str, limit: int | None) -> list[TokenizedDemo]:
        hp = self.hparams
        demos = load_demonstrations(path, limit=limit)
        if hp.tokenizer_name is None:
            raise ValueError("DemoDataModule needs tokenizer_name (the CLI links it from model.model)")
        tokenizer = load_tokenizer(hp.tokenizer_name)
        tokenized = [tokenize_demonstration(tokenizer, d, dict(hp.chat_template_kwargs or {})) for d in demos]
        for index, demo in enumerate(tokenized):
            length = len(demo.prompt_ids) + len(demo.response_ids)
            if length > hp.max_tokens:
                raise ValueError(
                    f"{path}: record {index}: prompt and response take {length} tokens, over data.max_tokens="
                    f"{hp.max_tokens}"
                )
        return tokenized

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and not self.train_demos:
            if hp.train_path is None:
                raise ValueError("data.train_path is required: a JSONL file of demonstrations (memalpha data demos)")
            self.train_demos = self._load(hp.train_path, hp.train_limit)
        if stage in ("fit", "validate") and not self.val_demos and hp.val_path is not None:
            self.val_demos = self._load(hp.val_path, hp.val_limit)

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.train_demos)))
        if self.hparams.shuffle:
            random.Random(self.hparams.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[TokenizedDemo]:
        """The next ``batch_size`` demonstrations, wrapping into a new (reshuffled) pass."""
        picked: list[TokenizedDemo] = []
        while len(picked) < self.hparams.batch_size:
            order = self._order(self._epoch)
            if self._cursor >= len(order):
                self._epoch, self._cursor = self._epoch + 1, 0
                continue
            picked.append(self.train_demos[order[self._cursor]])
            self._cursor += 1
        return picked

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_DemoStream(self), batch_size=None, collate_fn=_as_is, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_demos, batch_size=self.hparams.val_batch_size, collate_fn=_as_is, num_workers=0)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "cursor": self._cursor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._epoch = state_dict["epoch"]
        self._cursor = state_dict["cursor"]
