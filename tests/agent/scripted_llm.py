"""Scripted model replies for the llm proposer's tests, and a local HTTP server that speaks the OpenAI chat API.

The replies are real rmsnorm candidates: the row_block template rendered at its first point ("fixed"), and the same
source with a wrong epsilon, so that verification fails numerically on every shape ("broken"), wrapped in the kind
of prose a chat model writes around code.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from workbench.templating import load_template

POINT = {"BLOCK_N": 8192, "ACC_DTYPE": "float32", "num_warps": 16, "BWD_PROGRAMS": 128}
FIXED = load_template("rmsnorm", "row_block").render(POINT)
GOOD_RSTD = "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)"
assert GOOD_RSTD in FIXED
BROKEN = FIXED.replace(GOOD_RSTD, "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps + 0.5)")

BROKEN_REPLY = f"""Here is a row-per-program RMSNorm with a fused backward:

```python
{BROKEN}
```

It keeps rstd for the backward pass, so x is read once per direction."""

FIXED_REPLY = f"""The failing shapes all show the same relative error, which points at the normalisation itself: I
added a constant to the mean of squares. A snippet of the fix:

```python
rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
```

The corrected module:

```python
{FIXED}
```
"""

MODEL = "scripted-coder"


@dataclass
class Raw:
    """A reply given as it is: an HTTP status and a body (a failure or a malformed response)."""

    status: int
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def completion(content: str, model: str = MODEL) -> dict:
    return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}


class ScriptedServer:
    """POST /v1/chat/completions answered from ``script`` in order (a string: a completion with that content; a
    Raw: that response), GET /v1/models listing MODEL. ``requests`` keeps what came in: path, headers, JSON body and
the monotonic time it arrived.
    Use as a context manager; ``base_url`` is http://127.0.0.1:<free port>/v1."""

    def __init__(self, script: list[str | Raw]):
        self.script = list(script)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep the test output clean
                pass

            def _send(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests"}]}))
                else:
                    self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                            "at": time.monotonic()})
                    step = server.script.pop(0) if server.script else Raw(503, json.dumps(
                        {"error": {"message": "the script has no more replies"}}))
                if self.path != "/v1/chat/completions":
                    self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}))
                elif isinstance(step, Raw):
                    self._send(step.status, step.body, step.headers)
                else:
                    self._send(200, json.dumps(completion(step, body.get("model", MODEL))))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def prompts(self) -> list[str]:
        """The user message of every chat request, in order."""
        return [r["body"]["messages"][-1]["content"] for r in self.requests if r["path"] == "/v1/chat/completions"]
