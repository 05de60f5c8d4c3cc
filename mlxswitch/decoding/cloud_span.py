"""The session's cloud tier: spans for the token loop, whole-answer hand-offs, costs and notices.

Any failure leaves the local answer standing: the reason becomes one notice for the user (said
once per session) and the cloud is not called again in that session, so a dead network costs
one timeout, not one per span. A spent budget is said once too. Ctrl-C (CloudInterrupted, a
KeyboardInterrupt) is let through: the caller keeps what was shown.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from ..cloud.budget import CloudSettings
from ..json_numbers import rounded

Waiting = Callable[[str], contextlib.AbstractContextManager]
OnText = Callable[[str], None]


class CloudTier:
    """A cloud client with the session's budget, its one-time notices and this answer's record."""

    def __init__(self, settings: CloudSettings, client=None):
        from ..cloud.client import (
            CloudClient,  # the SDK loads only when a cloud tier is asked for
        )

        self.settings = settings
        self.client = client or CloudClient(settings)
        self.waiting: Waiting = lambda what: contextlib.nullcontext()  # the CLI's spinner, if any
        self.spans: list[dict] = []  # this answer's spans
        self._pending_notices: list[str] = []
        self._failure: str | None = None  # after one failure the session stays local
        self._budget_said = False

    @property
    def spans_on(self) -> bool:
        """Whether the cloud is the top rung of the ladder (else it takes whole answers)."""
        return self.settings.mode == "span"

    def start_answer(self) -> None:
        """A new answer: its costs and spans start from zero (the session's keep going)."""
        self.client.budget.start_answer()
        self.spans = []

    def take_notices(self) -> list[str]:
        """Lines the user has not been told yet (each is handed out once)."""
        out, self._pending_notices = self._pending_notices, []
        return out

    def span(
        self, tokenizer, system: str | None, messages: list[dict], answer_ids: list[int], room: int
    ) -> list[int]:
        """Ids of the cloud's continuation of the answer so far (none when it cannot be had)."""
        from ..cloud.client import CloudBudgetExhausted, CloudFailure

        if self._failure is not None:
            return []
        partial = tokenizer.decode(answer_ids)
        try:
            with self.waiting(f"asking {self.settings.model}"):
                reply = self.client.continue_span(system, messages, partial)
            text, usd = reply.text, reply.cost_usd
        except CloudBudgetExhausted as exc:
            self._spent(str(exc))
            return []
        except CloudFailure as exc:
            self._failed(str(exc))
            # Whole sentences that arrived before the failure are a valid continuation: keep them.
            text, usd = exc.partial, None
        ids = list(tokenizer.encode(text, add_special_tokens=False))[:room] if text else []
        self.spans.append({"at": len(answer_ids), "tokens": len(ids), "text": text, "usd": rounded(usd, 6)})
        return ids

    def handoff(
        self,
        system: str | None,
        messages: list[dict],
        entropies: list[float | None],
        on_text: OnText | None = None,
    ) -> dict:
        """Score the local answer; re-ask it in the cloud when uncertain. The decision record."""
        from ..cloud.client import CloudBudgetExhausted, CloudFailure

        finite = [h for h in entropies if h is not None and math.isfinite(h)]
        mean = math.fsum(finite) / len(finite) if finite else None
        peak = max(finite) if finite else None
        threshold = self.settings.handoff_threshold
        record = {
            "score": rounded(mean, 6),
            "peak": rounded(peak, 6),
            "threshold": threshold,
            "decision": "local",
            "shown": "local",
            "cloud_text": None,
        }
        if mean is None or mean <= threshold:
            return record
        record["decision"] = "cloud"
        if self._failure is not None:
            record["reason"] = self._failure
            return record
        try:
            with self.waiting(f"asking {self.settings.model} for the whole answer"):
                reply = self.client.answer(system, messages, on_text)
        except CloudBudgetExhausted as exc:
            self._spent(str(exc))
            record["reason"] = str(exc)
            return record
        except CloudFailure as exc:
            self._failed(str(exc))
            record["reason"] = str(exc)
            if exc.partial:  # shown already: it stays on screen, the local answer stands
                record["cloud_text"] = exc.partial
            return record
        record.update(shown="cloud", cloud_text=reply.text)
        return record

    def answer_record(self) -> dict:
        """Costs of this answer and of the session so far, and the answer's spans."""
        budget = self.client.budget.as_dict()
        out = {"mode": self.settings.mode, **budget}
        if self.spans_on:
            out["spans"] = list(self.spans)
        return out

    def _failed(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            self._pending_notices.append(f"{reason}; going on locally for the rest of this session")

    def _spent(self, reason: str) -> None:
        if not self._budget_said:
            self._budget_said = True
            self._pending_notices.append(f"{reason}; no more cloud calls in this session")
