"""The Responses and Conversations surface: responses on threads, chains and header-less inputs (``service``), their
records (``records``), stored responses and conversations (``stored``), streamed events (``stream``)."""
