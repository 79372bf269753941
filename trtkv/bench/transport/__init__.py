"""How requests reach a server and come back: one stream loop per process (client, stream), HTTP/1.1
(http1, http1_fetch), the OpenAI protocol (openai), the endpoints and the Triton answers."""
