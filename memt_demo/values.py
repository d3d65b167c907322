"""Open-vocabulary values and the held-out split of the demo data.

Names, pets' names, cities, companies, addresses and codes come from generators (pronounceable names of
1-4 syllables, random capitalised strings, multi-word values, numbers and dates), mixed with real words
from :mod:`memt_demo.pools`, so the model must copy values token by token out of memory rather than
pick one of a few hundred known words.

The split is deterministic: a fifth of the syllables and the letters ``HELDOUT_LETTERS`` are held out
of the generators, ``pools.HELDOUT_NAMES`` / ``pools.HELDOUT_CITIES`` are real words training never
draws, and :func:`phrasing` holds out about 20 % of every template tuple with three or more entries.
A :class:`DemoRandom` says which side of the split it draws from; training uses the default (none
held out), the evaluation's held-out column draws held-out values and held-out phrasings only.
"""

from __future__ import annotations

import hashlib
import random
import re
from functools import lru_cache

from memt_demo import pools


class DemoRandom(random.Random):
    """A seeded random source that also says which side of the held-out split to draw from."""

    def __init__(self, seed=None, *, heldout_values: bool = False, heldout_templates: bool = False):
        super().__init__(seed)
        self.heldout_values = heldout_values
        self.heldout_templates = heldout_templates
        self.variation = 0.0  # share of training phrasings perturbed by :func:`vary` (set per episode by the sampler)
        self.composition = 0.0  # share of training phrasings drawn from composed extras (see :func:`phrasing`)


def _values_heldout(rng: random.Random) -> bool:
    return bool(getattr(rng, "heldout_values", False))


def _stable(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode("utf-8")).digest()[:4], "big")


# --------------------------------------------------------------------------------------------------
# Templates


