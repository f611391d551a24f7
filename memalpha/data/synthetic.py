"""Synthetic memory tasks: the embedded default data (deterministic from a seed, no network).

Each instance spreads facts over several chunks and asks questions that only those facts
answer. Four families match the real metrics (``memalpha.agent.answer_metrics`` picks them by
``data_source``):

``synth_personal``  personal facts told in dated dialogue ("Which city did Adela Szabo move to?"
                    -> ``Lisbon``); short answers, substring metric.
``synth_timeline``  dated diary turns of who did what ("What did Bruno Eklund do on 2024-03-05?"
                    -> ``repaired a bicycle chain``); the date is only in the chunk header, so the
                    event must be stored with its time (episodic); substring metric.
``synth_icl``       labelled examples for in-context classification; an instance maps random
                    topics to labels, a question shows a new sentence and expects ``\\boxed{label}``;
                    the gold is the bare label (``"2"``), as in the real PubMed-RCT data; boxed metric.
``synth_summary``   a story read over several days (dated reading events); the question asks for a
                    summary of a date range, the gold is a comma-separated keyword list; keyword metric.

Two more shapes are real text's, not notes (named in ``families`` to be used):

``synth_conversation``  dated sessions of a chat between two or three friends, one session a
                    chunk, opened by a line as LoCoMo's (``[Chat between Ada and Bo, session 2,
                    4:04 pm on 17 March, 2024]``) and ending on a speaker's line: personal facts and
                    the day's events told in the first person, replies, small talk, other people's
                    news said in passing, and a fact told in one session and changed in a later one
                    (its question asks what holds now: ``metadata["changed_fact"]``); substring metric.
``synth_document``  a report read paragraph by paragraph: who leads each project, how many took
                    part, its budget, result and start date, among filler sentences; substring metric.

Knobs: chunks per instance, facts per chunk, distractor facts per chunk (about entities no
question asks about), questions per instance, chunk length in words (filler sentences, or
for ``synth_icl`` more labelled examples, top a chunk up to it) and where the questions' evidence
sits (:data:`EVIDENCE_PLACEMENTS`: ``random`` chunks, or ``spread`` evenly over the whole input, the
first chunks included, which the length benchmark needs). Entities come from per-split
pools (:mod:`memalpha.data.synthetic_vocab`), so train, validation and test never share one.
Instance ``i`` of a split is built from its own RNG seeded by ``(seed, split, i)``: the same
arguments give identical instances on every machine.

``metadata["notes"]`` lists, per chunk, every fact the chunk tells (distractors included, filler
excluded) with the memory list it belongs in (``semantic_memory`` for knowledge and labelled
examples, ``episodic_memory`` with its ``date`` for events and what was read on a day): what an
ideal agent stores, and what the oracle demonstrations of :mod:`memalpha.agent.oracle_demos` write.
``metadata["question_facts"]`` names, per question, the one fact that answers it (as
:func:`memalpha.agent.fact_recall.instance_facts` writes a fact: its date first when it has one), for
the families where one fact does (``synth_personal``, ``synth_timeline``; the others do not write
it): whether an answer was stored is then told apart from whether it was read back. The evidence
placement applies to those two families too (``synth_icl`` asks about labels seen everywhere,
``synth_summary`` about date ranges).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import cache
from typing import Literal, get_args

from memalpha.data import synthetic_vocab as vocab
from memalpha.data.schema import QA, Instance
from memalpha.data.wrapping import wrap_chunk

DEFAULT_FAMILIES = ("synth_personal", "synth_timeline", "synth_icl", "synth_summary")
"""The families a run mixes when it names none (those of the first generator version)."""
FAMILIES = (*DEFAULT_FAMILIES, "synth_conversation", "synth_document")
"""Every family the generator builds."""
GENERATOR_VERSION = "memalpha.synthetic/1"
ICL_NUM_LABELS = 4
EvidencePlacement = Literal["random", "spread"]
EVIDENCE_PLACEMENTS: tuple[str, ...] = get_args(EvidencePlacement)
"""Where the questions' evidence sits: ``random`` (the chunks are visited in a random order, one
question each, so a long instance asks about a few random chunks) or ``spread`` (question ``i`` of
``Q`` asks about a chunk of the ``i``-th of ``Q`` equal stretches of the input, so the questions
cover it from the first stretch to the last)."""


@dataclass(frozen=True)
class SynthConfig:
    """The size knobs of one synthetic instance."""

    num_chunks: int
    facts_per_chunk: int
    distractors_per_chunk: int
    questions_per_instance: int
    chunk_words: int
    evidence: EvidencePlacement = "random"

    def __post_init__(self) -> None:
        for name in ("num_chunks", "facts_per_chunk", "questions_per_instance"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("distractors_per_chunk", "chunk_words"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.evidence not in EVIDENCE_PLACEMENTS:
            raise ValueError(f"evidence must be one of {list(EVIDENCE_PLACEMENTS)}, got {self.evidence!r}")


@dataclass
class SyntheticSettings:
    """The synthetic data a run generates when it names no data files (``data.synthetic.*``).

    Args:
        train: Synthetic training instances when ``data.train_path`` is ``None``.
        val: Synthetic validation instances when ``data.val_path`` is ``None``.
        chunks: Chunks per synthetic instance.
        facts_per_chunk: Facts per synthetic chunk.
        distractors_per_chunk: Distractor facts per synthetic chunk.
        questions: Questions per synthetic instance.
        chunk_words: Approximate words per synthetic chunk.
        families: Synthetic task families to mix.
        evidence: Where the questions' evidence sits (``synth_personal`` and ``synth_timeline``):
            ``random`` (a few chunks in a random order) or ``spread`` (question ``i`` of ``Q`` about
            the ``i``-th of ``Q`` equal stretches of the input, first stretch included: what a long
            input needs to test every part of it).
    """

    train: int = 64
    val: int = 16
    chunks: int = 3
    facts_per_chunk: int = 3
    distractors_per_chunk: int = 1
    questions: int = 4
    chunk_words: int = 100
    families: tuple[str, ...] = field(default=DEFAULT_FAMILIES)
    evidence: EvidencePlacement = "random"

    def __post_init__(self) -> None:
        at_least = {"train": 1, "val": 1, "chunks": 1, "facts_per_chunk": 1, "distractors_per_chunk": 0,
                    "questions": 1, "chunk_words": 1}
        for name, low in at_least.items():
            value = getattr(self, name)
            if value < low:
                raise ValueError(f"data.synthetic.{name} must be >= {low}, got {value}")
        self.families = tuple(self.families)
        if not self.families or any(family not in FAMILIES for family in self.families):
            raise ValueError(
                "data.synthetic.families must be a non-empty list "
                f"of {list(FAMILIES)}, got {list(self.families)}"
            )
        if self.evidence not in EVIDENCE_PLACEMENTS:
            raise ValueError(
                f"data.synthetic.evidence must be one of {list(EVIDENCE_PLACEMENTS)}, got {self.evidence!r}"
            )

    def generate(self, split: str, seed: int, count: int | None = None) -> list[Instance]:
        """:func:`generate_synthetic` with these settings: ``count`` instances of ``split`` (``None``:
        ``train`` for the training split, ``val`` for any other)."""
        if count is None:
            count = self.train if split == "train" else self.val
        return generate_synthetic(
            count, split=split, seed=seed, num_chunks=self.chunks, facts_per_chunk=self.facts_per_chunk,
            distractors_per_chunk=self.distractors_per_chunk, questions_per_instance=self.questions,
            chunk_words=self.chunk_words, families=self.families, evidence=self.evidence,
        )


@dataclass(frozen=True)
class SplitPools:
    """One split's share of every entity pool."""

    first_names: list[str]
    last_names: list[str]
    attribute_values: dict[str, list[str]]
    activities: list[str]
    towns: list[str]
    key_objects: list[str]
    icl_topics: list[tuple[str, ...]]


