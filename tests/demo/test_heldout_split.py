"""The held-out split of the demo data: training never draws held-out values or phrasings.

The evaluation's held-out figures mean something only if training cannot have seen what they test:
real names and cities of the held-out lists, generated values with held-out syllables or letters, and
the held-out ~20 % of every skill's templates. These tests render many training episodes and look for
any of them, and check that the held-out sampler does draw them.
"""

from __future__ import annotations

import re

import pytest

from memt_demo import episodes as ep
from memt_demo import documents
from memt_demo import facts
from memt_demo import tool_turns
from memt_demo import pools, values


def _episode_text(episode: ep.Episode) -> str:
    parts = []
    for commit in episode.commits:
        if isinstance(commit, ep.Document):
            parts.append(commit.text)
        else:
            for turn in commit:
                parts += [turn.user, turn.reply] + ([turn.result] if isinstance(turn, ep.ToolTurn) else [])
    parts += [m["content"] for m in episode.query.messages if isinstance(m.get("content"), str)]
    return "\n".join(parts + [episode.query.answer])


def _render(seed: int, mix: ep.Mix, count: int) -> tuple[str, list[str]]:
    """``count`` training episodes as text, and the random texts they ask to repeat (word salad, which can
    match a loose held-out pattern by chance: "We have always apples" for "we have {a} {v}")."""
    sampler, repeated = ep.EpisodeSampler(seed), []
    original = ep.repeat_text

    def recording(rng):
        repeated.append(original(rng))
        return repeated[-1]

    ep.repeat_text = recording
    try:
        return "\n".join(_episode_text(sampler.sample(mix)) for _ in range(count)), repeated
    finally:
        ep.repeat_text = original


@pytest.fixture(scope="module")
def training() -> tuple[str, list[str]]:
    return _render(11, ep.Mix(), 3000)


@pytest.fixture(scope="module")
def training_text(training) -> str:
    return training[0]


def _fixed_templates() -> list[tuple[str, ...]]:
    """Template tuples of every skill (statements, questions, requests, tool results, document phrasings)."""
    tuples = [a.statements for a in ep.ATTRIBUTES.values()] + [a.questions for a in ep.ATTRIBUTES.values()]
    tuples += [tool_turns.WEATHER_REQUESTS, tool_turns.WEATHER_AT_HOME, tool_turns.ADD_REQUESTS, tool_turns.MULTIPLY_REQUESTS,
               ep.REPEAT_REQUESTS, tool_turns.WEATHER_TEXT_RESULTS, tool_turns.NUMBER_TEXT_RESULTS]
    org_facts = documents._org_facts(values.DemoRandom(0))
    tuples += [f.sentences for f in org_facts] + [f.questions for f in org_facts]
    return tuples


def _fillers() -> list[tuple[str, ...]]:
    """Prefix and ending fillers: split like templates, but short, so only their uniqueness is checked."""
    return [facts.GREETINGS, facts.STATEMENT_ENDINGS, facts.QUESTION_PREFIXES, facts.QUESTION_ENDINGS, documents.DOCUMENT_PREFIXES]


def test_about_a_fifth_of_every_skills_templates_is_held_out():
    for templates in _fixed_templates():
        train, held = values.template_split(templates)
        assert held and train, templates
        assert set(train) | set(held) == set(templates) and not set(train) & set(held)
        assert 0.1 <= len(held) / len(templates) <= 0.34, templates


def test_templates_differ_beyond_case_and_final_punctuation():
    """Casual messages are lower-cased and may drop the final "?"/"."; no template may become another that way.

    Otherwise a training template typed casually would be a held-out one.
    """
    for templates in _fixed_templates() + _fillers():
        forms = [t.lower().strip().rstrip("?.!").strip() for t in templates if t]
        assert len(forms) == len(set(forms)), sorted({f for f in forms if forms.count(f) > 1})


def test_training_never_shows_held_out_real_names_or_cities(training_text):
    words = set(re.findall(r"[A-Z][a-z]+", training_text))
    assert not words & set(pools.HELDOUT_NAMES)
    assert not words & set(pools.HELDOUT_CITIES)


def _pattern(template: str) -> re.Pattern:
    """A template as a regular expression, in any letter case (casual messages are lower-cased).

    Placeholders match any value within a clause: values never hold ``,.!?`` or line breaks.
    """
    pieces = [re.escape(p) for p in re.split(r"\{\w+\}", template)]
    return re.compile("[^\\n,.!?]{1,60}?".join(pieces), re.IGNORECASE)


def _rendered_training_templates() -> list[str]:
    fills = {"{v}": "Zed", "{a}": "a", "{animal}": "cat", "{c}": "Oslo", "{t}": "hi", "{r}": "5", "{city}": "Oslo", "{b}": "2"}
    out = []
    for templates in _fixed_templates():
        for template in values.template_split(templates)[0]:
            for key, value in fills.items():
                template = template.replace(key, value)
            out.append(template)
    return out


