"""Two endpoints on the same items: agreement and McNemar's exact test.

Per item each endpoint passed or failed. `a_only` items passed on A and failed on B, `b_only`
the reverse; McNemar's exact test asks whether the discordant items split more unevenly than
a fair coin would: under "no difference" `a_only` is Binomial(a_only + b_only, 1/2), and the
two-sided p-value is twice the smaller tail, at most 1 (computed exactly with math.comb).
"""

from __future__ import annotations

from math import comb


def mcnemar_exact(a_only: int, b_only: int) -> float:
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(a_only, b_only) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired(a: dict[str, bool], b: dict[str, bool]) -> dict:
    """Counts over the items both endpoints have a result for."""
    items = sorted(set(a) & set(b))
    both = sum(1 for t in items if a[t] and b[t])
    neither = sum(1 for t in items if not a[t] and not b[t])
    a_only = [t for t in items if a[t] and not b[t]]
    b_only = [t for t in items if b[t] and not a[t]]
    return {
        "items": len(items),
        "both_pass": both,
        "both_fail": neither,
        "a_only": a_only,
        "b_only": b_only,
        "agreement": round((both + neither) / len(items), 4) if items else None,
        "mcnemar_p": mcnemar_exact(len(a_only), len(b_only)),
    }