@lru_cache(maxsize=None)
def template_split(templates: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(training, held_out)`` shares of a template tuple: ~20 % held out when it has ≥ 3 templates."""
    if len(templates) < 3:
        return templates, ()
    count = max(1, round(len(templates) * 0.2))
    held = set(sorted(templates, key=_stable)[:count])
    return tuple(t for t in templates if t not in held), tuple(t for t in templates if t in held)


def phrasing(rng: random.Random, templates: tuple[str, ...], extra: tuple[str, ...] = (), forbid: tuple[str, ...] = ()) -> str:
    """One template from the split ``rng`` draws from (a tuple of < 3 templates is shared by both).

    A training draw comes from ``extra`` (composed phrasings, training only) with probability
    ``rng.composition``, leaving out any that is, or contains, one of ``templates``' held-out phrasings;
    it is then perturbed by :func:`vary` with probability ``rng.variation`` (both 0 unless set). ``forbid``:
    held-out phrasings of sibling tuples that a training draw must not become either (a varied "What's my
    pet's name?" that drops "pet's" is another attribute's held-out "What's my name?").
    """
    train, held = template_split(templates)
    if getattr(rng, "heldout_templates", False) and held:
        return rng.choice(held)
    template = None
    composition = getattr(rng, "composition", 0.0)
    if extra and composition and rng.random() < composition:
        allowed = allowed_extras(extra, held)
        template = rng.choice(allowed) if allowed else None
    template = template or rng.choice(train)
    variation = getattr(rng, "variation", 0.0)
    if variation and rng.random() < variation:
        return vary(rng, template, held + forbid)
    return template


def compose(frames: tuple[str, ...], slot: str, words: tuple[str, ...]) -> tuple[str, ...]:
    """Every frame with every word in ``slot`` ("{k}"); the slot capitalised ("{K}") takes the word capitalised."""
    upper = slot[0] + slot[1].upper() + slot[2:]
    return tuple(f.replace(slot, w).replace(upper, w[:1].upper() + w[1:]) for f in frames for w in words)


@lru_cache(maxsize=None)
def _held_out(held: tuple[str, ...]) -> tuple[frozenset[str], tuple[re.Pattern, ...]]:
    """Held-out templates as training must never produce them: exactly (normalised), or inside another text
    (but for those of punctuation alone, like ":)", which would be inside every text)."""
    return frozenset(_normal(h) for h in held), tuple(_template_pattern(h) for h in held if _normal(h))


@lru_cache(maxsize=None)
def allowed_extras(extra: tuple[str, ...], held: tuple[str, ...]) -> tuple[str, ...]:
    """The composed phrasings of ``extra`` training may use: none is, or contains, a held-out phrasing."""
    exact, patterns = _held_out(held)
    return tuple(t for t in extra if _normal(t) not in exact and not any(p.search(_normal(t)) for p in patterns))


#: Words inserted by :func:`vary`: fillers that change the surface of a sentence, not its meaning.
FILLERS = ("really", "actually", "just", "also", "now", "still", "honestly", "basically", "kind of",
           "you know", "so", "well", "like", "again", "anyway", "by the way", "ok", "um")


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9{} ]", "", text.lower()).split())


@lru_cache(maxsize=None)
def _template_pattern(template: str) -> re.Pattern:
    """A held-out template, without case and punctuation, found anywhere in a text; a placeholder matches any words."""
    return re.compile(".{1,60}?".join(re.escape(p) for p in re.split(r"\{\w+\}", _normal(template))))


def vary(rng: random.Random, template: str, held: tuple[str, ...] = ()) -> str:
    """``template`` with one or two random edits of its words: a filler inserted between two words, a
    word dropped, two neighbours swapped, or a typo (a letter dropped, doubled or swapped). Placeholders
    (``{v}``) are never edited. Training on such noise teaches the model to find the fact in a sentence
    rather than to match whole templates. A result that is a held-out template (``held``, compared without
    case and punctuation), or contains one ``template`` did not, is never returned: held-out phrasings
    stay unseen.
    """
    core = template.strip(" ")
    if not core:
        return template
    lead, trail = template[: len(template) - len(template.lstrip(" "))], template[len(template.rstrip(" ")):]
    exact, inside = _forbidden(core, held)
    for _ in range(4):
        words = core.split(" ")
        for _ in range(rng.choice((1, 1, 2))):
            words = _edit(rng, words)
        result = lead + " ".join(w for w in words if w) + trail
        normal = _normal(result)
        if normal not in exact and not any(p.search(normal) for p in inside):
            return result
    return template


@lru_cache(maxsize=None)
def _forbidden(core: str, held: tuple[str, ...]) -> tuple[frozenset[str], tuple[re.Pattern, ...]]:
    """What :func:`vary` must not produce from ``core``: the held-out templates themselves, and the patterns
    of those ``core`` does not already contain."""
    exact, patterns = _held_out(held)
    return exact, tuple(p for p in patterns if not p.search(_normal(core)))


def _edit(rng: random.Random, words: list[str]) -> list[str]:
    """One random edit of a template's words (see :func:`vary`); placeholder words stay as they are."""
    free = [i for i, w in enumerate(words) if w and "{" not in w and "\n" not in w]
    op = rng.choice(("filler", "filler", "drop", "swap", "typo"))
    words = list(words)
    if op == "filler" or not free:
        if len(words) > 1:  # between two words: never first (capitalised) nor after a trailing value
            words.insert(rng.randint(1, len(words) - 1), rng.choice(FILLERS))
    elif op == "drop" and len(free) >= 3:
        del words[rng.choice(free[:-1])]  # never the last word, which ends the sentence
    elif op == "swap":
        pairs = [i for i in free[:-1] if i + 1 in free[:-1] and i > 0]
        if pairs:
            i = rng.choice(pairs)
            words[i], words[i + 1] = words[i + 1], words[i]
    else:
        longer = [i for i in free if len(words[i]) >= 4 and words[i].isalpha()]
        if longer:
            i = rng.choice(longer)
            word, at = words[i], rng.randrange(1, len(words[i]) - 1)
            kind = rng.choice(("drop", "double", "swap"))
            if kind == "drop":
                words[i] = word[:at] + word[at + 1:]
            elif kind == "double":
                words[i] = word[:at] + word[at] + word[at:]
            else:
                words[i] = word[:at] + word[at + 1] + word[at] + word[at + 2:]
    return words


# --------------------------------------------------------------------------------------------------
# Generated words

HELDOUT_LETTERS = frozenset("qxj")
ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "dr", "fr",
          "gr", "kr", "pr", "tr", "bl", "kl", "pl", "sl", "st", "sh", "ch", "th", "qu", "x", "j")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ia")
CODAS = ("", "", "", "", "", "n", "r", "l", "s", "m", "k", "x")
SYLLABLES = tuple(sorted({o + v + c for o in ONSETS for v in VOWELS for c in CODAS}))


def _heldout_syllable(s: str) -> bool:
    return bool(HELDOUT_LETTERS & set(s)) or _stable("syllable:" + s) % 5 == 0


TRAIN_SYLLABLES = tuple(s for s in SYLLABLES if not _heldout_syllable(s))
HELDOUT_SYLLABLES = tuple(s for s in SYLLABLES if _heldout_syllable(s))
TRAIN_LETTERS = tuple(c for c in "abcdefghijklmnopqrstuvwxyz" if c not in HELDOUT_LETTERS)


def pronounceable(rng: random.Random, syllables: int | None = None) -> str:
    """A capitalised made-up word of 1-4 syllables; held-out draws contain at least one held-out syllable."""
    count = syllables or rng.choices((1, 2, 3, 4), (0.2, 0.5, 0.25, 0.05))[0]
    parts = [rng.choice(TRAIN_SYLLABLES) for _ in range(count)]
    if _values_heldout(rng):
        parts[rng.randrange(count)] = rng.choice(HELDOUT_SYLLABLES)
    word = "".join(parts)
    if len(word) < 3:
        word += rng.choice(TRAIN_SYLLABLES)
    return word[:1].upper() + word[1:]


def random_string(rng: random.Random, low: int = 3, high: int = 8) -> str:
    """A capitalised string of random letters; held-out draws contain a held-out letter."""
    letters = [rng.choice(TRAIN_LETTERS) for _ in range(rng.randint(low, high))]
    if _values_heldout(rng):
        letters[rng.randrange(len(letters))] = rng.choice(sorted(HELDOUT_LETTERS))
    word = "".join(letters)
    return word[:1].upper() + word[1:]


def code(rng: random.Random) -> str:
    """A booking-code-like value, e.g. ``KT-4821`` or ``B7R2``; held-out draws contain a held-out letter."""
    upper = [c.upper() for c in TRAIN_LETTERS]
    shape = rng.choice(("LL-DDDD", "LDLD", "LLL-DD", "DDD-LL", "LLDDD"))
    chars = [rng.choice(upper) if c == "L" else str(rng.randint(0, 9)) if c == "D" else c for c in shape]
    if _values_heldout(rng):
        slots = [i for i, c in enumerate(shape) if c == "L"]
        chars[rng.choice(slots)] = rng.choice(sorted(HELDOUT_LETTERS)).upper()
    return "".join(chars)


def number(rng: random.Random) -> int:
    return rng.choice((rng.randint(0, 20), rng.randint(0, 100), rng.randint(0, 999), rng.randint(1000, 99999)))


def date(rng: random.Random) -> str:
    month = rng.choice(pools.MONTHS)
    day = rng.randint(1, 28)
    return rng.choice((f"{day} {month}", f"{month} {day}", f"{day} {month} {rng.randint(1930, 2024)}"))


def _pool(rng: random.Random, train: tuple[str, ...], held: tuple[str, ...]) -> str:
    return rng.choice(held if _values_heldout(rng) else train)


# --------------------------------------------------------------------------------------------------
# Values by kind


def person_name(rng: random.Random) -> str:
    """A first name: a real one (training pool or held-out list), a made-up one, or sometimes two words."""
    r = rng.random()
    if r < 0.35:
        return _pool(rng, pools.NAMES, pools.HELDOUT_NAMES)
    if r < 0.85:
        return pronounceable(rng)
    if r < 0.93:
        return random_string(rng, 3, 7)
    return f"{pronounceable(rng)} {pronounceable(rng)}"


def pet_name(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.25:
        return _pool(rng, pools.NAMES, pools.HELDOUT_NAMES)
    if r < 0.9:
        return pronounceable(rng)
    return random_string(rng, 3, 6)


CITY_PREFIXES = ("New", "San", "Port", "Saint", "Lake", "Fort", "North", "East", "Old", "Upper")
CITY_SUFFIXES = ("", "", "", "", " City", " Bay", " Falls", " Springs", "ville", "burg", "holm", "ford")


def city(rng: random.Random) -> str:
    """A city: real (training pool or held-out list), made up, or multi-word ("New Amsterdam")."""
    r = rng.random()
    if r < 0.4:
        return _pool(rng, pools.CITIES, pools.HELDOUT_CITIES)
    if r < 0.75:
        return pronounceable(rng) + rng.choice(CITY_SUFFIXES)
    if r < 0.9:
        return f"{rng.choice(CITY_PREFIXES)} {_pool(rng, pools.CITIES, pools.HELDOUT_CITIES) if rng.random() < 0.5 else pronounceable(rng)}"
    return random_string(rng, 4, 8)


STREET_FORMS = ("Rue des {w} {n}", "{w} Street {n}", "{n} {w} Road", "Via {w} {n}", "{w}weg {n}", "{n} {w} Avenue",
                "Calle {w} {n}", "{w} Lane {n}")


def address(rng: random.Random) -> str:
    form = rng.choice(STREET_FORMS)
    return form.replace("{w}", pronounceable(rng, rng.randint(1, 3))).replace("{n}", str(rng.randint(1, 199)))


ORG_KINDS_EXTRA = ("Labs", "Systems", "Foods", "Motors", "Books", "Games", "Tools", "Energy", "Studios", "Works")


def company(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3 and not _values_heldout(rng):
        head = rng.choice(pools.ORG_WORDS)
    elif r < 0.85:
        head = pronounceable(rng)
    else:
        head = random_string(rng, 3, 7)
    return f"{head} {rng.choice(pools.ORG_KINDS)}"


def food(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        return rng.choice(pools.FOODS)
    if r < 0.85:
        return f"{rng.choice(pools.FOOD_ADJECTIVES)} {rng.choice(pools.FOODS)}"
    return pronounceable(rng).lower()


def generic(rng: random.Random) -> str:
    """Any value: used by repetition texts and "type exactly" requests."""
    r = rng.random()
    if r < 0.4:
        return pronounceable(rng)
    if r < 0.6:
        return random_string(rng)
    if r < 0.75:
        return code(rng)
    if r < 0.9:
        return str(number(rng))
    return date(rng)
