"""Long conversations in the demo data (issue #41): facts told early, many turns of neutral chatter, a fact
asked late; held-out chatter (templates, topics, numbers) never shows in training episodes."""

from __future__ import annotations

import re

import pytest

from memt_demo import chatter, values
from memt_demo import episodes as ep
from memt_demo.facts import acknowledgement

OPEN = ("name", "pet_name", "friend", "city", "company", "address", "code")
LONG_ONLY = ep.Mix(**{**{k: 0.0 for k in ep.EpisodeSampler.KINDS}, "long": 1.0})


def _turns(episode: ep.Episode) -> list:
    return [t for c in episode.commits if isinstance(c, list) for t in c]


def _chatter_pattern(template: str) -> re.Pattern:
    """A whole chatter message made from ``template``: slots match any words."""
    pieces = [re.escape(p) for p in re.split(r"\{\w+\}", template)]
    return re.compile("(?i)" + ".{1,60}?".join(pieces))


def _is_chatter(turn) -> bool:
    return any(
        _chatter_pattern(u).fullmatch(turn.user) and any(_chatter_pattern(r).fullmatch(turn.reply) for r in replies)
        for u, replies in chatter.TEMPLATES.items()
    )


@pytest.fixture(scope="module")
def long_episodes() -> list[ep.Episode]:
    sampler = ep.EpisodeSampler(21)
    return [sampler.sample(LONG_ONLY) for _ in range(300)]


@pytest.fixture(scope="module")
def training_episodes() -> list[ep.Episode]:
    sampler = ep.EpisodeSampler(22)
    return [sampler.sample(ep.Mix(variation=0.3)) for _ in range(1500)]


def test_long_episodes_tell_facts_early_chat_long_and_ask_a_told_fact(long_episodes):
    chatter_counts, between = [], []
    for episode in long_episodes:
        assert episode.kind == "long"
        turns = _turns(episode)
        facts = episode.query.meta["facts"]
        asked = episode.query.meta["asked"][0]
        assert asked in facts and asked.value in episode.query.answer
        told_at = [i for i, t in enumerate(turns) if chatter.is_fact_shaped(t.reply)]  # acknowledged statements
        assert told_at and max(told_at) <= 2, [t.user for t in turns[:4]]  # told in the first turns
        told = " ".join(turns[i].user for i in told_at)
        assert all(f.value in told for f in facts)
        chats = [t for t in turns if _is_chatter(t)]
        chatter_counts.append(len(chats))
        documents = sum(isinstance(c, ep.Document) for c in episode.commits)
        between.append(len(turns) + documents - len(told_at))
        assert ep.Mix().min_chatter <= between[-1] <= ep.Mix().max_chatter + 1
        # the question holds only the new user message: no transcript
        assert [m["role"] for m in episode.query.messages if m["role"] != "system"] == ["user"]
    assert sum(c == 0 for c in chatter_counts) < len(chatter_counts) // 20 and max(chatter_counts) >= 25
    assert sum(b >= 30 for b in between) > len(between) // 5  # long ones are common
    assert sum(c >= 10 for c in chatter_counts) > len(chatter_counts) // 3


def test_chatter_replies_are_neutral_and_never_restate_a_fact(long_episodes):
    for episode in long_episodes:
        facts = episode.query.meta["facts"]
        for turn in _turns(episode):
            if _is_chatter(turn):
                assert not chatter.is_fact_shaped(turn.reply), turn
                # no open value of the user's (a name, a city, a code ...) is said back in chatter
                assert not any(f.value in turn.reply for f in facts if f.attribute in OPEN), turn


def test_some_facts_are_asked_twice_and_some_never(long_episodes):
    twice = never = 0
    for episode in long_episodes:
        facts, asked = episode.query.meta["facts"], episode.query.meta["asked"][0]
        answers = [t.reply for t in _turns(episode)]
        twice += any(r == ep.fact_answer([asked]) for r in answers)
        never += len(facts) > 1
    assert twice > 20 and never > 100


def test_chatter_split_holds_out_a_fifth():
    for pool in (tuple(chatter.TEMPLATES), chatter.TOPICS):
        train, held = values.template_split(pool)
        assert train and held and not set(train) & set(held)
        assert 0.1 <= len(held) / len(pool) <= 0.34
    assert not set(chatter.TRAINING_NUMBERS) & set(chatter.HELDOUT_NUMBERS)


