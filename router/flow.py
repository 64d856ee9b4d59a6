"""Flow control (`--flow-control`): the router queues what its workers cannot run at once, per (tenant, priority),
and sheds the lowest priority first when its queue is full.

Each model has slots: for each ready worker serving it, its `max_num_seqs` (from its block report; else
`--worker-slots`, or that option where given). A request takes a slot for as long as its response lasts; with no
slot free it waits in the router's queue for its model, in the class of its `priority` (the request's field,
vLLM's meaning: lower first) and its tenant (`tenant_of`). A freed slot goes to the best priority waiting and,
among that priority's tenants, to the next one in turn (round robin): tenants flooding at once each get an
equal share, whatever their numbers of requests.

The queue of a model holds at most `max_queued` requests. A request arriving at a full queue takes the place of
the newest request of the worst priority queued if its own is better, and of the same priority the newest request
of the tenant with the longest queue (so a flooding tenant cannot crowd out another's turn); otherwise it is
refused itself. A request refused, or waiting longer than `queue_timeout_s`, gets a 429 with Retry-After: a
client of a saturated router is told at once to come back, rather than left to time out.

Named priority classes (`--priority-class NAME=PRIORITY`) give a request that names one in the trusted
`--priority-class-header` its priority (its own `priority` field wins); a tenant with a limit (`--tenant-limit
TENANT=N`) has at most N requests in flight at once over every model: its others wait, and its turn passes to the
next tenant meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

ANONYMOUS = "anonymous"


def tenant_of(headers: Mapping[str, str], header: str | None, keyed: bool) -> str:
    """The request's tenant: the trusted `header`'s value where configured and present; else, with API keys
    (`keyed`), a digest of the key it presented (never the key itself); else anonymous."""
    if header:
        value = headers.get(header, "").strip()
        if value:
            return value[:128]
    if keyed:
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return "key-" + hashlib.sha256(token.strip().encode()).hexdigest()[:12]
    return ANONYMOUS


def priority_of(payload: object, class_name: str | None = None, classes: Mapping[str, int] | None = None) -> int:
    """The request's `priority` (vLLM's field: an int, lower first); else its named class's (`class_name`, from the
    trusted header, looked up in `classes`: ValueError for an unknown one); else 0."""
    value = payload.get("priority") if isinstance(payload, dict) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if class_name:
        if not classes or class_name not in classes:
            known = ", ".join(sorted(classes or {})) or "none"
            raise ValueError(f"unknown priority class {class_name[:64]!r} (known: {known})")
        return classes[class_name]
    return 0


class Shed(Exception):
    """The request was refused (queue full) or waited too long: a 429."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False)
class Ticket:
    tenant: str
    priority: int
    granted: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class ModelQueue:
    """One model's waiting requests: priority -> tenant -> tickets (oldest first), and each priority's turn order."""

    in_flight: int = 0
    classes: dict[int, dict[str, deque[Ticket]]] = field(default_factory=dict)
    turns: dict[int, deque[str]] = field(default_factory=dict)  # tenants of a priority, next served first

    @property
    def queued(self) -> int:
        return sum(len(q) for tenants in self.classes.values() for q in tenants.values())

    def push(self, ticket: Ticket) -> None:
        tenants = self.classes.setdefault(ticket.priority, {})
        if ticket.tenant not in tenants:
            tenants[ticket.tenant] = deque()
            self.turns.setdefault(ticket.priority, deque()).append(ticket.tenant)
        tenants[ticket.tenant].append(ticket)

    def remove(self, ticket: Ticket) -> None:
        tenants = self.classes.get(ticket.priority, {})
        q = tenants.get(ticket.tenant)
        if q is None or ticket not in q:
            return
        q.remove(ticket)
        if not q:
            self._drop_tenant(ticket.priority, ticket.tenant)

    def _drop_tenant(self, priority: int, tenant: str) -> None:
        del self.classes[priority][tenant]
        self.turns[priority].remove(tenant)
        if not self.classes[priority]:
            del self.classes[priority]
            del self.turns[priority]

    def pop_next(self, may_run: Callable[[str], bool] = lambda tenant: True) -> Ticket | None:
        """The next to run: the best priority, its tenants in turn, skipping tenants that `may_run` holds back (at
        their limit); None when nobody queued may run."""
        for priority in sorted(self.classes):
            turn = self.turns[priority]
            for _ in range(len(turn)):
                tenant = turn[0]
                turn.rotate(-1)  # this tenant goes to the back of its priority's turn
                if not may_run(tenant):
                    continue
                q = self.classes[priority][tenant]
                ticket = q.popleft()
                if not q:
                    self._drop_tenant(priority, tenant)
                return ticket
        return None

    def victim(self, newcomer: Ticket) -> Ticket | None:
        """Whom a newcomer at a full queue displaces (see the module docstring); None: the newcomer is refused."""
        if not self.classes:
            return None
        worst = max(self.classes)
        if newcomer.priority > worst:
            return None
        tenants = self.classes[worst]
        longest = max(tenants, key=lambda t: (len(tenants[t]), t))
        if newcomer.priority == worst:
            mine = len(tenants.get(newcomer.tenant, ())) + 1  # counting the newcomer
            if mine >= len(tenants[longest]):
                return None  # its own tenant holds the longest queue: its newest, the newcomer, goes
        return tenants[longest][-1]


