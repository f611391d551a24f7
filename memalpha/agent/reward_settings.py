"""The reward's settings (the ``model.reward`` group): weights, rules and content judge, checked once.

:class:`RewardSettings` checks every value when it is built, with one line naming its key
(``reward.beta``); the reward math (:mod:`memalpha.agent.reward_math`) and the judges
(:mod:`memalpha.agent.content_judges`) take the checked values as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from memalpha.agent.answer_metrics import ANSWER_STYLES, AnswerStyle, MetricStyle, check_metric_overrides
from memalpha.agent.content_judges import (
    JUDGEMENT_PARSES,
    ContentJudge,
    JudgementParse,
    LLMContentJudge,
    RuleContentJudge,
)
from memalpha.reader.base import ReaderSampling

if TYPE_CHECKING:
    from memalpha.reader.base import Reader

ContentJudgeKind = Literal["rule", "llm"]
CallSuccessRule = Literal["memalpha", "status", "official"]
ContentGrounding = Literal["chunk", "none"]
CompressionGate = Literal["accuracy", "none"]
AnswerReward = Literal["token_f1", "metric"]


def _check_one_of(key: str, value: object, options: tuple[str, ...]) -> None:
    """One line naming ``reward.<key>`` when ``value`` is none of ``options``."""
    if value not in options:
        raise ValueError(f"reward.{key} must be one of {list(options)}, got {value!r}")


@dataclass
class RewardSettings:
    """The reward's weights, its content judge and the answer metric of each data source.

    Args:
        beta: Weight of the compression reward r3 (paper 0.05).
        gamma: Weight of the content-validity reward r4 (scripts 0.1).
        accuracy_weight: Weight of the accuracy reward r1 against the tool reward r2, whose
            weight is 1 (paper 1). Above 1 a rollout's answers count for more than its call
            format: once nearly every call succeeds, r2 barely varies within a group, and r1 is
            the term the advantages should follow (docs/results.md, "grpo_levers").
        content_judge: r4 judge: ``rule`` (deterministic checks) or ``llm`` (the reader judges,
            paper style).
        metric_overrides: ``data_source`` -> metric name, overriding the default registry
            mapping.
        metric_style: How an answer is compared with its gold, in the training reward r1 and in
            validation alike (docs/metrics_and_rewards.md, official difference 10): ``memalpha``
            normalises (punctuation, articles, white space; best of all golds; the judge's
            yes and not the word no) so that a right answer written differently scores;
            ``official`` compares as the official code does (the lower-cased first gold in the
            answer; perltqa parts in the prediction as written; a boxed label only when it is
            digits; the judge's yes only when no ``no`` appears anywhere in its reply).
        call_success: What r2 counts as a successful call (official difference 7). ``memalpha``:
            a call that changed the memory (status ``ok``: no ``skipped`` repeat or no-op, no
            error) and, for an insert or update, whose written text the turn's chunk supports
            (``support_min_share``, ``support_min_tokens``); a turn none of whose calls stores
            such a text gets r2 = 0, so deleting and rewriting alone earn nothing. ``status``
            (memalpha before issue 30): the statuses ``ok`` and ``skipped``. ``official``: what
            the official code reports as executed and not skipped, so a duplicate insert fails
            and deleting an unknown id succeeds (its code deletes nothing and reports success);
            the executor runs the same under all three.
        support_min_share: The support rule's share (``call_success: memalpha``, ``content_grounding:
            chunk``): of the content tokens a write adds to the memory (lower-cased words and
            numbers, function words dropped, those of the text it replaces removed), at least
            this share must occur in the turn's chunk (its text without memalpha's dated
            wrapper). In (0, 1].
        support_min_tokens: The support rule's count: at least this many of the added content
            tokens must occur in the chunk (>= 1), so a one-word write is never supported.
        content_grounding: ``chunk`` (memalpha): r4 scores a write 0 when the support rule says
            its chunk does not support it, so a valid-looking sentence about nothing in the chunk
            earns no content reward; ``none`` (official): r4 is the judge's verdict alone.
        compression_gate: ``accuracy`` (memalpha): a positive compression r3 is multiplied by r1,
            so an empty or useless memory (r1 = 0) earns no compression reward, while a memory
            larger than the input keeps its whole negative r3; ``none`` (official): r3 as the
            paper defines it, ``1 - memory / input`` (an empty memory earns 1).
        content_judge_attempts: The most asks the ``llm`` judge spends on one write: a write
            whose judgement is malformed (or whose reader call failed) is asked again until this
            many asks in all, then scores 0; 1 asks once. Each ask after a malformed reply appends
            the template file's ``content_judge_retry`` to the user message once more (absent, as
            in memalpha's texts: the same messages again). The official training judge
            (``/analyze_function``) asks once; its per-call judge, which training never calls,
            up to 3 times.
        content_judge_temperature: Sampling temperature of the ``llm`` judge's requests (0 =
            greedy); null: the reader's own (``reader.temperature``). Official 0.1.
        content_judge_max_tokens: Reply length cap of the ``llm`` judge's requests; null: the
            reader's own (``reader.max_new_tokens``). Official 512.
        content_judge_parse: Which judge replies are well-formed (the rest are malformed):
            ``memalpha`` reads the JSON object from a code fence or bare, after any thinking
            block; ``official`` reads the first fenced object of the reply as it is, and only
            when the reply opens a fence tagged ``json``, as the official code checks
            (``_validate_json_format``). Both need a boolean ``VALID``, a list ``ISSUES`` and a
            text ``EXPLANATION``.
        answer_reward: What rewards an answer of the answer agent's GRPO (``rollout.trains:
            answer``, docs/answer_agent.md): ``token_f1`` (LoCoMo's token F1 against the best gold,
            LoCoMo's own score for LoCoMo questions: continuous, a short right answer scores most) or
            ``metric`` (the source's own metric, as validation scores it: for most sources 0 or 1).
    """

    beta: float = 0.05
    gamma: float = 0.1
    accuracy_weight: float = 1.0
    content_judge: ContentJudgeKind = "rule"
    metric_overrides: dict[str, str] | None = None
    metric_style: MetricStyle = "memalpha"
    call_success: CallSuccessRule = "memalpha"
    support_min_share: float = 0.5
    support_min_tokens: int = 2
    content_grounding: ContentGrounding = "chunk"
    compression_gate: CompressionGate = "accuracy"
    content_judge_attempts: int = 1
    content_judge_temperature: float | None = None
    content_judge_max_tokens: int | None = None
    content_judge_parse: JudgementParse = "memalpha"
    answer_reward: AnswerReward = "token_f1"

    def __post_init__(self) -> None:
        _check_one_of("answer_reward", self.answer_reward, get_args(AnswerReward))
        _check_one_of("content_judge", self.content_judge, get_args(ContentJudgeKind))
        if self.beta < 0 or self.gamma < 0:
            raise ValueError(f"reward.beta and reward.gamma must be >= 0, got {self.beta}, {self.gamma}")
        if not self.accuracy_weight >= 0:
            raise ValueError(f"reward.accuracy_weight must be >= 0, got {self.accuracy_weight}")
        if self.metric_overrides:
            check_metric_overrides(self.metric_overrides, "reward.metric_overrides")
        _check_one_of("metric_style", self.metric_style, tuple(ANSWER_STYLES))
        _check_one_of("call_success", self.call_success, get_args(CallSuccessRule))
        if not 0.0 < self.support_min_share <= 1.0:
            raise ValueError(f"reward.support_min_share must be in (0, 1], got {self.support_min_share}")
        if isinstance(self.support_min_tokens, bool) or self.support_min_tokens < 1:
            raise ValueError(f"reward.support_min_tokens must be >= 1, got {self.support_min_tokens}")
        _check_one_of("content_grounding", self.content_grounding, get_args(ContentGrounding))
        _check_one_of("compression_gate", self.compression_gate, get_args(CompressionGate))
        attempts = self.content_judge_attempts
        if isinstance(attempts, bool) or attempts < 1:
            raise ValueError(f"reward.content_judge_attempts must be >= 1, got {attempts}")
        temperature, max_tokens = self.content_judge_temperature, self.content_judge_max_tokens
        if temperature is not None and not temperature >= 0:
            raise ValueError(
                f"reward.content_judge_temperature must be >= 0 (0 = greedy) or null, got {temperature}"
            )
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"reward.content_judge_max_tokens must be >= 1 or null, got {max_tokens}")
        _check_one_of("content_judge_parse", self.content_judge_parse, JUDGEMENT_PARSES)

    @property
    def answer_style(self) -> AnswerStyle:
        """How answers are compared with their golds: the style :attr:`metric_style` names (read once a
        round by :meth:`~memalpha.agent.rollout.Agent.rollouts`, which hands the object down)."""
        return ANSWER_STYLES[self.metric_style]

    def build_content_judge(self, reader: Reader) -> ContentJudge:
        """The r4 judge: the rule checks, or ``reader`` asked for a validity judgement per call
        (with this group's attempts, sampling and parse)."""
        if self.content_judge == "rule":
            return RuleContentJudge()
        return LLMContentJudge(
            reader,
            attempts=self.content_judge_attempts,
            sampling=ReaderSampling(self.content_judge_temperature, self.content_judge_max_tokens),
            parse=self.content_judge_parse,
        )
