"""Text outputs of a million-row Timeline (events.csv, trace.json) without a Python step per row.

Why: formatting each row with `%` costs microseconds, so a PP64 x 1024 x 4 run
(1M events) spent longer writing its trace than simulating it. Here a line is
cut into parts that are the same for every row of a "combination" (device,
kind, phase, stage, track ...: a few hundred distinct ones) and a few numbers.
Each combination's parts are laid out once as bytes; numbers become digit
columns by integer arithmetic. Lines are built as a fixed-width byte matrix
in which unused positions hold NUL, and dropping the NULs leaves the exact
variable-width text. NUL never occurs in the output itself (JSON escapes it;
callers refuse text that contains it), so the result is the same bytes as the
row-by-row formatting it replaces; tests compare the two.

Numbers are printed as Python prints them:
- INT: `%d`.
- US: whole ns (>= 0) as µs, exactly `repr(ns / 1000)`: for ns < 1e15 the
  division's float has a shorter-than-0.001 ulp, so the shortest repr is the
  3-decimal fraction with trailing zeros stripped (at least one decimal).
- FIXED6: a float as `"%.6f" % x`. The float product x * 1e6 can be off by a few
  ulps, so rows whose product lies near a rounding tie are formatted by Python
  itself and only their digits are used.
`render` returns None when a column is outside these ranges (non-finite, huge,
negative ns); callers then use their plain row-by-row writer.

Why not pyarrow's CSV writer (issue 22; benchmarks/csv_writer_bench.py): it cannot give these
bytes by itself. It prints a float's shortest repr, not `%.6f`, and quotes either every string
("needed") or none, refusing a value with a comma or quote ("none"), where events.csv quotes as
csv.writer does (only when needed). Made byte-identical (the `%.6f` text built as Arrow strings
from this module's exact rounding, strings pre-quoted, quoting "none"), it is slower on events.csv
of PP64 x 1024 x 4 (1,040,392 rows, 53 MB), medians of 5 interleaved rounds on the shared 2-core
box, load ~7-8, 2026-12-04: this writer 1.71 s; pyarrow 3.69 s (2.16x), 2.72 s (1.58x) with
batch_size 65536; even with Arrow's own float text (not the same bytes) 2.91 s (1.70x).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

INT, US, FIXED6 = "int", "us", "fixed6"
CHUNK = 8192  # rows per block: a block's bytes (rows x line width) stay in cache; writes stream
US_LIMIT = 10 ** 15  # ns; see the module docstring
FIXED6_LIMIT = 9.0e9  # |x| * 1e6 stays below 2**53, so its integer part is exact
_MINUS, _DOT, _ZERO = ord("-"), ord("."), ord("0")


def factorize(values: np.ndarray, likely: Sequence[str] = ()) -> tuple[list, np.ndarray]:
    """(values, code of each row): every distinct value gets a code (a `likely` value may get
    one without occurring). Far cheaper than np.unique(return_inverse=True), which argsorts
    every row: `likely` values are found by comparison (timeline kinds, phases), and short
    Latin-1 strings (device names) are coded as the 8 bytes that spell them.
    """
    a = np.asarray(values)
    n = len(a)
    found: list = []
    codes = np.full(n, -1, dtype=np.int64)
    for v in likely:
        codes[a == v] = len(found)
        found.append(v)
    if likely:
        rest = np.flatnonzero(codes < 0)
        if len(rest) == 0:
            return found, codes
        more, more_codes = factorize(a[rest])
        codes[rest] = more_codes + len(found)
        return found + more, codes
    if a.dtype.kind == "U" and 0 < a.dtype.itemsize <= 32 and n:
        chars = np.ascontiguousarray(a).view(np.uint32).reshape(n, -1)
        if int(chars.max()) < 256:
            spelled = np.zeros((n, 8), dtype=np.uint8)
            spelled[:, :chars.shape[1]] = chars
            key = spelled.view(np.uint64).reshape(n)
            uniq = np.unique(key)
            words = [bytes(w).rstrip(b"\0").decode("latin-1") for w in uniq.view(np.uint8).reshape(-1, 8)]
            return words, np.searchsorted(uniq, key).astype(np.int64)
    uniq = np.unique(a)
    return uniq.tolist(), np.searchsorted(uniq, a).astype(np.int64)


def _dense(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one row holding each distinct key, code of each row): a sort of the distinct keys and a
    binary search, far cheaper than np.unique's stable argsort of all rows."""
    uniq = np.unique(key)
    codes = np.searchsorted(uniq, key).astype(np.int64)
    rep = np.empty(len(uniq), dtype=np.int64)
    rep[codes] = np.arange(len(key), dtype=np.int64)  # any row of each key will do
    return rep, codes


