"""An OpenAI-compatible HTTP server in front of `llmengine.Engine` (`llmengine serve`).

`create_app(engine, tokenizer, served_model_name=...)` builds the FastAPI app;
`serve_in_thread(app)` runs it under uvicorn on a free local port for as long as a `with`
block lasts. The modules, one idea each: `protocol` (request bodies: the shared
`sampling_fields`, the completions body, the chat body in `chat_request`), `errors`
(OpenAI's error object), `engine_loop` (the engine's own thread and the hand-off to
asyncio), `engine_process` (the same loop in a process of its own: `serve`'s default),
`text_stream` (incremental text and stop strings), `choices` (one request's
choices as deltas), `streaming` (Server-Sent Events, disconnects), `serving` (the two
endpoints), `chat` (chat templates), `metrics` (Prometheus), `app` (routes, auth, body
limit) and `runner` (uvicorn in the foreground, or on a background thread).
"""

from llmengine.server.app import create_app as create_app
from llmengine.server.runner import serve as serve
from llmengine.server.runner import serve_in_thread as serve_in_thread
