"""Stored responses and conversations, read and changed outside a response: ``GET``/``DELETE`` of a response and its
input items, and the Conversations API (create, read, delete with its memory, list and add items). A response itself
is made by ``memt_proxy.responses.service``; both read the same records (``memt_proxy.responses.records``)."""

from __future__ import annotations

import time

from memt_proxy.responses.records import ResponseRecord, ResponseRecords, Thread, session_name
from memt_proxy.errors import BadRequest, NotFound, ProxyError
from memt_proxy.responses.protocol import ConversationRequest, InputItems, conversation_object, item_list, item_messages, new_id
from memt_proxy.session.sessions import Sessions


class StoredResponses:
    """What the records hold of responses and conversations, per tenant; closing a conversation closes its session."""

    def __init__(self, sessions: Sessions, records: ResponseRecords):
        self.sessions = sessions
        self.records = records

    def get(self, tenant: str, response_id: str) -> dict:
        return self._stored(tenant, response_id).body

    def delete(self, tenant: str, response_id: str) -> dict:
        """Forget a stored response (its thread and memory stay: later responses build on them)."""
        self.records.delete(self._stored(tenant, response_id))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def input_items(self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str) -> dict:
        return item_list(self._stored(tenant, response_id).input_items, after=after, limit=limit, order=order)

    def _stored(self, tenant: str, response_id: str) -> ResponseRecord:
        record = self.records.response(tenant, response_id)
        if record is None:
            raise NotFound(f"response {response_id!r} not found (it was never stored, was deleted, or belongs to another API key)", param="response_id", code="response_not_found")
        return record

    def create_conversation(self, tenant: str, request: ConversationRequest) -> dict:
        """A new conversation: a new session, made upstream on its first response; initial items are
        sent with that response's input and committed with its turn."""
        items = InputItems.of(request.items or []).items
        conversation = Thread(id=new_id("conv"), tenant=tenant, session="", created_at=int(time.time()), metadata=request.metadata or {}, items=items, uncommitted=item_messages(items))
        conversation.session = session_name(conversation.id)
        self.records.save(conversation)
        return conversation_object(conversation.id, conversation.created_at, conversation.metadata)

    def conversation(self, tenant: str, conversation_id: str) -> dict:
        conversation = self._conversation(tenant, conversation_id)
        return conversation_object(conversation.id, conversation.created_at, conversation.metadata)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> dict:
        """Close the conversation's session (its memory goes with it) and drop its records."""
        conversation = self._conversation(tenant, conversation_id)
        try:
            await self.sessions.admin(tenant, conversation.session, "close")
        except ProxyError as exc:
            if exc.status != 404:  # 404: no response ever made its session upstream
                raise
        self.records.delete(conversation)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def conversation_items(self, tenant: str, conversation_id: str, *, after: str | None, limit: int, order: str) -> dict:
        return item_list(self._conversation(tenant, conversation_id).items, after=after, limit=limit, order=order)

    async def add_items(self, tenant: str, conversation_id: str, raw: list[dict]) -> dict:
        """Append items: recorded now, sent to the model with the next response and committed with its turn."""
        conversation = self._conversation(tenant, conversation_id)
        items = InputItems.of(raw).items
        async with self.sessions.turn(tenant, conversation.session):  # not while a response runs on it
            if conversation.calls:
                raise BadRequest(f"the conversation's latest response waits for function results (call_id(s) {conversation.calls}); send them with POST /v1/responses first", param="items", code="tool_results_missing")
            conversation.items += items
            conversation.uncommitted += item_messages(items)
            self.records.save(conversation)
        return item_list(items, after=None, limit=len(items) or 1, order="asc")

    def _conversation(self, tenant: str, conversation_id: str) -> Thread:
        conversation = self.records.thread(tenant, conversation_id)
        if conversation is None or not conversation.conversation:
            raise NotFound(f"conversation {conversation_id!r} not found", param="conversation_id", code="conversation_not_found")
        return conversation