@cache
def split_pools(split: str) -> SplitPools:
    """The entity pools of ``split`` (``train``, ``validation``/``val``, ``test``)."""
    def part(pool: Sequence) -> list:
        return vocab.pool_for_split(pool, split)

    return SplitPools(
        first_names=part(vocab.FIRST_NAMES),
        last_names=part(vocab.LAST_NAMES),
        attribute_values={attr.name: part(attr.pool) for attr in PERSONAL_ATTRIBUTES},
        activities=part(vocab.ACTIVITIES),
        towns=part(vocab.TOWNS),
        key_objects=part(vocab.KEY_OBJECTS),
        icl_topics=part(vocab.ICL_TOPICS),
    )


def generate_synthetic(
    num_instances: int,
    split: str = "train",
    seed: int = 0,
    num_chunks: int = 4,
    facts_per_chunk: int = 3,
    distractors_per_chunk: int = 1,
    questions_per_instance: int = 4,
    chunk_words: int = 120,
    families: tuple[str, ...] = DEFAULT_FAMILIES,
    evidence: EvidencePlacement = "random",
) -> list[Instance]:
    """``num_instances`` synthetic instances of ``split``, cycling through ``families`` in order.

    Instance ids are ``{family}-{split}-s{seed}-{index:05d}``. ``questions_per_instance`` is an
    upper bound: a family asks at most as many questions as it has distinct facts.
    """
    if num_instances < 0:
        raise ValueError(f"num_instances must be >= 0, got {num_instances}")
    families = tuple(families)
    if not families:
        raise ValueError("families must name at least one family")
    unknown = [f for f in families if f not in _BUILDERS]
    if unknown:
        raise ValueError(f"unknown synthetic families {unknown}; expected some of {FAMILIES}")
    config = SynthConfig(
        num_chunks, facts_per_chunk, distractors_per_chunk, questions_per_instance, chunk_words, evidence
    )
    split = vocab.canonical_split(split)
    pools = split_pools(split)
    instances = []
    for index in range(num_instances):
        family = families[index % len(families)]
        rng = random.Random(f"memalpha-synthetic|{seed}|{split}|{index}")
        instance_id = f"{family}-{split}-s{seed}-{index:05d}"
        chunks, questions, evidence, entities, extra = _BUILDERS[family](rng, pools, config)
        metadata = {
            "generator": GENERATOR_VERSION,
            "split": split,
            "seed": seed,
            "index": index,
            "evidence_chunks": evidence,
            "entities": sorted(entities),
            **extra,
        }
        instances.append(Instance(instance_id, family, chunks, questions, metadata))
    return instances


# ---------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------

_Built = tuple[list[str], list[QA], list[list[int]], set[str], dict]

