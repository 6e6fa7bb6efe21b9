"""The load balancer's configuration for several `teamtr serve` replicas: HAProxy, as docs/scale.md runs
it (`python -m teamtr.serving.haproxy BIND BACKEND... > haproxy.cfg`); no request router of our own.

Why each line (what the replicas' guarantees rest on):

- `balance hdr(X-Conversation-Id)` with `hash-type consistent` (`avalanche`: conversation ids that differ
  in a few characters still spread over the replicas): a conversation goes to the same replica
  while it is up (its thread state is then in that replica's connection pool and the engine's prefix
  cache); any replica can serve it (the state is in the shared store), and when one goes down only its
  conversations move. A request without the header is balanced round-robin.
- `option httpchk GET /health/live` every second, 3 failures (or a check that takes over 5 s) take a
  replica out: a replica busy decoding may answer a check late, and taking it out for that sent every
  request to the other one, or with both out answered 503 to all (seen at 32 clients on 2 cores with
  one failure and the 500 ms default check timeout). A SIGKILLed replica is out at once anyway:
  `observe layer4` marks it down on the first connection a real request could not make.
- `retry-on conn-failure empty-response` with `option redispatch`: a request whose connection a dead
  replica refused, or which it died on before answering a byte, is sent again to another replica (the
  request is buffered whole first: `http-buffer-request`). The one it was in flight on may have run it;
  the shared store recognises the resent exchange as the client's own resend would be (the thread's seen
  messages: serving/threads.py `known_in_thread`), so the conversation gets it once. Without the
  `empty-response` retry HAProxy closes the client's keep-alive connection silently (the HTTP/1.1 way of
  asking the client to retry), which clients see as a dropped connection. A request the balancer cannot
  retry (3 tries, or a body over its buffer) gets 503. A stream (`stream: true`) whose replica dies after
  its first chunk cannot be resent by the balancer: it ends without `data: [DONE]`, and the client resends
  the exchange as after any dropped stream.
- `errorfile 502/503/504`: what the balancer itself answers is a 503 in the OpenAI error shape with
  Retry-After, as the API's own overload answers are (serving/errors.py), so a client retries it.
- timeouts: `timeout server` above the API's longest request deadline (request_timeout_s, 600 s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RETRY_AFTER_S = 1


def unavailable_response() -> str:
    """A raw HTTP 503 answer in the OpenAI error shape (HAProxy's errorfile format)."""
    body = json.dumps(
        {
            "error": {
                "message": "the replica serving this request went away before it answered; retry it",
                "type": "server_error",
                "param": None,
                "code": "replica_unavailable",
            }
        }
    )
    head = [
        "HTTP/1.1 503 Service Unavailable",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        f"Retry-After: {RETRY_AFTER_S}",
        "Cache-Control: no-cache",
        "Connection: close",
    ]
    return "\r\n".join(head) + "\r\n\r\n" + body


def haproxy_config(bind: str, backends: list[str], folder: Path, request_timeout_s: float = 600) -> str:
    """The configuration text: listen on `bind` (host:port), balance over `backends` (host:port each);
    the error file is written into `folder`."""
    if not backends:
        raise ValueError("haproxy_config needs at least one backend (host:port)")
    errors = folder / "unavailable.http"
    errors.write_text(unavailable_response())
    servers = "\n".join(f"    server replica{i} {b} check" for i, b in enumerate(backends))
    return f"""global
    maxconn 4096
    log stdout format raw local0

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client {int(request_timeout_s) + 30}s
    timeout server {int(request_timeout_s) + 30}s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
    option http-buffer-request
    errorfile 502 {errors}
    errorfile 503 {errors}
    errorfile 504 {errors}

frontend api
    bind {bind}
    default_backend replicas

backend replicas
    balance hdr(X-Conversation-Id)
    hash-type consistent sdbm avalanche
    option httpchk GET /health/live
    timeout check 5s
    default-server inter 1s fall 3 rise 2 observe layer4 error-limit 1 on-error mark-down
{servers}
"""


if __name__ == "__main__":  # python -m teamtr.serving.haproxy 0.0.0.0:8000 10.0.0.1:8000 10.0.0.2:8000
    if len(sys.argv) < 3:
        sys.exit("usage: python -m teamtr.serving.haproxy BIND BACKEND [BACKEND ...]  (host:port each)")
    print(haproxy_config(sys.argv[1], sys.argv[2:], Path.cwd()), end="")
