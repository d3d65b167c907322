"""Memory states addressed by the transcript they encode: which kept state a resent transcript resumes from.

A session's latent memory after committing conversation messages m1..mk (system/developer messages are never
committed) is a function of those messages alone. So a kept state is named by the hash chain of the messages
it holds, per tenant::

    c_0 = H("memt-prefix" || tenant)        c_k = H(c_{k-1} || message_hash(m_k))

A request resumes from the deepest ``c_k`` of its earlier messages that names a kept state, and sends the model
only the rest: reaching a state takes presenting every message it holds, and the tenant is in the root, so no
tenant reaches another's. States are native sessions the proxy made for conversations identified by their
transcript (``memt_proxy.session.headerless``), each holding the messages its chain names and never written again; one
closed is dropped. Nothing here does I/O or reads a clock; the session layer holds the states, checks one
under its lock and makes new ones.

``message_hash`` keys on exactly the text the model reads (``memt_proxy.session.transcript``), so a chain names a state
only for that text. Its scheme-2 hashes never equal scheme-1 ones: a state recorded under a scheme-1 chain (a proxy
before that rule) is not found by any new chain, which only lengthens its conversation's next prompt; the state is
bounded and closed as any other.

Besides the heads the index remembers, by recency, the chains of transcripts it has *answered* (conversation
plus answer): a later request whose history carries one shows that conversation continuing, which is what makes
committing it worth its cost (see ``PrefixIndex.worth_keeping``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

SEEN_LIMIT = 100_000  # answered transcripts remembered (about 150 bytes each)


def root(tenant: str) -> str:
    """``c_0``: the chain of a tenant's empty transcript."""
    return hashlib.sha256(b"memt-prefix\x00" + tenant.encode()).hexdigest()


def extend(link: str, message: str) -> str:
    """The chain one message (its ``message_hash``) further."""
    return hashlib.sha256((link + message).encode()).hexdigest()


def chain(tenant: str, hashes: list[str]) -> list[str]:
    """``[c_1, …, c_n]`` for message hashes ``hashes`` (see the module docstring)."""
    link, links = root(tenant), []
    for message in hashes:
        link = extend(link, message)
        links.append(link)
    return links


@dataclass(frozen=True)
class Found:
    """The deepest kept state of a transcript: ``depth`` messages held by the kept state ``name`` (a session name of ``tenant``)."""

    depth: int
    name: str


class PrefixIndex:
    """Kept heads (chain hash → kept state's name) and answered transcripts, per tenant by construction of the chain."""

    def __init__(self, seen_limit: int = SEEN_LIMIT):
        self._heads: dict[str, str] = {}  # chain hash → kept state's name
        self._head_of: dict[str, str] = {}  # kept state's name → its head's chain hash (None-free)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.seen_limit = seen_limit
        self._making: dict[str, asyncio.Event] = {}  # chain → set once the state it names is made (or not)

    def __len__(self) -> int:
        return len(self._head_of)

    def find(self, links: list[str]) -> Found | None:
        """The deepest kept head among ``links`` (a transcript's chain), or None."""
        for depth in range(len(links), 0, -1):
            name = self._heads.get(links[depth - 1])
            if name is not None:
                return Found(depth, name)
        return None

    def move(self, name: str, head: str | None) -> None:
        """The kept state ``name`` now holds the state named ``head`` (None: it holds nothing worth finding, e.g. empty)."""
        old = self._head_of.pop(name, None)
        if old is not None and self._heads.get(old) == name:
            del self._heads[old]
        if head is None:
            return
        other = self._heads.get(head)
        if other is not None and other != name:
            self._head_of.pop(other, None)  # two kept states holding the same messages: the newer one is found
        self._heads[head] = name
        self._head_of[name] = head

    def drop(self, name: str) -> None:
        """The kept state ``name`` is gone (closed, evicted, or its native session lost)."""
        self.move(name, None)

    def head(self, name: str) -> str | None:
        return self._head_of.get(name)

    def reserve(self, link: str) -> bool:
        """Claim the making of the state named ``link``: False if one is kept or being made already."""
        if link in self._heads or link in self._making:
            return False
        self._making[link] = asyncio.Event()
        return True

    def made(self, link: str) -> None:
        """The making claimed by ``reserve`` ended (the state is kept, or not): whoever waits for it goes on."""
        making = self._making.pop(link, None)
        if making is not None:
            making.set()

    def being_made(self, link: str) -> asyncio.Event | None:
        """Set once the state named ``link``, being made now, is made (or not); None if none is being made."""
        return self._making.get(link)

    def answered(self, link: str) -> None:
        """A transcript whose chain ends in ``link`` (its answer included) was answered."""
        self._seen[link] = None
        self._seen.move_to_end(link)
        while len(self._seen) > self.seen_limit:
            self._seen.popitem(last=False)

    def worth_keeping(self, links: list[str], user_messages: int) -> bool:
        """Whether a request with no kept state, whose earlier messages have chain ``links`` and hold
        ``user_messages`` user messages, is worth committing: an answer of ours is in its history (the
        conversation came back), or its history holds more than one exchange (a conversation new to this
        proxy: edited, forked, or kept by a proxy that forgot it). A one-shot request commits nothing."""
        return user_messages > 1 or any(link in self._seen for link in links)
