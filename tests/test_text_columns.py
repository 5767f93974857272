"""The block formatter behind events.csv and trace.json prints numbers exactly as Python does.

hops.outputs.text_columns builds lines from digit columns instead of `%` per row; these
specifications compare it with Python's own formatting on values chosen to break
it (rounding ties of "%.6f", -0.0, trailing zeros of a µs time, the largest widths),
and check that it declines what it cannot print (NaN, huge values, NUL).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from hops.outputs import text_columns as tc


def lines(parts, codes, fields) -> list[str]:
    blocks = tc.render(parts, np.asarray(codes), fields, chunk=7)  # several blocks, a ragged last one
    assert blocks is not None
    return b"".join(blocks).decode().split("\n")[:-1]


def test_integers_print_as_percent_d():
    v = np.array([0, 1, -1, 9, 10, -10, 99, 100, 12345, -987654321, 2 ** 40, -(2 ** 40)], dtype=np.int64)
    out = lines([[b"<"], [b">\n"]], np.zeros(len(v), dtype=np.int64), [(tc.INT, v)])
    assert out == [f"<{x}>" for x in v.tolist()]


def test_whole_ns_print_as_the_repr_of_microseconds():
    rng = np.random.default_rng(1)
    ns = np.concatenate([[0, 1, 10, 100, 999, 1000, 1001, 1010, 1100, 10 ** 15 - 1, 123456789000],
                         rng.integers(0, 10 ** 15, 3000), rng.integers(0, 10 ** 7, 3000) * 10,
                         rng.integers(0, 10 ** 6, 3000) * 1000])
    out = lines([[b""], [b"\n"]], np.zeros(len(ns), dtype=np.int64), [(tc.US, ns)])
    assert out == [repr(x / 1000.0) for x in ns.tolist()]


def test_floats_print_as_percent_point_6f_even_at_rounding_ties():
    rng = np.random.default_rng(2)
    ties = np.arange(-300, 300) / 128.0 + 0.5e-6  # near-ties and exact binary ties of the 6th decimal
    x = np.concatenate([[0.0, -0.0, 1 / 3, -1 / 3, 2.5e-7, -2.5e-7, 5e-7, 0.0078125, 1.0000005, 8.9e9, -8.9e9],
                        ties, np.arange(-300, 300) / 128.0, rng.uniform(-1e4, 1e4, 3000),
                        np.round(rng.uniform(0, 1e5, 3000), 6), 10.0 ** rng.uniform(-8, 9.9, 3000)])
    codes = np.arange(len(x)) % 3
    out = lines([[b"a", b"bb", b""], [b",\n", b";\n", b"\n"]], codes, [(tc.FIXED6, x)])
    assert out == [("a", "bb", "")[c] + "%.6f" % v + (",", ";", "")[c] for c, v in zip(codes.tolist(), x.tolist())]


def test_parts_and_fields_interleave_per_combination():
    parts = [[b"x=", b"long prefix="], [b" y=", b""], [b"\n", b"!\n"]]
    codes = np.array([0, 1, 1, 0])
    a, b = np.array([1, -22, 333, 0]), np.array([0, 1500, 7, 10 ** 9])
    out = lines(parts, codes, [(tc.INT, a), (tc.US, b)])
    assert out == ["x=1 y=0.0", "long prefix=-221.5!", "long prefix=3330.007!", "x=0 y=1000000.0"]


@pytest.mark.parametrize("field", [(tc.FIXED6, [1.0, math.nan]), (tc.FIXED6, [math.inf]), (tc.FIXED6, [1e10]),
                                   (tc.US, [-1]), (tc.US, [10 ** 15])])
def test_values_it_cannot_print_are_declined(field):
    kind, values = field
    assert tc.render([[b""], [b"\n"]], np.zeros(len(values), dtype=np.int64), [(kind, np.asarray(values))]) is None


def test_a_part_holding_nul_is_declined():
    assert tc.render([[b"a\0"], [b"\n"]], np.zeros(1, dtype=np.int64), [(tc.INT, np.array([1]))]) is None


@pytest.mark.parametrize("values", [["g1", "g10", "", "g1", "transfer", "é", ""],   # <= 8 Latin-1 characters
                                    ["optimizer", "a", "", "optimizer"],               # longer
                                    ["\u0100", "x\u00ff", "", "\u0100"], []])            # beyond Latin-1, empty
@pytest.mark.parametrize("likely", [(), ("", "transfer", "never")])
def test_factorize_codes_every_row_by_its_value(values, likely):
    a = np.array(values, dtype=str)
    uniq, codes = tc.factorize(a, likely)
    assert [uniq[c] for c in codes.tolist()] == a.tolist()
    assert len(set(uniq)) == len(uniq)


def test_factorize_and_combine_give_consistent_codes():
    a = np.array(["g1", "g10", "", "g1", "transfer", "é", ""])
    uniq, codes = tc.factorize(a)
    rep, combo = tc.combine([codes, np.array([0, 0, 5, 0, -1, 2, 5])])
    assert len(rep) == 5 and combo.tolist() == [combo[r] for r in rep[combo].tolist()]
    assert combo[0] == combo[3] and combo[2] == combo[6] and len(set(combo.tolist())) == 5