SEMANTIC_NOTE, EPISODIC_NOTE = "semantic_memory", "episodic_memory"


def _note(memory_type: str, fact: str, day: date | None = None) -> dict[str, str]:
    """One fact a chunk tells, with the memory list it belongs in (and, for an event, its date)."""
    note = {"memory_type": memory_type, "fact": fact}
    if day is not None:
        note["date"] = f"{day:%Y-%m-%d}"
    return note


def _article(phrase: str) -> str:
    return "an" if phrase[:1].lower() in "aeiou" else "a"


def _take(rng: random.Random, pool: Sequence[str], k: int) -> list[str]:
    """``k`` items of ``pool``: all distinct when the pool is big enough, else repeating it in shuffled
    rounds."""
    out: list[str] = []
    while len(out) < k:
        batch = list(pool)
        rng.shuffle(batch)
        out.extend(batch[: k - len(out)])
    return out


def _people(rng: random.Random, pools: SplitPools, k: int) -> list[str]:
    """``k`` distinct full names from the split's name pools."""
    if k <= min(len(pools.first_names), len(pools.last_names)):
        return [f"{a} {b}" for a, b in zip(rng.sample(pools.first_names, k), rng.sample(pools.last_names, k))]
    combos = [f"{a} {b}" for a, b in itertools.product(pools.first_names, pools.last_names)]
    if k > len(combos):
        raise ValueError(f"{k} people needed but the split's name pool has only {len(combos)}")
    return rng.sample(combos, k)


def _dates(rng: random.Random, n: int) -> list[date]:
    """``n`` increasing days: a random start in 2024, then gaps of 1-3 days."""
    day = date(2024, 1, 1) + timedelta(days=rng.randrange(0, 300))
    days = []
    for _ in range(n):
        days.append(day)
        day += timedelta(days=rng.randint(1, 3))
    return days


def _compose(
    rng: random.Random, required: list[str], filler: Sequence[str], min_words: int, sep: str = " "
) -> str:
    """The ``required`` sentences mixed at random places into filler sentences, up to ``min_words`` words."""
    sentences = list(required)
    words = sum(len(s.split()) for s in sentences)
    spare: list[str] = []
    while words < min_words:
        if not spare:
            spare = list(filler)
            rng.shuffle(spare)
        sentence = spare.pop()
        sentences.insert(rng.randint(0, len(sentences)), sentence)
        words += len(sentence.split())
    return sep.join(sentences)


def _spread_questions(rng: random.Random, per_chunk: list[list[int]], k: int) -> list[int]:
    """Pick ``k`` fact ids round-robin over the chunks (so questions need many chunks), in random order."""
    queues = [list(ids) for ids in per_chunk]
    for queue in queues:
        rng.shuffle(queue)
    order = list(range(len(queues)))
    rng.shuffle(order)
    picked: list[int] = []
    while len(picked) < k and any(queues):
        for c in order:
            if queues[c] and len(picked) < k:
                picked.append(queues[c].pop())
    rng.shuffle(picked)
    return picked