def test_training_never_shows_held_out_phrasings(training):
    """Held-out templates never occur in training text (those that a training template also matches excepted)."""
    _assert_no_held_out_phrasings(*training)


def test_composed_training_phrasings_never_show_held_out_ones():
    """Every statement and question composed from frames and keys, drawn always, still avoids held-out phrasings."""
    _assert_no_held_out_phrasings(*_render(12, ep.Mix(composition=1.0, variation=0.0), 1500))


def test_more_openers_and_closers_in_training_none_held_out():
    """Training draws messages' first and last words from extra lists too, none of them held out or holding one."""
    affixes = ((facts.GREETINGS, facts.GREETINGS_EXTRA), (facts.STATEMENT_ENDINGS, facts.STATEMENT_ENDINGS_EXTRA),
               (facts.QUESTION_PREFIXES, facts.QUESTION_PREFIXES_EXTRA), (facts.QUESTION_ENDINGS, facts.QUESTION_ENDINGS_EXTRA))
    text = _render(15, ep.Mix(composition=1.0, variation=0.0), 400)[0].lower()
    for fixed, extra in affixes:
        held = values.template_split(fixed)[1]
        assert values.allowed_extras(extra, held) == extra and not set(extra) & set(held), extra
        assert sum(e.strip().lower() in text for e in extra) >= len(extra) * 2 // 3, extra  # drawn


def test_composed_document_phrasings_never_show_held_out_ones():
    mix = ep.Mix(**{**{k: 0.0 for k in ep.EpisodeSampler.KINDS}, "document": 1.0}, composition=1.0, variation=0.0)
    text, repeated = _render(13, mix, 800)
    _assert_no_held_out_phrasings(text, repeated)
    assert "the headcount of" in text.lower() or "'s headcount" in text.lower()  # composition did take place


def test_composed_tool_and_repeat_requests_never_show_held_out_ones():
    kinds = {"tool_call": 0.5, "tool_answer": 0.2, "repeat": 0.3}
    mix = ep.Mix(**{**{k: 0.0 for k in ep.EpisodeSampler.KINDS}, **kinds}, composition=1.0, variation=0.0)
    text, repeated = _render(14, mix, 1500)
    _assert_no_held_out_phrasings(text, repeated)
    for composed in (tool_turns.WEATHER_AT_HOME_COMPOSED, tool_turns.WEATHER_COMPOSED, ep.REPEAT_COMPOSED):  # composition did take place
        assert any(t.split("{")[0] and t.split("{")[0] in text for t in composed if not t.startswith("{"))


def test_composed_phrasings_are_many_and_exclude_held_out_ones():
    keyed = [key for key, a in ep.ATTRIBUTES.items() if a.keys]
    assert len(keyed) >= 12 and len(facts.QUESTION_VERBS) >= 10
    for key in keyed:
        attribute = ep.ATTRIBUTES[key]
        # statements told with a verb ("I reside in {v}") as well as "my {k}"; questions asked with one ("Which firm do I work for?")
        with_verb = (facts.told_with_verb(key), facts.asked_with_verb(key) if key in facts.QUESTION_VERBS else None)
        for extra, templates, verbal in zip(facts.composed(key), (attribute.statements, attribute.questions), with_verb):
            held = values.template_split(templates)[1]
            allowed = values.allowed_extras(extra, held)
            assert len(allowed) >= 20, key
            if verbal is not None:
                assert len(set(allowed) & set(verbal)) >= 20, key
            normal_held = {values._normal(h) for h in held}
            for template in allowed:
                assert values._normal(template) not in normal_held
                assert not any(_pattern(h).search(template.lower()) for h in held if len(h) >= 10), (key, template)
    for fact in documents._org_facts(values.DemoRandom(0)):
        for extra, templates in zip(documents.composed_document(fact.key), (fact.sentences, fact.questions)):
            assert len(values.allowed_extras(extra, values.template_split(templates)[1])) >= 20, fact.key
    # a composed phrasing equal to a held-out one is left out: "my city is {v}" is held out for "city"
    city_held = values.template_split(ep.ATTRIBUTES["city"].statements)[1]
    assert "my city is {v}" in city_held and "my city is {v}" in facts.composed("city")[0]
    assert "my city is {v}" not in values.allowed_extras(facts.composed("city")[0], city_held)


def test_only_training_draws_are_composed():
    attribute = ep.ATTRIBUTES["company"]
    extra = facts.composed("company")[0]
    train, held = values.template_split(attribute.statements)
    held_rng, train_rng = values.DemoRandom(4, heldout_templates=True), values.DemoRandom(4)
    held_rng.composition = train_rng.composition = 1.0
    assert {values.phrasing(held_rng, attribute.statements, extra) for _ in range(200)} <= set(held)
    drawn = {values.phrasing(train_rng, attribute.statements, extra) for _ in range(400)}
    assert drawn <= set(values.allowed_extras(extra, held)) and len(drawn) > 40
    train_rng.composition = 0.0
    assert {values.phrasing(train_rng, attribute.statements, extra) for _ in range(200)} <= set(train)


