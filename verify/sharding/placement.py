"""Where a distributed optimizer keeps its state (``check_sharded_optimizer``'s ``state_placement``):
replicated on every rank, sharded like the parameter, or kept by an owner rank (ZeRO-1 style:
Keller Jordan's distributed Muon keeps a parameter's momentum on the rank that orthogonalizes it).
Recognized from what the ranks hold (``recognize``) and compared as the union over ranks with one
process's state (keys and full shapes)."""

from __future__ import annotations

__all__ = ["STATE_PLACEMENTS", "recognize", "state_placement"]

#: Values of ``state_placement``: "replicated" (every rank holds the full state), "sharded" (each
#: rank holds its shard: DTensors, or plain tensors of its local shard's shape), "owner" (the full
#: state on the ranks that own the parameter, none on the others).
STATE_PLACEMENTS = ("replicated", "sharded", "owner")


def state_placement(value) -> str | None:
    """``value`` checked: one of ``STATE_PLACEMENTS`` or None (recognized from the ranks).
    Raises: ValueError naming state_placement otherwise."""
    if value is not None and value not in STATE_PLACEMENTS:
        raise ValueError(f"state_placement: expected one of {list(STATE_PLACEMENTS)} or None, got {value!r}")
    return value


def recognize(i: int, runs: list[dict], want: dict) -> tuple[str | None, dict, str]:
    """(placement, union, description) of parameter i's state over ``runs`` (every rank's
    ``layout_rank_run`` result) against one process's state ``want`` (key -> tensor).

    "replicated": every rank holds the same keys and shapes (plain tensors); "sharded": every
    rank holds every key, as DTensors (assembled) or as plain tensors of its local shard's shape;
    "owner": some ranks hold the same keys and shapes and the others nothing. Whether the union
    has one process's shapes is checked apart (``analysis._state_note``). ``union``: key -> full
    shape, assembled over ranks (what a checkpoint would gather).
    None when the ranks fit none of them (``description`` says what each rank holds)."""
    full = {k: tuple(v.shape) for k, v in want.items()}
    held = [{k: tuple(v.shape) for k, v in r["state"][i].items()} for r in runs]
    kinds = [r.get("state_kinds", [{}] * (i + 1))[i] for r in runs]
    local = [tuple(r.get("local_shapes", [()] * (i + 1))[i]) for r in runs]
    per_rank = "; ".join(f"rank {r.get('rank', j)}: {h or 'nothing'}" for j, (r, h) in enumerate(zip(runs, held)))
    nonempty = [j for j, h in enumerate(held) if h]
    if not nonempty:
        return ("replicated" if not full else None), {}, f"no rank holds state ({per_rank})"
    keys = set(held[0])
    if all(set(h) == keys for h in held) and keys and all(
            all(h[k] == local[j] for k in keys if full.get(k) != h[k]) for j, h in enumerate(held)) and any(
            h[k] == local[j] != full.get(k) for j, h in enumerate(held) for k in keys):
        union = {k: full.get(k, held[0][k]) for k in keys}
        return "sharded", union, "each rank holds its local shard's part (plain tensors of the shard's shape)"
    if all(h == held[nonempty[0]] for h in held):  # the same on every rank (its shapes checked apart)
        if any(v == "dtensor" for kd in kinds for v in kd.values()):
            return "sharded", dict(held[0]), "every rank holds its shard (DTensor state)"
        return "replicated", dict(held[0]), "every rank holds the full state"
    if len(nonempty) < len(held) and all(held[j] == held[nonempty[0]] for j in nonempty):
        return "owner", dict(held[nonempty[0]]), (f"ranks {[runs[j].get('rank', j) for j in nonempty]} hold the full "
                                                  f"state, the others none")
    return None, dict(held[0]), f"the ranks hold state of no known placement ({per_rank})"
