"""Nested buckets on the model stores: one step on an inner bucket's and its outer's records."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from celery_interval.errors import ConfigurationError
from celery_interval.schedule import (
    BucketState,
    Claim,
    ClaimTerms,
    Grant,
    Mark,
    Pace,
    Slot,
    claim_capped,
    fair_claim,
    live_places,
)
from celery_interval.schedule import outer as nesting
from celery_interval.schedule.fair import FairShare
from celery_interval.schedule.outer import ClaimStep, Outer
from celery_interval.stores._apply import (
    BucketTxn,
    ModelStore,
    _born_us,
    _put,
    _settle_until_us,
)
from celery_interval.stores.base import DoneBatch, TaskCopy

__all__ = ["NestedSteps", "Nesting"]

#: The two records of a nested step: the inner bucket's and the outer's.
Pair = tuple[BucketTxn, BucketTxn]
#: A claim step per slot (``take_nested``'s ``step``).
_SlotStep = Callable[[Slot], ClaimStep]


#: A bucket's outer bucket (None: the bucket is not nested).
Nesting = Callable[[str], "Outer | None"]


class NestedSteps(ModelStore):
    """A model store whose nested buckets' grants, claims and takes (``_nesting``) also
    spend their outer bucket's budget: ``grant_nested``, ``claim_nested`` and ``take_nested``,
    both buckets' records loaded under one lock (``_locked_pair``), both saved on a clean
    exit."""

    _nesting: Nesting | None = None
    #: Each fair outer bucket's share (``schedule.fair``), by the outer's name.
    _shares: dict[str, FairShare]

    def _nested(self, bucket: str) -> Outer | None:
        return None if self._nesting is None else self._nesting(bucket)

    def grant(self, copy: TaskCopy, pace: Pace) -> Grant:
        outer = self._nested(copy.bucket)
        if outer is None:
            return super().grant(copy, pace)
        return self.grant_nested(copy, pace, outer)

    def claim(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, *, ticket: int = 0
    ) -> Claim:
        outer = self._nested(copy.bucket)
        if outer is None:
            return super().claim(copy, interval_us, slot, terms, ticket=ticket)
        return self.claim_nested(copy, interval_us, slot, terms, outer, ticket=ticket)

    def take(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, *, done_first: DoneBatch | None = None
    ) -> tuple[Grant, Claim | None]:
        outer = self._nested(copy.bucket)
        if outer is None:
            return super().take(copy, pace, terms, done_first=done_first)
        if done_first is not None:
            self.done(done_first.copies, done_first.dedupe_ttl_us)
        return self.take_nested(copy, pace, terms, outer)

    def _locked_pair(self, inner: str, outer: str) -> AbstractContextManager[Pair]:
        """Hold both buckets' records; a store that cannot lock two says so."""
        raise ConfigurationError(
            f"{type(self).__name__} does not run nested buckets ({inner!r} in {outer!r}): "
            "use a Redis store (or memory:// in one process)"
        )

    @contextmanager
    def _pair(self, copy: TaskCopy, outer: Outer) -> Iterator[Pair]:
        if copy.bucket == outer.bucket:
            raise ConfigurationError(f"bucket {copy.bucket!r} cannot be nested in itself")
        with self._locked_pair(copy.bucket, outer.bucket) as pair:
            yield pair

    def grant_nested(self, copy: TaskCopy, pace: Pace, outer: Outer) -> Grant:
        """``schedule.outer.grant_nested`` of ``copy`` in its bucket inside ``outer``."""
        with self._pair(copy, outer) as (txn, out):
            state, mark, outer_state, granted = nesting.grant_nested(
                txn.state,
                txn.mark(copy.task_id, copy.retries),
                out.state,
                txn.now_us,
                pace,
                outer,
                born_us=_born_us(txn),
                outer_born_us=_born_us(out),
            )
            _save(txn, out, copy, (state, mark, outer_state), pace.interval_us, outer)
            return granted

    def claim_nested(
        self,
        copy: TaskCopy,
        interval_us: int,
        slot: Slot,
        terms: ClaimTerms,
        outer: Outer,
        *,
        ticket: int = 0,
    ) -> Claim:
        """``schedule.outer.claim_nested`` (under the inner bucket's cap, ``terms.cap``);
        ``ticket`` is for a store's ledger only."""
        with self._pair(copy, outer) as (txn, out):
            step = _capped(txn, copy, interval_us, terms)(slot)
            args = (txn.state, txn.mark(copy.task_id, copy.retries), out.state)
            born_us, outer_born_us = _born_us(txn), _born_us(out)
            if outer.weight is None:
                state, mark, outer_state, claimed = nesting.claim_nested(
                    *args, txn.now_us, slot, terms, outer,
                    interval_us=interval_us, step=step,
                    born_us=born_us, outer_born_us=outer_born_us,
                )  # fmt: skip
            else:
                share = self._shares.get(outer.bucket, FairShare())
                state, mark, outer_state, share, claimed = fair_claim.claim_fair(
                    *args, share, txn.now_us, slot, terms, outer, copy.bucket,
                    interval_us=interval_us, step=step, refused=_unplaced(txn, terms),
                    born_us=born_us, outer_born_us=outer_born_us,
                )  # fmt: skip
                self._shares[outer.bucket] = share
            _save(txn, out, copy, (state, mark, outer_state), interval_us, outer)
            return claimed

    def take_nested(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, outer: Outer
    ) -> tuple[Grant, Claim | None]:
        """``schedule.outer.take_nested``: a grant, and its claim when due, in one step."""
        with self._pair(copy, outer) as (txn, out):
            args = (txn.state, txn.mark(copy.task_id, copy.retries), out.state)
            born_us, outer_born_us = _born_us(txn), _born_us(out)
            step = _capped(txn, copy, pace.interval_us, terms)
            if outer.weight is None:
                state, mark, outer_state, granted, claimed = nesting.take_nested(
                    *args,
                    txn.now_us,
                    pace,
                    terms,
                    outer,
                    step=step,
                    born_us=born_us,
                    outer_born_us=outer_born_us,
                )
            else:
                share = self._shares.get(outer.bucket, FairShare())
                state, mark, outer_state, share, granted, claimed = fair_claim.take_fair(
                    *args, share, txn.now_us, pace, terms, outer, copy.bucket,
                    step=step, refused=_unplaced(txn, terms),
                    born_us=born_us, outer_born_us=outer_born_us,
                )  # fmt: skip
                self._shares[outer.bucket] = share
            _save(txn, out, copy, (state, mark, outer_state), pace.interval_us, outer)
            return granted, claimed


