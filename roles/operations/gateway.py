"""The gateway's router, as the host's state says it is now (roles/fleet/gateway.py)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_ext import memo
from roles.facts.service import RouterWorkers


@operation()
def router_lists_only(tool: str, conf: str, urls: list[str]):
    """
    The gateway's router lists no worker but `urls`: one added through its worker API by anyone
    else (whoever held the key that guards it, an operator's test) is taken out, so the router
    sends clients' prompts to the inventory's workers only. Read when it runs, after the router's
    (re)start; a router that does not answer lists nothing to take out (it starts with `urls` only).

    + tool: glm-flash-gateway-launch on the gateway (it calls the router there with its own keys)
    + conf: the router's router.json, the keys' files beside it
    + urls: the inventory's workers (gateway_workers)
    """
    strangers = [w for w in memo.fact(host, RouterWorkers, tool=tool, conf=conf) or [] if w.get("url") not in urls]
    if not strangers:
        host.noop("the router lists the inventory's workers only")
        return
    for worker in strangers:
        # exits non-zero unless the router took it out (the JSON it prints says what it answered)
        yield StringCommand(QuoteString(tool), "workers", QuoteString(conf), "remove", QuoteString(str(worker["id"])))