def combine(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the distinct rows of several integer columns: (a row holding each distinct
    combination, code of each row). Columns are folded into one int64 key, re-coded densely
    whenever the key could overflow."""
    n = len(columns[0])
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for col in columns:
        col = np.asarray(col, dtype=np.int64)
        lo, hi = (int(col.min()), int(col.max())) if n else (0, 0)
        card = hi - lo + 1
        if span * card >= 1 << 62:
            key = _dense(key)[1]
            span = int(key.max()) + 1 if n else 1
        key = key * card + (col - lo)
        span *= card
    return _dense(key)


def _width(v: np.ndarray) -> int:
    return len(str(int(v.max()))) if len(v) else 1


def _put_digits(out: np.ndarray, v: np.ndarray, lead: bool = False) -> None:
    """Decimal digits of v >= 0 into the columns of `out`, right-aligned; NUL where a leading zero
    would be (`lead`: print the leading zeros, for a fraction)."""
    for j in range(out.shape[1] - 1, -1, -1):
        q = v // 10
        d = (v - q * 10).astype(np.uint8) + np.uint8(_ZERO)
        if not lead and j < out.shape[1] - 1:
            d *= v > 0
        out[:, j] = d
        v = q


def _fixed6_units(x: np.ndarray) -> np.ndarray:
    """round(|x| * 1e6) exactly as "%.6f" rounds it (Python formats the rows near a tie)."""
    y = np.abs(x) * 1e6
    k = np.rint(y)
    near_tie = np.abs(y - np.floor(y) - 0.5) <= y * 2.0 ** -50 + 1e-9
    k = k.astype(np.int64)
    for i in np.flatnonzero(near_tie).tolist():
        k[i] = int(("%.6f" % abs(float(x[i]))).replace(".", ""))
    return k


def render(parts: Sequence[Sequence[bytes]], codes: np.ndarray,
           fields: Sequence[tuple[str, np.ndarray]], chunk: int = CHUNK) -> Iterator[bytes] | None:
    """Lines `parts[0][c] + field0 + parts[1][c] + field1 + ... + parts[-1][c]` for each row's code c.

    `fields` are (INT | US | FIXED6, column). Returns an iterator of byte blocks (all
    checks are done before it is returned), or None when some value cannot be printed
    here, or a part contains NUL.
    """
    if len(parts) != len(fields) + 1:
        raise ValueError("need one more part than fields")
    if any(b"\0" in p for ps in parts for p in ps):
        return None
    cols = []
    for kind, col in fields:
        col = np.asarray(col)
        if kind == INT:
            col = col.astype(np.int64)
            cols.append((kind, col, None, _width(np.abs(col))))
        elif kind == US:
            col = col.astype(np.int64)
            if len(col) and (int(col.min()) < 0 or int(col.max()) >= US_LIMIT):
                return None
            cols.append((kind, col, None, _width(col // 1000)))
        elif kind == FIXED6:
            col = col.astype(np.float64)
            if len(col) and not bool(np.all(np.abs(col) < FIXED6_LIMIT)):  # also refuses NaN
                return None
            units = _fixed6_units(col)
            cols.append((kind, units, np.signbit(col), _width(units // 10 ** 6)))
        else:
            raise ValueError(f"unknown field kind {kind!r}")
    # One (combinations x width) table of every line's fixed bytes, NUL where a number's
    # digits go (and as padding); numbers are written into their columns block by block.
    layout, offsets, pos = [], [], 0
    for i, ps in enumerate(parts):
        offsets.append(pos)
        pos += max((len(p) for p in ps), default=0)
        if i < len(cols):
            kind, col, neg, width = cols[i]
            layout.append((kind, col, neg, pos, width))
            pos += {INT: 1 + width, US: width + 4, FIXED6: width + 8}[kind]
    table = np.zeros((len(parts[0]), pos), dtype=np.uint8)
    for ps, at in zip(parts, offsets):
        for i, p in enumerate(ps):
            table[i, at:at + len(p)] = np.frombuffer(p, dtype=np.uint8)
    for kind, _, _, at, width in layout:
        if kind == US:
            table[:, at + width] = _DOT
        elif kind == FIXED6:
            table[:, at + 1 + width] = _DOT
    codes = np.asarray(codes, dtype=np.int64)

    def blocks() -> Iterator[bytes]:
        for lo in range(0, len(codes), chunk):
            mat = table[codes[lo:lo + chunk]]
            for kind, col, neg, at, width in layout:
                v = col[lo:lo + chunk]
                if kind == INT:  # [-]digits
                    mat[:, at] = (v < 0) * np.uint8(_MINUS)
                    _put_digits(mat[:, at + 1:at + 1 + width], np.abs(v))
                elif kind == US:  # digits.d[d[d]]: trailing zeros dropped, one decimal kept
                    whole, frac = np.divmod(v, 1000)
                    _put_digits(mat[:, at:at + width], whole)
                    f1, rest = np.divmod(frac, 100)
                    f2, f3 = np.divmod(rest, 10)
                    mat[:, at + width + 1] = f1 + _ZERO
                    mat[:, at + width + 2] = (f2 + _ZERO) * (rest != 0)
                    mat[:, at + width + 3] = (f3 + _ZERO) * (f3 != 0)
                else:  # [-]digits.dddddd
                    mat[:, at] = neg[lo:lo + chunk] * np.uint8(_MINUS)
                    whole, frac = np.divmod(v, 10 ** 6)
                    _put_digits(mat[:, at + 1:at + 1 + width], whole)
                    _put_digits(mat[:, at + 2 + width:at + 8 + width], frac, lead=True)
            flat = mat.reshape(-1)
            yield flat[flat != 0].tobytes()

    return blocks()
