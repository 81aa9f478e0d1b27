"""What made-up bearer tokens on /status and /metrics cost (hoss/kube/access.py): they neither push out the answer
for a valid token nor make more than the allowed TokenReviews a second, and a reader whose token was accepted before
is reviewed again whatever they do. The apiserver is a fake that accepts one token."""

from __future__ import annotations

from typing import Any

from hoss.kube.access import CACHE_SIZE, TokenAccess, challenge
from hoss.model.objects import Json

VALID = "the-readers-token"


class FakeApiserver:
    """Accepts `VALID` (user ``reader``, who may read); counts the TokenReviews."""

    def __init__(self) -> None:
        self.token_reviews: list[str] = []

    async def request(self, method: str, path: str, *, body: Any = None, timeout: float = 0) -> Json:
        if path.endswith("/tokenreviews"):
            token = body["spec"]["token"]
            self.token_reviews.append(token)
            if token != VALID:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": "reader"}}}
        return {"status": {"allowed": True}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def access(apiserver: FakeApiserver, clock: Clock, *, rate: float) -> TokenAccess:
    return TokenAccess(apiserver, resource="resolvers", namespace="hoss-system", cache_seconds=10,
                       reviews_per_second=rate, clock=clock)


async def test_made_up_tokens_never_push_out_the_answer_for_a_valid_one() -> None:
    apiserver, clock = FakeApiserver(), Clock()
    guard = access(apiserver, clock, rate=1e6)
    assert await guard.authorize("/status", f"Bearer {VALID}") is None
    for n in range(3 * CACHE_SIZE):
        assert await guard.authorize("/status", f"Bearer made-up-{n}") == (
            401, "token not accepted by the apiserver: invalid bearer token")
    reviews = len(apiserver.token_reviews)
    assert await guard.authorize("/status", f"Bearer {VALID}") is None
    assert len(apiserver.token_reviews) == reviews, "the valid token's answer was still remembered"


async def test_tokens_never_accepted_are_reviewed_at_most_at_the_rate_then_get_429() -> None:
    apiserver, clock = FakeApiserver(), Clock()
    guard = access(apiserver, clock, rate=5)
    answers = [await guard.authorize("/metrics", f"Bearer made-up-{n}") for n in range(30)]
    assert len(apiserver.token_reviews) == 20, "a burst of four seconds' worth"
    refused = [answer for answer in answers if answer is not None and answer[0] == 429]
    assert len(refused) == 10 and "try again in 1s" in refused[0][1]
    assert challenge(429) == {"Retry-After": "1"}
    clock.now += 1
    for n in range(30, 40):
        await guard.authorize("/metrics", f"Bearer made-up-{n}")
    assert len(apiserver.token_reviews) == 25, "five more a second"


async def test_a_token_accepted_before_is_reviewed_again_whatever_made_up_ones_did() -> None:
    apiserver, clock = FakeApiserver(), Clock()
    guard = access(apiserver, clock, rate=5)
    assert await guard.authorize("/status", f"Bearer {VALID}") is None
    for n in range(100):
        await guard.authorize("/status", f"Bearer made-up-{n}")
    assert (await guard.authorize("/status", "Bearer one-more"))[0] == 429  # type: ignore[index]
    clock.now += 11  # the valid token's answer has expired; the budget for unknown tokens has not refilled much
    for n in range(100, 200):
        await guard.authorize("/status", f"Bearer made-up-{n}")
    reviews = len(apiserver.token_reviews)
    assert await guard.authorize("/status", f"Bearer {VALID}") is None
    assert apiserver.token_reviews[reviews:] == [VALID], "reviewed again, not refused for the others' flood"
