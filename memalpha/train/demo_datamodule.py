"""DemoDataModule: demonstration files in, token-id batches for supervised fine-tuning out.

Each demonstration (``memalpha.data.demo_files``) becomes a prompt (its messages through the chat
template with the generation prompt, as a rollout templates a memorising turn) and a response
(the reply's tokens followed by the end-of-turn token): the tokens the policy learns to write.
The train stream is endless: seeded reshuffles, ``batch_size`` demonstrations per optimiser
step; its position is saved in checkpoints, so a resumed run trains on exactly the batches the
interrupted one would have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from memalpha.agent.memorise_prompts import chat_prompt_ids
from memalpha.data.demo_files import Demonstration, load_demonstrations
from memalpha.data.schema import DataValidationError
from memalpha.lm.core.embedded import load_tokenizer
from memalpha.train.stream import PassCursor, as_is, endless_loader, pass_order


@dataclass
class DemoLoadSettings:
    """How many demonstrations are read (``data.load.*``, the key ``memalpha fit`` uses for its
    instance limits).

    Args:
        train_limit: Use at most this many training demonstrations.
        val_limit: Use at most this many validation demonstrations.
    """

    train_limit: int | None = None
    val_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("train_limit", "val_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.load.{name} must be >= 1 or null, got {value}")


@dataclass
class TokenizedDemo:
    """One demonstration as token ids: the templated prompt and the response to learn."""

    prompt_ids: list[int]
    response_ids: list[int]


def tokenize_demonstration(
    tokenizer, demo: Demonstration, chat_template_kwargs: dict[str, Any]
) -> TokenizedDemo:
    """The prompt as a rollout would template it, and the reply's tokens plus the end-of-turn token."""
    prompt = chat_prompt_ids(tokenizer, demo.messages, chat_template_kwargs)
    response = list(tokenizer(demo.response, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response.append(tokenizer.eos_token_id)
    return TokenizedDemo(prompt, response)


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
        load: How many demonstrations are read (``data.load.train_limit``, ``data.load.val_limit``).
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
        load: DemoLoadSettings = DemoLoadSettings(),  # noqa: B008 - a value object; jsonargparse shows its fields
        shuffle: bool = True,
        seed: int = 0,
        tokenizer_name: str | None = None,
    ) -> None:
        super().__init__()
        self.load = DemoLoadSettings(**load) if isinstance(load, Mapping) else load
        sizes = {"batch_size": batch_size, "val_batch_size": val_batch_size, "max_tokens": max_tokens}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"data.{name} must be >= 1, got {value}")
        if train_path is None:
            raise ValueError(
                "data.train_path is required: a JSONL file of demonstrations (memalpha data demos)"
            )
        for name, path in (("train_path", train_path), ("val_path", val_path)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ValueError(f"data.{name}: {path}: no such file")
        self.save_hyperparameters(logger=False)  # not to the loggers, as RolloutDataModule's
        self.train_demos: list[TokenizedDemo] = []
        self.val_demos: list[TokenizedDemo] = []
        self._position = PassCursor()

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
                raise DataValidationError(
                    path,
                    f"prompt and response take {length} tokens, over data.max_tokens={hp.max_tokens}",
                    index=index,
                )
        return tokenized

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and not self.train_demos:
            self.train_demos = self._load(hp.train_path, self.load.train_limit)
        if stage in ("fit", "validate") and not self.val_demos and hp.val_path is not None:
            self.val_demos = self._load(hp.val_path, self.load.val_limit)

    def next_batch(self) -> list[TokenizedDemo]:
        """The next ``batch_size`` demonstrations, wrapping into a new (reshuffled) pass."""
        hp = self.hparams
        indices = self._position.take(
            hp.batch_size, lambda epoch: pass_order(len(self.train_demos), hp.seed, epoch, hp.shuffle)
        )
        return [self.train_demos[index] for index in indices]

    def train_dataloader(self) -> DataLoader:
        return endless_loader(self.next_batch)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_demos, batch_size=self.hparams.val_batch_size, collate_fn=as_is, num_workers=0
        )

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._position.epoch, "cursor": self._position.cursor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position = PassCursor(state_dict["epoch"], state_dict["cursor"])