def _assert_no_held_out_phrasings(training_text: str, repeated: list[str] = ()) -> None:
    for text in sorted(set(repeated), key=len, reverse=True):
        training_text = training_text.replace(text, "\n")
    rendered = _rendered_training_templates()
    checked = skipped = 0
    for templates in _fixed_templates():
        for template in values.template_split(templates)[1]:
            pattern = _pattern(template)
            if len(template) < 10 or any(pattern.search(t) for t in rendered):
                skipped += 1  # e.g. "I'm {v}" also matches the training "I'm {a} {v} by trade"
                continue
            checked += 1
            match = pattern.search(training_text)
            assert match is None, (template, match and training_text[max(0, match.start() - 80) : match.end() + 40])
    assert checked >= 4 * skipped


def test_generated_training_values_avoid_held_out_syllables_and_letters():
    rng = values.DemoRandom(5)
    for _ in range(2000):
        word = values.pronounceable(rng)
        assert not values.HELDOUT_LETTERS & set(word.lower()), word
        assert not values.HELDOUT_LETTERS & set(values.random_string(rng).lower())
        assert not values.HELDOUT_LETTERS & set(values.code(rng).lower())


def test_held_out_draws_are_new():
    rng = values.DemoRandom(5, heldout_values=True)
    train_rng = values.DemoRandom(5)
    seen = {values.person_name(train_rng) for _ in range(5000)} | {values.city(train_rng) for _ in range(5000)}
    drawn = [values.person_name(rng) for _ in range(500)] + [values.city(rng) for _ in range(500)]
    assert sum(d in seen for d in drawn) / len(drawn) < 0.05
    for _ in range(300):
        word = values.pronounceable(rng).lower()
        # a held-out syllable: one with a held-out letter or one of the held-out fifth
        assert any(s in word for s in values.HELDOUT_SYLLABLES)
        assert values.HELDOUT_LETTERS & set(values.random_string(rng).lower())


def test_held_out_sampler_uses_held_out_phrasings():
    sampler = ep.EpisodeSampler(3, heldout=True)
    held_questions = {q for a in ep.ATTRIBUTES.values() for q in values.template_split(a.questions)[1]}
    asked = []
    for _ in range(200):
        episode = sampler.facts(ep.Mix(), count=1)
        asked.append(episode.query.messages[-1]["content"])
    fixed = [q for q in held_questions if "{" not in q]
    assert any(any(q in text or facts.lower_first(q) in text for q in fixed) for text in asked)
    train_questions = {q for a in ep.ATTRIBUTES.values() for q in values.template_split(a.questions)[0] if "{" not in q}
    assert not any(text in train_questions for text in asked)


def test_values_split_into_known_pieces():
    """The byte-level BPE is open: an unseen value encodes to several pieces and decodes back exactly."""
    from memt_demo import BUNDLED_MODEL
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_MODEL))
    rng = values.DemoRandom(9, heldout_values=True)
    for value in ["Belkavo", "Rue des Lilas 12", "New Amsterdam"] + [values.person_name(rng) for _ in range(50)]:
        ids = tokenizer.encode(" " + value, add_special_tokens=False)
        assert tokenizer.decode(ids) == " " + value
    assert len(tokenizer.encode(" Belkavo", add_special_tokens=False)) > 1


def test_varied_training_phrasings_keep_placeholders_and_never_become_held_out():
    """``values.vary`` perturbs training phrasings; its output keeps every placeholder and is never a held-out one."""
    rng = values.DemoRandom(7)
    normal = lambda text: " ".join(re.sub(r"[^a-z0-9{} ]", "", text.lower()).split())  # noqa: E731
    split_words = lambda text: [w for w in re.split(r"\W+", normal(text)) if w]  # noqa: E731
    changed = 0
    for templates in _fixed_templates() + _fillers():
        train, held = values.template_split(templates)
        forbidden = {normal(h) for h in held}
        for template in train:
            for _ in range(30):
                varied = values.vary(rng, template, held)
                assert re.findall(r"\{\w+\}", varied) == re.findall(r"\{\w+\}", template), (template, varied)
                assert varied == template or normal(varied) not in forbidden, (template, varied)
                assert abs(len(split_words(varied)) - len(split_words(template))) <= 6, (template, varied)
                changed += varied != template
    assert changed > 1000


def test_only_training_draws_are_varied():
    held_sampler, train_sampler = ep.EpisodeSampler(3, heldout=True), ep.EpisodeSampler(3)
    mix = ep.Mix(variation=1.0)
    held_questions = {q for a in ep.ATTRIBUTES.values() for q in values.template_split(a.questions)[1]}
    for _ in range(50):
        held_sampler.sample(mix)
        assert held_sampler.rng.variation == 0.0
        train_sampler.sample(mix)
    assert train_sampler.rng.variation == 1.0
    assert values.phrasing(held_sampler.rng, ep.ATTRIBUTES["name"].questions) in held_questions
