"""Short, seeded, collision-free entry ids.

The official code draws random 4-character ids; memalpha needs ids that are the
same on every run with the same seed and that never repeat inside one memory.

The n-th id is a keyed bijection of ``n`` written in hexadecimal. Counters
0..65535 map one-to-one onto the 4-digit ids; the next 16**5 counters map onto
5-digit ids, and so on. Because every step of the mixing function is invertible
modulo a power of two, two different counters never give the same id, so no
"seen" set has to be stored: the allocator's whole state is ``(seed, counter)``.
Deleted ids are never handed out again, because the counter only moves forward.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

MIN_ID_DIGITS = 4


@lru_cache(maxsize=64)
def _keys(seed: int, digits: int) -> tuple[int, int, int]:
    """Per-(seed, width) constants: an offset and two odd multipliers."""
    bits = 4 * digits
    mask = (1 << bits) - 1
    raw = hashlib.blake2b(f"memalpha-ids:{seed}:{digits}".encode(), digest_size=24).digest()
    offset = int.from_bytes(raw[0:8], "little") & mask
    mult_a = (int.from_bytes(raw[8:16], "little") & mask) | 1
    mult_b = (int.from_bytes(raw[16:24], "little") & mask) | 1
    return offset, mult_a, mult_b


def _mix(value: int, seed: int, digits: int) -> int:
    """A bijection of ``[0, 16**digits)`` keyed by ``seed`` (add, multiply by odd, xor-shift)."""
    bits = 4 * digits
    mask = (1 << bits) - 1
    offset, mult_a, mult_b = _keys(seed, digits)
    x = (value + offset) & mask
    x = (x * mult_a) & mask
    x ^= x >> (bits // 2)
    x = (x * mult_b) & mask
    x ^= x >> (bits // 3)
    return x


def id_for_counter(seed: int, counter: int) -> str:
    """The id with index ``counter`` (>= 0) under ``seed``; distinct counters give distinct ids."""
    digits = MIN_ID_DIGITS
    start = 0
    while counter - start >= 16**digits:
        start += 16**digits
        digits += 1
    return format(_mix(counter - start, seed, digits), f"0{digits}x")


class IdAllocator:
    """Hands out ids in a fixed order for a seed; state is ``seed`` and ``counter``."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self.counter = 0

    def next_id(self) -> str:
        """The next id, never one handed out before."""
        memory_id = id_for_counter(self.seed, self.counter)
        self.counter += 1
        return memory_id


def _unshift(value: int, shift: int, bits: int) -> int:
    """The ``x`` with ``x ^ (x >> shift) == value`` (``x`` of ``bits`` bits)."""
    x = value
    for _ in range(bits // shift + 1):
        x = value ^ (x >> shift)
    return x


def counter_for_id(seed: int, memory_id: str) -> int | None:
    """The counter whose id under ``seed`` is ``memory_id`` (the inverse of :func:`id_for_counter`),
    or None when no counter gives that text (not lowercase hexadecimal of at least
    :data:`MIN_ID_DIGITS` digits)."""
    digits = len(memory_id)
    if digits < MIN_ID_DIGITS or any(c not in "0123456789abcdef" for c in memory_id):
        return None
    bits = 4 * digits
    mask = (1 << bits) - 1
    offset, mult_a, mult_b = _keys(seed, digits)
    x = _unshift(int(memory_id, 16), bits // 3, bits)
    x = (x * pow(mult_b, -1, 1 << bits)) & mask
    x = _unshift(x, bits // 2, bits)
    x = (x * pow(mult_a, -1, 1 << bits)) & mask
    value = (x - offset) & mask
    start = sum(16**d for d in range(MIN_ID_DIGITS, digits))
    return start + value