def stretch_chunks(num_chunks: int, k: int) -> list[range]:
    """The ``k`` equal stretches of ``num_chunks`` chunks, in order (a stretch shorter than one chunk
    is the chunk it falls in)."""
    out = []
    for i in range(k):
        low = i * num_chunks // k
        out.append(range(low, max(low + 1, (i + 1) * num_chunks // k)))
    return out


def _evenly_placed_questions(rng: random.Random, per_chunk: list[list[int]], k: int) -> list[int]:
    """Pick ``k`` fact ids, the ``i``-th from a random chunk of the ``i``-th of ``k`` equal stretches
    of the input (a stretch with no fact left gives the unpicked fact nearest to it), in that order."""
    left = [list(ids) for ids in per_chunk]
    picked: list[int] = []
    for stretch in stretch_chunks(len(per_chunk), k):
        chunks = [c for c in stretch if left[c]]
        if not chunks:  # nearest chunk with a fact left, earlier first on a tie
            spare = [c for c in range(len(left)) if left[c]]
            if not spare:
                break
            middle = (stretch.start + stretch.stop - 1) / 2
            chunks = [min(spare, key=lambda c: (abs(c - middle), c))]
        chunk = rng.choice(chunks)
        picked.append(left[chunk].pop(rng.randrange(len(left[chunk]))))
    return picked


def _pick_questions(rng: random.Random, per_chunk: list[list[int]], cfg: SynthConfig) -> list[int]:
    """The asked fact ids, as ``cfg.evidence`` places them."""
    if cfg.evidence == "spread":
        return _evenly_placed_questions(rng, per_chunk, cfg.questions_per_instance)
    return _spread_questions(rng, per_chunk, cfg.questions_per_instance)


# ---------------------------------------------------------------------------
# synth_personal
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PersonalAttribute:
    """A kind of personal fact: its value pool, how it is told and how it is asked."""

    name: str
    pool: tuple[str, ...]
    statement: str
    question: str


PERSONAL_ATTRIBUTES = (
    PersonalAttribute(
        "city", vocab.CITIES, "{p} told me they moved to {v} a few weeks ago.", "Which city did {p} move to?"
    ),
    PersonalAttribute(
        "pet", vocab.PET_NAMES, "{p} adopted a puppy and called it {v}.", "What is the name of {p}'s puppy?"
    ),
    PersonalAttribute(
        "dish", vocab.DISHES, "{p} says their favourite dish is {v}.", "What is {p}'s favourite dish?"
    ),
    PersonalAttribute("job", vocab.PROFESSIONS, "{p} now works as {a} {v}.", "What does {p} work as?"),
    PersonalAttribute(
        "instrument",
        vocab.INSTRUMENTS,
        "{p} has started taking {v} lessons.",
        "Which instrument is {p} learning?",
    ),
    PersonalAttribute(
        "hobby", vocab.HOBBIES, "{p} has taken up {v} as a hobby.", "Which hobby has {p} taken up?"
    ),
    PersonalAttribute(
        "street", vocab.STREETS, "{p} rented a flat on {v}.", "On which street did {p} rent a flat?"
    ),
    PersonalAttribute(
        "language",
        vocab.LANGUAGES,
        "{p} signed up for evening classes in {v}.",
        "Which language is {p} studying in evening classes?",
    ),
)


def _personal_facts(
    rng: random.Random, pools: SplitPools, count: int, people: list[str]
) -> list[tuple[str, PersonalAttribute, str]]:
    pairs = rng.sample(list(itertools.product(people, PERSONAL_ATTRIBUTES)), count)
    values: dict[str, list[str]] = {}
    for attr in PERSONAL_ATTRIBUTES:
        needed = sum(1 for _, a in pairs if a is attr)
        values[attr.name] = _take(rng, pools.attribute_values[attr.name], needed)
    return [(person, attr, values[attr.name].pop()) for person, attr in pairs]


def _say(fact: tuple[str, PersonalAttribute, str]) -> str:
    person, attr, value = fact
    return attr.statement.format(p=person, v=value, a=_article(value))


def _build_personal(rng: random.Random, pools: SplitPools, cfg: SynthConfig) -> _Built:
    n_facts = cfg.num_chunks * cfg.facts_per_chunk
    n_distractors = cfg.num_chunks * cfg.distractors_per_chunk
    n_people = max(2, math.ceil(n_facts / 3))
    n_others = math.ceil(n_distractors / 2)
    everyone = _people(rng, pools, n_people + n_others)
    people, others = everyone[:n_people], everyone[n_people:]
    facts = _personal_facts(rng, pools, n_facts, people)
    distractors = _personal_facts(rng, pools, n_distractors, others) if n_distractors else []
    days = _dates(rng, cfg.num_chunks)
    chunks, per_chunk, notes = [], [], []
    for c in range(cfg.num_chunks):
        ids = list(range(c * cfg.facts_per_chunk, (c + 1) * cfg.facts_per_chunk))
        told = [_say(facts[i]) for i in ids]
        told += [
            _say(d) for d in distractors[c * cfg.distractors_per_chunk : (c + 1) * cfg.distractors_per_chunk]
        ]
        body = _compose(rng, told, vocab.DIALOGUE_FILLER, cfg.chunk_words)
        chunks.append(wrap_chunk(body, "dialogue", days[c], variant=rng.randrange(1 << 16)))
        per_chunk.append(ids)
        notes.append([_note(SEMANTIC_NOTE, sentence) for sentence in told])
    picked = _pick_questions(rng, per_chunk, cfg)
    questions = [QA(facts[i][1].question.format(p=facts[i][0]), facts[i][2]) for i in picked]
    evidence = [[i // cfg.facts_per_chunk] for i in picked]
    question_facts = [_say(facts[i]) for i in picked]
    entities = set(everyone) | {v for _, _, v in facts + distractors}
    return (
        chunks,
        questions,
        evidence,
        entities,
        {"people": people, "distractor_people": others, "notes": notes, "question_facts": question_facts},
    )


# ---------------------------------------------------------------------------
# synth_timeline
# ---------------------------------------------------------------------------

TIMES_OF_DAY = (
    "Early this morning",
    "Later in the morning",
    "Around noon today",
    "This afternoon",
    "This evening",
    "Late tonight",
)


def _build_timeline(rng: random.Random, pools: SplitPools, cfg: SynthConfig) -> _Built:
    per_day = cfg.facts_per_chunk
    n_people = per_day + 1
    n_others = math.ceil(cfg.num_chunks * cfg.distractors_per_chunk / 2) if cfg.distractors_per_chunk else 0
    everyone = _people(rng, pools, n_people + n_others)
    people, others = everyone[:n_people], everyone[n_people:]
    n_events = cfg.num_chunks * (per_day + cfg.distractors_per_chunk)
    activities = _take(rng, pools.activities, n_events)
    days = _dates(rng, cfg.num_chunks)
    chunks, per_chunk, events, notes = [], [], [], []
    for c, day in enumerate(days):
        actors = [(p, True) for p in rng.sample(people, per_day)]
        actors += [(p, False) for p in _take(rng, others, cfg.distractors_per_chunk)] if others else []
        rng.shuffle(actors)
        slots = (
            sorted(rng.sample(range(len(TIMES_OF_DAY)), len(actors)))
            if len(actors) <= len(TIMES_OF_DAY)
            else None
        )
        told, ids, chunk_notes = [], [], []
        for j, (person, asked) in enumerate(actors):
            activity = activities.pop()
            when = TIMES_OF_DAY[slots[j]] if slots is not None else TIMES_OF_DAY[j % len(TIMES_OF_DAY)]
            told.append(f"{when}, {person} {activity}.")
            chunk_notes.append(_note(EPISODIC_NOTE, f"{person} {activity}.", day))
            if asked:
                ids.append(len(events))
                events.append((person, day, activity, c))
        body = _compose(rng, told, vocab.DIALOGUE_FILLER, cfg.chunk_words)
        chunks.append(wrap_chunk(body, "dialogue", day, variant=rng.randrange(1 << 16)))
        per_chunk.append(ids)
        notes.append(chunk_notes)
    picked = _pick_questions(rng, per_chunk, cfg)
    questions = [QA(f"What did {events[i][0]} do on {events[i][1]:%Y-%m-%d}?", events[i][2]) for i in picked]
    evidence = [[events[i][3]] for i in picked]
    question_facts = [f"{events[i][1]:%Y-%m-%d} {events[i][0]} {events[i][2]}." for i in picked]
    entities = set(everyone) | {e[2] for e in events}
    return (
        chunks,
        questions,
        evidence,
        entities,
        {"people": people, "distractor_people": others, "notes": notes, "question_facts": question_facts},
    )


# ---------------------------------------------------------------------------
# synth_icl
# ---------------------------------------------------------------------------

ICL_QUESTION = "Sentence: {s}\n\nWhat is the label of the sentence above? Give the label inside \\boxed{{}}."


def _icl_sentence(rng: random.Random, topic: Sequence[str]) -> str:
    a, b = rng.sample(list(topic), 2)
    return rng.choice(vocab.ICL_TEMPLATES).format(a=a, b=b)


def _example(sentence: str, label: int) -> str:
    return f"Sample: {sentence}\nLabel: {label}"


def _build_icl(rng: random.Random, pools: SplitPools, cfg: SynthConfig) -> _Built:
    topics = list(pools.icl_topics)
    rng.shuffle(topics)
    use_distractors = cfg.distractors_per_chunk > 0 and len(topics) > 2
    n_labels = min(ICL_NUM_LABELS, len(topics) - (1 if use_distractors else 0))
    label_topics = topics[:n_labels]
    distractor_topic = topics[n_labels] if use_distractors else None
    days = _dates(rng, cfg.num_chunks)
    seen: set[str] = set()
    chunks: list[str] = []
    notes: list[list[dict[str, str]]] = []
    label_chunks: dict[int, set[int]] = {label: set() for label in range(n_labels)}
    label_cycle = itertools.cycle(rng.sample(range(n_labels), n_labels))
    for c, day in enumerate(days):
        examples: list[str] = []
        words = 0
        while len(examples) < cfg.facts_per_chunk or words < cfg.chunk_words:
            label = next(label_cycle) if len(examples) < cfg.facts_per_chunk else rng.randrange(n_labels)
            sentence = _icl_sentence(rng, label_topics[label])
            seen.add(sentence)
            examples.append(_example(sentence, label))
            label_chunks[label].add(c)
            words += len(examples[-1].split())
        if distractor_topic is not None:
            for _ in range(cfg.distractors_per_chunk):
                sentence = _icl_sentence(rng, distractor_topic)
                seen.add(sentence)
                examples.append(_example(sentence, n_labels))
        rng.shuffle(examples)
        notes.append([_note(SEMANTIC_NOTE, example.replace("\n", " ")) for example in examples])
        body = "Here are labelled examples to learn from:\n\n" + "\n\n".join(examples)
        chunks.append(wrap_chunk(body, "dialogue", day, variant=rng.randrange(1 << 16)))
    questions, evidence = [], []
    for _ in range(cfg.questions_per_instance):
        label = next(label_cycle)
        sentence = _icl_sentence(rng, label_topics[label])
        for _ in range(100):  # a sentence never shown as an example (almost always the first try)
            if sentence not in seen:
                break
            sentence = _icl_sentence(rng, label_topics[label])
        seen.add(sentence)
        questions.append(QA(ICL_QUESTION.format(s=sentence), str(label)))
        evidence.append(sorted(label_chunks[label]))
    entities = {w for t in label_topics for w in t} | (set(distractor_topic) if distractor_topic else set())
    extra = {
        "num_labels": n_labels,
        "label_topics": {str(i): t[0] for i, t in enumerate(label_topics)},
        "notes": notes,
    }
    return chunks, questions, evidence, entities, extra


# ---------------------------------------------------------------------------
# synth_summary
# ---------------------------------------------------------------------------

STORY_FACTS = (
    "{p} found {a} {k} hidden under the floorboards of an empty house in {t}.",
    "At the Saturday market in {t}, {p} bargained for {a} {k}.",
    "{p} learned that the {k} had once belonged to a ferryman.",
    "That night {p} hid the {k} inside a coat pocket.",
    "A stranger offered {p} a purse of coins for the {k}, and {p} refused.",
    "{p} carried the {k} up the hill above {t}.",
    "The {k} was the last thing {p} looked at before falling asleep.",
    "At dawn {p} handed the {k} to an old friend for safekeeping.",
    "{p} noticed strange markings scratched into the {k}.",
    "Back in {t}, {p} showed the {k} to the schoolteacher.",
)
STORY_DISTRACTORS = (
    "{A} {k} lay on a shelf in the inn, but nobody paid it any attention.",
    "Someone had left {a} {k} by the well; it was gone by evening.",
    "The shopkeeper dusted {a} {k} that had not sold in years.",
)
SUMMARY_QUESTION_RANGE = "Summarise the part of the book I read from {a} to {b}."
SUMMARY_QUESTION_DAY = "Summarise the part of the book I read on {a}."


def _build_summary(rng: random.Random, pools: SplitPools, cfg: SynthConfig) -> _Built:
    hero = _people(rng, pools, 1)[0]
    town = rng.choice(pools.towns)
    n_facts = cfg.num_chunks * cfg.facts_per_chunk
    n_distractors = cfg.num_chunks * cfg.distractors_per_chunk
    keys = _take(rng, pools.key_objects, n_facts)
    unused = [k for k in pools.key_objects if k not in keys]  # distractors never reuse a keyword
    spare = _take(rng, unused, n_distractors) if unused else []
    objects = keys + spare
    days = _dates(rng, cfg.num_chunks)
    chunks, chunk_keys, notes = [], [], []
    for c, day in enumerate(days):
        own = keys[c * cfg.facts_per_chunk : (c + 1) * cfg.facts_per_chunk]
        story = [rng.choice(STORY_FACTS).format(p=hero, k=k, t=town, a=_article(k)) for k in own]
        noise = [
            rng.choice(STORY_DISTRACTORS).format(k=k, a=_article(k), A=_article(k).capitalize())
            for k in spare[c * cfg.distractors_per_chunk : (c + 1) * cfg.distractors_per_chunk]
        ]
        mixed = list(story)
        for sentence in noise:
            mixed.insert(rng.randint(0, len(mixed)), sentence)
        body = _compose(rng, mixed, vocab.STORY_FILLER, cfg.chunk_words)
        chunks.append(wrap_chunk(body, "reading", day))
        chunk_keys.append(own)
        notes.append([_note(EPISODIC_NOTE, sentence, day) for sentence in mixed])
    n = cfg.num_chunks
    ranges = [(a, b) for a in range(n) for b in range(a, n) if (a, b) != (0, n - 1)]
    rng.shuffle(ranges)
    ranges = [(0, n - 1)] + ranges[: cfg.questions_per_instance - 1]
    questions, evidence = [], []
    for a, b in ranges:
        words = [hero, town] + [k for c in range(a, b + 1) for k in chunk_keys[c]]
        gold = ", ".join(dict.fromkeys(words))
        template = SUMMARY_QUESTION_DAY if a == b else SUMMARY_QUESTION_RANGE
        questions.append(QA(template.format(a=f"{days[a]:%Y-%m-%d}", b=f"{days[b]:%Y-%m-%d}"), gold))
        evidence.append(list(range(a, b + 1)))
    entities = {hero, town, *objects}
    return chunks, questions, evidence, entities, {"protagonist": hero, "town": town, "notes": notes}


# ---------------------------------------------------------------------------
# synth_conversation
# ---------------------------------------------------------------------------

FIRST_PERSON = {
    "city": "I moved to {v} a few weeks ago.",
    "pet": "I adopted a puppy and called it {v}.",
    "dish": "My favourite dish is {v} these days.",
    "job": "I now work as {a} {v}.",
    "instrument": "I have started taking {v} lessons.",
    "hobby": "I have taken up {v} as a hobby.",
    "street": "I rented a flat on {v}.",
    "language": "I signed up for evening classes in {v}.",
}
"""How a speaker tells a personal fact of their own, per :data:`PERSONAL_ATTRIBUTES` name."""
SHORT_NOTES = {
    "city": "{p} moved to {v}.",
    "pet": "{p} has a puppy called {v}.",
    "dish": "{p}'s favourite dish is {v}.",
    "job": "{p} works as {a} {v}.",
    "instrument": "{p} takes {v} lessons.",
    "hobby": "{p} took up {v}.",
    "street": "{p} rents a flat on {v}.",
    "language": "{p} takes evening classes in {v}.",
}
"""What a memory keeps of a personal fact told in a chat: short, as a reply must hold several."""
CHANGE_OF_MIND = "Change of plan since we last talked: {statement}"
"""How a speaker corrects, in a later session, a fact they told in an earlier one."""
CHAT_EVENTS = ("Guess what, today I {v}.", "I {v} today, finally.", "Today I {v}, it took all afternoon.")
"""How a speaker tells what they did on the session's day (an event: episodic, dated)."""
IN_PASSING = "By the way, {fact}"
"""How a speaker mentions someone else's news (a distractor: no question asks about it)."""
SESSION_TIMES = ("9:15 am", "11:40 am", "1:02 pm", "4:04 pm", "6:40 pm", "8:45 pm")


def chat_date(day: date) -> str:
    """A day as a chat session's line writes it, as LoCoMo does: ``17 March, 2024``."""
    return f"{day.day} {day:%B, %Y}"


def _short(fact: tuple[str, PersonalAttribute, str]) -> str:
    person, attr, value = fact
    return SHORT_NOTES[attr.name].format(p=person, v=value, a=_article(value))


def _chat_lines(rng: random.Random, speakers: list[str]) -> list[str]:
    """Small talk: every filler sentence and reply, each said by one of ``speakers``."""
    return [f"{rng.choice(speakers)}: {line}" for line in vocab.DIALOGUE_FILLER + vocab.CHAT_REPLIES]


def _build_conversation(rng: random.Random, pools: SplitPools, cfg: SynthConfig) -> _Built:
    """Dated sessions of a chat between two or three friends: personal facts and the day's events
    told in the first person, a reply after each, small talk, other people's news said in passing,
    and (from two sessions on) a fact told in one session and changed in a later one."""
    n_slots = cfg.num_chunks * cfg.facts_per_chunk
    speakers = rng.sample(pools.first_names, 3 if n_slots > 8 else 2)
    n_others = math.ceil(cfg.num_chunks * cfg.distractors_per_chunk / 2)
    others = _people(rng, pools, n_others) if n_others else []
    n_attributes = min(n_slots - n_slots // 3, len(speakers) * len(PERSONAL_ATTRIBUTES))
    attribute_facts = _personal_facts(rng, pools, n_attributes, speakers)
    activities = _take(rng, pools.activities, n_slots - n_attributes)
    n_passing = cfg.num_chunks * cfg.distractors_per_chunk
    distractors = _personal_facts(rng, pools, n_passing, others) if others else []
    kinds = ["attribute"] * n_attributes + ["event"] * (n_slots - n_attributes)
    rng.shuffle(kinds)
    days = _dates(rng, cfg.num_chunks)
    facts: list[dict] = []  # per told fact: its chunk, its line, its note, question and answer
    for slot, kind in enumerate(kinds):
        chunk = slot // cfg.facts_per_chunk
        if kind == "attribute":
            person, attr, value = attribute_facts.pop()
            line = FIRST_PERSON[attr.name].format(v=value, a=_article(value))
            fact = _short((person, attr, value))
            facts.append({"chunk": chunk, "owner": person, "line": line, "note": _note(SEMANTIC_NOTE, fact),
                          "fact": fact, "question": attr.question.format(p=person), "answer": value,
                          "attribute": attr, "value": value})
        else:  # one event a speaker a session while speakers last (a day's question has one answer)
            busy = {f["owner"] for f in facts if f["chunk"] == chunk and f.get("event")}
            free = [p for p in speakers if p not in busy] or speakers
            person, activity = rng.choice(free), activities.pop()
            fact, day = f"{person} {activity}.", days[chunk]
            facts.append({"chunk": chunk, "owner": person, "line": rng.choice(CHAT_EVENTS).format(v=activity),
                          "note": _note(EPISODIC_NOTE, fact, day), "fact": f"{day:%Y-%m-%d} {fact}",
                          "question": f"What did {person} do on {chat_date(day)}?", "answer": activity,
                          "event": True})
    changed = None
    earlier = [f for f in facts if "attribute" in f and f["chunk"] < cfg.num_chunks - 1]
    old = rng.choice(earlier) if earlier else None
    used = {f.get("value") for f in facts}
    unused = [v for v in pools.attribute_values[old["attribute"].name] if v not in used] if old else []
    if unused:
        attr, person = old["attribute"], old["owner"]
        value = rng.choice(unused)
        statement = FIRST_PERSON[attr.name].format(v=value, a=_article(value))
        fact = f"{_short((person, attr, value))[:-1]}, no longer {old['answer']}."
        chunk = rng.randint(old["chunk"] + 1, cfg.num_chunks - 1)
        old["superseded"] = True
        changed = {"chunk": chunk, "owner": person, "line": CHANGE_OF_MIND.format(statement=statement),
                   "note": _note(SEMANTIC_NOTE, fact), "fact": fact,
                   "question": old["question"], "answer": value, "was": old["answer"]}
        facts.append(changed)
    chunks, per_chunk, notes = [], [[] for _ in days], []
    events = Counter((f["owner"], f["chunk"]) for f in facts if f.get("event"))
    for index, fact in enumerate(facts):  # asked: what holds now, and days with one event of a speaker
        shared_day = fact.get("event") and events[fact["owner"], fact["chunk"]] > 1
        if not fact.get("superseded") and not shared_day:
            per_chunk[fact["chunk"]].append(index)
    small_talk = _chat_lines(rng, speakers)
    for c, day in enumerate(days):
        told = [f for f in facts if f["chunk"] == c]
        lines = [
            f"{f['owner']}: {f['line']}\n{rng.choice([s for s in speakers if s != f['owner']])}: "
            f"{rng.choice(vocab.CHAT_REPLIES)}"
            for f in told
        ]
        passing = distractors[c * cfg.distractors_per_chunk : (c + 1) * cfg.distractors_per_chunk]
        lines += [f"{rng.choice(speakers)}: {IN_PASSING.format(fact=_say(d))}" for d in passing]
        rng.shuffle(lines)
        names = ", ".join(speakers[:-1]) + f" and {speakers[-1]}"
        header = f"[Chat between {names}, session {c + 1}, {rng.choice(SESSION_TIMES)} on {chat_date(day)}]"
        chunks.append(header + "\n" + _compose(rng, lines, small_talk, cfg.chunk_words, sep="\n"))
        notes.append([f["note"] for f in told] + [_note(SEMANTIC_NOTE, _short(d)) for d in passing])
    picked = _pick_questions(rng, per_chunk, cfg)
    if changed is not None and facts.index(changed) not in picked and picked:
        picked[-1] = facts.index(changed)  # a conversation asks what holds now
    questions = [QA(facts[i]["question"], facts[i]["answer"]) for i in picked]
    evidence = [[facts[i]["chunk"]] for i in picked]
    entities = set(speakers) | set(others) | {f["answer"] for f in facts} | {v for _, _, v in distractors}
    extra = {"people": speakers, "distractor_people": others, "notes": notes,
             "question_facts": [facts[i]["fact"] for i in picked]}
    if changed is not None:
        extra["changed_fact"] = {"chunk": changed["chunk"], "question": changed["question"],
                                 "was": changed["was"], "now": changed["answer"]}
    return chunks, questions, evidence, entities, extra


# ---------------------------------------------------------------------------
# synth_document
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectAttribute:
    """A kind of fact a report states about a project: how it is stated and asked."""

    name: str
    statement: str
    question: str


PROJECT_ATTRIBUTES = (
    ProjectAttribute("lead", "The {j} is led by {v}.", "Who leads the {j}?"),
    ProjectAttribute("participants", "The {j} enrolled {v} participants.",
                     "How many participants did the {j} enrol?"),
    ProjectAttribute("budget", "The {j} has a budget of {v} thousand euros.",
                     "What is the budget of the {j}, in thousand euros?"),
    ProjectAttribute("result", "The {j} reported an improvement of {v} per cent.",
                     "By how many per cent did the {j} improve?"),
    ProjectAttribute("start", "Work on the {j} began on {v}.", "When did work on the {j} begin?"),
)


PROJECT_NUMBERS = {"participants": (40, 990), "budget": (20, 950), "result": (3, 60)}
"""The range each numeric project attribute is drawn from."""


def _project_value(rng: random.Random, attr: ProjectAttribute, pools: SplitPools, used: set[str]) -> str:
    """A value of ``attr`` no other fact of the instance has."""
    while True:
        if attr.name == "lead":
            value = _people(rng, pools, 1)[0]
        elif attr.name == "start":
            day = date(2023, 1, 1) + timedelta(days=rng.randrange(0, 700))
            value = f"{day.day} {day:%B %Y}"
        else:
            value = str(rng.randint(*PROJECT_NUMBERS[attr.name]))
        if value not in used:
            used.add(value)
            return value


def _build_document(rng: random.Random, pools: SplitPools, cfg: SynthConfig) -> _Built:
    """A report read paragraph by paragraph: who leads each project, how many took part, its budget,
    result and start date (names, numbers, dates), among the report's filler sentences; the
    projects no question asks about are the distractors."""
    n_facts = cfg.num_chunks * cfg.facts_per_chunk
    n_distractors = cfg.num_chunks * cfg.distractors_per_chunk
    n_projects = max(1, math.ceil(n_facts / 3)) + math.ceil(n_distractors / 3)
    towns = _take(rng, pools.towns, n_projects)
    kinds = _take(rng, vocab.PROJECT_KINDS, n_projects)
    projects = list(dict.fromkeys(f"{t} {k}" for t, k in zip(towns, kinds)))
    asked_projects = projects[: max(1, math.ceil(n_facts / 3))]
    other_projects = projects[len(asked_projects) :] or asked_projects

    def facts_of(names: list[str], count: int) -> list[tuple[str, ProjectAttribute]]:
        """``count`` (project, attribute) pairs, all distinct while there are enough (the asked
        facts always are: each asked project has 5 attributes for at most 3 facts)."""
        pairs = list(itertools.product(names, PROJECT_ATTRIBUTES))
        rng.shuffle(pairs)
        return [pairs[i % len(pairs)] for i in range(count)]

    used: set[str] = set()
    facts = [(j, a, _project_value(rng, a, pools, used)) for j, a in facts_of(asked_projects, n_facts)]
    distractors = [
        (j, a, _project_value(rng, a, pools, used)) for j, a in facts_of(other_projects, n_distractors)
    ]

    def state(fact: tuple[str, ProjectAttribute, str]) -> str:
        project, attr, value = fact
        sentence = attr.statement.format(j=project, v=value)
        return sentence[0].upper() + sentence[1:]

    chunks, per_chunk, notes = [], [], []
    for c in range(cfg.num_chunks):
        ids = list(range(c * cfg.facts_per_chunk, (c + 1) * cfg.facts_per_chunk))
        told = [state(facts[i]) for i in ids]
        told += [state(d) for d in distractors[c * cfg.distractors_per_chunk :][: cfg.distractors_per_chunk]]
        chunks.append(_compose(rng, told, vocab.DOCUMENT_FILLER, cfg.chunk_words))
        per_chunk.append(ids)
        notes.append([_note(SEMANTIC_NOTE, sentence) for sentence in told])
    picked = _pick_questions(rng, per_chunk, cfg)
    questions = [QA(facts[i][1].question.format(j=facts[i][0]), facts[i][2]) for i in picked]
    evidence = [[i // cfg.facts_per_chunk] for i in picked]
    # numbers and dates are not split entities (any split may draw the same number)
    entities = set(projects) | {v for _, a, v in facts + distractors if a.name == "lead"}
    extra = {"projects": asked_projects, "notes": notes, "question_facts": [state(facts[i]) for i in picked]}
    return chunks, questions, evidence, entities, extra


_BUILDERS: dict[str, Callable[[random.Random, SplitPools, SynthConfig], _Built]] = {
    "synth_personal": _build_personal,
    "synth_timeline": _build_timeline,
    "synth_icl": _build_icl,
    "synth_summary": _build_summary,
    "synth_conversation": _build_conversation,
    "synth_document": _build_document,
}