class FlowControl:
    """The router's queues, one per model (see the module docstring). `capacity(model)`: its slots now."""

    def __init__(self, capacity: Callable[[str | None], int], max_queued: int, queue_timeout_s: float,
                 on_shed: Callable[[int, str], None] | None = None,
                 tenant_limits: Mapping[str, int] | None = None) -> None:
        self.capacity = capacity
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.on_shed = on_shed  # (priority, reason) per request shed: the router's counter
        self.models: dict[str | None, ModelQueue] = {}
        self.tenant_limits = dict(tenant_limits or {})
        self.tenant_in_flight: dict[str, int] = {}  # tenants with a limit only, over every model

    def _may_run(self, tenant: str) -> bool:
        limit = self.tenant_limits.get(tenant)
        return limit is None or self.tenant_in_flight.get(tenant, 0) < limit

    def _start(self, mq: ModelQueue, tenant: str) -> None:
        mq.in_flight += 1
        if tenant in self.tenant_limits:
            self.tenant_in_flight[tenant] = self.tenant_in_flight.get(tenant, 0) + 1

    def _queue(self, model: str | None) -> ModelQueue:
        return self.models.setdefault(model, ModelQueue())

    def queued(self) -> dict[int, int]:
        """Requests waiting, by priority (every model)."""
        out: dict[int, int] = {}
        for mq in self.models.values():
            for priority, tenants in mq.classes.items():
                out[priority] = out.get(priority, 0) + sum(len(q) for q in tenants.values())
        return out

    async def acquire(self, model: str | None, tenant: str, priority: int) -> None:
        """A slot for a request (now, or once its turn comes); Shed when it is refused or waits too long. Every
        acquire that returns must be followed by one `release`."""
        mq = self._queue(model)
        if not mq.classes and mq.in_flight < self.capacity(model) and self._may_run(tenant):
            self._start(mq, tenant)
            return
        ticket = Ticket(tenant, priority)
        if mq.queued >= self.max_queued:
            victim = mq.victim(ticket)
            if victim is None:
                self._shed(priority, "queue_full")
                raise Shed("queue_full")
            mq.remove(victim)
            self._shed(victim.priority, "displaced")
            victim.granted.set_exception(Shed("displaced"))
        mq.push(ticket)
        self.pump(model)
        try:
            await asyncio.wait_for(asyncio.shield(ticket.granted), self.queue_timeout_s)
        except asyncio.TimeoutError:
            if ticket.granted.done() and not ticket.granted.exception():
                return  # granted just as the time ran out: it has its slot
            mq.remove(ticket)
            self._shed(priority, "queue_timeout")
            raise Shed("queue_timeout") from None
        except asyncio.CancelledError:  # the client went away while queued
            if ticket.granted.done() and not ticket.granted.cancelled() and not ticket.granted.exception():
                self.release(model, tenant)  # it had been given a slot: hand it on
            else:
                mq.remove(ticket)
            raise

    def release(self, model: str | None, tenant: str) -> None:
        mq = self._queue(model)
        mq.in_flight -= 1
        if tenant in self.tenant_limits:
            self.tenant_in_flight[tenant] -= 1
            self.pump_all()  # the tenant's others may wait on any model
        else:
            self.pump(model)

    def pump(self, model: str | None) -> None:
        """Grant the free slots of `model` to the requests next in turn (tenants at their limit wait)."""
        mq = self._queue(model)
        while mq.classes and mq.in_flight < self.capacity(model):
            ticket = mq.pop_next(self._may_run)
            if ticket is None:
                return
            self._start(mq, ticket.tenant)
            ticket.granted.set_result(None)

    def pump_all(self) -> None:
        """After the pool changed (workers joined: more slots)."""
        for model in list(self.models):
            self.pump(model)

    def _shed(self, priority: int, reason: str) -> None:
        if self.on_shed is not None:
            self.on_shed(priority, reason)