def test_held_out_chatter_never_shows_in_training(training_episodes):
    train, held = values.template_split(tuple(chatter.TEMPLATES))
    held_topics = values.template_split(chatter.TOPICS)[1]
    messages, text = [], []
    for episode in training_episodes:
        for turn in _turns(episode):
            messages.append(turn.user)
            text += [turn.user, turn.reply]
        text += [m["content"] for m in episode.query.messages if isinstance(m.get("content"), str)]
    kinds = {e.kind for e in training_episodes}
    assert "long" in kinds
    for template in (t for t in held if t in chatter.CHATTER):  # sentences (frames: disjoint draws, tested below)
        pattern = _chatter_pattern(template)
        assert not any(pattern.fullmatch(m) for m in messages), template
    joined = "\n".join(text).lower()
    for word in held_topics:
        assert not re.search(r"\b" + re.escape(word) + r"\b", joined), word
    # the training side is drawn: most training templates do show
    assert sum(any(_chatter_pattern(t).fullmatch(m) for m in messages) for t in train) >= len(train) * 3 // 4


def test_held_out_draws_use_only_held_out_chatter():
    rng = values.DemoRandom(4, heldout_values=True, heldout_templates=True)
    train, held = values.template_split(tuple(chatter.TEMPLATES))
    held_topics = values.template_split(chatter.TOPICS)[1]
    for _ in range(300):
        user, reply, _ = chatter.chatter(rng)
        assert any(_chatter_pattern(t).fullmatch(user) for t in held), user
        assert not chatter.is_fact_shaped(reply)
    seen_topics = {chatter.topic(rng) for _ in range(200)}
    assert seen_topics == set(held_topics)
    assert all(int(chatter.number(rng)) in chatter.HELDOUT_NUMBERS for _ in range(100))


def test_acknowledgements_are_fact_shaped_and_chatter_is_not():
    """The eval's measure of invented facts must tell an acknowledgement from a neutral reply."""
    rng = values.DemoRandom(2)
    facts = ep.sample_facts(rng, 2)
    assert chatter.is_fact_shaped(acknowledgement(facts))
    assert chatter.is_fact_shaped("Got it! I will remember that your favourite food is long walks.")
    assert not any(chatter.is_fact_shaped(reply) for replies in chatter.TEMPLATES.values() for reply in replies)


def test_chatter_is_composed_from_frames_and_words_split_like_the_templates():
    """Many distinct messages, not a list to learn (issue #41's second run): training and held-out draws share
    no message and no word of the split pools; no reply is fact-shaped; no message tells a personal fact."""
    train_rng, held_rng = values.DemoRandom(5), values.DemoRandom(6, heldout_values=True, heldout_templates=True)
    train = [chatter.chatter(train_rng) for _ in range(2000)]
    held = [chatter.chatter(held_rng) for _ in range(2000)]
    assert len({user for user, _, _ in train}) > 500
    assert not {user for user, _, _ in train} & {user for user, _, _ in held}
    for key, pool in chatter.WORDS.items():
        kept, out = values.template_split(pool)
        assert out and not set(kept) & set(out) and any(key in frame for frame in chatter.FRAMES), key
    fact = re.compile(r"(?i)\b(my name is|i live in|years old|my favou?rite|my best friend|my birthday|i work as)\b")
    for user, reply, _ in train + held:
        assert not chatter.is_fact_shaped(reply), reply
        assert not fact.search(user), user


def _side_pattern(template: str, side: int) -> re.Pattern:
    """``template`` with every split slot matching only the words of one side (0 training, 1 held out)."""
    trivia = values.template_split(chatter.TRIVIA)[side]
    topics = values.template_split(chatter.TOPICS)[side]
    numbers = chatter.HELDOUT_NUMBERS if side else chatter.TRAINING_NUMBERS
    pools = {key: values.template_split(pool)[side] for key, pool in chatter.WORDS.items()}
    pools.update({"{t}": topics, "{T}": topics, "{trivia}": trivia, "{q}": trivia, "{n}": tuple(map(str, numbers))})
    parts = []
    for piece in re.split(r"(\{\w+\})", template):
        if piece in pools:
            parts.append("(?:" + "|".join(re.escape(w) for w in sorted(pools[piece], key=len, reverse=True)) + ")")
        elif re.fullmatch(r"\{\w+\}", piece):  # a name or a city: split by their own generators
            parts.append(".{1,60}?")
        else:
            parts.append(re.escape(piece))
    return re.compile("(?i)" + "".join(parts))


def test_every_slot_of_a_draw_takes_only_its_own_sides_words():
    """Slot by slot, not only whole messages: a training draw is some training template filled with training
    words only (frames, moods, times, places, topics, trivia, numbers), and a held-out draw held-out ones only."""
    for side, rng in ((0, values.DemoRandom(7)), (1, values.DemoRandom(8, heldout_values=True, heldout_templates=True))):
        templates = values.template_split(tuple(chatter.TEMPLATES))[side]
        pairs = [(_side_pattern(u, side), [_side_pattern(r, side) for r in chatter.TEMPLATES[u]]) for u in templates]
        for _ in range(2000):
            user, reply, _ = chatter.chatter(rng)
            assert any(u.fullmatch(user) and any(r.fullmatch(reply) for r in rs) for u, rs in pairs), (side, user, reply)
