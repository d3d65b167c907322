"""The Chat Completions surface: a request read into a turn (``plan``) on the memory it runs on (``memory``: a named
session or a header-less conversation's kept state), the turn's answer shaped as a completion or its chunks
(``service``, ``stream``), over the session layer's turn runner (``memt_proxy.session.turn``). Its request and
response models are ``memt_proxy.protocol``, which the Responses surface shares."""
