"""Kubernetes resource quantities ("500m", "2Gi", "1e3"): parse and compare them exactly.

kubernetes-validate checks only that a quantity is a string, and `kubernetes.utils.parse_quantity` accepts
strings the API server rejects ("2 Gi", "NaN", "Infinity"), so the grammar of apimachinery's quantity.go is
checked here instead.
"""

from __future__ import annotations

import re
from decimal import Decimal

# <quantity> ::= <signedNumber><suffix>; suffix: binary SI (Ki..Ei), decimal SI (n u m "" k M G T P E)
# or a decimal exponent (e3, E-2). Same grammar as k8s.io/apimachinery/pkg/api/resource/quantity.go.
_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: str) -> Decimal:
    """The exact value of a Kubernetes quantity; ValueError naming the text when it is not one."""
    match = _QUANTITY.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (examples: 500m, 2, 1.5Gi, 512Mi)")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        return number.scaleb(int(suffix[1:]))
    return number


def check_quantity(text: str) -> str:
    """Validator: `text` unchanged when it is a non-negative quantity, else ValueError."""
    if parse_quantity(text) < 0:
        raise ValueError(f"{text!r} is negative; a resource quantity must be zero or more")
    return text
