"""GPU-model requirements and the pressure on each model (pure).

A pod may accept only some device models (the trace's ``gpu_spec``; in the product a
nodeSelector or node affinity on the node's GPU-product label, or the pod's models
annotation, see ``sharing/placement/pod_models.py``). ``ModelReq`` is that predicate: an OR of
terms, each an optional allow-list and a deny-list (what node affinity can say about one
label). Model names are compared in label form (``label_form``).

``ModelPressure`` prices GPU capacity per model for placement: the pods bound to a model
set will need the free capacity of those models, so a pod that could go elsewhere pays
for taking it. See docs/placement.md "Heterogeneous fleets".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_MODELS = 64  # names in one requirement (bounded: requirements can come from tenants)
MAX_NAME = 63  # a label value's length limit


def label_form(name: str) -> str:
    """A model name as a node label value would carry it: whitespace runs become '-'
    (NVML's "Tesla T4" is the label value "Tesla-T4")."""
    return "-".join(name.split())


@dataclass(frozen=True)
class ModelTerm:
    """Models in ``allow`` (None = any) and not in ``deny``."""

    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()

    def allows(self, model: str) -> bool:
        return (self.allow is None or model in self.allow) and model not in self.deny

    def both(self, other: ModelTerm) -> ModelTerm:
        if self.allow is None:
            allow = other.allow
        elif other.allow is None:
            allow = self.allow
        else:
            allow = self.allow & other.allow
        return ModelTerm(allow, self.deny | other.deny)

    def text(self) -> str:
        out = "any" if self.allow is None else "|".join(sorted(self.allow)) or "none"
        return out + ("" if not self.deny else " except " + "|".join(sorted(self.deny)))

    def sort_key(self) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
        return (self.allow is None, tuple(sorted(self.allow or ())), tuple(sorted(self.deny)))


@dataclass(frozen=True)
class ModelReq:
    """Which device models a pod accepts: any of ``terms`` (no terms = any model)."""

    terms: tuple[ModelTerm, ...] = ()

    @classmethod
    def of(cls, terms: Iterable[ModelTerm]) -> ModelReq:
        """Canonical form (sorted, deduplicated) so equal requirements compare equal."""
        uniq = set(terms)
        if any(t.allow is None and not t.deny for t in uniq):
            return ANY_MODEL  # one term accepts everything
        return cls(tuple(sorted(uniq, key=ModelTerm.sort_key)))

    @classmethod
    def listed(cls, names: Iterable[str]) -> ModelReq:
        """Exactly these models (none listed = any)."""
        allow = frozenset(label_form(n) for n in names if n.strip())
        return cls.of([ModelTerm(allow)]) if allow else ANY_MODEL

    @classmethod
    def parse(cls, text: str) -> ModelReq:
        """``"A|B"`` or ``"A,B"`` (the trace's ``gpu_spec``, the pod annotation);
        "" = any. Raises ValueError on too many or too long names."""
        names = [n.strip() for n in text.replace(",", "|").split("|") if n.strip()]
        if len(names) > MAX_MODELS:
            raise ValueError(f"more than {MAX_MODELS} models listed")
        for n in names:
            if len(n) > MAX_NAME:
                raise ValueError(f"model name longer than {MAX_NAME} characters: {n[:40]!r}...")
        return cls.listed(names)

    @property
    def any(self) -> bool:
        return not self.terms

    def allows(self, model: str) -> bool:
        return not self.terms or any(t.allows(model) for t in self.terms)

    def both(self, other: ModelReq) -> ModelReq:
        """Models both requirements accept."""
        if not self.terms:
            return other
        if not other.terms:
            return self
        return ModelReq.of(a.both(b) for a in self.terms for b in other.terms)

    def __str__(self) -> str:
        return " or ".join(t.text() for t in self.terms) if self.terms else "any"


ANY_MODEL = ModelReq()


class ModelPressure:
    """How much of each model's free capacity the model-bound pods still need.

    ``demand`` maps each requirement other than "any" to its share of the workload's GPU
    demand. Pods keep arriving until the cluster is full, so of the F free GPU-milli left
    a requirement R will ask about ``share_R * F``, spread over its models in proportion
    to their free capacity. A model k's price is the part of its free capacity F_k that
    bound pods will ask for: ``sum over R allowing k of share_R * F / F_R``. A pod that
    takes x GPU-milli of model k pays ``x * price_k``: pods that may go elsewhere leave
    scarce models to the pods that can only use them, and every model fills at the rate
    its bound demand allows. Prices only differ between models, so within one model the
    fragmentation gradient alone decides.
    """

    def __init__(self, demand: Mapping[ModelReq, float]) -> None:
        self.demand = {r: s for r, s in demand.items() if s > 0 and not r.any}

    def __bool__(self) -> bool:
        return bool(self.demand)

    def prices(self, free: Mapping[str, float]) -> dict[str, float]:
        """Price per model given the free GPU-milli of each model in the cluster."""
        out = dict.fromkeys(free, 0.0)
        total = sum(free.values())
        for req, share in self.demand.items():
            allowed = [k for k in free if req.allows(k)]
            f_req = sum(free[k] for k in allowed)
            if f_req <= 0:
                continue  # nothing left for these pods anyway
            for k in allowed:
                out[k] += share * total / f_req
        return out
