"""The proxy's session layer: what it knows of each session and kept state, and the one way a turn runs on them.

By floor: ``state`` (a session's state, its lifecycle transitions and the bounded table; no I/O), ``transcript``
(message hashes and trimming), ``prefix_index`` (kept states by the hash chain of their messages; no I/O), ``store``
(records on disk); the parts, each given the parts it uses (no part reaches another through a shared ``self``):
``upstream``, ``leases``, ``writes``, ``placement``, ``forks`` (a named session's kept states), ``held`` (one session
held by one request); ``sessions`` (builds the parts: the per-request hold, commits behind answers, admin),
``headerless`` (header-less memory: resume and fork; its states kept by ``kept``) and ``turn`` (the turn runner both surfaces use). No module here
knows a surface or HTTP."""
