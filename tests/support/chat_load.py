"""Chat clients that continue threads and resend the whole conversation each request, as OpenAI clients
do; what they were answered (tests/serving/test_kill.py, tests/serving/test_balancer.py)."""

from __future__ import annotations

import threading
from typing import Any


class ThreadLoad:
    """`clients` threads in turn, each `exchanges` exchanges long, then a new one; `histories` holds
    what each thread's client was answered, `answered` the completion ids (-> the turns they showed)."""

    def __init__(self, clients: int, exchanges: int) -> None:
        self.exchanges = exchanges
        self.histories: dict[str, list[dict[str, str]]] = {}
        self.answered: dict[str, int] = {}  # completion id -> turns the response showed
        self.lock = threading.Lock()
        self.threads_started = 0
        self.current = [self.new_thread() for _ in range(clients)]  # each client's thread

    def new_thread(self) -> str:
        with self.lock:
            self.threads_started += 1
            thread = f"thread-{self.threads_started}"
            self.histories[thread] = []
        return thread

    def next_request(self, slot: int) -> tuple[str, dict[str, str], dict[str, Any]]:
        """Client `slot`'s next request: (its thread, the new question, the body resending the thread)."""
        thread = self.current[slot]
        history = self.histories[thread]
        if len(history) >= 2 * self.exchanges:
            thread = self.current[slot] = self.new_thread()
            history = self.histories[thread]
        question = {"role": "user", "content": f"{thread} q{len(history) // 2}: 1+2"}
        return thread, question, {"model": "chain", "messages": [*history, question], "max_tokens": 3}

    def record(self, thread: str, question: dict[str, str], reply: dict[str, Any]) -> None:
        """An answered exchange: the thread's history goes on from it."""
        with self.lock:
            answer = {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
            self.histories[thread] += [question, answer]
            self.answered[reply["id"]] = len(reply["teamtr"]["turns"])
