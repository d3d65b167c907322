"""The Responses and Conversations surface: responses (``service``), continued on conversations and chains of
responses (``threads``) or from the history a header-less input carries (``service``), their records (``records``),
stored responses and conversations (``stored``), streamed events (``stream``)."""