def _unplaced(txn: BucketTxn, terms: ClaimTerms) -> Callable[[bool], None]:
    """Undo a capped step's places when its start was not the key's turn
    (``claim_fair``'s ``refused``): as they were, less those expired where the cap was
    checked (the step dropped them, as claim.lua's cap check does)."""
    before = txn.places

    def refused(checked: bool) -> None:
        txn.places = (
            live_places(before, txn.now_us) if checked and terms.cap is not None else before
        )

    return refused


def _capped(txn: BucketTxn, copy: TaskCopy, interval_us: int, terms: ClaimTerms) -> _SlotStep:
    """The inner claim of a slot under the bucket's cap: its places are read from and
    written to ``txn``; ``terms``' claimer may open the done marks' settle window at once."""
    settle_until_us = _settle_until_us(txn, terms)
    born_us = _born_us(txn)
    places_born_us = txn.places_born_us()

    def at(slot: Slot) -> ClaimStep:
        def step(
            state: BucketState, mark: Mark | None, terms: ClaimTerms
        ) -> tuple[BucketState, Mark | None, Claim]:
            state, mark, txn.places, claimed = claim_capped(
                state,
                mark,
                txn.places,
                txn.now_us,
                interval_us,
                slot,
                terms,
                place=copy.place,
                born_us=born_us,
                places_born_us=places_born_us,
                settle_until_us=settle_until_us,
            )
            return state, mark, claimed

        return step

    return at


def _save(
    txn: BucketTxn,
    out: BucketTxn,
    copy: TaskCopy,
    records: tuple[BucketState, Mark | None, BucketState],
    interval_us: int,
    outer: Outer,
) -> None:
    """Save the inner state and the copy's mark, and the outer state."""
    state, mark, outer_state = records
    _put(txn, state, interval_us)
    txn.set_mark(copy.task_id, copy.retries, mark)
    _put(out, outer_state, outer.interval_us)
